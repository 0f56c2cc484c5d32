// Image input through the official SDKs (issue 34), against a served Qwen2.5-VL checkpoint the
// project generates (test-qwen2.5-vl) beside a text-only model: the same image as a URL and as a
// data URI gives the same output at temperature 0, a different image another; usage counts the
// image's tokens as input; Responses, Chat Completions and Messages render the same prompt;
// background responses, previous_response_id chains and count_tokens carry images; bad images,
// refused URLs and too many images are 400s naming the part, and a text-only model answers
// image_input_unsupported before generating.

import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import type { ImageInputSettings } from '../../src/serving/request-images.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { patternRgb } from '../helpers/vision.js';
import { createBatch, readResults, waitForBatch } from '../helpers/batches.js';

let server: TestServer;
let openai: OpenAI;
let anthropic: Anthropic;
let images: Server;
let imageOrigin: string;
const settings: ImageInputSettings = { allowPrivateAddresses: true, maxImagesPerRequest: 3 };

/** A PNG of a deterministic pattern. */
const png = (width: number, height: number, seed: number): Promise<Buffer> =>
  sharp(patternRgb(width, height, seed), { raw: { width, height, channels: 3 } }).png().toBuffer();

const files = new Map<string, Buffer>();
const dataUri = (name: string) => `data:image/png;base64,${files.get(name)!.toString('base64')}`;
const url = (name: string) => `${imageOrigin}/${name}`;

beforeAll(async () => {
  files.set('cat.png', await png(224, 224, 1));      // 8 x 8 merged patches: 64 tokens
  files.set('dog.png', await png(224, 224, 2));
  files.set('small.png', await png(56, 56, 3));      // 2 x 2: 4 tokens
  files.set('not-an-image.png', Buffer.from('<svg xmlns="http://www.w3.org/2000/svg"/>'));
  images = createServer((req, res) => {
    const body = files.get((req.url ?? '').slice(1));
    if (!body) return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'image/png' }).end(body);
  });
  await new Promise<void>((resolve) => images.listen(0, '127.0.0.1', resolve));
  imageOrigin = `http://127.0.0.1:${(images.address() as { port: number }).port}`;
  server = await startTestServer({
    images: settings,
    catalog: (tinyDir) => ({
      models: [{ id: 'tiny', checkpoint: tinyDir }, { id: 'vl', checkpoint: join(tinyDir, '..', 'vl') },
        { id: 'gemma', checkpoint: join(tinyDir, '..', 'gemma') }],
    }),
    // (startTestServer makes the tiny model; the vision-language ones are made beside it here.)
    beforeOpen: async (tinyDir) => {
      await makeModel({ preset: 'test-qwen2.5-vl', out: join(tinyDir, '..', 'vl'), dtype: 'f32' });
      await makeModel({ preset: 'test-gemma3-vl', out: join(tinyDir, '..', 'gemma'), dtype: 'f32' });
    },
  });
  openai = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: server.origin, apiKey: server.key, maxRetries: 0 });
}, 120_000);
afterAll(async () => {
  await server?.close();
  await new Promise((resolve) => images?.close(resolve));
});

const ask = (image: string, text = 'What is in this image?', detail?: 'low' | 'high' | 'auto') => [{
  role: 'user' as const,
  content: [{ type: 'input_text' as const, text }, { type: 'input_image' as const, image_url: image, ...(detail && { detail }) }],
}];
const respond = (input: ReturnType<typeof ask>, extra: Record<string, unknown> = {}) =>
  openai.responses.create({ model: 'vl', input, temperature: 0, max_output_tokens: 8, ...extra } as never) as Promise<OpenAI.Responses.Response>;

describe('image input', () => {
  it('lists the vision-language model as taking images, the text model not', async () => {
    const models = (await openai.models.list()).data as unknown as { id: string; supports_image_input: boolean }[];
    expect(Object.fromEntries(models.map((m) => [m.id, m.supports_image_input]))).toEqual({ tiny: false, vl: true, gemma: true });
  });

  it('gives the same output for an image as a URL and as a data URI; another image changes it; usage counts its tokens', async () => {
    const byUrl = await respond(ask(url('cat.png')));
    const byData = await respond(ask(dataUri('cat.png')));
    expect(['completed', 'incomplete']).toContain(byUrl.status);  // (incomplete: max_output_tokens reached)
    expect(byData.output_text).toBe(byUrl.output_text);
    expect(byData.usage!.input_tokens).toBe(byUrl.usage!.input_tokens);
    const other = await respond(ask(url('dog.png')));
    expect(other.output_text).not.toBe(byUrl.output_text);
    // 64 tokens for 224x224, 4 for 56x56: the prompts differ by the images' tokens only.
    const small = await respond(ask(url('small.png')));
    expect(byUrl.usage!.input_tokens - small.usage!.input_tokens).toBe(60);
    // detail low resizes within its smaller budget (here the model's own is smaller still).
    const low = await respond(ask(url('cat.png'), 'What is in this image?', 'low'));
    expect(low.usage!.input_tokens).toBe(byUrl.usage!.input_tokens);
  });

  it('serves Gemma 3 with images: a fixed token count whatever the size, URL and data URI alike', async () => {
    const ask3 = (image: string) => openai.responses.create({ model: 'gemma', input: ask(image), temperature: 0, max_output_tokens: 8 } as never) as Promise<OpenAI.Responses.Response>;
    const [byUrl, byData, other, small] = await Promise.all([ask3(url('cat.png')), ask3(dataUri('cat.png')), ask3(url('dog.png')), ask3(url('small.png'))]);
    expect(byData.output_text).toBe(byUrl.output_text);
    expect(other.output_text).not.toBe(byUrl.output_text);
    // Every image is resized to the one square size: the same prompt length for 224x224 and 56x56.
    expect(small.usage!.input_tokens).toBe(byUrl.usage!.input_tokens);
    const text = await openai.responses.create({ model: 'gemma', input: 'What is in this image?', temperature: 0, max_output_tokens: 8 });
    // The image adds its 4 tokens and the processor's <start_of_image>, <end_of_image> and newlines.
    expect(byUrl.usage!.input_tokens - text.usage!.input_tokens).toBeGreaterThanOrEqual(6);
  });

  it('renders the same prompt on Chat Completions and Messages, and count_tokens counts the image', async () => {
    const responses = await respond(ask(url('cat.png'), 'Describe it.'));
    const chat = await openai.chat.completions.create({
      model: 'vl', temperature: 0, max_tokens: 8,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Describe it.' }, { type: 'image_url', image_url: { url: url('cat.png') } }] }],
    });
    expect(chat.choices[0]!.message.content).toBe(responses.output_text);
    expect(chat.usage!.prompt_tokens).toBe(responses.usage!.input_tokens);
    const content: Anthropic.ContentBlockParam[] = [
      { type: 'text', text: 'Describe it.' },
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: files.get('cat.png')!.toString('base64') } },
    ];
    const message = await anthropic.messages.create({ model: 'vl', max_tokens: 8, temperature: 0, messages: [{ role: 'user', content }] } as Anthropic.MessageCreateParamsNonStreaming);
    expect((message.content[0] as Anthropic.TextBlock).text).toBe(responses.output_text);
    // Anthropic's input_tokens leaves out what the prefix cache served: the same image's blocks.
    expect(message.usage.cache_read_input_tokens).toBeGreaterThanOrEqual(64);
    expect(message.usage.input_tokens + message.usage.cache_read_input_tokens!).toBe(responses.usage!.input_tokens);
    const counted = await anthropic.messages.countTokens({ model: 'vl', messages: [{ role: 'user', content }] });
    expect(counted.input_tokens).toBe(responses.usage!.input_tokens);
  });

  it('carries images through background responses and previous_response_id chains', async () => {
    const direct = await respond(ask(url('dog.png')));
    let bg = await respond(ask(url('dog.png')), { background: true, store: true });
    for (let i = 0; i < 200 && (bg.status === 'queued' || bg.status === 'in_progress'); i++) {
      await new Promise((r) => setTimeout(r, 50));
      bg = await openai.responses.retrieve(bg.id);
    }
    expect(['completed', 'incomplete']).toContain(bg.status);
    expect(bg.output_text).toBe(direct.output_text);
    // The second turn sees the first turn's image: its prompt holds the image's 64 tokens again.
    const first = await respond(ask(url('cat.png')), { store: true });
    const next = await openai.responses.create({ model: 'vl', previous_response_id: first.id, input: 'And now?', temperature: 0, max_output_tokens: 4 });
    expect(next.usage!.input_tokens).toBeGreaterThan(first.usage!.input_tokens + first.usage!.output_tokens);
    const alone = await openai.responses.create({ model: 'vl', input: 'And now?', temperature: 0, max_output_tokens: 4 });
    expect(next.usage!.input_tokens - alone.usage!.input_tokens).toBeGreaterThan(64);
  });

  it('runs batch lines with images, a bad image failing its line alone', async () => {
    const line = (id: string, image: string) => ({
      custom_id: id, method: 'POST' as const, url: '/v1/chat/completions' as const,
      body: { model: 'vl', max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: [{ type: 'text', text: 'Describe it.' }, { type: 'image_url', image_url: { url: image } }] }] },
    });
    const direct = await openai.chat.completions.create(line('x', dataUri('cat.png')).body as never) as OpenAI.ChatCompletion;
    const batch = await createBatch(openai, [line('good', dataUri('cat.png')), line('bad', url('not-an-image.png'))], '24h');
    const done = await waitForBatch(openai, batch.id);
    expect(done.status).toBe('completed');
    const results = [...await readResults(openai, done.output_file_id), ...await readResults(openai, done.error_file_id)];
    const good = results.find((r) => r.custom_id === 'good')!;
    expect(good.response!.status_code).toBe(200);
    expect(good.response!.body['choices'][0].message.content).toBe(direct.choices[0]!.message.content);
    const bad = results.find((r) => r.custom_id === 'bad')!;
    expect(bad.response!.status_code).toBe(400);
    expect(bad.response!.body['error']).toMatchObject({ param: 'messages[0].content[1]' });
  });

  it('refuses bad images with a 400 naming the part, before generating', async () => {
    const refused = async (input: unknown, param: string, message: RegExp, code = 'invalid_request') => {
      const err = await openai.responses.create({ model: 'vl', input, max_output_tokens: 4 } as never).catch((e: unknown) => e) as InstanceType<typeof OpenAI.APIError>;
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect(err.status).toBe(400);
      expect(err.error).toMatchObject({ param, code });
      expect(err.message).toMatch(message);
    };
    await refused(ask(url('not-an-image.png')), 'input[0].content[1]', /JPEG, PNG, WebP or GIF|not an image|format/i);
    await refused(ask(url('missing.png')), 'input[0].content[1]', /404/);
    await refused(ask('data:image/jpeg;base64,' + files.get('cat.png')!.toString('base64')), 'input[0].content[1]', /PNG|media type|jpeg/i);
    // A text-only model: refused before anything is fetched.
    const text = await openai.responses.create({ model: 'tiny', input: ask(url('cat.png')), max_output_tokens: 4 } as never).catch((e: unknown) => e) as InstanceType<typeof OpenAI.APIError>;
    expect(text.status).toBe(400);
    expect(text.error).toMatchObject({ code: 'image_input_unsupported', param: 'input[0].content[1]' });
    // More images than a request may hold.
    const four = [{ role: 'user', content: Array.from({ length: 4 }, () => ({ type: 'input_image', image_url: url('small.png') })) }];
    await refused(four, 'input[0].content[3]', /at most 3 images/);
  });

  it('refuses an image URL at a private address unless the operator allows them', async () => {
    settings.allowPrivateAddresses = false;
    try {
      const err = await respond(ask(url('cat.png'))).catch((e: unknown) => e) as InstanceType<typeof OpenAI.APIError>;
      expect(err.status).toBe(400);
      expect(err.error).toMatchObject({ code: 'invalid_request', param: 'input[0].content[1]' });
      expect(err.message).toMatch(/private|loopback|refused/i);
    } finally {
      settings.allowPrivateAddresses = true;
    }
  });
});
