// Sampling on the GPU, one block per logit row, with the CPU sampler's semantics: greedy picks
// the argmax (lowest id on ties); otherwise min-p and top-k, then top-p over softmax(logits / T),
// then an inverse-CDF draw, all in (logit desc, id asc) order. Logprobs are the raw log-softmax.
// A row verifying a speculative draft keeps it with its probability under that distribution, else
// draws from the distribution without it (sample/sampler.h, verify_draft_token); greedy keeps it
// when it is the argmax.
//
// Nothing is sorted. Every cut ("the first k", "the shortest head holding p of the mass", "the
// token where the cumulative mass passes u") is the same question: which element ends the
// shortest sorted prefix whose measure (a count, or a fixed-point probability mass) reaches a
// target? A 4-round radix select over order-preserving 32-bit keys answers it, then one pass in
// id order settles ties. Masses are 2^-40 fixed point summed with integer atomics, so every
// result is deterministic and the same on every run.
#include <cfloat>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

constexpr int kThreads = 512;
constexpr float kMassScale = 1099511627776.0f;  // 2^40
constexpr int kMaxTopN = 32;

// Ascending key order = descending logit order.
__device__ __forceinline__ uint32_t desc_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? b : ~(b | 0x80000000u);
}

// The elements still in play: sorted position <= (lim_key, lim_id).
struct Limit {
  uint32_t key;
  int32_t id;
  __device__ bool keeps(uint32_t k, int32_t i) const { return k < key || (k == key && i <= id); }
};

struct RowCtx {
  const float* logits;
  int V;
  float max_logit;
  float inv_temp;  // mass = exp((l - max) * inv_temp); unused for counts
};

__device__ __forceinline__ uint64_t measure(const RowCtx& r, float l, bool mass) {
  if (!mass) return 1;
  return uint64_t(__expf((l - r.max_logit) * r.inv_temp) * kMassScale);
}

// Calls f(logit, id) for this thread's elements (strided across the block), four loads in
// flight per round instead of one dependent load per element.
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* row, int V, F&& f) {
  const int stride = blockDim.x;
  int i = threadIdx.x;
  for (; i + 3 * stride < V; i += 4 * stride) {
    const float l0 = row[i], l1 = row[i + stride], l2 = row[i + 2 * stride], l3 = row[i + 3 * stride];
    f(l0, i);
    f(l1, i + stride);
    f(l2, i + 2 * stride);
    f(l3, i + 3 * stride);
  }
  for (; i < V; i += stride) f(row[i], i);
}

// hist[bin] += m, one shared atomic per distinct bin per warp: logits crowd into a few bins of
// the top key byte, and 1024 threads hitting one address would serialise. Masses (< 2^41) are
// summed across lanes as three 20-bit limbs so that 32 of them cannot overflow 32 bits.
__device__ __forceinline__ void hist_add(unsigned long long* hist, bool active, uint32_t bin, uint64_t m,
                                         bool counting) {
  const unsigned mask = __ballot_sync(__activemask(), active);
  if (!active) return;
  const unsigned peers = __match_any_sync(mask, bin);
  const int leader = __ffs(peers) - 1;
  uint64_t total;
  if (counting) {
    total = uint64_t(__popc(peers));
  } else {
    const unsigned lo = __reduce_add_sync(peers, unsigned(m & 0xfffffu));
    const unsigned mid = __reduce_add_sync(peers, unsigned((m >> 20) & 0xfffffu));
    const unsigned hi = __reduce_add_sync(peers, unsigned(m >> 40));
    total = uint64_t(lo) + (uint64_t(mid) << 20) + (uint64_t(hi) << 40);
  }
  if ((threadIdx.x & 31) == unsigned(leader)) atomicAdd(hist + bin, (unsigned long long)total);
}

struct Shared {
  unsigned long long hist[256];
  unsigned long long warp_tot[32];
  uint32_t prefix;
  unsigned long long target;
  int32_t found_id;
  int32_t top_count;
  uint32_t top_key[kMaxTopN];
  int32_t top_id[kMaxTopN];
};

// Block-wide exclusive scan of one uint64 per thread (thread order); also returns the total.
__device__ unsigned long long block_exclusive_scan(unsigned long long v, Shared& sh, unsigned long long* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) sh.warp_tot[warp] = incl;
  __syncthreads();
  unsigned long long before = 0, all = 0;
  for (int w = 0; w < int(blockDim.x >> 5); w++) {
    if (w < warp) before += sh.warp_tot[w];
    all += sh.warp_tot[w];
  }
  *total = all;
  return before + incl - v;
}

// Sum of the measure over kept elements (every thread gets it).
__device__ unsigned long long kept_total(const RowCtx& r, Limit lim, bool mass, Shared& sh) {
  unsigned long long s = 0;
  for_each_logit(r.logits, r.V, [&](float l, int i) {
    if (lim.keeps(desc_key(l), i)) s += measure(r, l, mass);
  });
  unsigned long long total;
  block_exclusive_scan(s, sh, &total);
  return total;
}

// The last element (key, id) of the shortest sorted prefix of kept elements whose measure sum
// reaches `target` (1 <= target <= kept total).
__device__ Limit select_prefix(const RowCtx& r, Limit lim, bool mass, unsigned long long target, Shared& sh) {
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.target = target;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    const uint32_t high_mask = shift == 24 ? 0u : ~((1u << (shift + 8)) - 1u);
    for_each_logit(r.logits, r.V, [&](float l, int i) {
      const uint32_t k = desc_key(l);
      const bool in_play = (k & high_mask) == prefix && lim.keeps(k, i);
      hist_add(sh.hist, in_play, (k >> shift) & 255u, in_play ? measure(r, l, mass) : 0, !mass);
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long cum = 0, want = sh.target;
      int digit = 255;
      for (int d = 0; d < 256; d++) {
        if (cum + sh.hist[d] >= want) {
          digit = d;
          break;
        }
        cum += sh.hist[d];
      }
      sh.target = want - cum;
      sh.prefix = prefix | (uint32_t(digit) << shift);
    }
    __syncthreads();
  }
  // Ties on the key: take them in id order. Each thread owns a contiguous id range.
  const uint32_t key = sh.prefix;
  const unsigned long long want = sh.target;
  const int chunk = (r.V + blockDim.x - 1) / blockDim.x;
  const int lo = threadIdx.x * chunk, hi = min(r.V, lo + chunk);
  unsigned long long local = 0;
  for (int i = lo; i < hi; i++) {
    const float l = r.logits[i];
    if (desc_key(l) == key && lim.keeps(key, i)) local += measure(r, l, mass);
  }
  unsigned long long total;
  const unsigned long long before = block_exclusive_scan(local, sh, &total);
  if (threadIdx.x == 0) sh.found_id = -1;
  __syncthreads();
  if (before < want && want <= before + local) {
    unsigned long long cum = before;
    for (int i = lo; i < hi; i++) {
      const float l = r.logits[i];
      if (desc_key(l) != key || !lim.keeps(key, i)) continue;
      cum += measure(r, l, mass);
      if (cum >= want) {
        sh.found_id = i;
        break;
      }
    }
  }
  __syncthreads();
  Limit out{key, sh.found_id};
  if (out.id < 0) out.id = lim.key == key ? lim.id : r.V - 1;  // unreachable unless rounding: keep all ties
  __syncthreads();
  return out;
}

// Chunks per row for the statistics pass: enough blocks to stream a row at full bandwidth.
constexpr int kMaxChunks = kSampleStatsFloatsPerRow / 3;  // (max, sum, argmax) per chunk
__host__ __device__ inline int stats_chunks(int V) {
  const int c = (V + 8191) / 8192;
  return c < 1 ? 1 : c > kMaxChunks ? kMaxChunks : c;
}

// Online (max, sum of exp(l - max), lowest argmax) merge; -inf maxima hold nothing.
__device__ __forceinline__ void merge_stats(float& m, float& s, int& id, float m2, float s2, int id2) {
  const float mx = fmaxf(m, m2);
  const float sum = (m == -INFINITY ? 0.f : s * __expf(m - mx)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mx));
  if (m2 > m || (m2 == m && id2 < id)) id = id2;
  m = mx;
  s = sum;
}

// Grid (R, chunks): each block reduces a contiguous chunk of a row to (max, sum exp, argmax),
// with a fixed merge tree, into row_stats[row, chunk, 0..2].
__global__ void __launch_bounds__(256) row_stats_kernel(SampleArgs a) {
  const int row = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const int per = (a.V + chunks - 1) / chunks;
  const int lo = chunk * per, hi = min(a.V, lo + per);
  const float* logits = a.logits + size_t(row) * a.V;
  float best = -INFINITY, se = 0.f;
  int best_id = 0x7fffffff;
  for_each_logit(logits + lo, hi - lo, [&](float l, int i) {
    i += lo;
    if (l > best) {
      se = se * __expf(best - l) + 1.f;
      best = l;
      best_id = i;
    } else if (best != -INFINITY) {  // (-inf logits add nothing)
      se += __expf(l - best);
      if (l == best && i < best_id) best_id = i;
    }
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, best, o), s2 = __shfl_xor_sync(0xffffffffu, se, o);
    const int id2 = __shfl_xor_sync(0xffffffffu, best_id, o);
    merge_stats(best, se, best_id, m2, s2, id2);
  }
  __shared__ float wm[8], ws[8];
  __shared__ int wid[8];
  if ((threadIdx.x & 31) == 0) {
    wm[threadIdx.x >> 5] = best;
    ws[threadIdx.x >> 5] = se;
    wid[threadIdx.x >> 5] = best_id;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < int(blockDim.x >> 5); w++) merge_stats(wm[0], ws[0], wid[0], wm[w], ws[w], wid[w]);
  float* st = a.row_stats + (size_t(row) * kMaxChunks + chunk) * 3;
  st[0] = wm[0];
  st[1] = ws[0];
  st[2] = __int_as_float(wid[0]);
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  __shared__ Shared sh;
  const int row = blockIdx.x;
  const float* logits = a.logits + size_t(row) * a.V;
  const SamplingParams prm = a.params[row].params;
  const double uniform = a.params[row].uniform;

  // The row's max (lowest id on ties) and log-sum-exp, from the chunk partials of row_stats_kernel.
  float best = -INFINITY, se = 0.f;
  int best_id = 0x7fffffff;
  const float* st = a.row_stats + size_t(row) * kMaxChunks * 3;
  for (int c = 0; c < stats_chunks(a.V); c++)
    merge_stats(best, se, best_id, st[3 * c], st[3 * c + 1], __float_as_int(st[3 * c + 2]));
  // No finite logit (every token masked to -inf, or NaN/inf from an overflow): best_id is still
  // the 0x7fffffff sentinel and indexing with it reads far outside the row. Report the row as
  // unsampled (token -1) for the host to fail; nothing below may run for it.
  if (!isfinite(best)) {
    if (threadIdx.x == 0) {
      a.tokens[row] = -1;
      a.logprobs[row] = -INFINITY;
      for (int i = 0; i < a.top_n; i++) {
        a.top_ids[size_t(row) * a.top_n + i] = -1;
        a.top_logprobs[size_t(row) * a.top_n + i] = -INFINITY;
      }
    }
    return;
  }
  const float lse = best + logf(se);
  const bool greedy = !(prm.temperature > 0.f && prm.top_k != 1);
  const int32_t draft = a.params[row].draft;
  if (greedy && a.top_n == 0) {
    if (threadIdx.x == 0) {
      a.tokens[row] = best_id;
      a.logprobs[row] = logits[best_id] - lse;
      if (a.accepted) a.accepted[row] = draft >= 0 && draft == best_id;
    }
    return;
  }

  RowCtx r{logits, a.V, best, 1.f};
  const Limit all{0xffffffffu, 0x7fffffff};

  // The top_n alternatives: select the n-th best, gather the n kept elements, sort them.
  if (a.top_n > 0) {
    const int n = min(a.top_n, a.V);
    const Limit lim = select_prefix(r, all, false, (unsigned long long)n, sh);
    if (threadIdx.x == 0) sh.top_count = 0;
    __syncthreads();
    for_each_logit(logits, a.V, [&](float l, int i) {
      const uint32_t k = desc_key(l);
      if (lim.keeps(k, i)) {
        const int slot = atomicAdd(&sh.top_count, 1);
        if (slot < kMaxTopN) {
          sh.top_key[slot] = k;
          sh.top_id[slot] = i;
        }
      }
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      const int m = min(sh.top_count, kMaxTopN);
      for (int i = 1; i < m; i++)  // insertion sort by (key, id)
        for (int j = i; j > 0 && (sh.top_key[j] < sh.top_key[j - 1] ||
                                  (sh.top_key[j] == sh.top_key[j - 1] && sh.top_id[j] < sh.top_id[j - 1]));
             j--) {
          const uint32_t tk = sh.top_key[j];
          sh.top_key[j] = sh.top_key[j - 1];
          sh.top_key[j - 1] = tk;
          const int32_t ti = sh.top_id[j];
          sh.top_id[j] = sh.top_id[j - 1];
          sh.top_id[j - 1] = ti;
        }
      for (int i = 0; i < a.top_n; i++) {
        const bool ok = i < m;
        a.top_ids[size_t(row) * a.top_n + i] = ok ? sh.top_id[i] : -1;
        a.top_logprobs[size_t(row) * a.top_n + i] = ok ? logits[sh.top_id[i]] - lse : -INFINITY;
      }
    }
    __syncthreads();
  }

  int token = best_id;
  if (!greedy) {
    r.inv_temp = 1.f / prm.temperature;
    Limit lim = all;
    if (prm.top_k > 0 && prm.top_k < a.V) lim = select_prefix(r, lim, false, (unsigned long long)prm.top_k, sh);
    if (prm.min_p > 0.f) {
      // min_p keeps p >= min_p * p_max, i.e. (logit - max) / T >= log(min_p), evaluated in double
      // as the CPU sampler does: a prefix of the sorted order (ties all in or all out), so its
      // intersection with the kept elements is their first n, n >= 1 (the argmax always passes).
      const double inv_t = 1.0 / double(prm.temperature), log_min_p = log(double(prm.min_p));
      unsigned long long mine = 0;
      for_each_logit(logits, a.V, [&](float l, int i) {
        mine += lim.keeps(desc_key(l), i) && (double(l) - double(best)) * inv_t >= log_min_p;
      });
      unsigned long long n;
      block_exclusive_scan(mine, sh, &n);
      lim = select_prefix(r, lim, false, n, sh);
    }
    if (prm.top_p < 1.f) {
      const unsigned long long total = kept_total(r, lim, true, sh);
      unsigned long long target = (unsigned long long)ceil(double(prm.top_p) * double(total));
      target = target < 1 ? 1 : target > total ? total : target;
      lim = select_prefix(r, lim, true, target, sh);
    }
    const unsigned long long total = kept_total(r, lim, true, sh);
    if (draft >= 0 && draft < a.V) {
      // The draft's mass (0 when a cut left it out) and the kept mass sorted before it.
      const float ld = logits[draft];
      const uint32_t kd = desc_key(ld);
      const unsigned long long md = lim.keeps(kd, draft) ? measure(r, ld, true) : 0;
      if (md > 0 && uniform * double(total) < double(md)) {
        token = draft;  // kept: uniform < p(draft)
      } else {
        unsigned long long before = 0;
        for_each_logit(logits, a.V, [&](float l, int i) {
          const uint32_t k = desc_key(l);
          if (lim.keeps(k, i) && (k < kd || (k == kd && i < draft))) before += measure(r, l, true);
        });
        unsigned long long all;
        block_exclusive_scan(before, sh, &all);
        before = all;
        // A draw over the kept mass without the draft's: u skips the draft's stretch.
        const unsigned long long rest = total - md;
        unsigned long long u = rest == 0 ? 0 : (unsigned long long)(a.params[row].uniform2 * double(rest));
        if (rest > 0 && u >= rest) u = rest - 1;
        if (md > 0 && u >= before) u += md;
        token = select_prefix(r, lim, true, u + 1, sh).id;
      }
    } else {
      unsigned long long u = (unsigned long long)(uniform * double(total));
      if (u >= total) u = total - 1;
      token = select_prefix(r, lim, true, u + 1, sh).id;  // the first element whose cumulative mass exceeds u
    }
  }
  if (threadIdx.x == 0) {
    a.tokens[row] = token;
    a.logprobs[row] = logits[token] - lse;
    if (a.accepted) a.accepted[row] = draft >= 0 && token == draft;
  }
}

// One thread per mask word: the logits of disallowed tokens become -inf.
__global__ void apply_token_masks_kernel(float* logits, int V, int words, const uint32_t* masks) {
  const int w = blockIdx.y * blockDim.x + threadIdx.x;
  if (w >= words) return;
  const uint32_t bits = masks[size_t(blockIdx.x) * words + w];
  if (bits == 0xffffffffu) return;
  float* row = logits + size_t(blockIdx.x) * V;
  for (int b = 0; b < 32; b++) {
    const int v = w * 32 + b;
    if (v < V && !(bits >> b & 1u)) row[v] = -INFINITY;
  }
}

}  // namespace

void apply_token_masks(float* logits, int R, int V, const uint32_t* masks, cudaStream_t stream) {
  if (R <= 0) return;
  const int words = (V + 31) / 32;
  apply_token_masks_kernel<<<dim3(R, (words + 255) / 256), 256, 0, stream>>>(logits, V, words, masks);
  SLUICE_CUDA_LAUNCH_CHECK("apply_token_masks_kernel");
}

void sample(const SampleArgs& a, cudaStream_t stream) {
  if (a.R <= 0) return;
  if (a.top_n > kMaxTopN) throw Error(ErrorCode::kInvalidArgument, "at most 32 logprobs alternatives");
  row_stats_kernel<<<dim3(a.R, stats_chunks(a.V)), 256, 0, stream>>>(a);
  SLUICE_CUDA_LAUNCH_CHECK("row_stats_kernel");
  sample_kernel<<<a.R, kThreads, 0, stream>>>(a);
  SLUICE_CUDA_LAUNCH_CHECK("sample_kernel");
}

}  // namespace sluice::cuda
