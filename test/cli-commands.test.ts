// The command line as an operator meets it, each command a separate process (dist/src/cli.js):
// --version, `sluice models`, keys and usage on a data directory without a store, admin keys in
// `keys list`, make-model refusing to overwrite, errors naming flags, no CUDA warning with
// --backend auto, and a first `sluice serve` on the demo catalog whose tiers, costs and
// `sluice usage` are at work.
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { DEMO_PRICING } from '../src/cli/served-catalog.js';
import { cudaUnavailableReason, nativeAddon } from '../src/native/native.js';

const execFileP = promisify(execFile);
const CLI = join(import.meta.dirname, '..', 'dist', 'src', 'cli.js');

let root: string;
let home: string;
let modelDir: string;

/** Runs the CLI with SLUICE_HOME in the test's directory; resolves with {code, stdout, stderr}. */
async function cli(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await execFileP(process.execPath, [CLI, ...args], { env: { ...process.env, SLUICE_HOME: home } });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** The backend --backend auto picks on this machine. */
const autoBackend = () => (nativeAddon().cudaCompiled && cudaUnavailableReason() === undefined ? 'cuda' : 'cpu');

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-cli-'));
  home = join(root, 'home');
  modelDir = join(root, 'my-model');
  await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('sluice --version', () => {
  it('prints the package version', async () => {
    const version = (JSON.parse(readFileSync(join(import.meta.dirname, '..', 'package.json'), 'utf8')) as { version: string }).version;
    for (const flag of ['--version', '-v']) {
      const out = await cli(flag);
      expect(out).toMatchObject({ code: 0, stdout: `sluice ${version}\n` });
    }
  });
});

describe('sluice models', () => {
  it('lists the demo catalog with its example rates on every window, without making the demo model', async () => {
    const text = await cli('models');
    expect(text.code).toBe(0);
    const rows = text.stdout.trim().split('\n').map((l) => l.split('\t'));
    expect(rows[0]).toEqual(['id', 'name', 'context_length', 'window', 'input_per_1m', 'cached_input_per_1m', 'output_per_1m', 'restricted']);
    expect(rows.slice(1).map((r) => [r[0], r[2], r[3], r[4], r[5], r[6]])).toEqual(DEMO_PRICING.map((p) =>
      ['tiny', '2048', p.tier, String(p.input_per_1m_tokens), String(p.cached_input_per_1m_tokens), String(p.output_per_1m_tokens)]));
    expect(rows[1]![1]).toMatch(/example prices/);
    expect(existsSync(join(home, 'models', 'tiny'))).toBe(false);
    const json = JSON.parse((await cli('models', '--json')).stdout) as { object: string; data: Array<Record<string, unknown>> };
    expect(json.object).toBe('list');
    expect(json.data).toEqual([{ id: 'tiny', name: expect.stringMatching(/example prices/), context_length: 2048, pricing: DEMO_PRICING }]);
    expect(DEMO_PRICING.map((p) => p.tier)).toEqual(['asap', 'standard', 'flex']);
  });

  it('reads a model directory\'s context length from its config.json', async () => {
    const out = await cli('models', '--model', modelDir, '--json');
    expect(JSON.parse(out.stdout)).toEqual({ object: 'list', data: [{ id: 'my-model', name: 'my-model', context_length: 2048, pricing: [] }] });
    const text = await cli('models', '--model', modelDir);
    expect(text.stdout.split('\n')[1]).toBe('my-model\tmy-model\t2048\t-\t-\t-\t-\t-');
  });

  it('shows a catalog as published, or as one organization sees it', async () => {
    const price = (tier: string, input: number) => ({ tier, input_per_1m_tokens: input, cached_input_per_1m_tokens: 0, output_per_1m_tokens: 2 * input });
    const catalog = join(root, 'catalog.json');
    writeFileSync(catalog, JSON.stringify({
      models: [
        { id: 'open', checkpoint: './my-model', context_length: 1024, pricing: [price('asap', 1), price('standard', 0.5)],
          negotiated_pricing: { acme: [price('standard', 0.25)] } },
        { id: 'secret', name: 'Secret', checkpoint: './my-model', restricted: true, granted_organizations: ['acme'], pricing: [price('asap', 3)] },
      ],
    }));
    const published = JSON.parse((await cli('models', '--config', catalog, '--json')).stdout) as { data: Array<Record<string, unknown>> };
    expect(published.data).toEqual([
      { id: 'open', name: 'open', context_length: 1024, pricing: [price('asap', 1), price('standard', 0.5)] },
      { id: 'secret', name: 'Secret', context_length: 2048, pricing: [price('asap', 3)], restricted: true, granted_organizations: ['acme'] },
    ]);
    const acme = JSON.parse((await cli('models', '--config', catalog, '--org', 'acme', '--json')).stdout) as { data: Array<Record<string, unknown>> };
    expect(acme.data.map((m) => [m['id'], m['pricing']])).toEqual([['open', [price('asap', 1), price('standard', 0.25)]], ['secret', [price('asap', 3)]]]);
    expect(acme.data[1]).not.toHaveProperty('granted_organizations');
    const other = JSON.parse((await cli('models', '--config', catalog, '--org', 'other', '--json')).stdout) as { data: Array<{ id: string }> };
    expect(other.data.map((m) => m.id)).toEqual(['open']);
    const table = (await cli('models', '--config', catalog)).stdout;
    expect(table).toContain('secret\tSecret\t2048\tasap\t3\t0\t6\tgranted: acme');

    // What serve would refuse, models refuses too: a window larger than the checkpoint's.
    writeFileSync(catalog, JSON.stringify({ models: [{ id: 'big', checkpoint: './my-model', context_length: 4096 }] }));
    const refused = await cli('models', '--config', catalog);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/model big: context_length 4096 is more than the checkpoint's 2048/);
    expect((await cli('models', '--model', modelDir, '--config', catalog)).stderr).toMatch(/give --model or --config, not both/);
  });
});

describe('sluice keys and sluice usage on a data directory without a store', () => {
  it('warn and create nothing for list and usage; revoke fails; create says it makes a store', async () => {
    const dataDir = join(root, 'typo-data');
    const list = await cli('keys', 'list', '--data-dir', dataDir);
    expect(list.code).toBe(0);
    expect(list.stderr).toMatch(/warning: no store in .*typo-data.*sluice\.db: is --data-dir right\?/);
    expect(list.stdout).toBe('id\torganization\tadmin\tprefix\tcreated\trevoked\n');
    expect((await cli('keys', 'list', '--json', '--data-dir', dataDir)).stdout).toBe('[]\n');
    const usage = await cli('usage', '--json', '--data-dir', dataDir);
    expect(usage.code).toBe(0);
    expect(usage.stderr).toMatch(/warning: no store in/);
    expect(JSON.parse(usage.stdout)).toMatchObject({ object: 'usage_report', data: [], total: { requests: 0, cost: '0' } });
    const revoke = await cli('keys', 'revoke', 'key_0123', '--data-dir', dataDir);
    expect(revoke.code).toBe(1);
    expect(revoke.stderr).toMatch(/keys revoke: no store in/);
    expect(existsSync(dataDir)).toBe(false);

    const created = await cli('keys', 'create', '--org', 'ops', '--admin', '--data-dir', dataDir);
    expect(created.code).toBe(0);
    expect(created.stderr).toMatch(/no store in .*; making a new one for this key/);
    expect(existsSync(join(dataDir, 'sluice.db'))).toBe(true);
    // Once it exists: no warning, and the admin key is marked as one.
    await cli('keys', 'create', '--org', 'dev', '--data-dir', dataDir);
    const listed = await cli('keys', 'list', '--data-dir', dataDir);
    expect(listed.stderr).toBe('');
    const rows = listed.stdout.trim().split('\n').slice(1).map((l) => l.split('\t'));
    expect(rows.map((r) => [r[1], r[2]]).sort()).toEqual([['dev', '-'], ['ops', 'admin']]);
    const json = JSON.parse((await cli('keys', 'list', '--json', '--data-dir', dataDir)).stdout) as Array<{ organization: string; admin: boolean }>;
    expect(json.map((k) => [k.organization, k.admin]).sort()).toEqual([['dev', false], ['ops', true]]);
  });
});

describe('sluice usage --since', () => {
  it('names the flag when the date is malformed', async () => {
    const out = await cli('usage', '--since', 'yesterday', '--data-dir', join(root, 'no-store'));
    expect(out.code).toBe(1);
    expect(out.stderr).toMatch(/^sluice: usage: --since must be a date \(YYYY-MM-DD, UTC\) or an ISO 8601 date-time with a zone \(got "yesterday"\)/);
  });
});

describe('sluice make-model', () => {
  it('refuses to write over a non-empty directory or a file without --force', async () => {
    const out = join(root, 'made');
    expect((await cli('make-model', '--preset', 'test-llama', '--out', out)).code).toBe(0);
    const config = readFileSync(join(out, 'config.json'), 'utf8');
    const again = await cli('make-model', '--preset', 'test-qwen2', '--out', out);
    expect(again.code).toBe(1);
    expect(again.stderr).toMatch(/--out .*made holds a model; give --force/);
    expect(readFileSync(join(out, 'config.json'), 'utf8')).toBe(config);
    const forced = await cli('make-model', '--preset', 'test-qwen2', '--out', out, '--force');
    expect(forced.code).toBe(0);
    expect(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')).architectures).toEqual(['Qwen2ForCausalLM']);

    const other = join(root, 'notes');
    mkdirSync(other);
    writeFileSync(join(other, 'todo.txt'), 'keep me');
    expect((await cli('make-model', '--preset', 'test-llama', '--out', other)).stderr).toMatch(/is not empty \(1 entry\); give --force/);
    const file = join(other, 'todo.txt');
    const onFile = await cli('make-model', '--preset', 'test-llama', '--out', file, '--force');
    expect(onFile.code).toBe(1);
    expect(onFile.stderr).toMatch(/is a file, not a directory/);
    expect(readFileSync(file, 'utf8')).toBe('keep me');
    const empty = join(root, 'empty');
    mkdirSync(empty);
    expect((await cli('make-model', '--preset', 'test-llama', '--out', empty)).code).toBe(0);
  });

  it('writes FP8, AWQ and GPTQ checkpoints with --quantize and names the flag for an unknown layout', async () => {
    const out = join(root, 'made-fp8');
    expect((await cli('make-model', '--preset', 'test-llama', '--out', out, '--quantize', 'fp8-modelopt')).code).toBe(0);
    expect(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')).quantization_config).toMatchObject({ quant_method: 'modelopt', quant_algo: 'FP8' });
    const bad = await cli('make-model', '--preset', 'test-llama', '--out', join(root, 'made-nf4'), '--quantize', 'nf4');
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/--quantize must be one of fp8-block, fp8-compressed-tensors, fp8-modelopt, awq, gptq, gptq-act-order, gptq-8bit/);
    const gptq = join(root, 'made-gptq');
    expect((await cli('make-model', '--preset', 'test-llama', '--out', gptq, '--quantize', 'gptq', '--group-size', '32')).code).toBe(0);
    expect(JSON.parse(readFileSync(join(gptq, 'config.json'), 'utf8')).quantization_config).toMatchObject({ quant_method: 'gptq', bits: 4, group_size: 32 });
    const tooBig = await cli('make-model', '--preset', 'test-llama', '--out', join(root, 'made-awq'), '--quantize', 'awq', '--group-size', '128');
    expect(tooBig.code).toBe(1);
    expect(tooBig.stderr).toMatch(/down_proj\.weight \[128, 352\]: 352 inputs are not a multiple of the group size 128/);
    const stray = await cli('make-model', '--preset', 'test-llama', '--out', join(root, 'made-stray'), '--group-size', '32');
    expect(stray.stderr).toMatch(/--group-size goes with --quantize awq\|gptq\|gptq-act-order\|gptq-8bit/);
  });
});

describe('sluice generate', () => {
  it('names flags, not library fields, in errors', async () => {
    const tooLong = await cli('generate', '--model', modelDir, '--prompt', 'Hi', '--max-tokens', '100000', '--backend', 'cpu');
    expect(tooLong.code).toBe(1);
    expect(tooLong.stderr).toMatch(/--max-tokens is 100000: together \d+ tokens, more than the model's context length of 2048/);
    expect(tooLong.stderr).not.toMatch(/maxTokens/);
    const topK = await cli('generate', '--model', modelDir, '--prompt', 'Hi', '--top-k', '100000000', '--backend', 'cpu');
    expect(topK.code).toBe(1);
    expect(topK.stderr).toMatch(/--top-k must be at most the vocabulary size/);
    expect(topK.stderr).not.toMatch(/topK/);
  });

  it('takes --quantization and --precision, and names each flag once in its errors', async () => {
    const ran = await cli('generate', '--model', modelDir, '--prompt', 'Hi', '--max-tokens', '2', '--backend', 'cpu',
      '--quantization', 'int8', '--precision', 'bf16', '--json');
    expect(ran.code, ran.stderr).toBe(0);
    expect(JSON.parse(ran.stdout).usage.completion_tokens).toBe(2);
    const badQuant = await cli('generate', '--model', modelDir, '--prompt', 'Hi', '--quantization', 'int4');
    expect(badQuant).toMatchObject({ code: 1, stderr: 'sluice: --quantization must be one of none, int8, fp8, got "int4"\n' });
    const badPrecision = await cli('serve', '--precision', 'f16');
    expect(badPrecision).toMatchObject({ code: 1, stderr: 'sluice: --precision must be one of f32, bf16, got "f16"\n' });
    // A flag a command does not take: parseArgs' message, with the flag as given.
    const unknown = await cli('make-model', '--preset', 'tiny', '--out', join(root, 'never'), '--quantization', 'int8');
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain("Unknown option '--quantization'");
    expect(unknown.stderr).not.toContain('----');
  });

  it('says nothing about CUDA with --backend auto, and names the backend it ran on', async () => {
    const out = await cli('generate', '--model', modelDir, '--prompt', 'Hi', '--max-tokens', '2');
    expect(out.code).toBe(0);
    expect(out.stderr).not.toMatch(/CUDA/i);
    expect(out.stderr).toMatch(new RegExp(`\\(\\d+ prompt tokens, ${autoBackend()} `));
  });

  it.skipIf(autoBackend() === 'cuda')('fails clearly when --backend cuda is asked for and no GPU is usable', async () => {
    const out = await cli('generate', '--model', modelDir, '--prompt', 'Hi', '--max-tokens', '2', '--backend', 'cuda');
    expect(out.code).toBe(1);
    expect(out.stderr).toMatch(/CUDA/);
  });
});

describe('a first sluice serve', () => {
  it('serves the demo catalog priced on three windows; costs reach sluice usage; no CUDA warning', async () => {
    const dataDir = join(root, 'first-run');
    const child = spawn(process.execPath, [CLI, 'serve', '--port', '0', '--data-dir', dataDir, '--kv-cache-bytes', String(32 << 20)],
      { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, SLUICE_HOME: home } });
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d) => { stdout += d; });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      const origin = await new Promise<string>((resolve, reject) => {
        child.stderr!.on('data', (d) => {
          stderr += d;
          const m = /serving tiny on (http:\/\/[^/\s]+)\/v1 \((\w+) backend; data in /.exec(stderr);
          if (m) resolve(m[1]!);
        });
        exited.then((code) => reject(new Error(`serve exited with ${code}: ${stderr}`)));
      });
      expect(stderr).toContain(`(${autoBackend()} backend; data in ${dataDir}; replica rpl_`);
      expect(stderr).not.toMatch(/CUDA/i);
      await new Promise((r) => setTimeout(r, 50)); // the key banner on stdout
      const key = /sk-sluice-[A-Za-z0-9_-]+/.exec(stdout)![0];
      const openai = new OpenAI({ baseURL: `${origin}/v1`, apiKey: key, maxRetries: 0 });
      const [model] = (await openai.models.list()).data as unknown as Array<{ id: string; pricing: unknown }>;
      expect(model).toMatchObject({ id: 'tiny', pricing: DEMO_PRICING });
      for (const window of ['asap', 'standard']) {
        await openai.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hello' }], max_completion_tokens: 4, metadata: { completion_window: window } });
      }
      const usage = JSON.parse((await cli('usage', '--json', '--data-dir', dataDir)).stdout) as { data: Array<{ tier: string; cost: string; output_tokens: number }> };
      expect(usage.data.map((r) => r.tier)).toEqual(['asap', 'standard']);
      for (const row of usage.data) {
        expect(row.output_tokens).toBe(4);
        expect(Number(row.cost)).toBeGreaterThan(0);
      }
      // asap costs more than standard for the same tokens.
      expect(Number(usage.data[0]!.cost)).toBeGreaterThan(Number(usage.data[1]!.cost));
    } finally {
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    }
  });
});
