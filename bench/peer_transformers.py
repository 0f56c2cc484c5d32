#!/usr/bin/env python3
"""Hugging Face transformers as the peer of the CUDA bench (bench/engine-cuda.ts).

Runs the same checkpoint directory with the same prompts and lengths as sluice's bench and
prints one JSON object: per batch size prefill tokens/s and decode tokens/s of `generate`
(greedy), and a reference: the greedy continuation of a fixed prompt with the log-softmax of
transformers' logits (top 20 per step), which the bench compares with sluice's logprobs.

  python3 bench/peer_transformers.py --model DIR [--batch 1,8,64,256] [--prompt 512]
                                     [--decode 32] [--ref-prompt 32] [--ref-steps 16]
Prompts: token t of sequence b is (t * 31 + b * 7 + 11) % vocab, as in the sluice bench.
"""
import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def prompts(batch, length, vocab):
    rows = [[(t * 31 + b * 7 + 11) % vocab for t in range(length)] for b in range(batch)]
    return torch.tensor(rows, dtype=torch.long, device="cuda")


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def reference(model, vocab, args):
    """Greedy steps of a fixed prompt with the log-softmax (f32) of the logits, top 20 per step."""
    ids = prompts(1, args.ref_prompt, vocab)
    gen = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    out = model.generate(ids, max_new_tokens=args.ref_steps, min_new_tokens=args.ref_steps,
                         output_logits=True, return_dict_in_generate=True, **gen)
    steps = []
    for i, logits in enumerate(out.logits):
        lp = torch.log_softmax(logits[0].float(), dim=-1)
        top = torch.topk(lp, 20)
        steps.append({
            "token": int(out.sequences[0, args.ref_prompt + i]),
            "top_ids": [int(x) for x in top.indices],
            "top_logprobs": [float(x) for x in top.values],
        })
    return {"prompt_tokens": ids[0].tolist(), "dtype": str(model.dtype), "steps": steps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="1,8,64,256")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--ref-prompt", type=int, default=32)
    ap.add_argument("--ref-steps", type=int, default=16)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (the reference)

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda").eval()
    vocab = model.config.vocab_size
    gen = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    rows = []
    with torch.inference_mode():
        for batch in [int(b) for b in args.batch.split(",")]:
            ids = prompts(batch, args.prompt, vocab)
            # Warm-up, then prefill alone (logits of the last position only) and full generations.
            model.generate(ids[:, :16], max_new_tokens=2, min_new_tokens=2, **gen)
            t_prefill, _ = timed(lambda: model(ids, logits_to_keep=1))
            t_one, _ = timed(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, **gen))
            n = args.decode + 1
            t_all, _ = timed(lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **gen))
            rows.append({
                "batch": batch,
                "prefill_tokens_per_s": batch * args.prompt / t_prefill,
                "decode_tokens_per_s": batch * args.decode / max(t_all - t_one, 1e-9),
                "generate_seconds": t_all,
            })
            print(f"transformers batch {batch}: prefill {rows[-1]['prefill_tokens_per_s']:.0f} tok/s, "
                  f"decode {rows[-1]['decode_tokens_per_s']:.1f} tok/s", file=sys.stderr)
            del ids
            torch.cuda.empty_cache()

        ref_bf16 = reference(model, vocab, args)
    # The reference proper runs the checkpoint in float32 (transformers' bf16 run keeps its
    # residual stream in bf16 too, so its own distance to float32 is reported beside sluice's).
    del model
    torch.cuda.empty_cache()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to("cuda").eval()
    with torch.inference_mode():
        ref_f32 = reference(model, vocab, args)
    print(json.dumps({
        "peer": "transformers",
        "transformers_version": __import__("transformers").__version__,
        "torch_version": torch.__version__,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "rows": rows,
        "reference": ref_f32,
        "reference_bf16": ref_bf16,
    }))


if __name__ == "__main__":
    main()
