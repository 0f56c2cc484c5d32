// Weights the CPU backend streams every decode step, copied at load out of the checkpoint's
// file mapping into anonymous huge-page host memory (util/host_memory.h: page-cache pages read
// measurably slower), the file pages given back as each tensor is copied, so peak RSS stays
// near one copy of the weights.
#pragma once
#include "model/model_weights.h"

namespace sluice {

// Copies streamed_matrices(w) (a tied lm_head: the embedding, which both views then point to)
// into one arena, on num_threads threads (0 = all online CPUs). Values and dtypes are unchanged.
void copy_weights_to_host_memory(ModelWeights& w, int num_threads);

// Whether the CPU backend copies its weights (copy_weights_to_host_memory): yes unless the
// environment sets SLUICE_CPU_WEIGHTS=mmap (serve straight from the file mapping, so that
// processes on one host share the page cache). Throws kInvalidArgument on any other value.
bool cpu_weights_copied_from_env();

}  // namespace sluice
