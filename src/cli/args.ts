// Flag parsing helpers for the CLI: node:util parseArgs, with every malformed flag or value
// turned into SluiceError invalid_argument (printed without a stack trace, exit code 1).

import { parseArgs, type ParseArgsConfig } from 'node:util';
import { SluiceError } from '../errors.js';
import { DEFAULT_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS, type SpeculativeOptions } from '../scheduler/speculator.js';

type Options = NonNullable<ParseArgsConfig['options']>;
type Parsed<O extends Options> = ReturnType<typeof parseArgs<{ args: string[]; options: O; strict: true; allowPositionals: false }>>;

export function parseFlags<O extends Options>(args: string[], options: O, command: string): Parsed<O> {
  try {
    return parseArgs({ args, options, strict: true, allowPositionals: false });
  } catch (err) {
    // parseArgs messages name the flag: "Unknown option '--foo'", "Option '--prompt <value>' argument missing".
    throw new SluiceError('invalid_argument', `${command}: ${(err as Error).message} (see sluice ${command} --help)`);
  }
}

/**
 * A command's flags, or undefined when --help was asked for (its help text then printed): the
 * caller returns at once.
 */
export function commandFlags<O extends Options>(args: string[], options: O, command: string, help: string): Parsed<O>['values'] | undefined {
  const { values } = parseFlags(args, options, command);
  if ((values as { help?: unknown }).help) {
    process.stdout.write(help);
    return undefined;
  }
  return values;
}

function bad(flag: string, expected: string, raw: string): SluiceError {
  return new SluiceError('invalid_argument', `--${flag} must be ${expected}, got "${raw}"`, { param: flag });
}

/** Decimal integer within [min, max]. */
export function intFlag(raw: string | undefined, flag: string, min: number, max = Number.MAX_SAFE_INTEGER): number | undefined {
  if (raw === undefined) return undefined;
  const value = Number(raw);
  if (!/^-?\d+$/.test(raw.trim()) || !Number.isSafeInteger(value) || value < min || value > max) {
    throw bad(flag, max === Number.MAX_SAFE_INTEGER ? `an integer >= ${min}` : `an integer in [${min}, ${max}]`, raw);
  }
  return value;
}

/** Finite number within [min, max]. */
export function numberFlag(raw: string | undefined, flag: string, min: number, max: number): number | undefined {
  if (raw === undefined) return undefined;
  const value = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(value) || value < min || value > max) {
    throw bad(flag, `a number in [${min}, ${max}]`, raw);
  }
  return value;
}

/** Unsigned 64-bit integer (decimal). */
export function u64Flag(raw: string | undefined, flag: string): bigint | undefined {
  if (raw === undefined) return undefined;
  if (!/^\d+$/.test(raw.trim()) || BigInt(raw.trim()) >= 2n ** 64n) throw bad(flag, 'an integer in [0, 2^64)', raw);
  return BigInt(raw.trim());
}

export function choiceFlag<C extends string>(raw: string | undefined, flag: string, choices: readonly C[]): C | undefined {
  if (raw === undefined) return undefined;
  if (!(choices as readonly string[]).includes(raw)) throw bad(flag, `one of ${choices.join(', ')}`, raw);
  return raw as C;
}

export function requiredFlag(raw: string | undefined, flag: string, command: string): string {
  if (raw === undefined || raw === '') {
    throw new SluiceError('invalid_argument', `${command}: --${flag} is required (see sluice ${command} --help)`, { param: flag });
  }
  return raw;
}

/**
 * --speculative METHOD and --num-speculative-tokens K: the engine's speculative option, or undefined
 * without --speculative: ngram (prompt lookup), draft:DIR (a draft model) or eagle3:DIR (an EAGLE-3
 * head in its published layout).
 */
export function speculativeFlags(method: string | undefined, k: string | undefined): SpeculativeOptions | undefined {
  if (method === undefined) {
    if (k !== undefined) {
      throw new SluiceError('invalid_argument', '--num-speculative-tokens needs --speculative', { param: 'num-speculative-tokens' });
    }
    return undefined;
  }
  const numSpeculativeTokens = intFlag(k, 'num-speculative-tokens', 1, MAX_SPECULATIVE_TOKENS) ?? DEFAULT_SPECULATIVE_TOKENS;
  if (method.startsWith('draft:') && method.length > 'draft:'.length) {
    return { method: 'draft', draftModel: method.slice('draft:'.length), numSpeculativeTokens };
  }
  if (method.startsWith('eagle3:') && method.length > 'eagle3:'.length) {
    return { method: 'eagle3', draftModel: method.slice('eagle3:'.length), numSpeculativeTokens };
  }
  if (method !== 'ngram') throw bad('speculative', 'ngram, draft:DIR or eagle3:DIR', method);
  return { method, numSpeculativeTokens };
}

/**
 * Library option names (Engine.load, Engine.generate) -> the flag that sets them. The engine's
 * errors name what it was given (`maxTokens is 100000`); on the command line the user gave a flag.
 */
const FLAG_OF_OPTION: Record<string, string> = {
  maxTokens: '--max-tokens',
  topP: '--top-p',
  topK: '--top-k',
  kvCacheBytes: '--kv-cache-bytes',
  gpuMemoryUtilization: '--gpu-memory-utilization',
  matmulPrecision: '--precision',
  cudaGemm: '--cuda-gemm',
  quantization: '--quantization',
  kvCacheDtype: '--kv-cache-dtype',
  maxNumSeqs: '--max-num-seqs',
  maxBatchedTokens: '--max-batched-tokens',
  loraMemoryBytes: '--lora-memory-bytes',
  flexDeferral: '--flex-deferral',
  tenantDeferral: '--tenant-deferral',
  numSpeculativeTokens: '--num-speculative-tokens',
};
// A name already written as a flag (`--quantization`, `'--top-k'`) is left alone: where the
// option and the flag share a name, a plain word boundary would make it `----quantization`.
const OPTION_NAMES = new RegExp(`(?<![\\w-])(${Object.keys(FLAG_OF_OPTION).join('|')})\\b`, 'g');

/** An expected error's message as the CLI prints it: library option names replaced by their flags. */
export function cliMessage(err: Error): string {
  return err.message.replace(OPTION_NAMES, (name) => FLAG_OF_OPTION[name]!);
}
