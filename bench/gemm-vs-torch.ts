// sluice's GEMMs (our mma.sync kernel and cuBLASLt) beside torch.matmul on a model's projection
// shapes, from the two benches' JSON files (same device, same call of scripts/device-check.sh):
//   node dist/bench/gemm-vs-torch.js --sluice cuda-kernels.json --torch torch-matmul.json [--out FILE]
// Prints per (projection, T) the TFLOP/s of each and the ratios to torch, then the verdict the
// `auto` GEMM choice waits on: cuBLASLt at >= 90% of torch.matmul on every projection at T >= 256.
import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

interface KernelRow { op: string; T: number; us: number; flops: number }
interface TorchRow { op: string; T: number; us: number; tflops: number }

export const AUTO_MIN_RATIO = 0.9;
export const AUTO_MIN_TOKENS = 256;

/** 'gemm o (+residual) [cuBLASLt]' -> 'gemm o'; the projection without its epilogue or path. */
export function projectionOf(op: string): string {
  return op.replace(/\s*\[cuBLASLt\]$/, '').replace(/\s*\(.*\)$/, '').trim();
}

export interface GemmComparison {
  op: string;
  T: number;
  oursTflops: number | null;
  cublasLtTflops: number | null;
  torchTflops: number;
  oursOverTorch: number | null;
  cublasLtOverTorch: number | null;
}

export function compareGemms(kernelRows: KernelRow[], torchRows: TorchRow[]): GemmComparison[] {
  const tflops = (r: KernelRow) => r.flops / r.us / 1e6;
  const find = (projection: string, T: number, lt: boolean) =>
    kernelRows.find((r) => r.op.startsWith('gemm') && !r.op.includes('L2-hot') && projectionOf(r.op) === projection &&
      r.T === T && r.op.endsWith('[cuBLASLt]') === lt);
  return torchRows.map((t) => {
    const ours = find(t.op, t.T, false);
    const lt = find(t.op, t.T, true);
    const oursTflops = ours ? tflops(ours) : null;
    const cublasLtTflops = lt ? tflops(lt) : null;
    return {
      op: t.op, T: t.T, oursTflops, cublasLtTflops, torchTflops: t.tflops,
      oursOverTorch: oursTflops === null ? null : oursTflops / t.tflops,
      cublasLtOverTorch: cublasLtTflops === null ? null : cublasLtTflops / t.tflops,
    };
  });
}

/** True when cuBLASLt reaches AUTO_MIN_RATIO of torch on every projection row at T >= AUTO_MIN_TOKENS. */
export function cublasLtQualifiesForAuto(rows: GemmComparison[]): boolean {
  const large = rows.filter((r) => r.T >= AUTO_MIN_TOKENS);
  return large.length > 0 && large.every((r) => r.cublasLtOverTorch !== null && r.cublasLtOverTorch >= AUTO_MIN_RATIO);
}

function main(): void {
  const { values: args } = parseArgs({ options: { sluice: { type: 'string' }, torch: { type: 'string' }, out: { type: 'string' } } });
  if (!args.sluice || !args.torch) throw new Error('--sluice and --torch name the two benches\' JSON files');
  const kernels = JSON.parse(readFileSync(args.sluice, 'utf8')) as { shape: string; rows: KernelRow[] };
  const torch = JSON.parse(readFileSync(args.torch, 'utf8')) as { device: string; torch: string; rows: TorchRow[] };
  const rows = compareGemms(kernels.rows, torch.rows);
  const fmt = (v: number | null, digits = 1) => (v === null ? 'n/a' : v.toFixed(digits));
  console.log(`${kernels.shape} on ${torch.device} (torch ${torch.torch}): TFLOP/s`);
  console.log(`${'projection'.padEnd(14)}${'T'.padStart(6)}${'ours'.padStart(8)}${'cuBLASLt'.padStart(10)}${'torch'.padStart(8)}${'ours/t'.padStart(8)}${'Lt/t'.padStart(7)}`);
  for (const r of rows) {
    console.log(`${r.op.padEnd(14)}${String(r.T).padStart(6)}${fmt(r.oursTflops).padStart(8)}${fmt(r.cublasLtTflops).padStart(10)}` +
      `${fmt(r.torchTflops).padStart(8)}${fmt(r.oursOverTorch, 2).padStart(8)}${fmt(r.cublasLtOverTorch, 2).padStart(7)}`);
  }
  const qualifies = cublasLtQualifiesForAuto(rows);
  console.log(`cuBLASLt >= ${AUTO_MIN_RATIO}x torch.matmul on every projection at T >= ${AUTO_MIN_TOKENS}: ${qualifies ? 'yes' : 'no'}`);
  if (args.out) {
    writeFileSync(args.out, `${JSON.stringify({ bench: 'gemm-vs-torch', shape: kernels.shape, device: torch.device,
      torch: torch.torch, cublasLtQualifiesForAuto: qualifies, rows }, null, 2)}\n`);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) main();
