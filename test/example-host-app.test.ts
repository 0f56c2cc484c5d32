// The example host application (examples/host-app) started as its own process: it is compiled
// from its sources and its `sluice` import resolves to this repository's build (what its
// `file:../..` dependency names), so the test needs no install of the example. Its type-check
// against its own fastify, with sluice installed as a packed copy, is .ci/run's step.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const example = join(root, 'examples', 'host-app');

let tmp: string;
let child: ChildProcess | undefined;

beforeAll(async () => {
  tmp = mkdtempSync(join(os.tmpdir(), 'sluice-example-'));
  await makeModel({ preset: 'tiny', out: join(tmp, 'tiny'), seed: 3 });
  // Emit only: the type-check is .ci/run's, against the example's installed dependencies.
  const tsc = spawnSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', example, '--noCheck', '--outDir', join(example, 'dist')],
    { encoding: 'utf8' });
  expect(tsc.status, tsc.stdout + tsc.stderr).toBe(0);
  // `sluice` -> this repository's dist/ (the module the package's "exports" names).
  writeFileSync(join(tmp, 'hooks.mjs'), `export async function resolve(specifier, context, next) {
  if (specifier === 'sluice') return { url: ${JSON.stringify(pathToFileURL(join(root, 'dist', 'src', 'index.js')).href)}, shortCircuit: true };
  return next(specifier, context);
}\n`);
  writeFileSync(join(tmp, 'register.mjs'), `import { register } from 'node:module';\nregister('./hooks.mjs', import.meta.url);\n`);
});
afterAll(() => {
  child?.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});

describe('examples/host-app', () => {
  it('serves its own route and the sluice API under /llm/v1, and stops on SIGTERM', async () => {
    const proc = spawn(process.execPath, ['--import', pathToFileURL(join(tmp, 'register.mjs')).href, join(example, 'dist', 'server.js')], {
      cwd: tmp,
      env: { ...process.env, MODEL_DIR: join(tmp, 'tiny'), DATA_DIR: join(tmp, 'data'), HOST: '127.0.0.1', PORT: '0' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child = proc;
    let stderr = '';
    proc.stderr!.on('data', (chunk: Buffer) => { stderr += chunk.toString(); });
    const exited = new Promise<number | null>((r) => proc.on('exit', (code) => r(code)));

    // fastify's JSON log lines: the first key, then the address it listens on.
    let apiKey: string | undefined;
    const origin = await new Promise<string>((resolveOrigin, reject) => {
      const timer = setTimeout(() => reject(new Error(`the example did not start in time; stderr: ${stderr}`)), 90_000);
      proc.on('exit', (code) => reject(new Error(`the example exited (${code}); stderr: ${stderr}`)));
      createInterface({ input: proc.stdout! }).on('line', (line) => {
        let entry: { msg?: string; apiKey?: string };
        try { entry = JSON.parse(line); } catch { return; }
        if (entry.apiKey) apiKey = entry.apiKey;
        const listening = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(entry.msg ?? '');
        if (listening) {
          clearTimeout(timer);
          resolveOrigin(listening[1]!);
        }
      });
    });
    expect(apiKey).toMatch(/^sk-sluice-/);

    expect(await (await fetch(`${origin}/hello?name=host`)).json()).toEqual({ hello: 'host' });
    const chat = await fetch(`${origin}/llm/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3, temperature: 0 }),
    });
    expect(chat.status).toBe(200);
    const body = await chat.json() as { object: string; usage: { completion_tokens: number } };
    expect(body.object).toBe('chat.completion');
    expect(body.usage.completion_tokens).toBeGreaterThan(0);
    const refused = await fetch(`${origin}/llm/v1/models`);
    expect(refused.status).toBe(401);
    expect((await refused.json() as { error: { type: string } }).error.type).toBe('authentication_error');

    proc.kill('SIGTERM');
    expect(await exited).toBe(0);
    child = undefined;
  });
});
