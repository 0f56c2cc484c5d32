// The tensor-core flash decode attention (cuda/flash_decode.cu) against a double-precision
// reference computed on the host from the same E-rounded K/V and f32 q, and against the paged
// kernel (paged_attention, with the same split count and partial buffers) on the same inputs.
// Exits 77 (ctest: skipped) when no CUDA device is present.
//
// Steps are decode batches of T in {1, 7, 64, 256} tokens, one per sequence, with contexts mixed
// from 1 to 5000 (a third short, the rest up to 2000, a few past it), split 1, 4 or 16 ways (the
// backend fixes the split count for the longest context, so short ones leave splits empty); a
// test also puts several consecutive tokens of one sequence in a step (any T must be correct).
// Block tables are shuffled with 16-position blocks and a stride wider than needed, and every
// cache slot no token may read holds NaN: block tails past a context, spare blocks, table
// entries past a sequence's blocks, and with a window the positions before it (blocks wholly
// before it are named by the table as a NaN block, as the backend's -1 entries are never read).
//
// Tolerances, with u the unit roundoff of E (2^-8 for bf16, 2^-11 for f16) and
// wabs = sum_i p_i |v_i| / (sum_i p_i [+ exp(sink - m)]), the attention-weighted mean |v| of the
// row (the reference's), which bounds |out|:
//  - the kernel rounds P to E before P·V: |error| <= u * wabs;
//  - it rounds the output to E: <= u * |out| <= u * wabs;
//  - it rounds q to E before Q·K^T: each score moves by scale * sum_d q_d k_d eps_d, |eps_d| <= u,
//    independent across d (about u / sqrt(3) in size for these N(0, 1) inputs), and the output by
//    sum_i p_i (v_i - out) delta_i, which averages over the keys: well under 1e-3 here;
//  - f32 accumulation, exp2 and the merges of warps and splits (f32, a handful of terms) are
//    exact to ~1e-6 relative.
// The worst case of the first two is 2u * wabs; the test allows |out - ref| <= 5u * wabs + 1e-3
// (2.5x margin on the rounding terms; for bf16 about 0.02 * wabs), and 6u * wabs + 1e-3 against
// the paged kernel (whose own error is its output rounding, <= u * wabs).
// Masking is checked exactly: with q = 0 every visible score is 0, so the output is the plain
// mean of the visible V rows (divided by n + exp(sink) with a sink); V holds small integers, so
// the f32 sums are exact whatever the split and warp boundaries, and the only error left is the
// final rounding to E (at most one ulp after the f32 division: 2u * |ref|). A position wrongly
// included or excluded moves the mean by about |v - mean| / n, far above that.
// An fp8 (e4m3) cache (Config::fp8) is checked the same way against the reference reading
// code * k_scale and code * v_scale (held as f32: 2^-24 relative): the kernel converts codes to E
// exactly and folds the scales into f32 factors (~1e-7 relative), so the same tolerances hold; K
// spans 2^-10 .. 2^0 and V 2^-8 .. 2^2 times N(0, 1) (codes from subnormal to saturated), and
// with q = 0 V holds codes of small integers / v_scale (integer code values: exact f32 sums).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/flash_decode.h"
#include "cuda/kernels.h"
#include "sluice/dtype.h"
#include "test_util.h"
#include "util/e4m3.h"
#include "cuda/cuda_test_util.h"

using namespace sluice;
using sluice_cuda_test::Dev;

namespace {

constexpr uint16_t kNaN16 = 0xffff;  // NaN in bf16 and in f16

uint16_t to_e(float f, DType e) { return e == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f); }
double unit_roundoff(DType e) { return e == DType::BF16 ? 1.0 / 256 : 1.0 / 2048; }

// E bits -> float, for the reference's inner loops.
const std::vector<float>& e_table(DType e) {
  static std::vector<float> bf, f16;
  std::vector<float>& t = e == DType::BF16 ? bf : f16;
  if (t.empty()) {
    t.resize(65536);
    for (uint32_t i = 0; i < 65536; i++) t[i] = e == DType::BF16 ? bf16_to_f32(uint16_t(i)) : f16_to_f32(uint16_t(i));
  }
  return t;
}

// e4m3 code -> code * scale as f32 (the fp8 cache's values; NaN codes stay NaN).
std::vector<float> e4m3_table(float scale) {
  std::vector<float> t;
  for (double v : sluice_cuda_test::e4m3_values(scale)) t.push_back(float(v));
  return t;
}

// Normal samples for the large caches: a pool drawn once, indexed by a fast generator.
struct FastNormal {
  std::vector<float> pool;
  uint32_t state;
  explicit FastNormal(uint32_t seed) : pool(4096), state(seed * 2654435761u + 1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : pool) v = nd(rng);
  }
  uint32_t index() {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state & 4095;
  }
  float operator()() { return pool[index()]; }
};

// One sequence: the cache holds positions 0 .. ctx - 1; its `tokens` step tokens sit at the last
// positions (ctx - tokens .. ctx - 1). `lowest` (>= 0): the lowest position any run will give
// one of its tokens (the graph test moves them), else ctx - tokens.
struct Seq {
  int ctx, tokens = 1, lowest = -1;
};

struct Config {
  DType e = DType::BF16;
  int hd = 128, nq = 8, nkv = 2;
  int splits = 1;
  int window = 0;
  bool sinks = false;
  bool zero_q = false;  // the exact masking check: q = 0, integer V
  int ld_pad = 8;       // ld_out = nq * hd + ld_pad (8, 4: 8-byte stores; 2: the element path)
  bool fp8 = false;     // an e4m3 KV cache (kv_fp8) with scales kFp8KScale / kFp8VScale
  uint32_t seed = 1;
};

std::string describe(const Config& c, int T) {
  return std::string(dtype_name(c.e)) + " hd=" + std::to_string(c.hd) + " nq=" + std::to_string(c.nq) +
         " nkv=" + std::to_string(c.nkv) + " T=" + std::to_string(T) + " splits=" + std::to_string(c.splits) +
         " window=" + std::to_string(c.window) + (c.sinks ? " sinks" : "") + (c.zero_q ? " q=0" : "") +
         (c.fp8 ? " fp8 kv" : "") + " ld_pad=" + std::to_string(c.ld_pad) + " seed=" + std::to_string(c.seed);
}

// A step over a paged cache with shuffled blocks, its inputs on the host and the device.
struct Problem {
  Config c;
  int T = 0, bs = 16, stride = 0, num_blocks = 0, ld_out = 0;
  std::vector<int32_t> token_seq, positions, tables;
  std::vector<uint16_t> kc, vc;
  std::vector<float> q, sinks;
  size_t slot(int s, int p) const { return size_t(tables[size_t(s) * stride + p / bs]) * bs + p % bs; }
};

Problem make_problem(const Config& c, const std::vector<Seq>& seqs) {
  Problem P;
  P.c = c;
  std::mt19937 rng(c.seed);
  FastNormal nd(c.seed);
  const DType e = c.e;
  int used = 0, max_blocks = 0;
  for (const Seq& s : seqs) {
    const int blocks = (s.ctx + P.bs - 1) / P.bs;
    used += blocks;
    max_blocks = std::max(max_blocks, blocks);
    P.T += s.tokens;
  }
  P.num_blocks = used + 3;  // 3 spare blocks no table entry of a sequence's readable context names
  P.stride = max_blocks + 2;
  std::vector<int> perm(static_cast<size_t>(P.num_blocks));
  for (int i = 0; i < P.num_blocks; i++) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  const int spare = perm[size_t(used)];
  P.tables.assign(seqs.size() * size_t(P.stride), spare);  // entries past a sequence's blocks: NaN
  const size_t row = size_t(c.nkv) * c.hd, slots = size_t(P.num_blocks) * P.bs;
  P.kc.assign(slots * row, c.fp8 ? 0xff : kNaN16);  // 0xff: e4m3's NaN
  P.vc.assign(slots * row, c.fp8 ? 0xff : kNaN16);
  std::vector<uint16_t> pool_e;  // the pool in E: K/V are filled without a conversion per element
  for (float v : nd.pool) pool_e.push_back(to_e(v, e));
  std::vector<uint16_t> pool_k = pool_e, pool_v = pool_e;
  using sluice_cuda_test::kFp8KScale, sluice_cuda_test::kFp8VScale;
  if (c.fp8) {  // codes of the pool's values times 2^k, k in [-10, 0] for K and [-8, 2] for V
    std::uniform_int_distribution<int> k_exp(-10, 0), v_exp(-8, 2);
    for (size_t i = 0; i < nd.pool.size(); i++) {
      pool_k[i] = f32_to_e4m3(std::ldexp(nd.pool[i], k_exp(rng)) / kFp8KScale);
      pool_v[i] = f32_to_e4m3(std::ldexp(nd.pool[i], v_exp(rng)) / kFp8VScale);
    }
  }
  std::uniform_int_distribution<int> small_int(-8, 8);
  int next = 0;
  for (size_t s = 0; s < seqs.size(); s++) {
    const Seq& sq = seqs[s];
    const int lowest = sq.lowest >= 0 ? sq.lowest : sq.ctx - sq.tokens;
    const int readable = c.window > 0 ? std::max(0, lowest + 1 - c.window) : 0;  // positions before: NaN
    for (int b = 0; b < (sq.ctx + P.bs - 1) / P.bs; b++) {
      const int block = perm[size_t(next++)];
      P.tables[s * size_t(P.stride) + size_t(b)] = (b + 1) * P.bs <= readable ? spare : block;
    }
    for (int p = readable; p < sq.ctx; p++) {
      const size_t base = P.slot(int(s), p) * row;
      for (size_t i = 0; i < row; i++) {
        P.kc[base + i] = pool_k[nd.index()];
        if (!c.zero_q) P.vc[base + i] = pool_v[nd.index()];
        else if (c.fp8) P.vc[base + i] = f32_to_e4m3(float(small_int(rng)) / kFp8VScale);
        else P.vc[base + i] = to_e(float(small_int(rng)), e);
      }
    }
    for (int p = sq.ctx - sq.tokens; p < sq.ctx; p++) {
      P.token_seq.push_back(int32_t(s));
      P.positions.push_back(p);
    }
  }
  P.q.assign(size_t(P.T) * c.nq * c.hd, 0.f);
  if (!c.zero_q)
    for (auto& v : P.q) v = nd();
  std::uniform_real_distribution<float> sink_dist(-2.f, 4.f);
  for (int h = 0; h < c.nq; h++) P.sinks.push_back(sink_dist(rng));
  P.ld_out = c.nq * c.hd + c.ld_pad;
  return P;
}

// The reference outputs and weighted mean |v| ([T, nq, hd]) for the given positions.
struct Reference {
  std::vector<double> out, wabs;
};
Reference reference(const Problem& P, const std::vector<int32_t>& positions) {
  const Config& c = P.c;
  const int hd = c.hd, G = c.nq / c.nkv;
  const size_t row = size_t(c.nkv) * hd;
  const std::vector<float> k8 = e4m3_table(sluice_cuda_test::kFp8KScale), v8 = e4m3_table(sluice_cuda_test::kFp8VScale);
  const std::vector<float>& kf = c.fp8 ? k8 : e_table(c.e);  // cache element -> value
  const std::vector<float>& vf = c.fp8 ? v8 : e_table(c.e);
  const double scale = 1.0 / std::sqrt(double(hd));
  Reference R;
  R.out.assign(size_t(P.T) * c.nq * hd, 0.0);
  R.wabs.assign(R.out.size(), 0.0);
  std::vector<size_t> keys;
  std::vector<double> sc, acc(static_cast<size_t>(hd)), wab(static_cast<size_t>(hd));
  for (int t = 0; t < P.T; t++) {
    const int s = P.token_seq[size_t(t)], pos = positions[size_t(t)];
    const int lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    keys.clear();
    for (int p = lo; p <= pos; p++) keys.push_back(P.slot(s, p) * row);
    for (int h = 0; h < c.nq; h++) {
      const size_t head = size_t(h / G) * hd;
      const float* qh = P.q.data() + (size_t(t) * c.nq + h) * hd;
      sc.assign(keys.size(), 0.0);
      double mx = -INFINITY;
      for (size_t i = 0; i < keys.size(); i++) {
        const uint16_t* k = P.kc.data() + keys[i] + head;
        double d = 0;
        for (int x = 0; x < hd; x++) d += double(qh[x]) * kf[k[x]];
        sc[i] = d * scale;
        mx = std::max(mx, sc[i]);
      }
      if (c.sinks) mx = std::max(mx, double(P.sinks[size_t(h)]));
      double denom = c.sinks ? std::exp(double(P.sinks[size_t(h)]) - mx) : 0.0;
      for (auto& v : sc) denom += (v = std::exp(v - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(wab.begin(), wab.end(), 0.0);
      for (size_t i = 0; i < keys.size(); i++) {
        const uint16_t* v = P.vc.data() + keys[i] + head;
        for (int x = 0; x < hd; x++) {
          const double vx = vf[v[x]];
          acc[size_t(x)] += sc[i] * vx;
          wab[size_t(x)] += sc[i] * std::fabs(vx);
        }
      }
      for (int x = 0; x < hd; x++) {
        const size_t at = (size_t(t) * c.nq + h) * hd + x;
        R.out[at] = acc[size_t(x)] / denom;
        R.wabs[at] = wab[size_t(x)] / denom;
      }
    }
  }
  return R;
}

// The problem's device buffers and the AttentionArgs over them (out: set per launch).
struct DeviceProblem {
  Dev<float> q, sinks, part_acc, part_ml;
  Dev<int32_t> seq, pos, tab, stride, tickets;
  Dev<uint16_t> k, v;
  Dev<uint8_t> k8, v8;  // fp8: the codes as the cache's bytes (else empty)
  cuda::AttentionArgs a;
  explicit DeviceProblem(const Problem& P)
      : q(P.q),
        sinks(P.sinks),
        part_acc(size_t(P.T) * P.c.nq * P.c.splits * P.c.hd),
        part_ml(size_t(P.T) * P.c.nq * P.c.splits * 2),
        seq(P.token_seq),
        pos(P.positions),
        tab(P.tables),
        stride(std::vector<int32_t>{P.stride}),
        tickets(std::vector<int32_t>(size_t(P.T) * P.c.nkv, 0)),
        k(P.kc),
        v(P.vc),
        k8(sluice_cuda_test::narrow_codes(P.c.fp8 ? P.kc : std::vector<uint16_t>())),
        v8(sluice_cuda_test::narrow_codes(P.c.fp8 ? P.vc : std::vector<uint16_t>())) {
    const Config& c = P.c;
    a.q = q.p, a.T = P.T, a.nq = c.nq, a.nkv = c.nkv, a.hd = c.hd, a.token_seq = seq.p, a.positions = pos.p;
    a.block_tables = tab.p, a.table_stride = stride.p, a.block_size = P.bs, a.k_cache = k.p, a.v_cache = v.p;
    a.scale = float(1.0 / std::sqrt(double(c.hd))), a.num_splits = c.splits, a.ld_out = P.ld_out;
    a.partial_acc = part_acc.p, a.partial_ml = part_ml.p;
    a.window = c.window;
    a.sinks = c.sinks ? sinks.p : nullptr;
    if (c.fp8) {
      a.k_cache = k8.p, a.v_cache = v8.p;
      a.kv_fp8 = true, a.k_scale = sluice_cuda_test::kFp8KScale, a.v_scale = sluice_cuda_test::kFp8VScale;
    }
  }
  bool tickets_zero() const {
    const auto t = tickets.read();
    return std::all_of(t.begin(), t.end(), [](int32_t ticket) { return ticket == 0; });
  }
};

// Compares an output ([T, ld_out] E) for the given positions with the reference (and, when
// given, with the paged kernel's output); returns the number of mismatches, printing the first few.
int compare(const Problem& P, const std::vector<int32_t>& positions, const Reference& R,
            const std::vector<uint16_t>& got, const std::vector<uint16_t>* paged, const std::string& what) {
  const Config& c = P.c;
  const double u = unit_roundoff(c.e);
  const std::vector<float>& ef = e_table(c.e);
  int bad_ref = 0, bad_paged = 0, bad_pad = 0;
  double worst_ref = 0, worst_paged = 0;
  for (int t = 0; t < P.T; t++) {
    for (int col = c.nq * c.hd; col < P.ld_out; col++)
      if (got[size_t(t) * P.ld_out + col] != kNaN16) bad_pad++;  // the padding is left alone
    for (int h = 0; h < c.nq; h++)
      for (int x = 0; x < c.hd; x++) {
        const size_t r = (size_t(t) * c.nq + h) * c.hd + x, at = size_t(t) * P.ld_out + size_t(h) * c.hd + x;
        const double ref = R.out[r], wabs = R.wabs[r], g = ef[got[at]];
        const double tol_ref = c.zero_q ? 2 * u * std::fabs(ref) + 1e-5 : 5 * u * wabs + 1e-3;
        const double err = std::fabs(g - ref);
        worst_ref = std::max(worst_ref, err / tol_ref);
        if (!(err <= tol_ref)) {
          if (bad_ref < 4)
            std::printf("    t=%d (pos %d) h=%d d=%d: flash %.6g, reference %.6g\n", t, positions[size_t(t)], h, x, g,
                        ref);
          bad_ref++;
        }
        if (paged) {
          const double tol_paged = c.zero_q ? 4 * u * std::fabs(ref) + 1e-5 : 6 * u * wabs + 1e-3;
          const double err_paged = std::fabs(g - double(ef[(*paged)[at]]));
          worst_paged = std::max(worst_paged, err_paged / tol_paged);
          if (!(err_paged <= tol_paged)) bad_paged++;
        }
      }
  }
  if (bad_ref || bad_paged || bad_pad)
    std::printf("  %s %s: %d off the reference (worst %.2fx tol), %d off paged (worst %.2fx tol), %d padding written\n",
                what.c_str(), describe(c, P.T).c_str(), bad_ref, worst_ref, bad_paged, worst_paged, bad_pad);
  return bad_ref + bad_paged + bad_pad;
}

// Flash twice (the same bits), paged once, both against the reference; the tickets end at zero.
void check_decode(const Config& c, const std::vector<Seq>& seqs) {
  CHECK(cuda::flash_decode_supported(c.hd, c.nq, c.nkv));
  const Problem P = make_problem(c, seqs);
  DeviceProblem D(P);
  const size_t out_elems = size_t(P.T) * P.ld_out;
  Dev<uint16_t> out_flash(out_elems), out_again(out_elems), out_paged(out_elems);
  cuda::AttentionArgs a = D.a;
  a.out = out_flash.p;
  cuda::flash_decode_attention(a, c.e, D.tickets.p, nullptr);
  a.out = out_again.p;
  cuda::flash_decode_attention(a, c.e, D.tickets.p, nullptr);
  a.out = out_paged.p;
  cuda::paged_attention(a, c.e, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto flash = out_flash.read(), again = out_again.read(), paged = out_paged.read();
  CHECK(std::memcmp(flash.data(), again.data(), flash.size() * sizeof(uint16_t)) == 0);  // deterministic
  CHECK(D.tickets_zero());
  const Reference R = reference(P, P.positions);
  CHECK(compare(P, P.positions, R, flash, &paged, "flash") == 0);
}

// Decode contexts for T tokens (one per sequence): a third up to 64, most of the rest up to
// 2000, one in twenty up to 5000; with 7 tokens or more, one of context 1 and one of 5000.
std::vector<Seq> decode_seqs(int T, uint32_t seed) {
  std::mt19937 rng(seed * 7919u + 3);
  std::uniform_int_distribution<int> pct(0, 99), shortc(1, 64), mid(65, 600), longc(601, 2000), longest(2001, 5000);
  std::vector<Seq> seqs;
  for (int i = 0; i < T; i++) {
    const int r = pct(rng);
    seqs.push_back({r < 33 ? shortc(rng) : r < 75 ? mid(rng) : r < 95 ? longc(rng) : longest(rng)});
  }
  if (T >= 7) {
    seqs[0].ctx = 1;
    seqs[size_t(T) / 2].ctx = 5000;
  } else if (T == 1) {
    const int pick[] = {5000, 1, 777, 2048, 64, 4097};
    seqs[0].ctx = pick[seed % 6];
  }
  return seqs;
}

}  // namespace

TEST_CASE(flash_decode_supported_heads) {
  CHECK(cuda::flash_decode_supported(64, 8, 8));
  CHECK(cuda::flash_decode_supported(128, 32, 8));
  CHECK(cuda::flash_decode_supported(256, 8, 1));
  CHECK(cuda::flash_decode_supported(128, 64, 2));
  CHECK(!cuda::flash_decode_supported(96, 8, 8));
  CHECK(!cuda::flash_decode_supported(128, 6, 4));
  CHECK(!cuda::flash_decode_supported(128, 0, 0));
}

TEST_CASE(flash_decode_split_choice) {
  // Within [1, max_splits], never more than the longest context has pairs of KV tiles, one split
  // when the batch alone fills many waves, several for a small batch with long contexts.
  for (int T : {1, 7, 64, 256})
    for (int hd : {64, 128, 256})
      for (int64_t ctx : {1, 100, 4096, 131072}) {
        const int s = cuda::flash_decode_splits(T, 32, 8, hd, ctx, 132, 16);
        CHECK(s >= 1 && s <= 16);
        CHECK(s == 1 || int64_t(s) * 2 * (hd == 256 ? 32 : 64) <= ctx);
      }
  CHECK(cuda::flash_decode_splits(256, 32, 8, 128, 4096, 132, 16) == 1);
  CHECK(cuda::flash_decode_splits(1, 32, 8, 128, 4096, 132, 16) > 4);
  CHECK(cuda::flash_decode_splits(1, 32, 8, 96, 4096, 132, 16) == 1);  // unsupported heads
}

TEST_CASE(flash_decode_matches_double_reference_and_paged) {
  // Head dims 64/128/256 x GQA 1, 4, 8 x bf16/f16, with T, the split count, the window / sink
  // variant and the output stride turning over at different periods.
  struct Heads {
    int nq, nkv;
  };
  const Heads heads[] = {{2, 2}, {8, 2}, {8, 1}};
  const int Ts[] = {1, 7, 64, 256}, splits[] = {1, 4, 16}, pads[] = {8, 4, 2};
  int i = 0;
  for (DType e : {DType::BF16, DType::F16})
    for (int hd : {64, 128, 256})
      for (const Heads& hs : heads) {
        Config c;
        c.e = e, c.hd = hd, c.nq = hs.nq, c.nkv = hs.nkv;
        c.splits = splits[i % 3];
        const int variant = (i + i / 4) % 4;
        c.window = variant & 1 ? (i % 2 ? 100 : 1000) : 0;
        c.sinks = variant & 2;
        c.ld_pad = pads[(i / 3) % 3];
        c.seed = uint32_t(100 + i);
        const int T = Ts[i % 4];
        check_decode(c, decode_seqs(T, c.seed));
        i++;
      }
}

TEST_CASE(flash_decode_wide_groups_and_shared_sequences) {
  // GQA 12 and 16 (one block of q heads), 32 (two, both taking tickets of their kv head), and
  // steps with several consecutive tokens of one sequence.
  struct Case {
    DType e;
    int hd, nq, nkv, splits, window;
    bool sinks;
  };
  const Case cases[] = {
      {DType::BF16, 128, 24, 2, 4, 0, false}, {DType::F16, 64, 16, 1, 16, 0, true},
      {DType::BF16, 128, 64, 2, 16, 300, true}, {DType::F16, 256, 32, 1, 1, 0, false},
      {DType::BF16, 64, 64, 2, 1, 50, false},
  };
  uint32_t seed = 300;
  for (const Case& k : cases) {
    Config c;
    c.e = k.e, c.hd = k.hd, c.nq = k.nq, c.nkv = k.nkv, c.splits = k.splits, c.window = k.window, c.sinks = k.sinks;
    c.seed = seed++;
    check_decode(c, decode_seqs(7, c.seed));
    // Tokens sharing sequences: 5 tokens at the end of a 2000 context, 1 at 1, 8 at 20, 3 at 700.
    check_decode(c, {{2000, 5}, {1, 1}, {20, 8}, {700, 3}});
  }
}

TEST_CASE(flash_decode_reads_fp8_kv_cache) {
  // An e4m3 cache: head dims 64/128/256 x bf16/f16 x GQA 1, 4, 8 and 16, with 1, 4 and 16 splits
  // (the splits' partials carry v_scale), windows and sinks, tokens sharing sequences, and the
  // exact masking check.
  struct Heads {
    int nq, nkv;
  };
  const Heads heads[] = {{2, 2}, {8, 2}, {8, 1}, {16, 1}};
  const int Ts[] = {1, 7, 64}, splits[] = {1, 4, 16};
  int i = 0;
  for (DType e : {DType::BF16, DType::F16})
    for (int hd : {64, 128, 256})
      for (const Heads& hs : heads) {
        Config c;
        c.fp8 = true, c.e = e, c.hd = hd, c.nq = hs.nq, c.nkv = hs.nkv;
        c.splits = splits[i % 3];
        const int variant = (i + i / 4) % 4;
        c.window = variant & 1 ? (i % 2 ? 100 : 1000) : 0;
        c.sinks = variant & 2;
        c.ld_pad = i % 2 ? 2 : 8;
        c.seed = uint32_t(1500 + i);
        check_decode(c, decode_seqs(Ts[i % 3], c.seed));
        i++;
      }
  Config c;
  c.fp8 = true, c.hd = 128, c.nq = 24, c.nkv = 2, c.splits = 4, c.sinks = true, c.seed = 1600;
  check_decode(c, {{2000, 5}, {1, 1}, {20, 8}, {700, 3}});
  for (int hd : {64, 128, 256}) {
    Config m;
    m.fp8 = true, m.hd = hd, m.nq = 4, m.nkv = 1, m.window = 16, m.zero_q = true, m.splits = 4;
    m.seed = uint32_t(1610 + hd);
    check_decode(m, decode_seqs(7, m.seed));
  }
}

TEST_CASE(flash_decode_masks_exactly) {
  // q = 0: the output is the mean of exactly the visible V rows (see the header). Windows of 1
  // (the token alone), 16 (one block), 100 and 1000, causal (0), with and without sinks, 1, 4 and
  // 16 splits.
  const int splits[] = {1, 4, 16};
  uint32_t seed = 900;
  int i = 0;
  for (DType e : {DType::BF16, DType::F16})
    for (int hd : {64, 128, 256})
      for (int window : {0, 1, 16, 100, 1000})
        for (bool sinks : {false, true}) {
          Config c;
          c.e = e, c.hd = hd, c.nq = 4, c.nkv = 1, c.window = window, c.sinks = sinks, c.zero_q = true;
          c.splits = splits[i++ % 3];
          c.seed = seed++;
          check_decode(c, decode_seqs(7, c.seed));
        }
}

TEST_CASE(flash_decode_graph_replays_new_contexts) {
  // A captured launch replayed twice with positions rewritten in device memory in between (the
  // contexts of the second replay are longer for some tokens and shorter for others): each
  // replay gives the bits of an eager launch with those positions, which match the reference.
  // As in the backend, an eager launch (the warm-up) precedes the capture.
  Config c;
  c.e = DType::F16, c.hd = 128, c.nq = 8, c.nkv = 2, c.splits = 16, c.sinks = true, c.window = 700, c.seed = 4242;
  std::vector<Seq> seqs = decode_seqs(64, 11);
  std::mt19937 rng(5);
  std::vector<int32_t> pos_a, pos_b;
  for (Seq& s : seqs) {
    const int a = std::uniform_int_distribution<int>(0, s.ctx - 1)(rng);
    const int b = std::uniform_int_distribution<int>(0, s.ctx - 1)(rng);
    s.lowest = std::min(a, b);
    pos_a.push_back(a);
    pos_b.push_back(b);
  }
  const Problem P = make_problem(c, seqs);
  DeviceProblem D(P);
  const size_t out_elems = size_t(P.T) * P.ld_out;
  Dev<uint16_t> out_graph(out_elems), out_eager(out_elems);
  cuda::AttentionArgs a = D.a;
  a.out = out_eager.p;
  cuda::flash_decode_attention(a, c.e, D.tickets.p, nullptr);  // warm-up
  CUDA_OK(cudaDeviceSynchronize());

  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  a.out = out_graph.p;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::flash_decode_attention(a, c.e, D.tickets.p, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (const std::vector<int32_t>* positions : {&pos_a, &pos_b}) {
    D.pos.write(*positions);
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    const auto replayed = out_graph.read();
    a.out = out_eager.p;
    cuda::flash_decode_attention(a, c.e, D.tickets.p, nullptr);
    a.out = out_graph.p;
    CUDA_OK(cudaDeviceSynchronize());
    const auto eager = out_eager.read();
    CHECK(std::memcmp(replayed.data(), eager.data(), eager.size() * sizeof(uint16_t)) == 0);
    CHECK(D.tickets_zero());
    CHECK(compare(P, *positions, reference(P, *positions), replayed, nullptr, "graph replay") == 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE(flash_decode_falls_back_to_paged_elsewhere) {
  // Head dims the flash kernel does not take, and split steps without tickets, go to
  // paged_attention with the same arguments: the same bits.
  for (int hd : {96, 128}) {
    Config c;
    c.hd = hd, c.nq = 4, c.nkv = 2, c.splits = 3, c.window = 40, c.seed = 77;
    const Problem P = make_problem(c, decode_seqs(7, c.seed));
    DeviceProblem D(P);
    Dev<uint16_t> out_flash(size_t(P.T) * P.ld_out), out_paged(size_t(P.T) * P.ld_out);
    cuda::AttentionArgs a = D.a;
    CHECK(cuda::flash_decode_supported(hd, c.nq, c.nkv) == (hd == 128));
    a.out = out_flash.p;
    cuda::flash_decode_attention(a, c.e, nullptr, nullptr);
    a.out = out_paged.p;
    cuda::paged_attention(a, c.e, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto f = out_flash.read(), p = out_paged.read();
    CHECK(std::memcmp(f.data(), p.data(), f.size() * sizeof(uint16_t)) == 0);
  }
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda flash decode")) return rc;
  return sluice_test::run_all("cuda flash decode");
}
