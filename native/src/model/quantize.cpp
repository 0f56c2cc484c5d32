#include "model/quantize.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/gemm_q8.h"
#include "cpu/thread_pool.h"

namespace sluice {

namespace {

// Gives back the resident pages of a tensor of the (read-only, private) checkpoint mapping that
// nothing reads any more; a later read would fault them in again from the file.
void release_pages(const void* data, size_t bytes) {
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (uintptr_t(data) + page - 1) / page * page, end = (uintptr_t(data) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

void quantize_weights_q8(ModelWeights& w, int num_threads) {
  std::vector<TensorView*> targets;
  for (LayerWeights& l : w.layers)
    for (TensorView* t : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) targets.push_back(t);
  targets.push_back(&w.lm_head);
  const bool tied = w.lm_head.data == w.embed.data;
  cpu::ThreadPool pool(num_threads);
  for (TensorView* t : targets) {
    if (t->dtype == DType::Q8_0) continue;
    const int64_t N = t->shape[0], K = t->shape[1];
    auto buf = std::make_shared<std::vector<uint8_t>>(cpu::q8_bytes(N, K));
    void* dst = buf->data();
    const TensorView src = *t;
    pool.parallel_for(N, 64, [&](int64_t b, int64_t e) { cpu::quantize_rows_q8(src.data, src.dtype, N, K, b, e, dst); });
    // Tied: the embedding keeps its bytes (still counted once), the quantized lm_head adds its own.
    if (!(t == &w.lm_head && tied)) {
      w.total_bytes -= t->nbytes;
      release_pages(src.data, src.nbytes);  // (a tied lm_head's bytes are the embedding's: kept)
    }
    w.total_bytes += buf->size();
    t->data = dst;
    t->dtype = DType::Q8_0;
    t->nbytes = buf->size();
    w.owned.push_back(std::move(buf));
  }
  if (!w.layers.empty()) w.main_dtype = DType::Q8_0;
}

}  // namespace sluice
