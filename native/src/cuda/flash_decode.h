// Tensor-core (mma.sync) decode attention over the paged KV cache: the same contract as
// paged_attention (kernels.h AttentionArgs: per-token causal range, block tables, sliding window,
// attention sinks, num_splits KV splits), with the q heads of a kv head (its GQA group) computed
// together as the rows of one m16n8k16 tile, so each K/V row is read once per (token, kv head)
// (once per 16 q heads of the group when the group has more than 16), and the KV splits merged
// in the same launch by the last block of each (token, kv head) to finish (no combine kernel).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels.h"

namespace sluice::cuda {

// Whether flash_decode_attention runs its own kernel for these heads: head dims 64, 128 and 256,
// nq a multiple of nkv (any GQA ratio, 1 included). Elsewhere it hands the step to paged_attention.
bool flash_decode_supported(int hd, int nq, int nkv);

// out = attention as paged_attention computes it (same AttentionArgs, same result up to
// rounding). One block per (token, kv head, group of up to 16 of its q heads, split); a block
// covers its split's share of the token's own KV range (found on the device from positions[t],
// so a captured graph replays for any contexts: the split count only fixes the launch shape).
// Correct for any T and any mix of sequences; built for decode (a token per sequence).
//
// num_splits > 1: each block writes its heads' partial results to a.partial_acc / a.partial_ml
// ([T, nq, num_splits, hd] and [T, nq, num_splits, 2] floats, 16-byte aligned) and takes a ticket
// of its (token, kv head); the last block to arrive merges the splits in split order (the result
// does not depend on which block is last) and sets the ticket back to zero. `tickets`: at least
// T * nkv device ints, zero on entry and left zero (the GEMM's split-K tickets serve, as the two
// never run at once on the stream); unused (may be null) when num_splits == 1.
//
// Deterministic (no floating-point atomics), no host synchronisation or allocation: graph-
// capturable once the instantiation's shared-memory attribute is set, i.e. after its first eager
// launch (the backend's warm-up before a capture). Unsupported heads, q / K / V / partial
// buffers not 16-byte aligned, num_splits > 1 without tickets, or a.last set (bidirectional image
// attention: decode steps never carry it) fall back to paged_attention (which merges the splits in
// its own second kernel).
void flash_decode_attention(const AttentionArgs& a, DType e, int* tickets, cudaStream_t stream);

// A suggested split count for flash_decode_attention over T tokens whose longest context is
// max_ctx, on a device of num_sms SMs (the backend's choose_attn_splits targets the paged
// kernel's blocks): the fewest splits whose blocks fill the device's block slots in whole waves
// (85%) or make four waves or more, else the best-filled count; between 1 and max_splits and
// no more than max_ctx / (2 KV tiles). It counts blocks as if equally long.
int flash_decode_splits(int T, int nq, int nkv, int hd, int64_t max_ctx, int num_sms, int max_splits);

}  // namespace sluice::cuda
