// `sluice adapters`: LoRA adapters on a running server (issue 36), through its admin endpoint
// /v1/admin/adapters with an admin API key: list them, load one into a base model's engine and
// serve it as a model, or stop serving one. The server does the work; this is its client.

import { ModelPriceSchema, type ModelPrice } from '../config/catalog.js';
import { SluiceError } from '../errors.js';
import { commandFlags } from './args.js';
import { Ajv } from 'ajv';
import Type from 'typebox';

export const ADAPTERS_HELP = `usage: sluice adapters list | load --id ID --base MODEL --dir DIR | unload ID  [options]

  LoRA adapters on a running server, through its /v1/admin/adapters endpoint with an admin
  API key (sluice keys makes one: see its help).

  list                 the adapters served: id, base model, rank, bytes, resident, requests
  load                 loads the PEFT adapter in DIR (a path on the server) into the engine of
                       the base model MODEL and serves it as model ID
  unload ID            stops serving it: refused from then on, its accepted requests finish first

  --url URL            the server (default http://127.0.0.1:8080)
  --api-key KEY        an admin API key (default: the SLUICE_API_KEY environment variable)
  --id ID              load: the adapter's model id
  --base MODEL         load: the base model's id
  --dir DIR            load: the adapter's directory on the server
  --name NAME          load: its display name
  --pricing JSON       load: its rates, as the catalog writes them: [{"tier":"asap",...}]
  --restricted         load: visible to granted organizations only
  --grant ORG          load: an organization granted it (repeat for more)
  --json               the server's JSON answer as is
`;

/** The flags adapters accepts (README's CLI synopsis and --help list each; test/readme.test.ts checks). */
export const ADAPTERS_OPTIONS = {
  url: { type: 'string' },
  'api-key': { type: 'string' },
  id: { type: 'string' },
  base: { type: 'string' },
  dir: { type: 'string' },
  name: { type: 'string' },
  pricing: { type: 'string' },
  restricted: { type: 'boolean' },
  grant: { type: 'string', multiple: true },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

const LOAD_ONLY = ['id', 'base', 'dir', 'name', 'pricing', 'restricted', 'grant'] as const;
const checkPricing = new Ajv({ allErrors: true }).compile(Type.Array(ModelPriceSchema, { minItems: 1, maxItems: 3 }));

interface AdapterRow { id: string; base: string; rank: number; bytes: number; resident: boolean; requests: number }

export async function runAdapters(args: string[]): Promise<void> {
  // The action first, then (unload) the adapter's id, then flags.
  const rest = [...args];
  const action = rest[0] !== undefined && !rest[0].startsWith('-') ? rest.shift() : undefined;
  const target = action === 'unload' && rest[0] !== undefined && !rest[0].startsWith('-') ? rest.shift() : undefined;
  const values = commandFlags(rest, ADAPTERS_OPTIONS, 'adapters', ADAPTERS_HELP);
  if (values === undefined) return;
  const usage = (why: string) => new SluiceError('invalid_argument', `adapters: ${why} (see sluice adapters --help)`);
  if (action !== 'list' && action !== 'load' && action !== 'unload') throw usage('name an action: list, load or unload');
  if (action === 'unload' && target === undefined) throw usage('unload takes the adapter id');
  if (action !== 'load') {
    const given = LOAD_ONLY.filter((f) => values[f] !== undefined);
    if (given.length > 0) throw usage(`--${given[0]} goes with load`);
  }
  const key = values['api-key'] ?? process.env['SLUICE_API_KEY'];
  if (key === undefined || key === '') throw usage('an admin API key is needed: --api-key KEY or SLUICE_API_KEY');
  const url = serverUrl(values.url ?? 'http://127.0.0.1:8080');
  const call = (method: string, path: string, body?: unknown) => adminCall(url, key, method, path, body);

  if (action === 'list') {
    const list = await call('GET', '') as { data: AdapterRow[] };
    if (values.json) return print(list);
    process.stdout.write('id\tbase\trank\tbytes\tresident\trequests\n');
    for (const a of list.data) process.stdout.write(`${a.id}\t${a.base}\t${a.rank}\t${a.bytes}\t${a.resident}\t${a.requests}\n`);
    return;
  }
  if (action === 'unload') {
    const deleted = await call('DELETE', `/${encodeURIComponent(target!)}`);
    if (values.json) return print(deleted);
    process.stdout.write(`unloaded ${target}\n`);
    return;
  }
  for (const flag of ['id', 'base', 'dir'] as const) if (values[flag] === undefined) throw usage(`load needs --${flag}`);
  const body = {
    id: values.id, base: values.base, dir: values.dir,
    ...(values.name !== undefined && { name: values.name }),
    ...(values.pricing !== undefined && { pricing: pricingFlag(values.pricing) }),
    ...(values.restricted && { restricted: true }),
    ...(values.grant !== undefined && { granted_organizations: values.grant }),
  };
  const loaded = await call('POST', '', body) as AdapterRow;
  if (values.json) return print(loaded);
  process.stdout.write(`loaded ${loaded.id} on ${loaded.base}: rank ${loaded.rank}, ${loaded.bytes} bytes\n`);
}

function print(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

function serverUrl(raw: string): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new SluiceError('invalid_argument', `--url must be an http(s) URL, got "${raw}"`, { param: 'url' });
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new SluiceError('invalid_argument', `--url must be an http(s) URL, got "${raw}"`, { param: 'url' });
  }
  return url;
}

function pricingFlag(raw: string): ModelPrice[] {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    throw new SluiceError('invalid_argument', '--pricing must be JSON: [{"tier":"asap","input_per_1m_tokens":...}]', { param: 'pricing' });
  }
  if (!checkPricing(value)) {
    const first = checkPricing.errors?.[0];
    throw new SluiceError('invalid_argument', `--pricing: ${first?.instancePath || 'the list'} ${first?.message ?? 'is invalid'}`, { param: 'pricing' });
  }
  return value as ModelPrice[];
}

/** One call to /v1/admin/adapters; the server's error envelope becomes the error's message. */
async function adminCall(base: URL, key: string, method: string, path: string, body?: unknown): Promise<unknown> {
  const url = new URL(`${base.pathname.replace(/\/+$/, '')}/v1/admin/adapters${path}`, base);
  let res: Response;
  try {
    res = await fetch(url, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body !== undefined && { 'content-type': 'application/json' }) },
      ...(body !== undefined && { body: JSON.stringify(body) }),
    });
  } catch (err) {
    throw new SluiceError('server_unreachable', `adapters: cannot reach ${base.origin}: ${(err as Error).cause instanceof Error ? ((err as Error).cause as Error).message : (err as Error).message}`);
  }
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new SluiceError('server_error', `adapters: ${res.status} from ${url.href}, not JSON: ${text.slice(0, 200)}`);
  }
  if (!res.ok) {
    const error = (json as { error?: { message?: string; param?: string | null } }).error;
    const param = error?.param ? ` (${error.param})` : '';
    throw new SluiceError('server_error', `adapters: ${res.status}${param}: ${error?.message ?? text.slice(0, 200)}`);
  }
  return json;
}
