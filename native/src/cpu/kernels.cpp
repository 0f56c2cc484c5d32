// Kernel entry points: dispatch by SIMD level, threading, and the portable implementations.
#include "cpu/kernels.h"


#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/gemm.h"
#include "cpu/gemm_q4.h"
#include "cpu/gemm_q8.h"
#include "cpu/ops_simd.h"
#include "sluice/error.h"
#include "util/e4m3.h"
#include "util/host_memory.h"

namespace sluice {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      uint32_t m = mant;
      do {
        e++;
        m <<= 1;
      } while (!(m & 0x400));
      bits = sign | uint32_t(127 - 15 - e) << 23 | (m & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00);                 // NaN
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);                // rounds to inf
  if (ax < 0x38800000u) {                                               // subnormal or zero in f16
    float a;
    std::memcpy(&a, &ax, 4);
    return uint16_t(sign | uint16_t(std::nearbyint(a * 16777216.0f)));  // units of 2^-24, RNE
  }
  uint32_t mant = ax & 0x7fffff, exp = (ax >> 23) - 127 + 15;
  uint32_t h = exp << 10 | mant >> 13;
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;  // may carry into the exponent: correct
  return uint16_t(sign | h);
}

}  // namespace sluice

namespace sluice::cpu {

namespace detail {

float load_scalar(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::Q8_0:
    case DType::Q4: break;  // blocks, not elements: only the Q8_0 and Q4 kernels read them
    case DType::U8:
    case DType::I32:
    case DType::I64:
    case DType::F8E4M3: break;  // repacked or dequantized at load (model_weights.cpp): never reach a kernel
  }
  return 0.f;
}

void gemm_generic(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  for (int64_t t = 0; t < a.T; t++)
    for (int64_t n = n_begin; n < n_end; n++) {
      float s = 0.f;
      for (int64_t k = 0; k < a.K; k++) s += a.x[t * a.K + k] * load_scalar(a.w, a.w_dtype, n * a.K + k);
      if (a.bias) s += load_scalar(a.bias, a.bias_dtype, n);
      a.y[t * a.N + n] = s;
    }
}

inline int64_t kv_offset(const int32_t* table, int64_t p, const PagedKV& c, int64_t kv_head) {
  const int64_t slot = int64_t(table[p / c.block_size]) * c.block_size + p % c.block_size;
  return (slot * c.n_kv_heads + kv_head) * c.head_dim;
}

namespace {

// The exact values of the 256 e4m3 codes (NaN for 0x7f and 0xff), for the scalar fp8 cache reads.
const float* e4m3_values() {
  static const auto table = [] {
    std::vector<float> t(256);
    for (int code = 0; code < 256; code++) t[size_t(code)] = e4m3_to_float(uint8_t(code));
    return t;
  }();
  return table.data();
}

// Element i of a K or V cache buffer as f32: an fp8 cache reads back code * its scale (PagedKV).
inline float load_kv(const void* p, DType t, int64_t i, const float* e4m3, float fp8_scale) {
  if (t == DType::F8E4M3) return e4m3[static_cast<const uint8_t*>(p)[i]] * fp8_scale;
  return load_scalar(p, t, i);
}

}  // namespace

void attend_generic(const float* q, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c, float scale,
                    float* scores, float* out) {
  const int64_t hd = c.head_dim, P = pos + 1 - c.first;
  const float* e4m3 = c.dtype == DType::F8E4M3 ? e4m3_values() : nullptr;
  float max_score = -INFINITY;
  for (int64_t p = 0; p < P; p++) {
    const int64_t off = kv_offset(table, c.first + p, c, kv_head);
    float s = 0.f;
    for (int64_t i = 0; i < hd; i++) s += q[i] * load_kv(c.k, c.dtype, off + i, e4m3, c.k_scale);
    scores[p] = s * scale;
    max_score = std::max(max_score, scores[p]);
  }
  // A sink (gpt-oss) joins the softmax's sum: it takes its share and adds nothing to the output.
  if (c.has_sink) max_score = std::max(max_score, c.sink);
  float sum = c.has_sink ? std::exp(c.sink - max_score) : 0.f;
  for (int64_t p = 0; p < P; p++) {
    scores[p] = std::exp(scores[p] - max_score);
    sum += scores[p];
  }
  for (int64_t i = 0; i < hd; i++) out[i] = 0.f;
  for (int64_t p = 0; p < P; p++) {
    const int64_t off = kv_offset(table, c.first + p, c, kv_head);
    for (int64_t i = 0; i < hd; i++) out[i] += scores[p] * load_kv(c.v, c.dtype, off + i, e4m3, c.v_scale);
  }
  const float inv = 1.f / sum;
  for (int64_t i = 0; i < hd; i++) out[i] *= inv;
}

void logits_row_stats_generic(const float* row, int64_t V, int32_t* argmax, float* lse) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (row[i] > row[best]) best = i;
  double sum = 0;
  for (int64_t i = 0; i < V; i++) sum += std::exp(double(row[i]) - double(row[best]));
  *argmax = int32_t(best);
  *lse = float(double(row[best]) + std::log(sum));
}

void rmsnorm_row_generic(const float* x, int64_t D, const void* weight, DType w_dtype, float eps, float* out) {
  double ss = 0;  // double: exact enough that the fixed order never matters
  for (int64_t d = 0; d < D; d++) ss += double(x[d]) * double(x[d]);
  const float r = float(1.0 / std::sqrt(ss / double(D) + double(eps)));
  for (int64_t d = 0; d < D; d++) out[d] = x[d] * r * load_scalar(weight, w_dtype, d);
}

bool mask_row_generic(float* row, int64_t V, const uint32_t* allow) {
  uint32_t any = 0;
  for (int64_t w = 0; w * 32 < V; w++) {
    const uint32_t bits = allow[w];
    const int64_t n = V - w * 32 < 32 ? V - w * 32 : 32;
    any |= n == 32 ? bits : bits & ((uint32_t(1) << n) - 1);
    if (bits == 0xffffffffu) continue;
    float* p = row + w * 32;
    for (int64_t b = 0; b < n; b++) p[b] = (bits >> b) & 1u ? p[b] : -INFINITY;
  }
  return any != 0;
}

// Which SIMD version of an elementwise kernel this level runs (the AVX-512 ones need AVX-512F).
template <typename Fn>
Fn pick(Fn generic, Fn avx2, Fn avx512) {
  const SimdLevel level = simd_level();
  return level >= SimdLevel::Avx512 ? avx512 : level == SimdLevel::Avx2 ? avx2 : generic;
}

void silu_mul_generic(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

}  // namespace detail

using namespace detail;

// Guided chunking: each chunk takes 1 / (2 * threads) of the weight bytes still unassigned, at
// least kMinChunkBytes (and 24 rows), in whole multiples of 12 rows (the decode tiles' 4 row
// streams, the prefill tiles' 3 or 6 rows): the first chunks are large, the last ones small.
// Large chunks keep each thread streaming one long run of rows (batch-1 decode on the 2-core
// Zen 4, in bursts of high bandwidth: int8 42.8 -> 48.9 GB/s, bf16 46.5 -> 50.8 GB/s against
// fixed chunks of N / (8 * threads) rows); small last chunks keep the wait at the end of the
// region short, also when one thread is slowed by another process.
namespace {

// The bytes a kernel streams per row of w ([N, K] in `dtype`).
int64_t weight_row_bytes(DType dtype, int64_t K, const void* w) {
  if (dtype == DType::Q4) {
    const Q4View v = q4_view(w);
    return v.h->Kp / 2 + v.ng * int64_t(sizeof(float) + 1);  // codes, scales, zeros
  }
  return dtype == DType::Q8_0 ? int64_t(q8_bytes(1, K)) : K * int64_t(dtype_size(dtype));
}

// Cuts outputs of N[i] rows of row_bytes[i] bytes into chunks of about an even share of the
// remaining bytes per thread (at least 128 KiB, 24 rows, multiples of 12 rows).
void chunk_rows(int num_outs, const int64_t* N, const int64_t* row_bytes, int threads, std::vector<MatmulChunk>& chunks) {
  constexpr int64_t kMinChunkBytes = 128 << 10;
  chunks.clear();
  int64_t remaining = 0;  // weight bytes not yet in a chunk
  for (int i = 0; i < num_outs; i++) remaining += N[i] * row_bytes[i];
  for (int i = 0; i < num_outs; i++) {
    const int64_t rb = row_bytes[i];
    for (int64_t b = 0; b < N[i];) {
      const int64_t want = std::max(kMinChunkBytes, remaining / (2 * int64_t(threads)));
      const int64_t rows = std::max<int64_t>(24, (want / rb + 11) / 12 * 12);
      const int64_t e = std::min(N[i], b + rows);
      chunks.push_back({i, b, e});
      remaining -= (e - b) * rb;
      b = e;
    }
  }
}

}  // namespace

void matmul_chunks(const LinearOut* outs, int num_outs, int64_t K, int threads, std::vector<MatmulChunk>& chunks) {
  std::vector<int64_t> N(static_cast<size_t>(num_outs)), rb(static_cast<size_t>(num_outs));
  for (int i = 0; i < num_outs; i++) {
    N[size_t(i)] = outs[i].N;
    rb[size_t(i)] = weight_row_bytes(outs[i].w_dtype, K, outs[i].w);
  }
  chunk_rows(num_outs, N.data(), rb.data(), threads, chunks);
}

void matmul_groups(ThreadPool& pool, const MatmulGroup* groups, int num_groups, MatmulPrecision precision) {
  const SimdLevel level = simd_level();
  const bool split = precision == MatmulPrecision::F32;
  const int64_t bf16_rows = split ? 2 : 1;
  // Each group's activations converted once for its outputs: bf16 for vdpbf16ps, Q8_0 for int8
  // weights, Q4 sets for 4-bit weights (one per group for its outputs without a permutation, one
  // per distinct permutation: outputs of the same weights share it). One buffer each, every
  // group or set at its own offset. NOTE: the workers must see the caller's buffers, not their
  // own thread_locals.
  struct Q4Set {
    int group;
    const int32_t* perm;
    size_t xq, xd;  // offsets in xq, and in xd and xs
  };
  thread_local std::vector<uint16_t> xb;
  thread_local std::vector<int8_t> xq;  // [T, Kp] per group or Q4 set
  thread_local std::vector<float> xd;   // [T, Kp / 32] per group or Q4 set
  thread_local std::vector<float> xs;   // [T, Kp / 32] per Q4 set (sized as xd)
  thread_local std::vector<size_t> xb_off, xq_off, xd_off;
  thread_local std::vector<Q4Set> q4_sets;
  thread_local std::vector<int> q4_set_of;  // per output (all groups' in order): its Q4 set or -1
  xb_off.assign(size_t(num_groups), SIZE_MAX);
  xq_off.assign(size_t(num_groups), SIZE_MAX);
  xd_off.assign(size_t(num_groups), 0);
  q4_sets.clear();
  q4_set_of.clear();
  size_t xb_total = 0, xq_total = 0, xd_total = 0;
  int num_outs = 0;
  for (int g = 0; g < num_groups; g++) {
    const MatmulGroup& gr = groups[g];
    if (gr.T <= 0) continue;
    bool any_bf16 = false, any_q8 = false;
    const size_t group_sets = q4_sets.size();
    for (int i = 0; i < gr.num_outs; i++) {
      const LinearOut& o = gr.outs[i];
      any_bf16 |= o.w_dtype == DType::BF16;
      any_q8 |= o.w_dtype == DType::Q8_0;
      int set = -1;
      if (o.w_dtype == DType::Q4) {
        const Q4View v = q4_view(o.w);
        if (v.h->N != o.N || v.h->K != gr.K || v.h->group <= 0 || v.h->group % kQ8Block != 0)
          throw std::invalid_argument("matmul: Q4 weights of another shape, or a group not a multiple of 32");
        for (size_t s = group_sets; s < q4_sets.size() && set < 0; s++)
          if (q4_sets[s].perm == v.perm) set = int(s);
        if (set < 0) {
          const int64_t Kp = q4_padded_k(gr.K);
          set = int(q4_sets.size());
          q4_sets.push_back({g, v.perm, xq_total, xd_total});
          xq_total += size_t(gr.T * Kp);
          xd_total += size_t(gr.T * (Kp / kQ8Block));
        }
      }
      q4_set_of.push_back(set);
    }
    num_outs += gr.num_outs;
    if (level == SimdLevel::Avx512Bf16 && any_bf16) {
      xb_off[size_t(g)] = xb_total;
      xb_total += size_t(bf16_rows * gr.T * gr.K);
    }
    if (any_q8) {
      const int64_t Kp = q8_padded_k(gr.K);
      xq_off[size_t(g)] = xq_total;
      xd_off[size_t(g)] = xd_total;
      xq_total += size_t(gr.T * Kp);
      xd_total += size_t(gr.T * (Kp / kQ8Block));
    }
  }
  if (num_outs == 0) return;
  xb.resize(xb_total);
  xq.resize(xq_total);
  xd.resize(xd_total);
  xs.resize(q4_sets.empty() ? 0 : xd_total);
  for (int g = 0; g < num_groups; g++) {
    const MatmulGroup& gr = groups[g];
    const int64_t T = gr.T, K = gr.K;
    if (T <= 0) continue;
    const float* x = gr.x;
    if (xb_off[size_t(g)] != SIZE_MAX) {
      uint16_t* xbp = xb.data() + xb_off[size_t(g)];
      // A few rows convert faster on this thread than a parallel region costs to start.
      if (T * K <= 16384) rows_to_bf16_avx512bf16(x, T, K, split, xbp);
      else pool.parallel_for(T, 16, [&](int64_t b, int64_t e) { rows_to_bf16_avx512bf16(x + b * K, e - b, K, split, xbp + bf16_rows * b * K); });
    }
    if (xq_off[size_t(g)] != SIZE_MAX) {
      const int64_t Kp = q8_padded_k(K);
      int8_t* xqp = xq.data() + xq_off[size_t(g)];
      float* xdp = xd.data() + xd_off[size_t(g)];
      if (T * K <= 16384) quantize_activations_q8(x, T, K, xqp, xdp);
      else pool.parallel_for(T, 16, [&](int64_t b, int64_t e) { quantize_activations_q8(x + b * K, e - b, K, xqp + b * Kp, xdp + b * (Kp / kQ8Block)); });
    }
  }
  for (const Q4Set& set : q4_sets) {
    const MatmulGroup& gr = groups[set.group];
    const int64_t T = gr.T, K = gr.K, Kp = q4_padded_k(K), nb = Kp / kQ8Block;
    const float* x = gr.x;
    const int32_t* perm = set.perm;
    int8_t* xqp = xq.data() + set.xq;
    float* xdp = xd.data() + set.xd;
    float* xsp = xs.data() + set.xd;
    if (T * K <= 16384) quantize_activations_q4(x, T, K, perm, xqp, xdp, xsp);
    else pool.parallel_for(T, 16, [&](int64_t b, int64_t e) { quantize_activations_q4(x + b * K, e - b, K, perm, xqp + b * Kp, xdp + b * nb, xsp + b * nb); });
  }
  using Kernel = void (*)(const GemmArgs&, int64_t, int64_t);
  thread_local std::vector<GemmArgs> args;
  thread_local std::vector<Kernel> kernels;
  thread_local std::vector<int64_t> rows, row_bytes;
  args.assign(size_t(num_outs), GemmArgs{});
  kernels.assign(size_t(num_outs), gemm_generic);
  rows.resize(size_t(num_outs));
  row_bytes.resize(size_t(num_outs));
  int n = 0;
  for (int g = 0; g < num_groups; g++) {
    const MatmulGroup& gr = groups[g];
    if (gr.T <= 0) continue;
    for (int i = 0; i < gr.num_outs; i++, n++) {
      const LinearOut& o = gr.outs[i];
      GemmArgs& a = args[size_t(n)];
      a.x = gr.x;
      a.T = gr.T;
      a.K = gr.K;
      a.N = o.N;
      a.w = o.w;
      a.w_dtype = o.w_dtype;
      a.bias = o.bias;
      a.bias_dtype = o.bias_dtype;
      a.y = o.y;
      rows[size_t(n)] = o.N;
      row_bytes[size_t(n)] = weight_row_bytes(o.w_dtype, gr.K, o.w);
      Kernel& k = kernels[size_t(n)];
      if (o.w_dtype == DType::Q4) {
        const Q4Set& set = q4_sets[size_t(q4_set_of[size_t(n)])];
        a.xq = xq.data() + set.xq;
        a.xd = xd.data() + set.xd;
        a.xs = xs.data() + set.xd;
        k = level >= SimdLevel::Avx512 && cpu_has_avx512vnni() ? gemm_q4_avx512vnni
            : level >= SimdLevel::Avx2                         ? gemm_q4_avx2
                                                               : gemm_q4_generic;
      } else if (o.w_dtype == DType::Q8_0) {
        a.xq = xq.data() + xq_off[size_t(g)];
        a.xd = xd.data() + xd_off[size_t(g)];
        k = level >= SimdLevel::Avx512 && cpu_has_avx512vnni() ? gemm_q8_avx512vnni
            : level >= SimdLevel::Avx2                         ? gemm_q8_avx2
                                                               : gemm_q8_generic;
      } else if (level == SimdLevel::Avx512Bf16 && o.w_dtype == DType::BF16) {
        a.xb = xb.data() + xb_off[size_t(g)];
        a.xb_split = split;
        k = gemm_avx512bf16;
      } else if (level >= SimdLevel::Avx512) {
        k = gemm_avx512;
      } else if (level == SimdLevel::Avx2) {
        k = gemm_avx2;
      }
    }
  }
  // Work list: contiguous chunks of output features of every output. Threads take chunks from a
  // shared counter, so a thread slowed by something else on the machine does not hold the
  // others up, and one parallel region serves all outputs. Which thread computes an output
  // never changes its value.
  thread_local std::vector<MatmulChunk> chunks;
  const int threads = pool.size();
  chunk_rows(num_outs, rows.data(), row_bytes.data(), threads, chunks);
  const MatmulChunk* list = chunks.data();
  const GemmArgs* arg = args.data();
  const Kernel* kernel = kernels.data();
  const int64_t num_chunks = int64_t(chunks.size());
  if (threads == 1 || num_chunks == 1) {
    for (int64_t c = 0; c < num_chunks; c++) kernel[list[c].out](arg[list[c].out], list[c].begin, list[c].end);
    return;
  }
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    for (int64_t c = next.fetch_add(1); c < num_chunks; c = next.fetch_add(1))
      kernel[list[c].out](arg[list[c].out], list[c].begin, list[c].end);
  });
}

void matmul_multi(ThreadPool& pool, const float* x, int64_t T, int64_t K, const LinearOut* outs, int num_outs,
                  MatmulPrecision precision) {
  if (T <= 0 || num_outs <= 0) return;
  const MatmulGroup group{x, T, K, outs, num_outs};
  matmul_groups(pool, &group, 1, precision);
}

void matmul(ThreadPool& pool, const float* x, int64_t T, int64_t K, const void* W, DType w_dtype, int64_t N,
            const void* bias, DType bias_dtype, float* y, MatmulPrecision precision) {
  if (N <= 0) return;
  const LinearOut out{W, w_dtype, N, bias, bias_dtype, y};
  matmul_multi(pool, x, T, K, &out, 1, precision);
}

void rmsnorm(ThreadPool& pool, const float* x, int64_t T, int64_t D, const void* weight, DType w_dtype, float eps,
             float* out) {
  // NOTE: the AVX-512 levels keep the generic row, so their recorded results stay bit for bit.
  auto fn = pick(rmsnorm_row_generic, rmsnorm_row_avx2, rmsnorm_row_generic);
  pool.parallel_for(T, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) fn(x + t * D, D, weight, w_dtype, eps, out + t * D);
  });
}

void silu_mul(ThreadPool& pool, const float* gate_up, int64_t T, int64_t D, float* out) {
  auto fn = pick(silu_mul_generic, silu_mul_avx2, silu_mul_avx512);
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) fn(gate_up + t * 2 * D, gate_up + t * 2 * D + D, D, out + t * D);
  });
}

void silu_mul_split(ThreadPool& pool, const float* gate, const float* up, int64_t T, int64_t D, float* out) {
  auto fn = pick(silu_mul_generic, silu_mul_avx2, silu_mul_avx512);
  // Split on multiples of 16 so every element goes through the same vector lane position class.
  // At least 16K elements a thread: a decode row (a few thousand) runs on the caller, without
  // a parallel region that costs more than it saves.
  const int64_t n = T * D, units = (n + 15) / 16;
  pool.parallel_for(units, 1024, [&](int64_t b, int64_t e) {
    const int64_t lo = b * 16, hi = std::min(n, e * 16);
    fn(gate + lo, up + lo, hi - lo, out + lo);
  });
}

void gelu_tanh_mul_split(ThreadPool& pool, const float* gate, const float* up, int64_t T, int64_t D, float* out) {
  const int64_t n = T * D;
  pool.parallel_for(n, 16384, [&](int64_t b, int64_t e) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    for (int64_t i = b; i < e; i++) {
      const float g = gate[i];
      out[i] = 0.5f * g * (1.0f + std::tanh(c * (g + 0.044715f * g * g * g))) * up[i];
    }
  });
}

void swiglu_clamped_mul_split(ThreadPool& pool, const float* gate, const float* up, int64_t T, int64_t D, float limit,
                              float* out) {
  const int64_t n = T * D;
  pool.parallel_for(n, 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) {
      const float g = std::min(gate[i], limit);
      const float u = std::min(std::max(up[i], -limit), limit);
      out[i] = (u + 1.0f) * (g / (1.0f + std::exp(-1.702f * g)));
    }
  });
}

void add_inplace(ThreadPool& pool, float* x, const float* y, int64_t n) {
  pool.parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) x[i] += y[i];
  });
}

void embedding(ThreadPool& pool, const int32_t* ids, int64_t T, const void* table, DType dtype, int64_t D, float* out) {
  pool.parallel_for(T, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++)
      for (int64_t d = 0; d < D; d++) out[t * D + d] = load_scalar(table, dtype, int64_t(ids[t]) * D + d);
  });
}

void rope(ThreadPool& pool, float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
          const float* inv_freq, const int32_t* positions, const int32_t* mrope_positions, const int64_t* mrope_section) {
  const int64_t half = rot_dim / 2;
  pool.parallel_for(T, 16, [&](int64_t b, int64_t e) {
    std::vector<float> cs(size_t(2 * half));
    for (int64_t t = b; t < e; t++) {
      // Angles in double from the f32 frequencies, then rounded: cos/sin depend only on the position.
      for (int64_t i = 0; i < half; i++) {
        int32_t pos = positions[t];
        if (mrope_positions) {
          const int c = i < mrope_section[0] ? 0 : i < mrope_section[0] + mrope_section[1] ? 1 : 2;
          pos = mrope_positions[3 * t + c];
        }
        const double angle = double(pos) * double(inv_freq[i]);
        cs[size_t(i)] = float(std::cos(angle));
        cs[size_t(half + i)] = float(std::sin(angle));
      }
      for (int64_t h = 0; h < n_heads; h++) {
        float* v = x + (t * n_heads + h) * head_dim;
        for (int64_t i = 0; i < half; i++) {
          const float c = cs[size_t(i)], s = cs[size_t(half + i)];
          const float x0 = v[i], x1 = v[i + half];
          v[i] = x0 * c - x1 * s;
          v[i + half] = x1 * c + x0 * s;
        }
      }
    }
  });
}

namespace {

// The K/V cache dtypes kv_write and paged_attention handle; any other is a caller's bug.
void check_kv_dtype(DType dtype, const char* what) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F8E4M3)
    throw Error(ErrorCode::kInternal,
                std::string(what) + ": a KV cache of dtype " + dtype_name(dtype) + " (f32, bf16 or f8_e4m3 only)");
}

}  // namespace

void kv_write(ThreadPool& pool, const PagedKV& cache, const float* k, const float* v, const int32_t* slots, int64_t T) {
  check_kv_dtype(cache.dtype, "kv_write");
  const int64_t row = cache.n_kv_heads * cache.head_dim;
  for (int64_t t = 0; t < T; t++) {
    const int64_t dst = int64_t(slots[t]) * row;
    const float* kt = k + t * row;
    const float* vt = v + t * row;
    if (cache.dtype == DType::F32) {
      std::memcpy(static_cast<float*>(cache.k) + dst, kt, size_t(row) * sizeof(float));
      std::memcpy(static_cast<float*>(cache.v) + dst, vt, size_t(row) * sizeof(float));
    } else if (cache.dtype == DType::F8E4M3) {
      // value / scale, divided (not times a reciprocal) so a code is exactly the nearest one to it.
      uint8_t* kd = static_cast<uint8_t*>(cache.k) + dst;
      uint8_t* vd = static_cast<uint8_t*>(cache.v) + dst;
      for (int64_t i = 0; i < row; i++) {
        kd[i] = f32_to_e4m3(kt[i] / cache.k_scale);
        vd[i] = f32_to_e4m3(vt[i] / cache.v_scale);
      }
    } else {
      uint16_t* kd = static_cast<uint16_t*>(cache.k) + dst;
      uint16_t* vd = static_cast<uint16_t*>(cache.v) + dst;
      for (int64_t i = 0; i < row; i++) {
        kd[i] = f32_to_bf16(kt[i]);
        vd[i] = f32_to_bf16(vt[i]);
      }
    }
  }
}

void paged_attention(ThreadPool& pool, const float* q, int64_t T, const AttentionBatch& b, const PagedKV& cache,
                     float* out) {
  check_kv_dtype(cache.dtype, "paged_attention");
  const int64_t H = b.n_heads, hd = cache.head_dim, n_kv = cache.n_kv_heads, group = H / n_kv;
  const SimdLevel level = simd_level();
  const bool avx512 = level >= SimdLevel::Avx512 && hd <= 256, avx2 = level == SimdLevel::Avx2;
  auto group_fn = avx512 ? attend_group_avx512 : avx2 ? attend_group_avx2 : nullptr;
  AttendFn fn = avx512 ? attend_avx512 : avx2 ? attend_avx2 : attend_generic;
  // Work items are (token, kv head) pairs covering that kv head's query heads; a token's result
  // never depends on the others. Items go to threads through a shared counter: long and short
  // contexts in one batch would leave a static split unbalanced.
  std::atomic<int64_t> next{0};
  const int64_t items = T * n_kv;
  pool.run([&](int, int) {
    thread_local std::vector<float> scores;
    for (int64_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) {
      const int64_t t = item / n_kv, kvh = item % n_kv;
      const int64_t at = b.token_pos[t], pos = b.token_last ? b.token_last[t] : at;
      // A sliding window reads positions first..pos only.
      PagedKV span = cache;
      span.first = b.window > 0 ? std::max<int64_t>(0, at - b.window + 1) : 0;
      if (scores.size() < size_t(group * (pos + 16))) scores.resize(size_t(group * (pos + 16)));
      const float* q_group = q + (t * H + kvh * group) * hd;
      float* out_group = out + (t * H + kvh * group) * hd;
      const int32_t* table = b.block_tables[b.token_seq[t]];
      if (!b.sinks && group_fn && group_fn(q_group, group, table, pos, kvh, span, b.scale, scores.data(), out_group))
        continue;
      for (int64_t g = 0; g < group; g++) {
        if (b.sinks) {
          span.has_sink = true;
          span.sink = b.sinks[kvh * group + g];
        }
        fn(q_group + g * hd, table, pos, kvh, span, b.scale, scores.data(), out_group + g * hd);
      }
    }
  });
}

void logits_stats(ThreadPool& pool, const float* logits, int64_t R, int64_t V, int32_t* argmax, float* log_sum_exp) {
  auto fn = pick(logits_row_stats_generic, logits_row_stats_avx2, logits_row_stats_avx512);
  pool.parallel_for(R, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) fn(logits + r * V, V, argmax + r, log_sum_exp + r);
  });
}

void apply_token_masks(ThreadPool& pool, float* logits, int64_t R, int64_t V, const uint32_t* const* allow,
                       uint8_t* allows_any) {
  auto fn = pick(mask_row_generic, mask_row_avx2, mask_row_avx512);
  int64_t masked = 0;
  for (int64_t r = 0; r < R; r++) {
    allows_any[r] = 1;
    masked += allow[r] != nullptr;
  }
  if (masked == 0) return;
  pool.parallel_for(R, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++)
      if (allow[r]) allows_any[r] = fn(logits + r * V, V, allow[r]) ? 1 : 0;
  });
}

size_t probe_bytes() {
  size_t largest = 0;
  for (int index = 0; index < 8; index++) {
    const std::string path = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size";
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;
    unsigned long long size = 0;
    char unit = 0;
    if (std::fscanf(f, "%llu%c", &size, &unit) >= 1)
      largest = std::max<size_t>(largest, size_t(size) * (unit == 'K' ? 1024 : unit == 'M' ? 1 << 20 : 1));
    std::fclose(f);
  }
  return std::max<size_t>(size_t(1) << 30, 8 * largest);
}

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeats, bool keep_buffer) {
  if (bytes == 0) bytes = probe_bytes();
  const size_t n = bytes / sizeof(uint64_t);
  // The kind of memory the CPU backend streams its weights from (resident_weights.h), filled
  // once; a kept buffer serves the next call of the same size.
  static std::mutex kept_mu;
  static std::unique_ptr<HostBuffer> kept;
  std::unique_lock<std::mutex> lock(kept_mu);
  std::unique_ptr<HostBuffer> mem = std::move(kept);
  if (!mem || mem->size() != n * sizeof(uint64_t)) {
    mem.reset();  // (a kept buffer of another size is freed first)
    mem = std::make_unique<HostBuffer>(n * sizeof(uint64_t));
    uint64_t* fill = reinterpret_cast<uint64_t*>(mem->data());
    pool.parallel_for(int64_t(n), 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) fill[i] = uint64_t(i);
    });
  }
  uint64_t* buf = reinterpret_cast<uint64_t*>(mem->data());
  double best = 0;
  std::vector<uint64_t> sinks(size_t(pool.size()) * 8);
  for (int r = 0; r < repeats; r++) {
    auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int index, int num) {
      const size_t begin = n * size_t(index) / size_t(num), end = n * size_t(index + 1) / size_t(num);
      // Four independent accumulators keep the loads in flight; XOR cannot be optimized away.
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      size_t i = begin;
      for (; i + 4 <= end; i += 4) {
        s0 ^= buf[i];
        s1 ^= buf[i + 1];
        s2 ^= buf[i + 2];
        s3 ^= buf[i + 3];
      }
      for (; i < end; i++) s0 ^= buf[i];
      sinks[size_t(index) * 8] = s0 ^ s1 ^ s2 ^ s3;
    });
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(n * sizeof(uint64_t)) / dt);
  }
  volatile uint64_t keep = sinks[0];
  (void)keep;
  if (keep_buffer) kept = std::move(mem);
  return best;
}

}  // namespace sluice::cpu
