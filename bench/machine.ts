// What every bench result records about the machine it ran on: the CPU as /proc/cpuinfo names it
// (vendor, family / model numbers, the SIMD extensions the kernels dispatch on), since a virtual
// machine's model string ("AMD EPYC") alone does not say which generation ran the numbers.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';

export interface MachineInfo {
  cpu: string | undefined;
  /** e.g. "AMD family 25 model 17 (Zen 4)"; null off Linux. */
  cpuGeneration: string | null;
  /** The x86 SIMD extensions present among those the CPU kernels use. */
  simdFlags: string[];
  cores: number;
  memoryBytes: number;
  platform: string;
  node: string;
}

const KERNEL_FLAGS = ['avx2', 'fma', 'f16c', 'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512_vnni', 'avx512_bf16', 'avx_vnni', 'amx_bf16', 'amx_int8'];

/** AMD's family 19h / 1Ah model ranges and Intel's family 6 are too many to name; AMD's are named. */
function amdGeneration(family: number, model: number): string | null {
  if (family === 0x17) return model >= 0x30 ? 'Zen 2' : 'Zen / Zen+';
  if (family === 0x19) return (model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0xaf) ? 'Zen 4' : 'Zen 3';
  if (family === 0x1a) return 'Zen 5';
  return null;
}

function cpuinfo(): { generation: string | null; flags: string[] } {
  const path = '/proc/cpuinfo';
  if (!existsSync(path)) return { generation: null, flags: [] };
  const text = readFileSync(path, 'utf8').split('\n\n')[0] ?? '';
  const field = (name: string) => new RegExp(`^${name}\\s*:\\s*(.*)$`, 'm').exec(text)?.[1]?.trim();
  const vendor = field('vendor_id');
  const family = Number(field('cpu family')), model = Number(field('model'));
  const flags = new Set((field('flags') ?? '').split(/\s+/));
  const name = vendor === 'AuthenticAMD' ? 'AMD' : vendor === 'GenuineIntel' ? 'Intel' : (vendor ?? 'unknown');
  const generation = Number.isFinite(family) && Number.isFinite(model)
    ? `${name} family ${family} model ${model}${vendor === 'AuthenticAMD' && amdGeneration(family, model) ? ` (${amdGeneration(family, model)})` : ''}`
    : null;
  return { generation, flags: KERNEL_FLAGS.filter((f) => flags.has(f)) };
}

export function machineInfo(): MachineInfo {
  const cpus = os.cpus();
  const { generation, flags } = cpuinfo();
  return { cpu: cpus[0]?.model, cpuGeneration: generation, simdFlags: flags, cores: cpus.length, memoryBytes: os.totalmem(), platform: `${os.platform()} ${os.release()}`, node: process.version };
}

/** The first GPU's name as nvidia-smi gives it, if it does. */
export function gpuName(): string | undefined {
  try {
    return execFileSync('nvidia-smi', ['--query-gpu=name', '--format=csv,noheader'], { encoding: 'utf8' }).split('\n')[0]?.trim() || undefined;
  } catch {
    return undefined;
  }
}
