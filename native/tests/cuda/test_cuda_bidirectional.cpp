// Bidirectional attention within an image (Gemma 3; AttentionArgs::last): the paged kernel
// (paged_attention, one split and several), the flash prefill kernel (flash_prefill_attention)
// and flash decode's hand-off to the paged kernel, against a double-precision reference computed
// on the host from the same E-rounded K/V and f32 q. Token t attends to positions
// first .. last[t], first = max(0, positions[t] - window + 1) (0 without a window), last[t] the
// image's last position for the image's tokens and positions[t] for the others. Exits 77 (ctest:
// skipped) when no CUDA device is present.
//
// Images sit at the start of chunks, across the flash kernel's 64-row query tiles and its KV
// tiles, longer than the windows (so a token's range can start after its image's start and end
// past its position), and in several sequences of one step. Block tables are shuffled and every
// slot past a sequence's context holds NaN.
//
// Tolerances as test_cuda_flash_attention.cpp (u: E's unit roundoff, wabs: the row's
// attention-weighted mean |v|): flash 5u * wabs + 1e-3 (P and the output rounded to E, q rounded
// to E), paged 3u * wabs + 1e-3 (the output rounded to E). Masking is checked exactly with q = 0
// and small-integer V: the output is the plain mean of exactly the visible V rows (tolerance:
// the final rounding, 2u * |ref|); a position wrongly in or out moves it by about |v - mean| / n.
// With last[t] == positions[t] for every token the kernels give the bits they give without last.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/flash_attention.h"
#include "cuda/flash_decode.h"
#include "cuda/kernels.h"
#include "sluice/dtype.h"
#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace sluice;
using sluice_cuda_test::Dev;

namespace {

constexpr uint16_t kNaN16 = 0xffff;  // NaN in bf16 and in f16

uint16_t to_e(float f, DType e) { return e == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f); }
double from_e(uint16_t h, DType e) { return e == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }
double unit_roundoff(DType e) { return e == DType::BF16 ? 1.0 / 256 : 1.0 / 2048; }

// One sequence of the step: positions first .. first + count - 1 are computed now; images are
// inclusive position ranges [begin, end] whose tokens attend up to `end`. The cache holds every
// position up to the chunk's last or an image's end, whichever is later.
struct Seq {
  int first, count;
  std::vector<std::pair<int, int>> images;
};

struct Step {
  int bs = 16, stride = 0, num_blocks = 0;
  std::vector<int32_t> token_seq, positions, last, tables;
  std::vector<int> context;
  size_t slot(int s, int p) const { return size_t(tables[size_t(s) * stride + p / bs]) * bs + p % bs; }
};

Step make_step(const std::vector<Seq>& seqs, std::mt19937& rng) {
  Step st;
  std::vector<int> ctx;
  int used = 0, max_blocks = 0;
  for (const Seq& s : seqs) {
    int c = s.first + s.count;
    for (const auto& im : s.images) c = std::max(c, im.second + 1);
    ctx.push_back(c);
    const int blocks = (c + st.bs - 1) / st.bs;
    used += blocks;
    max_blocks = std::max(max_blocks, blocks);
  }
  st.num_blocks = used + 2;  // spare blocks (NaN) that table entries past a sequence's blocks name
  st.stride = max_blocks + 1;
  std::vector<int> perm(static_cast<size_t>(st.num_blocks));
  for (int i = 0; i < st.num_blocks; i++) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  st.tables.assign(seqs.size() * size_t(st.stride), perm[size_t(used)]);
  int next = 0;
  for (size_t s = 0; s < seqs.size(); s++) {
    st.context.push_back(ctx[s]);
    for (int b = 0; b < (ctx[s] + st.bs - 1) / st.bs; b++) st.tables[s * size_t(st.stride) + size_t(b)] = perm[size_t(next++)];
    for (int p = seqs[s].first; p < seqs[s].first + seqs[s].count; p++) {
      int last = p;
      for (const auto& im : seqs[s].images)
        if (p >= im.first && p <= im.second) last = im.second;
      st.token_seq.push_back(int32_t(s));
      st.positions.push_back(p);
      st.last.push_back(last);
    }
  }
  return st;
}

struct Config {
  DType e = DType::BF16;
  int hd = 128, nq = 8, nkv = 2;
  int window = 0;
  bool zero_q = false;  // the exact masking check: q = 0, integer V
  uint32_t seed = 1;
};

std::string describe(const Config& c) {
  return std::string(dtype_name(c.e)) + " hd=" + std::to_string(c.hd) + " nq=" + std::to_string(c.nq) +
         " nkv=" + std::to_string(c.nkv) + " window=" + std::to_string(c.window) + (c.zero_q ? " q=0" : "");
}

// Runs the kernels on `seqs` and checks them against the reference. flash: the flash prefill
// kernel too (and flash decode, which must hand the step to the paged kernel: the same bits).
void check_bidirectional(const Config& c, const std::vector<Seq>& seqs, bool flash) {
  std::mt19937 rng(c.seed);
  const Step st = make_step(seqs, rng);
  const int T = int(st.token_seq.size()), nq = c.nq, nkv = c.nkv, hd = c.hd;
  const DType e = c.e;
  const size_t slots = size_t(st.num_blocks) * st.bs, row = size_t(nkv) * hd;

  std::vector<uint16_t> kc(slots * row, kNaN16), vc(slots * row, kNaN16);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> small_int(-8, 8);
  for (size_t s = 0; s < seqs.size(); s++)
    for (int p = 0; p < st.context[s]; p++) {
      const size_t base = st.slot(int(s), p) * row;
      for (size_t i = 0; i < row; i++) {
        kc[base + i] = to_e(nd(rng), e);
        vc[base + i] = to_e(c.zero_q ? float(small_int(rng)) : nd(rng), e);
      }
    }
  std::vector<float> q(size_t(T) * nq * hd, 0.f);
  if (!c.zero_q)
    for (auto& v : q) v = nd(rng);
  const double scale = 1.0 / std::sqrt(double(hd));

  constexpr int kSplits = 3;
  Dev<float> dq(q);
  Dev<float> part_acc(size_t(T) * nq * kSplits * hd), part_ml(size_t(T) * nq * kSplits * 2);
  Dev<int32_t> dseq(st.token_seq), dpos(st.positions), dlast(st.last), dtab(st.tables),
      dstride(std::vector<int32_t>{st.stride});
  Dev<uint16_t> dk(kc), dv(vc);
  Dev<int> tickets(size_t(T) * nkv);
  tickets.zero();
  const int ld_out = nq * hd;
  const size_t out_elems = size_t(T) * ld_out;
  Dev<uint16_t> out_paged(out_elems), out_split(out_elems), out_flash(out_elems), out_decode(out_elems);
  cuda::AttentionArgs a;
  a.q = dq.p, a.T = T, a.nq = nq, a.nkv = nkv, a.hd = hd, a.token_seq = dseq.p, a.positions = dpos.p;
  a.last = dlast.p;
  a.block_tables = dtab.p, a.table_stride = dstride.p, a.block_size = st.bs, a.k_cache = dk.p, a.v_cache = dv.p;
  a.scale = float(scale), a.num_splits = 1, a.ld_out = ld_out, a.window = c.window;
  a.partial_acc = part_acc.p, a.partial_ml = part_ml.p;

  a.out = out_paged.p;
  cuda::paged_attention(a, e, nullptr);
  a.num_splits = kSplits;
  a.out = out_split.p;
  cuda::paged_attention(a, e, nullptr);
  if (flash) {
    // Flash decode does not take `last`: it hands the step (splits included) to the paged kernel.
    a.out = out_decode.p;
    cuda::flash_decode_attention(a, e, tickets.p, nullptr);
    a.num_splits = 1;
    a.out = out_flash.p;
    CHECK(cuda::flash_prefill_supported(hd, nq, nkv));
    cuda::flash_prefill_attention(a, e, nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  const auto paged = out_paged.read(), split = out_split.read();
  std::vector<uint16_t> fl, dec;
  if (flash) {
    fl = out_flash.read(), dec = out_decode.read();
    CHECK(std::memcmp(dec.data(), split.data(), split.size() * sizeof(uint16_t)) == 0);
  }

  const double u = unit_roundoff(e);
  int bad[3] = {0, 0, 0};  // paged, paged split, flash
  double worst[3] = {0, 0, 0};
  std::vector<double> sc, acc(static_cast<size_t>(hd)), wab(static_cast<size_t>(hd));
  std::vector<size_t> key_slots;
  for (int t = 0; t < T; t++) {
    const int s = st.token_seq[size_t(t)], pos = st.positions[size_t(t)], last = st.last[size_t(t)];
    const int lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    key_slots.clear();
    for (int p = lo; p <= last; p++) key_slots.push_back(st.slot(s, p));
    for (int h = 0; h < nq; h++) {
      const int kvh = h / (nq / nkv);
      const float* qh = q.data() + (size_t(t) * nq + h) * hd;
      sc.assign(key_slots.size(), 0.0);
      double mx = -INFINITY;
      for (size_t i = 0; i < key_slots.size(); i++) {
        const uint16_t* k = kc.data() + key_slots[i] * row + size_t(kvh) * hd;
        double d = 0;
        for (int x = 0; x < hd; x++) d += double(qh[x]) * from_e(k[x], e);
        sc[i] = d * scale;
        mx = std::max(mx, sc[i]);
      }
      double denom = 0.0;
      for (auto& v : sc) denom += (v = std::exp(v - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(wab.begin(), wab.end(), 0.0);
      for (size_t i = 0; i < key_slots.size(); i++) {
        const uint16_t* v = vc.data() + key_slots[i] * row + size_t(kvh) * hd;
        for (int x = 0; x < hd; x++) {
          const double vx = from_e(v[x], e);
          acc[size_t(x)] += sc[i] * vx;
          wab[size_t(x)] += sc[i] * std::fabs(vx);
        }
      }
      for (int x = 0; x < hd; x++) {
        const double ref = acc[size_t(x)] / denom, wabs = wab[size_t(x)] / denom;
        const size_t at = size_t(t) * ld_out + size_t(h) * hd + x;
        const double tols[3] = {c.zero_q ? 2 * u * std::fabs(ref) + 1e-5 : 3 * u * wabs + 1e-3,
                                c.zero_q ? 2 * u * std::fabs(ref) + 1e-5 : 3 * u * wabs + 1e-3,
                                c.zero_q ? 2 * u * std::fabs(ref) + 1e-5 : 5 * u * wabs + 1e-3};
        const std::vector<uint16_t>* outs[3] = {&paged, &split, &fl};
        static const char* const names[3] = {"paged", "paged split", "flash"};
        for (int k = 0; k < (flash ? 3 : 2); k++) {
          const double got = from_e((*outs[k])[at], e), err = std::fabs(got - ref);
          worst[k] = std::max(worst[k], err / tols[k]);
          if (!(err <= tols[k])) {
            if (bad[k] < 3)
              std::printf("    %s t=%d (seq %d pos %d last %d) h=%d d=%d: %.6g, reference %.6g\n", names[k], t, s, pos,
                          last, h, x, got, ref);
            bad[k]++;
          }
        }
      }
    }
  }
  if (bad[0] || bad[1] || bad[2])
    std::printf("  bidirectional %s: off the reference: paged %d (worst %.2fx tol), split %d (%.2fx), flash %d (%.2fx)\n",
                describe(c).c_str(), bad[0], worst[0], bad[1], worst[1], bad[2], worst[2]);
  CHECK(bad[0] == 0);
  CHECK(bad[1] == 0);
  CHECK(bad[2] == 0);
}

// Prefill chunks with images: seq 0 continues after a 40-token prefix with an image of 40 tokens
// across the first query tile's end and one of 6, seq 1 has an image inside a short chunk, seq 2
// decodes at 300 (causal), seq 3 starts with a 64-token image. Query tiles hold rows of several.
const std::vector<Seq> kMixed = {{40, 100, {{50, 89}, {120, 125}}}, {0, 10, {{2, 7}}}, {300, 1, {}}, {0, 70, {{0, 63}}}};
// Long chunks: a 256-token image over many KV and query tiles; an image right after a long prefix.
const std::vector<Seq> kLong = {{0, 300, {{10, 265}}}, {1000, 130, {{1001, 1064}}}};
// One token per sequence (decode-shaped), some attending past their position (synthetic: the
// cache holds the later positions).
const std::vector<Seq> kDecode = {{36, 1, {{36, 40}}}, {0, 1, {}}, {15, 1, {{15, 47}}}, {1000, 1, {{1000, 1003}}}};

}  // namespace

TEST_CASE(bidirectional_attention_matches_double_reference) {
  uint32_t seed = 1;
  for (DType e : {DType::BF16, DType::F16})
    for (int hd : {64, 128, 256})
      for (int window : {0, 16, 32}) {
        Config c;
        c.e = e, c.hd = hd, c.window = window;
        c.nq = hd == 256 ? 8 : 4, c.nkv = hd == 256 ? 4 : 1;  // Gemma 3 4B: 8 q heads, 4 kv heads of 256
        c.seed = seed++;
        check_bidirectional(c, kMixed, true);
        if (hd == 128) check_bidirectional(c, kLong, true);
        if (hd == 64) check_bidirectional(c, kDecode, true);
      }
  Config c;  // a head dim only the paged kernel takes
  c.hd = 96, c.nq = 4, c.nkv = 2, c.window = 16, c.seed = seed++;
  check_bidirectional(c, kMixed, false);
}

TEST_CASE(bidirectional_attention_masks_exactly) {
  // q = 0: the output is the mean of exactly the visible V rows. Windows of 1, 16 and 100, none.
  uint32_t seed = 300;
  for (DType e : {DType::BF16, DType::F16})
    for (int hd : {64, 256})
      for (int window : {0, 1, 16, 100}) {
        Config c;
        c.e = e, c.hd = hd, c.nq = 4, c.nkv = 1, c.window = window, c.zero_q = true, c.seed = seed++;
        check_bidirectional(c, kMixed, true);
        check_bidirectional(c, kLong, true);
        check_bidirectional(c, kDecode, true);
      }
}

TEST_CASE(causal_last_gives_the_same_bits) {
  // last[t] == positions[t] everywhere: the same bits as without `last` (paged and flash).
  std::mt19937 rng(7);
  const Step st = make_step({{40, 100, {}}, {0, 10, {}}, {300, 1, {}}, {0, 70, {}}}, rng);
  const int T = int(st.token_seq.size()), nq = 8, nkv = 4, hd = 256;
  const size_t slots = size_t(st.num_blocks) * st.bs;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> kc(slots * nkv * hd), vc(slots * nkv * hd);
  for (auto& v : kc) v = to_e(nd(rng), DType::BF16);
  for (auto& v : vc) v = to_e(nd(rng), DType::BF16);
  std::vector<float> q(size_t(T) * nq * hd);
  for (auto& v : q) v = nd(rng);
  CHECK(st.last == st.positions);
  Dev<float> dq(q);
  Dev<int32_t> dseq(st.token_seq), dpos(st.positions), dlast(st.last), dtab(st.tables),
      dstride(std::vector<int32_t>{st.stride});
  const size_t n = size_t(T) * nq * hd;
  Dev<uint16_t> dk(kc), dv(vc), out[4] = {Dev<uint16_t>(n), Dev<uint16_t>(n), Dev<uint16_t>(n), Dev<uint16_t>(n)};
  for (int window : {0, 32}) {
    cuda::AttentionArgs a;
    a.q = dq.p, a.T = T, a.nq = nq, a.nkv = nkv, a.hd = hd, a.token_seq = dseq.p, a.positions = dpos.p;
    a.block_tables = dtab.p, a.table_stride = dstride.p, a.block_size = st.bs, a.k_cache = dk.p, a.v_cache = dv.p;
    a.scale = float(1.0 / std::sqrt(double(hd))), a.num_splits = 1, a.ld_out = nq * hd, a.window = window;
    for (int with_last = 0; with_last < 2; with_last++) {
      a.last = with_last ? dlast.p : nullptr;
      a.out = out[with_last].p;
      cuda::paged_attention(a, DType::BF16, nullptr);
      a.out = out[2 + with_last].p;
      cuda::flash_prefill_attention(a, DType::BF16, nullptr);
    }
    CUDA_OK(cudaDeviceSynchronize());
    const auto p0 = out[0].read(), p1 = out[1].read(), f0 = out[2].read(), f1 = out[3].read();
    CHECK(std::memcmp(p0.data(), p1.data(), n * sizeof(uint16_t)) == 0);
    CHECK(std::memcmp(f0.data(), f1.data(), n * sizeof(uint16_t)) == 0);
  }
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda bidirectional attention")) return rc;
  return sluice_test::run_all("cuda bidirectional attention");
}
