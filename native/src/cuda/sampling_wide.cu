// Sampling with many blocks per logit row: the outputs of apply_token_masks + sample()
// (sampling.cu), bit for bit, with a row spread over B <= 32 blocks (B chosen so that R * B
// blocks fill the GPU; B = 1 for large batches, where R blocks already do).
//
// The semantics are sampling.cu's: every cut is "the last element of the shortest prefix, in
// (logit desc, id asc) order, whose measure reaches a target", the measure being a count or a
// 2^-40 fixed-point mass exp((l - max) / T) summed exactly in integers. Only the way there
// differs, in ways that cannot change an integer result:
//  - The row statistics (max, lowest argmax, sum of exp) repeat row_stats_kernel's arithmetic
//    exactly: the same chunks, each reduced in the same per-thread order and merge tree by 256
//    threads, then merged in chunk order. A block owns a run of whole chunks, its slice.
//  - Radix selects take 3 rounds (11, 11, 10 bits) instead of 4, and each first round's
//    histogram also gives the total of the kept set (so no separate "total" pass).
//  - All ties of one key weigh the same, so the tie that ends a prefix is the c-th in id order
//    with c = the remaining target (counts) or ceil(remaining / mass) (masses); c == 1 (usual
//    with float logits) is the lowest id in the final bin, recorded in the final round.
//  - min-p keeps a prefix of the order (logit >= a threshold): a limit on the key, found by
//    bisection over keys with the CPU's own double test, instead of a count and a select.
//    (The same set for any logits but NaN, which sort first and fail the test: a row of an
//    overflowed model, where only the min-p cut could differ.)
//  - The top-n select runs in the same passes as the first select of the chain.
// Per row: one pass to load (mask applied) and reduce, then 3 passes per select (top-n and
// top-k side by side, top-p, the draw), each pass ended by a barrier of the row's blocks.
//
// Rows of B > 1 blocks synchronise through a per-row workspace in global memory (a barrier
// counter, histograms summed with integer atomics, so every block reads the same sums and takes
// the same decisions) and are launched cooperatively, which guarantees that all blocks of the
// grid run at once. Their slices stay in shared memory as 32-bit keys when they fit (so a pass
// costs no global traffic); otherwise every pass re-reads the logits (L2-resident at moderate
// R). The workspace is returned to zero by the kernel itself: after each barrier the blocks
// clear the histogram buffer of the barrier before (three buffers rotate), and the row's last
// block to finish clears the last one, the gather count and the barrier counter.
#include "cuda/sampling_wide.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <mutex>

#include "cuda/check.h"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kStatsThreads = 256;  // row_stats_kernel's block: its reduction order is reproduced
constexpr int kStatsWarps = kStatsThreads / 32;
constexpr float kMassScale = 1099511627776.0f;  // 2^40
constexpr int kMaxTopN = 32;
constexpr int kMaxChunks = kSampleStatsFloatsPerRow / 3;  // sample()'s statistics chunks per row
constexpr int kBins = 2048;                                 // rounds 0 and 1: 11-bit digits
constexpr int kLastBins = 1024;                             // round 2: 10-bit digits
constexpr int kMaxWideRows = 128;    // rows of more than one block (the workspace holds this many)
constexpr int kMaxCacheKeys = 16384;  // a slice cached in shared memory: 64 KiB of keys at most

// ---- the per-row workspace (B > 1) -----------------------------------------------------------

struct alignas(16) HistBuf {
  unsigned long long hist[2][kBins];  // per select slot: measure per digit
  int first[2][kLastBins];            // final round: INT_MAX - lowest id per digit (0: none)
};

struct RowWs {
  unsigned int arrive;        // barrier counter: B per barrier passed (and one per block at exit)
  unsigned int gather_count;  // top-n elements gathered
  int found[2];               // tie resolution: the id found, per select slot
  float stats[kMaxChunks * 3];  // per chunk: max, sum of exp, argmax (as row_stats)
  uint32_t gather_key[kMaxTopN];
  int32_t gather_id[kMaxTopN];
  unsigned int tie_count[2][kMaxChunks];  // ties of the wanted key per block
  HistBuf buf[3];                          // round histograms, by barrier number % 3
};
constexpr size_t kRowWsBytes = (sizeof(RowWs) + 255) / 256 * 256;

// ---- keys, limits, statistics (as sampling.cu) ------------------------------------------------

// Ascending key order = descending logit order.
__device__ __forceinline__ uint32_t desc_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? b : ~(b | 0x80000000u);
}
// Its inverse: the logit, bit for bit.
__device__ __forceinline__ float key_logit(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? k : (~k & 0x7fffffffu));
}

// The elements kept: sorted position <= (key, id).
struct Limit {
  uint32_t key;
  int32_t id;
  __device__ bool keeps(uint32_t k, int32_t i) const { return k < key || (k == key && i <= id); }
};
__device__ __forceinline__ Limit shorter(Limit a, Limit b) {
  return (a.key < b.key || (a.key == b.key && a.id <= b.id)) ? a : b;
}
constexpr uint32_t kAllKey = 0xffffffffu;
constexpr int32_t kAllId = 0x7fffffff;

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

// One element of row_stats_kernel's per-thread scan.
__device__ __forceinline__ void stats_step(float& best, float& se, int& best_id, float l, int i) {
  if (l > best) {
    se = se * __expf(best - l) + 1.f;
    best = l;
    best_id = i;
  } else if (best != -INFINITY) {  // (-inf logits add nothing)
    se += __expf(l - best);
    if (l == best && i < best_id) best_id = i;
  }
}

// hist[bin] += m, one shared atomic per distinct bin per warp. Every lane of the warp calls it.
// Masses (< 2^41) are summed across lanes as three 20-bit limbs so that 32 of them cannot
// overflow 32 bits.
__device__ __forceinline__ void hist_add(unsigned long long* hist, bool active, uint32_t bin, unsigned long long m,
                                         bool counting) {
  const unsigned act = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(act, bin);
  const int leader = __ffs(peers) - 1;
  unsigned long long total;
  if (counting) {
    total = (unsigned long long)__popc(peers);
  } else {
    const unsigned lo = __reduce_add_sync(peers, unsigned(m & 0xfffffu));
    const unsigned mid = __reduce_add_sync(peers, unsigned((m >> 20) & 0xfffffu));
    const unsigned hi = __reduce_add_sync(peers, unsigned(m >> 40));
    total = (unsigned long long)lo + ((unsigned long long)mid << 20) + ((unsigned long long)hi << 40);
  }
  if (int(threadIdx.x & 31) == leader) atomicAdd(hist + bin, total);
}

// Radix rounds: digit shift, number of bins, and the key bits fixed by the rounds before.
__device__ __forceinline__ int round_shift(int r) { return r == 0 ? 21 : r == 1 ? 10 : 0; }
__device__ __forceinline__ int round_bins(int r) { return r == 2 ? kLastBins : kBins; }
__device__ __forceinline__ uint32_t round_high(int r) { return r == 0 ? 0u : r == 1 ? 0xffe00000u : 0xfffffc00u; }

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// ---- per-row state -----------------------------------------------------------------------------

enum Kind : int { kNone = 0, kTopN, kTopK, kTopP, kDraw };

// One select in flight: kind, kept set, the target still to reach, the key bits found so far and
// (after the final round) the result. Lives in shared memory; thread 0 writes it between barriers.
struct Select {
  int kind;
  Limit lim;
  unsigned long long want;  // kTopN / kTopK: the count; kTopP / kDraw: set from the first round's total
  double param;             // kTopP: top_p; kDraw: the row's uniform
  uint32_t prefix;
  uint32_t key;             // result (after round 2)
  int32_t id;               // result; -2 while the ties-th tie of key is still to find
  unsigned long long ties;
};

// Dynamic shared memory: the block's histograms [2][kBins], lowest ids [2][kLastBins], then the
// cached slice (keys). Fixed addresses, so they cost no registers.
__device__ __forceinline__ unsigned long long* smem_hist() {
  extern __shared__ unsigned long long sw_dyn[];
  return sw_dyn;
}
__device__ __forceinline__ int* smem_first() { return reinterpret_cast<int*>(smem_hist() + 2 * kBins); }
__device__ __forceinline__ uint32_t* smem_keys() { return reinterpret_cast<uint32_t*>(smem_first() + 2 * kLastBins); }

// The row a block works on. Lives in shared memory (Shared::row, written by thread 0): read
// where used, it holds no registers through the passes.
struct RowCtx {
  int row, V;
  int lo, hi;  // this block's slice of ids: its statistics chunks [b * C / B, (b + 1) * C / B)
  const float* logits;
  const uint32_t* mask;  // the row's words, or nullptr
  bool cached;           // the slice is in shared memory (smem_keys)
  RowWs* ws;             // B > 1
  float best, inv_temp;

  // This block's part of the row, and the row's blocks (read when needed: no registers held).
  __device__ __forceinline__ int b() const { return int(blockIdx.x); }
  __device__ __forceinline__ int B() const { return int(gridDim.x); }

  // The logit as apply_token_masks leaves it.
  __device__ __forceinline__ float logit(int i) const {
    float l = __ldg(logits + i);
    if (mask && !((__ldg(mask + (i >> 5)) >> (i & 31)) & 1u)) l = -INFINITY;
    return l;
  }
  __device__ __forceinline__ uint32_t key(int i) const { return cached ? smem_keys()[i - lo] : desc_key(logit(i)); }
  __device__ __forceinline__ unsigned long long mass(uint32_t k) const {
    return (unsigned long long)(__expf((key_logit(k) - best) * inv_temp) * kMassScale);
  }
};

// The row's plan (thread 0 keeps it between the stages).
struct Plan {
  float lse, inv_temp;
  int token;
  unsigned chain;  // select kinds, 4 bits each
  int nchain, pos;
  Limit lim, min_p_lim, top_lim;
  int top_pending, top_done, gathered, gather_now, more;
};

struct Shared {
  unsigned long long warp_tot[kWarps];
  float wm[2][kStatsWarps], wsum[2][kStatsWarps];
  int wid[2][kStatsWarps];
  float chunk_m[kMaxChunks], chunk_s[kMaxChunks];  // B == 1: the chunk statistics
  int chunk_id[kMaxChunks];
  Select sel[2];  // slot 0: top-n; slot 1: the chain (top-k, top-p, draw)
  int loc_digit;
  unsigned long long loc_before;
  int found[2];
  unsigned int g;  // row barriers passed
  int finisher;
  float best, se;
  int best_id;
  int gather_count;  // B == 1: the top-n elements gathered
  uint32_t gather_key[kMaxTopN];
  int32_t gather_id[kMaxTopN];
  Plan plan;
  RowCtx row;
};

// Calls f(key, id, valid) for this thread's ids of the slice (strided across the block), U loads
// in flight; every lane of a warp makes the same calls (invalid past the slice).
template <int U, typename F>
__device__ __forceinline__ void for_each_key(const RowCtx& c, F&& f) {
  const int steps = (c.hi - c.lo + kThreads - 1) / kThreads;
  int j = 0;
  for (; j + U <= steps; j += U) {
    uint32_t k[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int i = c.lo + (j + u) * kThreads + int(threadIdx.x);
      k[u] = i < c.hi ? c.key(i) : 0u;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int i = c.lo + (j + u) * kThreads + int(threadIdx.x);
      f(k[u], i, i < c.hi);
    }
  }
  for (; j < steps; j++) {
    const int i = c.lo + j * kThreads + int(threadIdx.x);
    f(i < c.hi ? c.key(i) : 0u, i, i < c.hi);
  }
}

// Block-wide exclusive scan of one value per thread (thread order); also returns the total.
__device__ unsigned long long block_scan(unsigned long long v, Shared& sh, unsigned long long* total) {
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
#pragma unroll
  for (int w = 0; w < kWarps; w++) {
    if (w < warp) before += sh.warp_tot[w];
    all += sh.warp_tot[w];
  }
  *total = all;
  return before + incl - v;
}

// Zeroes this block's share of a histogram buffer.
__device__ void zero_share(const RowCtx& c, int which) {
  uint4* p = reinterpret_cast<uint4*>(&c.ws->buf[which]);
  constexpr int n = int(sizeof(HistBuf) / sizeof(uint4));
  const int lo = c.b() * n / c.B(), hi = (c.b() + 1) * n / c.B();
  for (int i = lo + int(threadIdx.x); i < hi; i += kThreads) p[i] = make_uint4(0u, 0u, 0u, 0u);
}

// Barrier of the row's blocks (B == 1: of the block). What any block wrote to the workspace
// before it is visible to every block after it (read with __ldcg: L1 is not coherent). The
// histogram buffer of the barrier before this one is then free (its readers have all arrived
// here): each block clears its share of it, before it can be written again two barriers on.
__device__ void row_barrier(const RowCtx& c, Shared& sh) {
  __syncthreads();
  if (c.B() == 1) return;
  if (threadIdx.x == 0) {
    const unsigned int g = sh.g + 1;
    __threadfence();
    atomicAdd(&c.ws->arrive, 1u);
    while (load_acquire(&c.ws->arrive) < g * unsigned(c.B())) {
    }
    __threadfence();
    sh.g = g;
  }
  __syncthreads();
  if (sh.g >= 2) zero_share(c, int((sh.g - 1) % 3));
}

__device__ __forceinline__ void gather_add(const RowCtx& c, Shared& sh, uint32_t k, int i) {
  if (c.B() > 1) {
    const unsigned slot = atomicAdd(&c.ws->gather_count, 1u);
    if (slot < unsigned(kMaxTopN)) {
      c.ws->gather_key[slot] = k;
      c.ws->gather_id[slot] = i;
    }
  } else {
    const int slot = atomicAdd(&sh.gather_count, 1);
    if (slot < kMaxTopN) {
      sh.gather_key[slot] = k;
      sh.gather_id[slot] = i;
    }
  }
}

// One radix round of the selects in flight (and the top-n gather when asked): the block's
// histogram of the kept elements still in play, added into the row's, then the row barrier.
template <bool kGather>
__device__ __forceinline__ void hist_scan(const RowCtx& c, Shared& sh, int r, const Select& s0, const Select& s1) {
  const int shift = round_shift(r);
  const uint32_t high = round_high(r), dmask = uint32_t(round_bins(r) - 1);
  const bool on0 = s0.kind != kNone, on1 = s1.kind != kNone;
  const bool mass0 = s0.kind >= kTopP, mass1 = s1.kind >= kTopP;
  const Limit gather_lim = sh.plan.top_lim;
  // (Fewer loads in flight with the gather, which needs registers; it runs once per row.)
  for_each_key<kGather ? 2 : 4>(c, [&](uint32_t k, int i, bool valid) {
    const uint32_t d = (k >> shift) & dmask;
    if (on0) {
      const bool in = valid && (k & high) == s0.prefix && s0.lim.keeps(k, i);
      hist_add(smem_hist(), in, d, in && mass0 ? c.mass(k) : 1ull, !mass0);
      if (r == 2 && in) atomicMax(smem_first() + d, INT_MAX - i);
    }
    if (on1) {
      const bool in = valid && (k & high) == s1.prefix && s1.lim.keeps(k, i);
      hist_add(smem_hist() + kBins, in, d, in && mass1 ? c.mass(k) : 1ull, !mass1);
      if (r == 2 && in) atomicMax(smem_first() + kLastBins + d, INT_MAX - i);
    }
    if (kGather && valid && gather_lim.keeps(k, i)) gather_add(c, sh, k, i);
  });
}

// Top-n and top-k side by side: their first rounds count the same elements (all of them), so
// slot 0's histogram serves both.
__device__ __forceinline__ bool shares_first_round(const Shared& sh, int r) {
  return r == 0 && sh.sel[0].kind == kTopN && sh.sel[1].kind == kTopK;
}

__device__ void hist_pass(const RowCtx& c, Shared& sh, int r, bool gather) {
  Select s0 = sh.sel[0], s1 = sh.sel[1];
  if (shares_first_round(sh, r)) s1.kind = kNone;
  const int bins = round_bins(r);
  const bool on0 = s0.kind != kNone, on1 = s1.kind != kNone;
  for (int i = threadIdx.x; i < 2 * kBins; i += kThreads)
    if (i < kBins ? on0 : on1) smem_hist()[i] = 0;
  if (r == 2)
    for (int i = threadIdx.x; i < 2 * kLastBins; i += kThreads) smem_first()[i] = 0;
  __syncthreads();
  if (gather) hist_scan<true>(c, sh, r, s0, s1);
  else hist_scan<false>(c, sh, r, s0, s1);
  __syncthreads();
  if (c.B() > 1) {
    HistBuf& G = c.ws->buf[(sh.g + 1) % 3];
    for (int s = 0; s < 2; s++) {
      if (!(s == 0 ? on0 : on1)) continue;
      for (int d = threadIdx.x; d < bins; d += kThreads) {
        const unsigned long long v = smem_hist()[s * kBins + d];
        if (v) atomicAdd(&G.hist[s][d], v);
      }
      if (r == 2)
        for (int d = threadIdx.x; d < kLastBins; d += kThreads) {
          const int f = smem_first()[s * kLastBins + d];
          if (f) atomicMax(&G.first[s][d], f);
        }
    }
  }
  row_barrier(c, sh);
}

// After round r's barrier: the digit of select slot s (every block alike, from the row's
// histogram), and after the last round its result.
__device__ void decide(const RowCtx& c, Shared& sh, int s, int r) {
  const Select sel = sh.sel[s];
  const int bins = round_bins(r), shift = round_shift(r);
  const int per = bins / kThreads;  // 4 or 2 bins per thread
  const bool global = c.B() > 1;
  const int hs = s == 1 && shares_first_round(sh, r) ? 0 : s;  // the histogram's slot
  const unsigned long long* H = global ? c.ws->buf[sh.g % 3].hist[hs] : smem_hist() + hs * kBins;
  unsigned long long v[4] = {0, 0, 0, 0}, local = 0;
#pragma unroll
  for (int j = 0; j < 4; j++)
    if (j < per) {
      const int d = int(threadIdx.x) * per + j;
      v[j] = global ? __ldcg(H + d) : H[d];
      local += v[j];
    }
  unsigned long long total;
  const unsigned long long before = block_scan(local, sh, &total);
  unsigned long long want = sel.want;
  if (r == 0 && sel.kind == kTopP) {
    // The shortest head holding top_p of the kept mass (sample_kernel's rounding).
    unsigned long long target = (unsigned long long)ceil(sel.param * double(total));
    want = target < 1 ? 1 : target > total ? total : target;
  } else if (r == 0 && sel.kind == kDraw) {
    // The first element whose cumulative mass exceeds u.
    unsigned long long u = (unsigned long long)(sel.param * double(total));
    if (u >= total) u = total - 1;
    want = u + 1;
  }
  if (want >= 1 && before < want && want <= before + local) {
    unsigned long long cum = before;
    bool done = false;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      if (done || j >= per) continue;
      if (cum + v[j] >= want) {
        sh.loc_digit = int(threadIdx.x) * per + j;
        sh.loc_before = cum;
        done = true;
      }
      cum += v[j];
    }
  }
  __syncthreads();
  int digit;
  unsigned long long cum;
  if (want == 0) {  // (only with a degenerate temperature: sample_kernel's loop picks digit 0)
    digit = 0;
    cum = 0;
  } else if (want > total) {  // (unreachable: the targets never exceed the kept total)
    digit = bins - 1;
    cum = total;
  } else {
    digit = sh.loc_digit;
    cum = sh.loc_before;
  }
  const uint32_t prefix = sel.prefix | (uint32_t(digit) << shift);
  want -= cum;
  int32_t id = -2;
  unsigned long long ties = 0;
  if (r == 2) {
    // All ties of the key weigh the same: the prefix ends at the ties-th of them in id order
    // (the kept ties are the first ones in id order, and at least `ties` of them are kept).
    if (want > 0) {
      if (sel.kind >= kTopP) {
        const unsigned long long m = c.mass(prefix);
        ties = m ? (want + m - 1) / m : 0;
      } else {
        ties = want;
      }
    }
    if (ties == 1) {
      const int f = global ? __ldcg(&c.ws->buf[sh.g % 3].first[s][digit]) : smem_first()[s * kLastBins + digit];
      id = f ? INT_MAX - f : -1;
    } else if (ties == 0) {
      id = -1;
    }
    if (id == -1) id = sel.lim.key == prefix ? sel.lim.id : c.V - 1;  // sample_kernel's fallback
  }
  __syncthreads();  // every thread has read loc_* before they are reused
  if (threadIdx.x == 0) {
    sh.sel[s].prefix = prefix;
    sh.sel[s].want = want;
    if (r == 2) {
      sh.sel[s].key = prefix;
      sh.sel[s].id = id;
      sh.sel[s].ties = ties;
    }
  }
}

// Selects whose result is the ties-th (> 1) element of their key: count the key in contiguous
// id ranges (per thread, per block), find the block and thread that hold it, and scan there.
// Counts are below V < 2^31: both slots' counts travel packed in one 64-bit scan.
__device__ void resolve_ties(const RowCtx& c, Shared& sh) {
  __syncthreads();
  const bool t0 = sh.sel[0].kind != kNone && sh.sel[0].id == -2;
  const bool t1 = sh.sel[1].kind != kNone && sh.sel[1].id == -2;
  if (!t0 && !t1) return;
  const int sub = (c.hi - c.lo + kThreads - 1) / kThreads;
  const int tlo = c.lo + int(threadIdx.x) * sub, thi = min(c.hi, tlo + sub);
  unsigned long long mine = 0;  // this thread's ties: slot 0 in the low half, slot 1 in the high
  {
    const uint32_t k0 = sh.sel[0].key, k1 = sh.sel[1].key;
    for (int i = tlo; i < thi; i++) {
      const uint32_t k = c.key(i);
      mine += (t0 && k == k0 ? 1ull : 0ull) + (t1 && k == k1 ? 1ull << 32 : 0ull);
    }
  }
  unsigned long long block_total;
  unsigned long long before = block_scan(mine, sh, &block_total);
  if (c.B() > 1) {
    if (threadIdx.x == 0) {
      c.ws->tie_count[0][c.b()] = unsigned(block_total);
      c.ws->tie_count[1][c.b()] = unsigned(block_total >> 32);
    }
    row_barrier(c, sh);
    for (int j = 0; j < c.b(); j++)
      before += __ldcg(&c.ws->tie_count[0][j]) + ((unsigned long long)__ldcg(&c.ws->tie_count[1][j]) << 32);
  }
  if (threadIdx.x == 0) sh.found[0] = sh.found[1] = -1;
  __syncthreads();
  for (int s = 0; s < 2; s++) {
    const unsigned want = unsigned(sh.sel[s].ties), first = unsigned(before >> (32 * s)), n = unsigned(mine >> (32 * s));
    if (!(s == 0 ? t0 : t1) || !(first < want && want <= first + n)) continue;
    const uint32_t key = sh.sel[s].key;
    unsigned cum = first;
    for (int i = tlo; i < thi; i++) {
      if (c.key(i) != key) continue;
      if (++cum == want) {
        if (c.B() > 1) c.ws->found[s] = i;
        else sh.found[s] = i;
        break;
      }
    }
  }
  row_barrier(c, sh);
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; s++) {
      if (!(s == 0 ? t0 : t1)) continue;
      const Select& sel = sh.sel[s];
      int id = c.B() > 1 ? __ldcg(&c.ws->found[s]) : sh.found[s];
      if (id < 0 || id >= c.V) id = sel.lim.key == sel.key ? sel.lim.id : c.V - 1;  // (unreachable)
      sh.sel[s].id = id;
    }
  }
  __syncthreads();
}

// The selects set in sh.sel, side by side: 3 radix rounds, then their ties.
__device__ void run_selects(const RowCtx& c, Shared& sh, bool gather) {
  for (int r = 0; r < 3; r++) {
    hist_pass(c, sh, r, gather && r == 0);
    if (sh.sel[0].kind != kNone) decide(c, sh, 0, r);
    if (sh.sel[1].kind != kNone) decide(c, sh, 1, r);
    __syncthreads();
  }
  resolve_ties(c, sh);
}

// The largest key whose logit passes min-p's test, evaluated in double as the CPU sampler does:
// (l - max) / T >= log(min_p) is monotone in the logit, so the kept logits are a prefix of the
// order and a bisection over the keys between the max and -inf finds its end.
__device__ uint32_t min_p_key(float best, float temperature, float min_p) {
  const double inv_t = 1.0 / double(temperature), log_min_p = log(double(min_p));
  uint32_t lo = desc_key(best), hi = desc_key(-INFINITY);  // passes; fails (min_p > 0)
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if ((double(key_logit(mid)) - double(best)) * inv_t >= log_min_p) lo = mid;
    else hi = mid;
  }
  return lo;
}

__device__ void sample_row(RowCtx& c, Shared& sh, const SampleArgs& a) {
  const int V = c.V;
  // Load: the slice into shared memory as keys, the masks applied.
  if (c.cached) {
    const int n = c.hi - c.lo;
    for (int j = threadIdx.x; j < n; j += 8 * kThreads) {
      float l[8];
#pragma unroll
      for (int u = 0; u < 8; u++) l[u] = j + u * kThreads < n ? c.logit(c.lo + j + u * kThreads) : 0.f;
#pragma unroll
      for (int u = 0; u < 8; u++)
        if (j + u * kThreads < n) smem_keys()[j + u * kThreads] = desc_key(l[u]);
    }
    __syncthreads();
  }
  // Statistics: row_stats_kernel's chunks, each by 256 threads (one half of the block) in its
  // per-thread order and merge tree.
  {
    const int half = threadIdx.x / kStatsThreads, vt = threadIdx.x % kStatsThreads;
    const int lane = threadIdx.x & 31, hw = vt >> 5;
    const int C = stats_chunks(V), per = (V + C - 1) / C;
    const int c0 = c.b() * C / c.B(), c1 = (c.b() + 1) * C / c.B();
    for (int q = 0; q < (c1 - c0 + 1) / 2; q++) {
      const int ch = c0 + 2 * q + half;
      const bool valid = ch < c1;
      float best = -INFINITY, se = 0.f;
      int best_id = 0x7fffffff;
      if (valid) {
        const int clo = ch * per, chi = min(V, clo + per);
        if (c.cached) {
          for (int i = clo + vt; i < chi; i += kStatsThreads) stats_step(best, se, best_id, key_logit(smem_keys()[i - c.lo]), i);
        } else {
          int i = clo + vt;
          for (; i + 3 * kStatsThreads < chi; i += 4 * kStatsThreads) {
            const float l0 = c.logit(i), l1 = c.logit(i + kStatsThreads), l2 = c.logit(i + 2 * kStatsThreads),
                        l3 = c.logit(i + 3 * kStatsThreads);
            stats_step(best, se, best_id, l0, i);
            stats_step(best, se, best_id, l1, i + kStatsThreads);
            stats_step(best, se, best_id, l2, i + 2 * kStatsThreads);
            stats_step(best, se, best_id, l3, i + 3 * kStatsThreads);
          }
          for (; i < chi; i += kStatsThreads) stats_step(best, se, best_id, c.logit(i), i);
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, best, o), s2 = __shfl_xor_sync(0xffffffffu, se, o);
        const int id2 = __shfl_xor_sync(0xffffffffu, best_id, o);
        merge_stats(best, se, best_id, m2, s2, id2);
      }
      if (lane == 0) {
        sh.wm[half][hw] = best;
        sh.wsum[half][hw] = se;
        sh.wid[half][hw] = best_id;
      }
      __syncthreads();
      if (vt == 0 && valid) {
        float m = sh.wm[half][0], s = sh.wsum[half][0];
        int id = sh.wid[half][0];
        for (int w = 1; w < kStatsWarps; w++) merge_stats(m, s, id, sh.wm[half][w], sh.wsum[half][w], sh.wid[half][w]);
        if (c.B() > 1) {
          c.ws->stats[3 * ch] = m;
          c.ws->stats[3 * ch + 1] = s;
          c.ws->stats[3 * ch + 2] = __int_as_float(id);
        } else {
          sh.chunk_m[ch] = m;
          sh.chunk_s[ch] = s;
          sh.chunk_id[ch] = id;
        }
      }
      __syncthreads();
    }
  }
  row_barrier(c, sh);
  if (threadIdx.x == 0) {
    float best = -INFINITY, se = 0.f;
    int best_id = 0x7fffffff;
    for (int ch = 0; ch < stats_chunks(V); ch++) {
      if (c.B() > 1)
        merge_stats(best, se, best_id, __ldcg(&c.ws->stats[3 * ch]), __ldcg(&c.ws->stats[3 * ch + 1]),
                    __float_as_int(__ldcg(&c.ws->stats[3 * ch + 2])));
      else
        merge_stats(best, se, best_id, sh.chunk_m[ch], sh.chunk_s[ch], sh.chunk_id[ch]);
    }
    sh.best = best;
    sh.se = se;
    sh.best_id = best_id;
  }
  __syncthreads();
  const float best = sh.best;
  const int best_id = sh.best_id;
  const bool writer = c.b() == 0 && threadIdx.x == 0;
  const int top_n = a.top_n;
  // No finite logit: the row is unsampled (token -1), as sample_kernel reports it.
  if (!isfinite(best)) {
    if (writer) {
      a.tokens[c.row] = -1;
      a.logprobs[c.row] = -INFINITY;
      for (int i = 0; i < top_n; i++) {
        a.top_ids[size_t(c.row) * top_n + i] = -1;
        a.top_logprobs[size_t(c.row) * top_n + i] = -INFINITY;
      }
    }
    return;
  }
  // The plan of the row lives in shared memory, kept by thread 0 (registers stay free for the
  // passes): the chain of selects of a sampled row (top-k, top-p, the draw; min-p is a limit),
  // kinds packed 4 bits each, the first in the low bits; the top-n select rides along with the
  // chain's first and gathers its elements in the next pass.
  Plan& pl = sh.plan;
  if (threadIdx.x == 0) {
    const SamplingParams prm = a.params[c.row].params;
    const bool greedy = !(prm.temperature > 0.f && prm.top_k != 1);
    const Limit all{kAllKey, kAllId};
    pl.lse = best + logf(sh.se);
    pl.inv_temp = greedy ? 1.f : 1.f / prm.temperature;
    c.best = best;
    c.inv_temp = pl.inv_temp;
    pl.token = best_id;
    pl.chain = 0;
    pl.nchain = 0;
    pl.pos = 0;
    pl.min_p_lim = all;
    const bool top_k = !greedy && prm.top_k > 0 && prm.top_k < V;
    if (!greedy) {
      if (top_k) pl.chain |= unsigned(kTopK) << (4 * pl.nchain++);
      if (prm.top_p < 1.f) pl.chain |= unsigned(kTopP) << (4 * pl.nchain++);
      pl.chain |= unsigned(kDraw) << (4 * pl.nchain++);
      if (prm.min_p > 0.f) pl.min_p_lim = Limit{min_p_key(best, prm.temperature, prm.min_p), kAllId};
    }
    pl.lim = top_k ? all : pl.min_p_lim;  // min-p applies after top-k
    pl.top_lim = all;
    pl.top_pending = top_n > 0;
    pl.top_done = false;
    pl.gathered = false;
  }
  __syncthreads();
  for (;;) {
    if (threadIdx.x == 0) {
      Select s0{}, s1{};
      if (pl.top_pending) {
        s0.kind = kTopN;
        s0.lim = Limit{kAllKey, kAllId};
        s0.want = (unsigned long long)min(top_n, V);
      }
      if (pl.pos < pl.nchain) {
        const SampleRowParams& rp = a.params[c.row];
        s1.kind = int((pl.chain >> (4 * pl.pos)) & 15u);
        s1.lim = pl.lim;
        s1.want = s1.kind == kTopK ? (unsigned long long)rp.params.top_k : 0ull;
        s1.param = s1.kind == kTopP ? double(rp.params.top_p) : rp.uniform;
      }
      sh.sel[0] = s0;
      sh.sel[1] = s1;
      pl.gather_now = pl.top_done && !pl.gathered;
      pl.more = s0.kind != kNone || s1.kind != kNone;
    }
    __syncthreads();
    if (!pl.more) break;
    run_selects(c, sh, pl.gather_now);
    if (threadIdx.x == 0) {
      pl.gathered = pl.gathered || pl.gather_now;
      if (pl.top_pending) {
        pl.top_lim = Limit{sh.sel[0].key, sh.sel[0].id};
        pl.top_pending = false;
        pl.top_done = true;
      }
      if (pl.pos < pl.nchain) {
        const Limit res{sh.sel[1].key, sh.sel[1].id};
        const int kind = int((pl.chain >> (4 * pl.pos)) & 15u);
        if (kind == kTopK) pl.lim = shorter(res, pl.min_p_lim);
        else if (kind == kTopP) pl.lim = res;
        else pl.token = res.id;
        pl.pos++;
      }
    }
    __syncthreads();
  }
  if (pl.top_done && !pl.gathered) {
    const Limit top_lim = pl.top_lim;
    for_each_key<4>(c, [&](uint32_t k, int i, bool valid) {
      if (valid && top_lim.keeps(k, i)) gather_add(c, sh, k, i);
    });
    row_barrier(c, sh);
  }
  if (writer) {
    const float lse = pl.lse;
    const int token = pl.token;
    a.tokens[c.row] = token;
    a.logprobs[c.row] = c.logit(token) - lse;
    if (top_n > 0) {
      uint32_t* tk = sh.gather_key;  // sorted in place (B > 1: copied from the workspace)
      int32_t* ti = sh.gather_id;
      const int m = min(int(c.B() > 1 ? __ldcg(&c.ws->gather_count) : unsigned(sh.gather_count)), kMaxTopN);
      if (c.B() > 1)
        for (int i = 0; i < m; i++) {
          tk[i] = __ldcg(&c.ws->gather_key[i]);
          ti[i] = __ldcg(&c.ws->gather_id[i]);
        }
      for (int i = 1; i < m; i++)  // insertion sort by (key, id)
        for (int j = i; j > 0 && (tk[j] < tk[j - 1] || (tk[j] == tk[j - 1] && ti[j] < ti[j - 1])); j--) {
          const uint32_t k = tk[j];
          tk[j] = tk[j - 1];
          tk[j - 1] = k;
          const int32_t t = ti[j];
          ti[j] = ti[j - 1];
          ti[j - 1] = t;
        }
      for (int i = 0; i < top_n; i++) {
        const bool ok = i < m;
        a.top_ids[size_t(c.row) * top_n + i] = ok ? ti[i] : -1;
        a.top_logprobs[size_t(c.row) * top_n + i] = ok ? key_logit(tk[i]) - lse : -INFINITY;
      }
    }
  }
}

// Grid (B, rows): blockIdx.x is the block's part of its row. `cached`: slices live in shared
// memory (dynamic, after the block's histograms).
__global__ void __launch_bounds__(kThreads, 2)
    sample_wide_kernel(SampleArgs a, const uint32_t* masks, unsigned char* workspace, int cached) {
  __shared__ Shared sh;
  const int V = a.V, B = gridDim.x, b = blockIdx.x, words = (V + 31) / 32;
  for (int row = blockIdx.y; row < a.R; row += gridDim.y) {
    RowCtx& c = sh.row;
    if (threadIdx.x == 0) {
      const int C = stats_chunks(V), per = (V + C - 1) / C;
      c.row = row;
      c.V = V;
      c.lo = min(V, b * C / B * per);
      c.hi = min(V, (b + 1) * C / B * per);
      c.logits = a.logits + size_t(row) * V;
      c.mask = masks ? masks + size_t(row) * words : nullptr;
      c.cached = cached != 0;
      c.ws = B > 1 ? reinterpret_cast<RowWs*>(workspace + size_t(row) * kRowWsBytes) : nullptr;
      c.best = 0.f;
      c.inv_temp = 1.f;
      sh.g = 0;
      sh.gather_count = 0;
    }
    __syncthreads();
    sample_row(c, sh, a);
    if (B > 1) {
      // The row's last block to finish returns the workspace to zero: the histogram buffer of
      // the last barrier (the others are clear), the gather count and the barrier counter.
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        const unsigned int old = atomicAdd(&c.ws->arrive, 1u);
        sh.finisher = old == (sh.g + 1) * unsigned(B) - 1;
      }
      __syncthreads();
      if (sh.finisher) {
        __threadfence();
        uint4* p = reinterpret_cast<uint4*>(&c.ws->buf[sh.g % 3]);
        for (int i = threadIdx.x; i < int(sizeof(HistBuf) / sizeof(uint4)); i += kThreads) p[i] = make_uint4(0u, 0u, 0u, 0u);
        if (threadIdx.x == 0) {
          c.ws->gather_count = 0;
          c.ws->arrive = 0;
        }
      }
    }
    __syncthreads();
  }
}

constexpr size_t kSmemBase = size_t(2) * kBins * sizeof(unsigned long long) + size_t(2) * kLastBins * sizeof(int);

// Per device: SMs, whether cooperative launches work, how many keys a block can cache, and how
// many blocks fit at once with and without a cache.
struct DeviceInfo {
  bool ready = false;
  bool coop = false;
  int cache_keys = 0;
  int cap_cached = 0, cap_uncached = 0;
};

const DeviceInfo& device_info() {
  static std::mutex mu;
  static DeviceInfo infos[64];
  int dev = 0;
  SLUICE_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  DeviceInfo& d = infos[dev & 63];
  if (d.ready) return d;
  int sms = 0, coop = 0, optin = 0;
  SLUICE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  SLUICE_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  SLUICE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes fa{};
  SLUICE_CUDA_CHECK(cudaFuncGetAttributes(&fa, sample_wide_kernel));
  const long room = long(optin) - long(fa.sharedSizeBytes) - long(kSmemBase);
  long keys = room > 0 ? room / 4 : 0;
  keys = keys > kMaxCacheKeys ? kMaxCacheKeys : keys / 32 * 32;
  d.cache_keys = int(keys);
  const size_t max_dyn = kSmemBase + size_t(d.cache_keys) * 4;
  SLUICE_CUDA_CHECK(cudaFuncSetAttribute(sample_wide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_dyn)));
  int per_sm = 0;
  SLUICE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sample_wide_kernel, kThreads, max_dyn));
  d.cap_cached = per_sm * sms;
  SLUICE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sample_wide_kernel, kThreads, kSmemBase));
  d.cap_uncached = per_sm * sms;
  d.coop = coop != 0;
  d.ready = true;
  return d;
}

}  // namespace

size_t sample_wide_workspace_bytes(int R, int V) {
  (void)V;
  if (R <= 0) return 0;
  return size_t(R < kMaxWideRows ? R : kMaxWideRows) * kRowWsBytes;
}

SampleWidePlan sample_wide_plan(int R, int V) {
  SampleWidePlan p;
  if (R <= 0 || V <= 0) return p;
  const DeviceInfo& d = device_info();
  const int C = stats_chunks(V), per = (V + C - 1) / C;
  // As many blocks per row as fill the GPU at once (at most one per statistics chunk), with the
  // slices in shared memory when they fit; one per row when the batch alone fills the GPU.
  if (d.coop && R <= kMaxWideRows && C > 1) {
    const int bc = std::min(C, d.cap_cached / R);
    if (bc >= 2 && (C + bc - 1) / bc * per <= d.cache_keys) {
      p.blocks_per_row = bc;
      p.cached = true;
      return p;
    }
    const int bu = std::min(C, d.cap_uncached / R);
    if (bu >= 2) {
      p.blocks_per_row = bu;
      return p;
    }
  }
  p.cached = V <= d.cache_keys;
  return p;
}

void sample_wide(const SampleArgs& a, const uint32_t* masks, cudaStream_t stream) {
  if (a.R <= 0) return;
  if (a.top_n > kMaxTopN) throw Error(ErrorCode::kInvalidArgument, "at most 32 logprobs alternatives");
  const int R = a.R, V = a.V, C = stats_chunks(V), per = (V + C - 1) / C;
  SampleWidePlan p = sample_wide_plan(R, V);
  auto* ws = reinterpret_cast<unsigned char*>(a.row_stats);
  if (p.blocks_per_row > 1 && !ws) p = SampleWidePlan{1, V <= device_info().cache_keys};
  if (p.blocks_per_row > 1) {
    const int B = p.blocks_per_row;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(B), unsigned(R));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmemBase + (p.cached ? size_t((C + B - 1) / B) * size_t(per) * 4 : 0);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;  // all blocks at once: the rows' barriers need it
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, sample_wide_kernel, a, masks, ws, int(p.cached));
    if (err == cudaSuccess) return;
    if (err != cudaErrorCooperativeLaunchTooLarge) throw_cuda_error(err, "launch of sample_wide_kernel", __FILE__, __LINE__);
    (void)cudaGetLastError();  // a GPU shared with others: one block per row needs no co-residency
    p = SampleWidePlan{1, V <= device_info().cache_keys};
  }
  const unsigned rows = unsigned(R < 65535 ? R : 65535);
  const size_t smem = kSmemBase + (p.cached ? size_t(V) * 4 : 0);
  sample_wide_kernel<<<dim3(1, rows), kThreads, smem, stream>>>(a, masks, ws, int(p.cached));
  SLUICE_CUDA_LAUNCH_CHECK("sample_wide_kernel");
}

}  // namespace sluice::cuda
