// Sampling with many blocks per logit row (issue 32): the same outputs, bit for bit, as
// apply_token_masks (when masks are given) followed by sample() (cuda/kernels.h), with a row's
// work spread over up to 32 blocks so that a batch of one keeps many SMs busy.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernels.h"

namespace sluice::cuda {

// Bytes of the device workspace sample_wide needs for R rows of V logits (V does not change it
// today). The caller allocates it once, zeroes it once (cudaMemsetAsync) and passes it as
// SampleArgs::row_stats; the kernels leave it zeroed after every launch, so one workspace serves
// every later launch of any R and V up to its size, eager or replayed from a CUDA graph.
size_t sample_wide_workspace_bytes(int R, int V);

// apply_token_masks(logits, R, V, masks) + sample(a) in one launch, without writing the logits:
// masks (nullable, [R, ceil(V / 32)] words, bit v of row r clear = token v disallowed) are
// applied as the logits are read, a disallowed token weighing exactly as a -inf logit.
// a.row_stats must point at sample_wide_workspace_bytes(a.R, a.V) zeroed bytes (see above).
// No host synchronisation and no allocation: capturable into a CUDA graph.
void sample_wide(const SampleArgs& a, const uint32_t* masks, cudaStream_t stream);

// How sample_wide runs R rows of V logits on the current device: blocks per row (1: no
// cross-block synchronisation, no workspace use) and whether a block's slice of the row stays in
// shared memory. (Tests and benchmarks report it.)
struct SampleWidePlan {
  int blocks_per_row = 1;
  bool cached = false;
};
SampleWidePlan sample_wide_plan(int R, int V);

}  // namespace sluice::cuda
