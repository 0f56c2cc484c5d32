// Tensor-core (mma.sync) flash attention for prefill chunks over the paged KV cache: the same
// contract as paged_attention (kernels.h AttentionArgs: causal per token or up to last[t], block
// tables, sliding window, attention sinks) with one pass over the KV range per tile of query tokens, so a chunk
// of N tokens reads each K/V row about N / 64 times less often than the per-token kernel.
#pragma once
#include <cuda_runtime.h>

#include "cuda/kernels.h"

namespace sluice::cuda {

// Whether flash_prefill_attention runs its own kernel for these heads: head dims 64, 128 and 256,
// nq a multiple of nkv (GQA). Elsewhere it hands the step to paged_attention.
bool flash_prefill_supported(int hd, int nq, int nkv);

// out = attention as paged_attention computes it with num_splits == 1 (num_splits and the
// partial buffers are ignored). Any mix of sequences, chunk starts and decode rows is correct;
// it is fast when a sequence's tokens are contiguous in the step (as the scheduler lays them
// out): each 64-token tile makes one pass over the KV of every sequence it holds rows of.
// Deterministic (no atomics), no host synchronisation or allocation (graph-capturable once the
// instantiation's shared-memory attribute is set, i.e. after its first eager launch). Unsupported
// heads, or q / K / V not 16-byte aligned, fall back to paged_attention.
void flash_prefill_attention(const AttentionArgs& a, DType e, cudaStream_t stream);

}  // namespace sluice::cuda
