#!/usr/bin/env python3
"""torch.matmul (cuBLAS) on a model's projection shapes: the peer of sluice_cuda_kernel_bench's GEMM rows.

  python3 bench/peer_torch_matmul.py [--shape llama-3.1-8b|qwen2.5-0.5b] [--tokens 16,256,2048,8192]
                                     [--json FILE]

y[T, N] = x[T, K] @ W[N, K]^T in bf16 with f32 accumulation (torch's default for bf16 on Hopper),
random normal data (never zeros), weights rotated through enough copies that each timed product
reads its weights from device memory rather than L2. Timed with CUDA events: median over 7 trials
of the mean of 20 back-to-back products after warm-up, as the native kernel bench times. Output is
bf16 here where sluice writes f32 (T*N*2 fewer bytes; negligible against the weights at T >= 256).
Prints a table and one JSON object (also written to --json).
"""
import argparse
import json
import statistics

import torch

SHAPES = {
    # hidden, intermediate, q heads, kv heads, head dim, vocab
    "qwen2.5-0.5b": (896, 4864, 14, 2, 64, 151936),
    "llama-3.1-8b": (4096, 14336, 32, 8, 128, 128256),
}


def projections(shape):
    H, I, nq, nkv, hd, V = SHAPES[shape]
    return [("gemm qkv", (nq + 2 * nkv) * hd, H), ("gemm o", H, nq * hd),
            ("gemm gate_up", 2 * I, H), ("gemm down", H, I), ("gemm lm_head", V, H)]


def time_us(fn, reps=20, trials=7):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(5):
        fn(i)
    times = []
    for _ in range(trials):
        start.record()
        for i in range(reps):
            fn(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", default="16,256,2048,8192")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for op, N, K in projections(args.shape):
        copies = max(2, -(-4 * l2 // (N * K * 2)))
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for T in (int(t) for t in args.tokens.split(",")):
            if op == "gemm lm_head" and T > 256:
                continue  # only the sampled rows reach the vocabulary projection
            x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
            us = time_us(lambda i: torch.matmul(x, weights[i % copies].t()))
            flops = 2.0 * T * N * K
            rows.append({"op": op, "T": T, "N": N, "K": K, "us": us,
                         "tflops": flops / us / 1e6, "gbps": (N * K * 2 + T * K * 2 + T * N * 2) / us / 1e3})
        del weights
        torch.cuda.empty_cache()
    out = {"bench": "torch-matmul", "shape": args.shape, "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "cuda": torch.version.cuda, "rows": rows}
    print(f"{'op':<16}{'T':>6}{'us':>11}{'TFLOP/s':>10}{'GB/s':>9}")
    for r in rows:
        print(f"{r['op']:<16}{r['T']:>6}{r['us']:>11.1f}{r['tflops']:>10.1f}{r['gbps']:>9.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print(json.dumps({"rows": len(rows)}))


if __name__ == "__main__":
    main()
