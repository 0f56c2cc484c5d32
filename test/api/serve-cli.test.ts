// `sluice serve` and `sluice keys` as separate processes on one data directory: the first-start
// key, key management while the server runs, persistence across a restart, clean shutdown.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { SqliteStore } from '../../src/store/sqlite-store.js';

const run = promisify(execFile);
const CLI = join(import.meta.dirname, '..', '..', 'dist', 'src', 'cli.js');

let root: string;
let modelDir: string;
let dataDir: string;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-serve-'));
  modelDir = join(root, 'my-model');
  dataDir = join(root, 'data');
  await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

interface Served { child: ChildProcess; origin: string; stdout: string; exited: Promise<number | null> }

/** Starts `sluice serve` on a free port and waits for its "serving" line. */
async function serve(): Promise<Served> {
  const child = spawn(process.execPath, [CLI, 'serve', '--model', modelDir, '--port', '0', '--data-dir', dataDir,
    '--backend', 'cpu', '--kv-cache-bytes', String(32 << 20), '--log-level', 'warn'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d) => { stdout += d; });
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const origin = await new Promise<string>((resolve, reject) => {
    child.stderr!.on('data', (d) => {
      stderr += d;
      const m = /serving my-model on (http:\/\/[^/\s]+)\/v1/.exec(stderr);
      if (m) resolve(m[1]!);
    });
    exited.then((code) => reject(new Error(`serve exited with ${code}: ${stderr}`)));
  });
  await new Promise((r) => setTimeout(r, 50)); // let the key banner on stdout arrive
  return { child, origin, get stdout() { return stdout; }, exited };
}

async function stop(served: Served): Promise<number | null> {
  served.child.kill('SIGTERM');
  return served.exited;
}

const cli = (...args: string[]) => run(process.execPath, [CLI, ...args, '--data-dir', dataDir]);

describe('sluice serve and sluice keys', () => {
  it('makes and prints a first key with a curl example, manages keys live, and keeps data across a restart', async () => {
    const first = await serve();
    let responseId: string;
    try {
      const key = /sk-sluice-[A-Za-z0-9_-]+/.exec(first.stdout)?.[0];
      expect(key).toBeDefined();
      expect(first.stdout).toContain(`curl ${first.origin}/v1/responses`);
      expect(first.stdout).toContain('"model": "my-model"');

      const created = await fetch(`${first.origin}/v1/responses`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'my-model', input: 'Hello', max_output_tokens: 3 }),
      });
      expect(created.status).toBe(200);
      responseId = (await created.json() as { id: string }).id;

      // A key made by the CLI while the server runs works at once; revoked, it stops at once.
      const { stdout: made } = await cli('keys', 'create', '--org', 'acme', '--json');
      const acme = JSON.parse(made) as { key: string; id: string; organization: string };
      expect(acme.organization).toBe('acme');
      const models = () => fetch(`${first.origin}/v1/models`, { headers: { authorization: `Bearer ${acme.key}` } });
      expect((await models()).status).toBe(200);
      const { stdout: listed } = await cli('keys', 'list', '--json');
      const keys = JSON.parse(listed) as Array<{ id: string; organization: string; revoked_at: number | null }>;
      expect(keys.map((k) => k.organization).sort()).toEqual(['acme', 'default']);
      expect(listed).not.toContain(acme.key);
      await cli('keys', 'revoke', acme.id);
      expect((await models()).status).toBe(401);
      await expect(cli('keys', 'revoke', acme.id)).rejects.toThrow(/no active key matches/);
      await expect(cli('keys', 'create')).rejects.toThrow(/--org NAME is required/);
    } finally {
      expect(await stop(first)).toBe(0);
    }

    // Restart on the same data directory: no new key, the old key and the stored response remain.
    const second = await serve();
    try {
      expect(second.stdout).not.toContain('sk-sluice-');
      const key = /sk-sluice-[A-Za-z0-9_-]+/.exec(first.stdout)![0];
      const got = await fetch(`${second.origin}/v1/responses/${responseId!}`, { headers: { authorization: `Bearer ${key}` } });
      expect(got.status).toBe(200);
      expect((await got.json() as { id: string }).id).toBe(responseId!);
    } finally {
      expect(await stop(second)).toBe(0);
    }
  });

  it('resumes background work after the process is killed (SIGKILL, no shutdown at all)', async () => {
    const first = await serve();
    const key = /sk-sluice-[A-Za-z0-9_-]+/.exec(first.stdout)?.[0] ?? (JSON.parse((await cli('keys', 'create', '--org', 'default', '--json')).stdout) as { key: string }).key;
    const created = await fetch(`${first.origin}/v1/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'my-model', input: 'Tell me a long story', max_output_tokens: 1500, temperature: 0, background: true }),
    });
    const { id, status } = await created.json() as { id: string; status: string };
    expect(status).toBe('in_progress');
    first.child.kill('SIGKILL');
    await first.exited;
    // Killed mid-generation: the stored response is still in_progress, with its job.
    const store = new SqliteStore(join(dataDir, 'sluice.db'));
    const org = (await store.getOrganizationByName('default'))!.id;
    expect((await store.getResponse(org, id))!.status).toBe('in_progress');
    expect((await store.listBackgroundJobs()).map((j) => j.responseId)).toContain(id);
    await store.close();

    const second = await serve();
    try {
      let body: { status: string; usage: { output_tokens: number } } | undefined;
      for (let i = 0; i < 600; i++) {
        const res = await fetch(`${second.origin}/v1/responses/${id}`, { headers: { authorization: `Bearer ${key}` } });
        body = await res.json() as typeof body;
        if (body!.status !== 'in_progress') break;
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(['completed', 'incomplete']).toContain(body!.status);
      expect(body!.usage.output_tokens).toBeGreaterThan(0);
    } finally {
      expect(await stop(second)).toBe(0);
    }
  });

  it('refuses --model with --config, and a bad catalog, with a message and exit code 1', async () => {
    await expect(run(process.execPath, [CLI, 'serve', '--model', modelDir, '--config', 'x.json'])).rejects.toMatchObject({
      code: 1, stderr: expect.stringContaining('give --model or --config, not both'),
    });
    await expect(run(process.execPath, [CLI, 'serve', '--config', join(root, 'none.json')])).rejects.toMatchObject({
      code: 1, stderr: expect.stringContaining('cannot read the model catalog'),
    });
  });
});
