// An ONNX export served through the whole service (store, scheduler, HTTP) with the onnx backend:
// a chat completion with OpenAI's client, the same text as the native engine on the same weights,
// and structured outputs (token masks applied to the ONNX logits) that parse against their schema.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { exportOnnx } from '../models/onnx-export.js';
import { openService, type Service } from '../src/service.js';
import { createApiKey } from '../src/store/api-keys.js';

let root: string;
let service: Service;
let client: OpenAI;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-onnx-http-'));
  const nativeDir = join(root, 'tiny');
  const onnxDir = join(root, 'tiny-onnx');
  await makeModel({ preset: 'tiny', out: nativeDir, seed: 3 });
  await exportOnnx({ modelDir: nativeDir, out: onnxDir });
  service = await openService({
    catalog: {
      models: [
        { id: 'tiny-onnx', checkpoint: onnxDir, engine: { backend: 'onnx' } },
        { id: 'tiny', checkpoint: nativeDir, engine: { backend: 'cpu' } },
      ],
    },
    dataDir: join(root, 'data'),
    engineDefaults: { kvCacheBytes: 32 << 20, threads: 1 },
    onProgress: () => {},
  });
  const address = await service.app.listen({ host: '127.0.0.1', port: 0 });
  const key = service.firstKey?.key ?? (await createApiKey(service.store, 'default')).key;
  client = new OpenAI({ baseURL: `${address}/v1`, apiKey: key, maxRetries: 0 });
});
afterAll(async () => {
  await service?.close();
  rmSync(root, { recursive: true, force: true });
});

describe('chat completions on the onnx backend', () => {
  it('runs on onnxruntime and answers as the native engine does', async () => {
    const engine = service.registry.models.find((m) => m.id === 'tiny-onnx')!.engine;
    expect(engine.info.backend).toBe('onnx');
    const ask = (model: string) => client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Name a river.' }], max_tokens: 20, temperature: 0, logprobs: true, top_logprobs: 2,
    });
    const [onnx, native] = await Promise.all([ask('tiny-onnx'), ask('tiny')]);
    expect(onnx.model).toBe('tiny-onnx');
    expect(onnx.choices[0]!.message.content).toBe(native.choices[0]!.message.content);
    expect(onnx.choices[0]!.finish_reason).toBe(native.choices[0]!.finish_reason);
    expect(onnx.usage).toMatchObject({ prompt_tokens: native.usage!.prompt_tokens, completion_tokens: native.usage!.completion_tokens });
    expect(onnx.choices[0]!.logprobs!.content).toHaveLength(native.choices[0]!.logprobs!.content!.length);
  });

  it('keeps structured outputs to their schema', async () => {
    const schema = { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'], additionalProperties: false };
    const res = await client.chat.completions.create({
      model: 'tiny-onnx', messages: [{ role: 'user', content: 'A number as JSON.' }], max_tokens: 40, seed: 11,
      response_format: { type: 'json_schema', json_schema: { name: 'n', schema, strict: true } },
    });
    const choice = res.choices[0]!;
    if (choice.finish_reason === 'stop') {
      const value = JSON.parse(choice.message.content!) as { n: unknown };
      expect(Number.isInteger(value.n)).toBe(true);
    } else {
      // Cut by max_tokens: still a prefix of {"n": <digits>
      expect(choice.message.content).toMatch(/^\s*\{\s*("(n"?)?)?/);
    }
  });
});
