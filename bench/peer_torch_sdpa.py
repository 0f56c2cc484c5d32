#!/usr/bin/env python3
"""torch's scaled_dot_product_attention (flash backend) on causal prefill: the peer of
sluice_cuda_kernel_bench's "prefill attention" rows (issue 32).

  python3 bench/peer_torch_sdpa.py [--shape llama-3.1-8b|qwen2.5-0.5b] [--tokens 2048,8192,32768]
                                   [--json FILE]

One sequence of T tokens attending causally to itself, q [1, nq, T, hd] and k/v [1, nkv, T, hd] in
bf16 (GQA through enable_gqa, so K/V are read at their own size as sluice's paged cache is),
random normal data. Timed as peer_torch_matmul.py times (CUDA events, median of 7 trials). FLOPs counted as the causal half of
4 * T^2 * nq * hd (the convention of the flash-attention papers). Prints a table and one JSON
object (also written to --json).
"""
import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

from peer_torch_matmul import time_us  # the same timing (this script's directory is on sys.path)

SHAPES = {
    # q heads, kv heads, head dim
    "qwen2.5-0.5b": (14, 2, 64),
    "llama-3.1-8b": (32, 8, 128),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", default="2048,8192,32768")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    nq, nkv, hd = SHAPES[args.shape]
    rows = []
    for T in (int(t) for t in args.tokens.split(",")):
        q = torch.randn(1, nq, T, hd, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, nkv, T, hd, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, nkv, T, hd, device="cuda", dtype=torch.bfloat16)
        try:
            F.scaled_dot_product_attention(q[:, :, :16], k[:, :, :16], v[:, :, :16], is_causal=True, enable_gqa=True)
            call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            backend = "flash"
        except TypeError:
            # A torch before enable_gqa (2.5): K/V expanded to the q heads, named in the row.
            ke, ve = k.repeat_interleave(nq // nkv, dim=1), v.repeat_interleave(nq // nkv, dim=1)
            call = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
            backend = "flash, K/V expanded"
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                us = time_us(lambda _: call())
        except RuntimeError:
            # A torch whose flash backend refuses the shape: its default choice, named in the row.
            backend = "default"
            us = time_us(lambda _: call())
        flops = 2.0 * T * T * nq * hd  # causal half of 4 T^2 nq hd
        rows.append({"op": f"sdpa prefill ({backend})", "T": T, "us": us, "flops": flops})
        del q, k, v
    device = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__} scaled_dot_product_attention, {args.shape} heads, causal, bf16, {device}")
    print(f"{'op':<28} {'T':>6} {'us':>10} {'TFLOP/s':>8}")
    for r in rows:
        print(f"{r['op']:<28} {r['T']:>6} {r['us']:>10.1f} {r['flops'] / r['us'] / 1e6:>8.1f}")
    result = {"shape": args.shape, "device": device, "torch": torch.__version__, "rows": rows}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
