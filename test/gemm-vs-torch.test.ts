// bench/gemm-vs-torch.ts: matching the native kernel bench's GEMM rows to torch.matmul's, and the
// rule that makes cuBLASLt the `auto` GEMM (>= 0.9x torch on every projection at T >= 256).
import { describe, expect, it } from 'vitest';

import { compareGemms, cublasLtQualifiesForAuto, projectionOf } from '../bench/gemm-vs-torch.js';

// us for 2*T*N*K flops at a given TFLOP/s: flops / (tflops * 1e6).
const kernelRow = (op: string, T: number, tflops: number, N = 4096, K = 4096) => {
  const flops = 2 * T * N * K;
  return { op, T, flops, us: flops / (tflops * 1e6) };
};
const torchRow = (op: string, T: number, tflops: number) => ({ op, T, us: 1, tflops });

describe('gemm-vs-torch', () => {
  it('names a projection without its epilogue or path', () => {
    expect(projectionOf('gemm o (+residual) [cuBLASLt]')).toBe('gemm o');
    expect(projectionOf('gemm gate_up (+silu)')).toBe('gemm gate_up');
    expect(projectionOf('gemm lm_head')).toBe('gemm lm_head');
  });

  it('pairs each torch row with our kernel and cuBLASLt at the same T, ignoring L2-hot rows', () => {
    const rows = compareGemms([
      kernelRow('gemm o (+residual)', 256, 200),
      kernelRow('gemm o (+residual) [cuBLASLt]', 256, 450),
      kernelRow('gemm o (L2-hot) splits 4', 256, 900),
      kernelRow('gemm o (+residual)', 2048, 230),
    ], [torchRow('gemm o', 256, 500), torchRow('gemm o', 2048, 600)]);
    expect(rows[0]!.oursTflops).toBeCloseTo(200, 6);
    expect(rows[0]!.cublasLtOverTorch).toBeCloseTo(0.9, 6);
    expect(rows[0]!.oursOverTorch).toBeCloseTo(0.4, 6);
    expect(rows[1]!.cublasLtTflops).toBeNull();  // no cuBLASLt row at 2048
  });

  it('qualifies cuBLASLt only when every row at T >= 256 reaches 0.9x torch', () => {
    const kernels = [kernelRow('gemm qkv [cuBLASLt]', 16, 10), kernelRow('gemm qkv [cuBLASLt]', 256, 455),
      kernelRow('gemm down (+residual) [cuBLASLt]', 2048, 540)];
    const torch = [torchRow('gemm qkv', 16, 100), torchRow('gemm qkv', 256, 500), torchRow('gemm down', 2048, 600)];
    expect(cublasLtQualifiesForAuto(compareGemms(kernels, torch))).toBe(true);  // T = 16 does not count
    kernels[2] = kernelRow('gemm down (+residual) [cuBLASLt]', 2048, 530);
    expect(cublasLtQualifiesForAuto(compareGemms(kernels, torch))).toBe(false);
    expect(cublasLtQualifiesForAuto(compareGemms([], torch))).toBe(false);  // no cuBLASLt at all
  });
});
