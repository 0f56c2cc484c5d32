// One server per data directory: a second server on it is refused with a message naming the
// directory (in this process or another), the lock goes with the process that held it (kill -9
// included), and the CLI's store access keeps working next to a running server. `sluice serve`
// also reports a port in use before loading any model. And the data directory's modes: 0700
// directories, 0600 files, an existing directory tightened at open.

import { execFile, spawn } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { openService, storePath, type OpenServiceOptions } from '../../src/service.js';
import { createApiKey } from '../../src/store/api-keys.js';
import { SqliteStore } from '../../src/store/sqlite-store.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'src', 'cli.js');
const run = promisify(execFile);

let root: string;
let modelDir: string;
beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-lock-'));
  modelDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const options = (dataDir: string): OpenServiceOptions => ({
  catalog: { models: [{ id: 'tiny', checkpoint: modelDir }] }, dataDir,
  engineDefaults: { backend: 'cpu', kvCacheBytes: 32 << 20, threads: 1 }, onProgress: () => {},
});
const mode = (path: string) => statSync(path).mode & 0o777;

describe('the data directory lock', () => {
  it('refuses a second server on the same directory until the first closes', async () => {
    const dataDir = join(root, 'twice');
    const first = await openService(options(dataDir));
    try {
      const second = openService(options(dataDir));
      await expect(second).rejects.toMatchObject({ code: 'data_dir_locked', message: expect.stringContaining(dataDir) });
      await expect(second).rejects.toThrow(/another sluice server is using the data directory/);
      // What `sluice keys` and `sluice usage` do: open sluice.db directly, next to the server.
      const cliStore = new SqliteStore(storePath(dataDir));
      const made = await createApiKey(cliStore, 'acme');
      await cliStore.close();
      expect((await first.store.listApiKeys()).map((k) => k.id)).toContain(made.info.id);
    } finally {
      await first.close();
    }
    const again = await openService(options(dataDir));
    await again.close();
  });

  it('is released by the operating system when the server is killed with SIGKILL', async () => {
    const dataDir = join(root, 'killed');
    const child = spawn(process.execPath, [CLI, 'serve', '--model', modelDir, '--port', '0', '--data-dir', dataDir,
      '--backend', 'cpu', '--kv-cache-bytes', String(32 << 20), '--log-level', 'warn'], { stdio: ['ignore', 'pipe', 'pipe'] });
    const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on('exit', (_code, signal) => resolve(signal)));
    let stderr = '';
    await new Promise<void>((resolve, reject) => {
      child.stderr!.on('data', (d) => {
        stderr += d;
        if (/serving tiny on/.test(stderr)) resolve();
      });
      exited.then(() => reject(new Error(`serve exited: ${stderr}`)));
    });
    await expect(openService(options(dataDir))).rejects.toMatchObject({ code: 'data_dir_locked' });
    // The CLI next to it still works.
    const { stdout } = await run(process.execPath, [CLI, 'keys', 'list', '--json', '--data-dir', dataDir]);
    expect(JSON.parse(stdout)).toHaveLength(1);
    child.kill('SIGKILL');
    expect(await exited).toBe('SIGKILL');
    const after = await openService(options(dataDir));
    await after.close();
  });
});

describe('sluice serve and its port', () => {
  it('reports a port in use before loading any model', async () => {
    const taken = net.createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', () => resolve()));
    const { port } = taken.address() as net.AddressInfo;
    try {
      const result = await run(process.execPath, [CLI, 'serve', '--model', join(root, 'no-such-model'), '--port', String(port),
        '--data-dir', join(root, 'port')]).then(() => ({ code: 0, stderr: '' }), (e: { code: number; stderr: string }) => e);
      expect(result.code).toBe(1);
      expect(result.stderr).toContain(`127.0.0.1:${port} is already in use`);
      expect(result.stderr).not.toMatch(/loading|no-such-model/);
    } finally {
      taken.close();
    }
  });
});

describe('file modes of the data directory', () => {
  it('makes a new data directory 0700 with 0600 files, uploads included', async () => {
    const dataDir = join(root, 'new', 'data');
    const service = await openService(options(dataDir));
    try {
      const origin = await service.app.listen({ host: '127.0.0.1', port: 0 });
      const client = new OpenAI({ baseURL: `${origin}/v1`, apiKey: service.firstKey!.key, maxRetries: 0 });
      const file = await client.files.create({ file: await toFile(Buffer.from('secret'), 'a.txt'), purpose: 'user_data' });
      expect(mode(join(root, 'new'))).toBe(0o700);
      expect(mode(dataDir)).toBe(0o700);
      expect(mode(join(dataDir, 'files'))).toBe(0o700);
      for (const f of ['sluice.db', 'sluice.db-wal', 'sluice.db-shm', 'server.lock', join('files', file.id)]) {
        expect(mode(join(dataDir, f)), f).toBe(0o600);
      }
    } finally {
      await service.close();
    }
  });

  it('tightens files/ and sluice.db of an existing data directory at open', async () => {
    const dataDir = join(root, 'existing');
    await (await openService(options(dataDir))).close();
    chmodSync(join(dataDir, 'files'), 0o755);
    chmodSync(join(dataDir, 'sluice.db'), 0o644);
    mkdirSync(join(dataDir, 'other'), { mode: 0o755 }); // not ours: left alone
    const service = await openService(options(dataDir));
    try {
      expect(mode(join(dataDir, 'files'))).toBe(0o700);
      expect(mode(join(dataDir, 'sluice.db'))).toBe(0o600);
      expect(mode(join(dataDir, 'other'))).toBe(0o755);
    } finally {
      await service.close();
    }
  });
});
