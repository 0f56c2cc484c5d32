#include "model/resident_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu/thread_pool.h"
#include "sluice/error.h"
#include "util/host_memory.h"

namespace sluice {

void copy_weights_to_host_memory(ModelWeights& w, int num_threads) {
  const bool tied = w.lm_head.data == w.embed.data;
  // Matrices made at load (FP8 dequantized, AWQ / GPTQ repacked) already live in such memory:
  // copying them again would only double the peak.
  const auto made_at_load = [&](const TensorView* t) {
    const auto* p = static_cast<const uint8_t*>(t->data);
    for (const auto& b : w.owned)
      if (p >= b->data() && p < b->data() + b->size()) return true;
    return false;
  };
  std::vector<TensorView*> targets = streamed_matrices(w);
  targets.erase(std::remove_if(targets.begin(), targets.end(), made_at_load), targets.end());
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const TensorView* t : targets) {
    offsets.push_back(total);
    total += (t->nbytes + 63) / 64 * 64;
  }
  if (total == 0) return;
  auto arena = std::make_shared<HostBuffer>(total);
  cpu::ThreadPool pool(num_threads);
  for (size_t i = 0; i < targets.size(); i++) {
    TensorView* t = targets[i];
    uint8_t* dst = arena->data() + offsets[i];
    const uint8_t* src = static_cast<const uint8_t*>(t->data);
    const size_t bytes = t->nbytes;
    // 1 MiB pieces: both threads fault in and fill their own huge pages.
    const int64_t pieces = int64_t((bytes + (size_t(1) << 20) - 1) >> 20);
    pool.parallel_for(pieces, 1, [&](int64_t b, int64_t e) {
      const size_t from = size_t(b) << 20, to = std::min(bytes, size_t(e) << 20);
      std::memcpy(dst + from, src + from, to - from);
    });
    release_mapped_pages(src, bytes);
    if (t == &w.lm_head && tied) w.embed.data = dst;  // the embedding lookup reads the copy too
    t->data = dst;
  }
  w.owned.push_back(std::move(arena));
}

bool cpu_weights_copied_from_env() {
  const char* v = std::getenv("SLUICE_CPU_WEIGHTS");
  if (!v || !*v || !std::strcmp(v, "memory")) return true;
  if (!std::strcmp(v, "mmap")) return false;
  throw Error(ErrorCode::kInvalidArgument,
              std::string("SLUICE_CPU_WEIGHTS must be \"memory\" or \"mmap\", got \"") + v + "\"");
}

}  // namespace sluice
