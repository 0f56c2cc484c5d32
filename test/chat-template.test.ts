// Tests of chat-template rendering (src/text/chat-template.ts) and of the tokenizer loading
// that supplies it (src/text/tokenizer.ts): template source, bos/eos, eos ids, file errors.

import { mkdtemp, rm, writeFile, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { ChatTemplate, compileChatTemplate } from '../src/text/chat-template.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';
import { SluiceError } from '../src/errors.js';

const CHATML =
  "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return err instanceof SluiceError ? err.code : `not a SluiceError: ${String(err)}`;
  }
  return undefined;
}

describe('ChatTemplate', () => {
  it('renders messages and the generation prompt', () => {
    const template = new ChatTemplate(CHATML);
    expect(template.render([{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }])).toBe(
      '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n');
    expect(template.render([{ role: 'user', content: 'Hi' }], { addGenerationPrompt: false })).toBe(
      '<|im_start|>user\nHi<|im_end|>\n');
  });

  it('renders developer as system and joins text parts with newlines', () => {
    const template = new ChatTemplate(CHATML);
    expect(template.render([
      { role: 'developer', content: 'rules' },
      { role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] },
    ])).toBe('<|im_start|>system\nrules<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n');
  });

  it('passes bos_token and eos_token', () => {
    const template = new ChatTemplate('{{ bos_token }}{{ messages[0].content }}{{ eos_token }}');
    expect(template.render([{ role: 'user', content: 'x' }], { bosToken: '<s>', eosToken: '</s>' })).toBe('<s>x</s>');
    expect(template.render([{ role: 'user', content: 'x' }])).toBe('x');
  });

  it('reports a missing template, bad messages, template exceptions and unparsable templates by code', () => {
    expect(codeOf(() => compileChatTemplate(undefined, 'models/base'))).toBe('no_chat_template');
    try {
      compileChatTemplate('', 'models/base');
    } catch (err) {
      expect((err as Error).message).toContain('models/base has no chat template');
    }
    const template = new ChatTemplate(CHATML);
    expect(codeOf(() => template.render([]))).toBe('invalid_request');
    expect(codeOf(() => template.render([{ role: 'function' as 'user', content: 'x' }]))).toBe('invalid_request');
    // Tool results pass through to the template under their own role.
    expect(template.render([{ role: 'tool', content: '42' }], { addGenerationPrompt: false })).toBe('<|im_start|>tool\n42<|im_end|>\n');
    expect(codeOf(() => template.render([{ role: 'user', content: [{ type: 'video' as 'text', text: '' }] }])))
      .toBe('invalid_request');
    const strict = new ChatTemplate(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok");
    expect(codeOf(() => strict.render([{ role: 'assistant', content: 'x' }]))).toBe('chat_template_error');
    expect(() => strict.render([{ role: 'assistant', content: 'x' }])).toThrow(/first message must be from the user/);
    expect(codeOf(() => new ChatTemplate('{% for %}'))).toBe('model_file_invalid');
  });
});

// Written here in the shape of templates that take one call per assistant turn (as Llama 3.1-3.3
// do: they raise on several): calls, then results, each in its own bracket.
const ONE_CALL_PER_TURN =
  "{% for m in messages %}{% if m.tool_calls %}{% if m.tool_calls | length != 1 %}{{ raise_exception('one call a turn') }}{% endif %}" +
  "[{{ m.content }}call {{ m.tool_calls[0].function.name }} {{ m.tool_calls[0].function.arguments | tojson }}" +
  "{% if m.reasoning_content %} thinking {{ m.reasoning_content }}{% endif %}]" +
  "{% elif m.role == 'tool' %}[result {{ m.content }}]{% else %}[{{ m.role }}: {{ m.content }}]{% endif %}{% endfor %}";
const MANY_CALLS_PER_TURN =
  "{% for m in messages %}[{{ m.role }}{% for c in m.tool_calls or [] %} {{ c.function.name }}{% endfor %}]{% endfor %}";

describe('ChatTemplate with parallel tool calls', () => {
  const call = (id: string, name: string) => ({ id, type: 'function' as const, function: { name, arguments: { n: id } } });

  it('renders a turn of several calls one call per turn, each before its result, where the template takes one', () => {
    const template = new ChatTemplate(ONE_CALL_PER_TURN);
    // Results given in the other order: each follows the call its id names.
    expect(template.render([
      { role: 'user', content: 'q' },
      { role: 'assistant', content: 'Both. ', reasoning_content: 'r', tool_calls: [call('c1', 'tide'), call('c2', 'units')] },
      { role: 'tool', content: 'two', tool_call_id: 'c2' },
      { role: 'tool', content: 'one', tool_call_id: 'c1' },
      { role: 'user', content: 'next' },
    ], { addGenerationPrompt: false })).toBe(
      '[user: q][Both. call tide {"n": "c1"} thinking r][result one][call units {"n": "c2"}][result two][user: next]');
    // Without ids, results pair with the calls in order.
    expect(template.render([
      { role: 'user', content: 'q' },
      { role: 'assistant', content: '', tool_calls: [call('c1', 'tide'), call('c2', 'units')] },
      { role: 'tool', content: 'one' }, { role: 'tool', content: 'two' },
    ])).toBe('[user: q][call tide {"n": "c1"}][result one][call units {"n": "c2"}][result two]');
    // One call a turn renders as given.
    expect(template.render([{ role: 'user', content: 'q' }, { role: 'assistant', content: '', tool_calls: [call('c1', 'tide')] }]))
      .toBe('[user: q][call tide {"n": "c1"}]');
  });

  it('keeps several calls in one turn where the template renders them', () => {
    const template = new ChatTemplate(MANY_CALLS_PER_TURN);
    expect(template.render([
      { role: 'user', content: 'q' },
      { role: 'assistant', content: '', tool_calls: [call('c1', 'tide'), call('c2', 'units')] },
      { role: 'tool', content: 'one', tool_call_id: 'c1' },
    ])).toBe('[user][assistant tide units][tool]');
  });
});

describe('SluiceTokenizer + chat template of the tiny model', () => {
  let dir: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sluice-chat-'));
    await makeModel({ preset: 'tiny', out: dir, weights: false });
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('loads the ChatML template, eos ids and special tokens', async () => {
    const tokenizer = await SluiceTokenizer.load(dir);
    const imStart = tokenizer.tokenId('<|im_start|>')!;
    const imEnd = tokenizer.tokenId('<|im_end|>')!;
    const endOfText = tokenizer.tokenId('<|endoftext|>')!;
    expect(tokenizer.eosTokenIds).toEqual(new Set([imEnd, endOfText]));
    expect(tokenizer.eosToken).toBe('<|im_end|>');
    expect(tokenizer.isSpecial(imStart)).toBe(true);
    expect(tokenizer.addBosByDefault).toBe(false);

    const template = compileChatTemplate(tokenizer.chatTemplate, dir);
    const text = template.render([{ role: 'user', content: 'Hello' }]);
    expect(text).toBe('<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n');
    const ids = tokenizer.encode(text);
    expect(ids[0]).toBe(imStart);
    expect(ids.filter((id) => id === imStart)).toHaveLength(2);
    expect(tokenizer.decode(ids, { skipSpecialTokens: false })).toBe(text);
    expect(tokenizer.decode(ids)).toBe('user\nHello\nassistant\n');
  });

  it('adds bos only when tokenizer_config asks for it', async () => {
    const copy = await mkdtemp(join(tmpdir(), 'sluice-bos-'));
    try {
      for (const f of ['tokenizer.json', 'generation_config.json']) {
        await writeFile(join(copy, f), await readFile(join(dir, f)));
      }
      const config = JSON.parse(await readFile(join(dir, 'tokenizer_config.json'), 'utf8'));
      await writeFile(join(copy, 'tokenizer_config.json'),
        JSON.stringify({ ...config, add_bos_token: true, bos_token: { content: '<|endoftext|>' } }));
      const tokenizer = await SluiceTokenizer.load(copy);
      const bos = tokenizer.tokenId('<|endoftext|>')!;
      expect(tokenizer.encode('hi')[0]).toBe(bos);
      expect(tokenizer.encode('hi', { addBos: false })[0]).not.toBe(bos);
    } finally {
      await rm(copy, { recursive: true, force: true });
    }
  });

  it('names the missing or corrupt file', async () => {
    const empty = await mkdtemp(join(tmpdir(), 'sluice-empty-'));
    try {
      await expect(SluiceTokenizer.load(empty)).rejects.toMatchObject({
        code: 'model_file_missing', message: expect.stringContaining('tokenizer.json'),
      });
      await writeFile(join(empty, 'tokenizer.json'), await readFile(join(dir, 'tokenizer.json')));
      await writeFile(join(empty, 'tokenizer_config.json'), '{ not json');
      await expect(SluiceTokenizer.load(empty)).rejects.toMatchObject({
        code: 'model_file_invalid', message: expect.stringContaining('tokenizer_config.json'),
      });
    } finally {
      await rm(empty, { recursive: true, force: true });
    }
  });
});
