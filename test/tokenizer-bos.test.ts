// Raw prompts get special tokens the way transformers' tokenizer(text) adds them: from the
// tokenizer.json post-processor (Llama 3 style), not only from add_bos_token.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sluice-bos-'));
  await makeModel({ preset: 'llama-3.2-1b', out: dir, weights: false });
});
afterAll(() => rm(dir, { recursive: true, force: true }));

describe('bos from the post-processor', () => {
  it('prepends <|begin_of_text|> to raw prompts when the post-processor says so, never to chat prompts', async () => {
    const path = join(dir, 'tokenizer.json');
    const json = JSON.parse(await readFile(path, 'utf8'));
    const bos = json.added_tokens.find((t: { content: string }) => t.content === '<|begin_of_text|>');
    expect(bos).toBeDefined();
    // The shape Llama 3 checkpoints ship: ByteLevel, then a template that prepends bos.
    json.post_processor = {
      type: 'Sequence',
      processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        {
          type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
          pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
            { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
          special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [bos.id], tokens: ['<|begin_of_text|>'] } },
        },
      ],
    };
    await writeFile(path, JSON.stringify(json));
    const tok = await SluiceTokenizer.load(dir);
    const raw = tok.encode('Hello world');
    expect(raw[0]).toBe(bos.id);
    expect(raw.filter((id) => id === bos.id)).toHaveLength(1);
    expect(tok.encode('Hello world', { addBos: false })).toEqual(raw.slice(1));
  });
});
