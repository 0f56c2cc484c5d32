// The tensor-core flash prefill attention (cuda/flash_attention.cu) against a double-precision
// reference computed on the host from the same E-rounded K/V and f32 q, and against the paged
// kernel (paged_attention, one split) on the same inputs. Exits 77 (ctest: skipped) when no CUDA
// device is present.
//
// Steps mix sequences as the scheduler lays them out: chunks that start after a cached prefix,
// fresh prefills, single decode rows, so that 64-row query tiles straddle sequences. Block
// tables are shuffled, the table stride is wider than needed and every cache slot that no
// token may read (block tails past a sequence's context, spare blocks, table entries past a
// sequence's blocks) holds NaN: reading one shows in the output.
//
// Tolerances, with u the unit roundoff of E (2^-8 for bf16, 2^-11 for f16) and
// wabs = sum_i p_i |v_i| / (sum_i p_i [+ exp(sink - m)]), the attention-weighted mean |v| of the
// row (the reference's), which bounds |out|:
//  - the kernel rounds P to E before P·V: |error| <= u * wabs;
//  - it rounds the output to E: <= u * |out| <= u * wabs;
//  - it rounds q to E before Q·K^T: each score moves by scale * sum_d q_d k_d eps_d, |eps_d| <= u.
//    These moves are independent across d (for these N(0, 1) inputs about u / sqrt(3) in size)
//    and the output moves by sum_i p_i (v_i - out) delta_i, which averages over the keys: well
//    under 1e-3 here;
//  - f32 accumulation and exp2 are exact to ~1e-6 relative.
// The worst case of the first two is 2u * wabs; the test allows |out - ref| <= 5u * wabs + 1e-3
// (2.5x margin on the rounding terms; for bf16 about 0.02 * wabs, tighter than 0.02 * max|v|),
// and 6u * wabs + 1e-3 against the paged kernel (whose own error is its output rounding,
// <= u * wabs).
// Masking is checked exactly: with q = 0 every visible score is 0, so the output is the plain
// mean of the visible V rows (divided by n + exp(sink) with a sink); V holds small integers, so
// the f32 sums are exact and the only error left is the final rounding to E (at most one ulp
// after the f32 division: 2u * |ref|). A position wrongly included or excluded moves the mean by
// about |v - mean| / n, far above that.
// An fp8 (e4m3) cache (Config::fp8) is checked the same way against the reference reading
// code * k_scale and code * v_scale (sluice_cuda_test::e4m3_values): the kernel converts codes to
// E exactly and folds the scales into f32 factors (~1e-7 relative), so the same tolerances hold;
// K spans 2^-10 .. 2^0 and V 2^-8 .. 2^2 times N(0, 1) (codes from subnormal to saturated), and
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

#include "cuda/flash_attention.h"
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
double from_e(uint16_t h, DType e) { return e == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }
double unit_roundoff(DType e) { return e == DType::BF16 ? 1.0 / 256 : 1.0 / 2048; }

// One sequence of the step: positions first .. first + count - 1 are computed now; the cache
// holds positions 0 .. first + count - 1 (a prefix cached or computed by earlier chunks).
struct Chunk {
  int first, count;
};

// The step's flattened tokens over a paged cache with shuffled blocks.
struct Step {
  int bs = 16, stride = 0, num_blocks = 0, spare = 0;
  std::vector<int32_t> token_seq, positions, tables;
  std::vector<int> context;
  size_t slot(int s, int p) const { return size_t(tables[size_t(s) * stride + p / bs]) * bs + p % bs; }
};

Step make_step(const std::vector<Chunk>& chunks, std::mt19937& rng) {
  Step st;
  int used = 0, max_blocks = 0;
  for (const Chunk& c : chunks) {
    const int blocks = (c.first + c.count + st.bs - 1) / st.bs;
    used += blocks;
    max_blocks = std::max(max_blocks, blocks);
  }
  st.num_blocks = used + 3;  // 3 spare blocks no table entry of a sequence's context names
  st.stride = max_blocks + 2;
  std::vector<int> perm(static_cast<size_t>(st.num_blocks));
  for (int i = 0; i < st.num_blocks; i++) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  st.spare = perm[size_t(used)];
  // Entries past a sequence's blocks name a spare (NaN) block.
  st.tables.assign(chunks.size() * size_t(st.stride), st.spare);
  int next = 0;
  for (size_t s = 0; s < chunks.size(); s++) {
    const int ctx = chunks[s].first + chunks[s].count;
    st.context.push_back(ctx);
    for (int b = 0; b < (ctx + st.bs - 1) / st.bs; b++) st.tables[s * size_t(st.stride) + size_t(b)] = perm[size_t(next++)];
    for (int p = chunks[s].first; p < ctx; p++) {
      st.token_seq.push_back(int32_t(s));
      st.positions.push_back(p);
    }
  }
  return st;
}

struct Config {
  DType e = DType::BF16;
  int hd = 128, nq = 8, nkv = 2;
  int window = 0;
  bool sinks = false;
  bool zero_q = false;  // the exact masking check: q = 0, integer V
  int ld_pad = 8;       // ld_out = nq * hd + ld_pad (8: 16-byte row stores; 4: the element path)
  bool graph = false;   // also capture the launch in a CUDA graph and replay it
  bool fp8 = false;     // an e4m3 KV cache (kv_fp8) with scales kFp8KScale / kFp8VScale
  uint32_t seed = 1;
};

std::string describe(const Config& c, const std::vector<Chunk>& chunks) {
  std::string s = std::string(dtype_name(c.e)) + " hd=" + std::to_string(c.hd) + " nq=" + std::to_string(c.nq) +
                  " nkv=" + std::to_string(c.nkv) + " window=" + std::to_string(c.window) +
                  (c.sinks ? " sinks" : "") + (c.zero_q ? " q=0" : "") + (c.fp8 ? " fp8 kv" : "") + " ld_pad=" + std::to_string(c.ld_pad) + " seqs=";
  for (const Chunk& ch : chunks) s += "[" + std::to_string(ch.first) + "+" + std::to_string(ch.count) + "]";
  return s;
}

void check_flash(const Config& c, const std::vector<Chunk>& chunks) {
  std::mt19937 rng(c.seed);
  const Step st = make_step(chunks, rng);
  const int T = int(st.token_seq.size()), nq = c.nq, nkv = c.nkv, hd = c.hd;
  const DType e = c.e;
  const size_t slots = size_t(st.num_blocks) * st.bs, row = size_t(nkv) * hd;

  // K/V: NaN everywhere, then values at every position of every sequence's context (fp8: codes,
  // kept in 16-bit slots on the host; 0xff is e4m3's NaN).
  using sluice_cuda_test::kFp8KScale, sluice_cuda_test::kFp8VScale, sluice_cuda_test::wide_normal;
  const uint16_t nan_code = c.fp8 ? 0xff : kNaN16;
  std::vector<uint16_t> kc(slots * row, nan_code), vc(slots * row, nan_code);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> small_int(-8, 8);
  for (size_t s = 0; s < chunks.size(); s++)
    for (int p = 0; p < st.context[s]; p++) {
      const size_t base = st.slot(int(s), p) * row;
      for (size_t i = 0; i < row; i++) {
        if (c.fp8) {
          kc[base + i] = f32_to_e4m3(wide_normal(rng, -10, 0) / kFp8KScale);
          vc[base + i] = f32_to_e4m3((c.zero_q ? float(small_int(rng)) : wide_normal(rng, -8, 2)) / kFp8VScale);
        } else {
          kc[base + i] = to_e(nd(rng), e);
          vc[base + i] = to_e(c.zero_q ? float(small_int(rng)) : nd(rng), e);
        }
      }
    }
  const std::vector<double> k8 = sluice_cuda_test::e4m3_values(kFp8KScale), v8 = sluice_cuda_test::e4m3_values(kFp8VScale);
  auto kval = [&](uint16_t x) { return c.fp8 ? k8[x] : from_e(x, e); };
  auto vval = [&](uint16_t x) { return c.fp8 ? v8[x] : from_e(x, e); };
  std::vector<float> q(size_t(T) * nq * hd, 0.f);
  if (!c.zero_q)
    for (auto& v : q) v = nd(rng);
  std::vector<float> sinks(static_cast<size_t>(nq));
  std::uniform_real_distribution<float> sink_dist(-2.f, 4.f);
  for (auto& v : sinks) v = sink_dist(rng);
  const double scale = 1.0 / std::sqrt(double(hd));

  Dev<float> dq(q), dsinks(sinks);
  Dev<int32_t> dseq(st.token_seq), dpos(st.positions), dtab(st.tables), dstride(std::vector<int32_t>{st.stride});
  Dev<uint16_t> dk(kc), dv(vc);
  Dev<uint8_t> dk8(sluice_cuda_test::narrow_codes(kc)), dv8(sluice_cuda_test::narrow_codes(vc));
  const int ld_out = nq * hd + c.ld_pad;
  const size_t out_elems = size_t(T) * ld_out;
  Dev<uint16_t> out_flash(out_elems), out_again(out_elems), out_paged(out_elems), out_graph(out_elems);
  cuda::AttentionArgs a;
  a.q = dq.p, a.T = T, a.nq = nq, a.nkv = nkv, a.hd = hd, a.token_seq = dseq.p, a.positions = dpos.p;
  a.block_tables = dtab.p, a.table_stride = dstride.p, a.block_size = st.bs, a.k_cache = dk.p, a.v_cache = dv.p;
  a.scale = float(scale), a.num_splits = 1, a.ld_out = ld_out, a.window = c.window;
  a.sinks = c.sinks ? dsinks.p : nullptr;
  if (c.fp8) {
    a.k_cache = dk8.p, a.v_cache = dv8.p;
    a.kv_fp8 = true, a.k_scale = kFp8KScale, a.v_scale = kFp8VScale;
  }

  CHECK(cuda::flash_prefill_supported(hd, nq, nkv));
  a.out = out_flash.p;
  cuda::flash_prefill_attention(a, e, nullptr);
  a.out = out_again.p;
  cuda::flash_prefill_attention(a, e, nullptr);
  a.out = out_paged.p;
  cuda::paged_attention(a, e, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto flash = out_flash.read(), again = out_again.read(), paged = out_paged.read();
  // Deterministic: the same inputs give the same bits.
  CHECK(std::memcmp(flash.data(), again.data(), flash.size() * sizeof(uint16_t)) == 0);

  if (c.graph) {
    // Graph-capturable: no host synchronisation or allocation inside (the instantiation's
    // shared-memory attribute was set by the eager launches above).
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    a.out = out_graph.p;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    cuda::flash_prefill_attention(a, e, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    CHECK(std::memcmp(out_graph.read().data(), flash.data(), flash.size() * sizeof(uint16_t)) == 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }

  const double u = unit_roundoff(e);
  int bad_ref = 0, bad_paged = 0, bad_pad = 0;
  double worst_ref = 0, worst_paged = 0;
  std::vector<double> sc, acc(static_cast<size_t>(hd)), wab(static_cast<size_t>(hd));
  std::vector<size_t> key_slots;
  for (int t = 0; t < T; t++) {
    const int s = st.token_seq[size_t(t)], pos = st.positions[size_t(t)];
    const int lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    key_slots.clear();
    for (int p = lo; p <= pos; p++) key_slots.push_back(st.slot(s, p));
    for (int col = nq * hd; col < ld_out; col++)
      if (flash[size_t(t) * ld_out + col] != kNaN16) bad_pad++;  // the padding is left alone
    for (int h = 0; h < nq; h++) {
      const int kvh = h / (nq / nkv);
      const float* qh = q.data() + (size_t(t) * nq + h) * hd;
      sc.assign(key_slots.size(), 0.0);
      double mx = -INFINITY;
      for (size_t i = 0; i < key_slots.size(); i++) {
        const uint16_t* k = kc.data() + key_slots[i] * row + size_t(kvh) * hd;
        double d = 0;
        for (int x = 0; x < hd; x++) d += double(qh[x]) * kval(k[x]);
        sc[i] = d * scale;
        mx = std::max(mx, sc[i]);
      }
      if (c.sinks) mx = std::max(mx, double(sinks[size_t(h)]));
      double denom = c.sinks ? std::exp(double(sinks[size_t(h)]) - mx) : 0.0;
      for (auto& v : sc) denom += (v = std::exp(v - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(wab.begin(), wab.end(), 0.0);
      for (size_t i = 0; i < key_slots.size(); i++) {
        const uint16_t* v = vc.data() + key_slots[i] * row + size_t(kvh) * hd;
        for (int x = 0; x < hd; x++) {
          const double vx = vval(v[x]);
          acc[size_t(x)] += sc[i] * vx;
          wab[size_t(x)] += sc[i] * std::fabs(vx);
        }
      }
      for (int x = 0; x < hd; x++) {
        const double ref = acc[size_t(x)] / denom, wabs = wab[size_t(x)] / denom;
        const size_t at = size_t(t) * ld_out + size_t(h) * hd + x;
        const double got = from_e(flash[at], e), pg = from_e(paged[at], e);
        const double tol_ref = c.zero_q ? 2 * u * std::fabs(ref) + 1e-5 : 5 * u * wabs + 1e-3;
        const double tol_paged = c.zero_q ? 4 * u * std::fabs(ref) + 1e-5 : 6 * u * wabs + 1e-3;
        const double err_ref = std::fabs(got - ref), err_paged = std::fabs(got - pg);
        worst_ref = std::max(worst_ref, err_ref / tol_ref);
        worst_paged = std::max(worst_paged, err_paged / tol_paged);
        if (!(err_ref <= tol_ref)) {
          if (bad_ref < 4)
            std::printf("    t=%d (seq %d pos %d) h=%d d=%d: flash %.6g, reference %.6g\n", t, s, pos, h, x, got, ref);
          bad_ref++;
        }
        if (!(err_paged <= tol_paged)) bad_paged++;
      }
    }
  }
  if (bad_ref || bad_paged || bad_pad)
    std::printf("  flash %s: %d off the reference (worst %.2fx tol), %d off paged (worst %.2fx tol), %d padding written\n",
                describe(c, chunks).c_str(), bad_ref, worst_ref, bad_paged, worst_paged, bad_pad);
  CHECK(bad_ref == 0);
  CHECK(bad_paged == 0);
  CHECK(bad_pad == 0);
}

// Three prefill chunks and a decode row: seq 0 continues after a 40-token prefix, seq 1 starts
// at 0, seq 2 decodes at 300, seq 3 starts at 0. Tile 1 (rows 64..127) holds rows of all four.
const std::vector<Chunk> kMixed = {{40, 100}, {0, 10}, {300, 1}, {0, 70}};
// Decode rows only: five sequences in one tile, contexts across block boundaries.
const std::vector<Chunk> kDecode = {{36, 1}, {0, 1}, {15, 1}, {16, 1}, {1000, 1}};
// Long chunks: many KV and query tiles per sequence.
const std::vector<Chunk> kLong = {{0, 300}, {1000, 130}};

}  // namespace

TEST_CASE(flash_prefill_supported_heads) {
  CHECK(cuda::flash_prefill_supported(64, 8, 8));
  CHECK(cuda::flash_prefill_supported(128, 32, 8));
  CHECK(cuda::flash_prefill_supported(256, 8, 1));
  CHECK(!cuda::flash_prefill_supported(96, 8, 8));
  CHECK(!cuda::flash_prefill_supported(48, 16, 1));
  CHECK(!cuda::flash_prefill_supported(128, 6, 4));
  CHECK(!cuda::flash_prefill_supported(128, 0, 0));
}

TEST_CASE(flash_prefill_matches_double_reference_and_paged) {
  // Head dims 64/128/256 x GQA 1, 4, 8 x bf16/f16 x {causal, window 32} x {no sink, sinks}.
  struct Heads {
    int nq, nkv;
  };
  const Heads heads[] = {{2, 2}, {8, 2}, {8, 1}};
  uint32_t seed = 1;
  for (DType e : {DType::BF16, DType::F16})
    for (int hd : {64, 128, 256})
      for (const Heads& hs : heads)
        for (int variant = 0; variant < 4; variant++) {
          Config c;
          c.e = e, c.hd = hd, c.nq = hs.nq, c.nkv = hs.nkv;
          c.window = variant & 1 ? 32 : 0;
          c.sinks = variant & 2;
          c.ld_pad = seed % 3 == 0 ? 4 : 8;
          c.seed = seed++;
          check_flash(c, kMixed);
        }
}

TEST_CASE(flash_prefill_decode_rows_and_long_chunks) {
  uint32_t seed = 500;
  for (int hd : {64, 128, 256}) {
    Config c;
    c.hd = hd, c.nq = 8, c.nkv = 2, c.seed = seed++;
    check_flash(c, kDecode);
    c.sinks = true, c.window = 20, c.e = DType::F16, c.seed = seed++;
    check_flash(c, kDecode);
  }
  {
    Config c;  // bf16, hd 128, GQA 4, causal; replayed from a CUDA graph too
    c.graph = true, c.seed = seed++;
    check_flash(c, kLong);
  }
  {
    Config c;
    c.e = DType::F16, c.hd = 64, c.nq = 4, c.nkv = 4, c.window = 128, c.seed = seed++;
    check_flash(c, kLong);
  }
  {
    Config c;
    c.hd = 256, c.nq = 8, c.nkv = 1, c.sinks = true, c.window = 100, c.ld_pad = 4, c.graph = true, c.seed = seed++;
    check_flash(c, kLong);
  }
}

TEST_CASE(flash_prefill_masks_exactly) {
  // q = 0: the output is the mean of exactly the visible V rows (see the header). Windows of 1
  // (the token alone), 16 (one block), 32 and 100, causal (0), with and without sinks.
  uint32_t seed = 900;
  for (DType e : {DType::BF16, DType::F16})
    for (int hd : {64, 128, 256})
      for (int window : {0, 1, 16, 32, 100})
        for (bool sinks : {false, true}) {
          Config c;
          c.e = e, c.hd = hd, c.nq = 4, c.nkv = 1, c.window = window, c.sinks = sinks, c.zero_q = true;
          c.seed = seed++;
          check_flash(c, kMixed);
          if (hd == 128) check_flash(c, kLong);
          if (hd == 64) check_flash(c, kDecode);
        }
}

TEST_CASE(flash_prefill_reads_fp8_kv_cache) {
  // An e4m3 cache: head dims 64/128/256 x bf16/f16, GQA 1 and 4, causal / window / sinks, the
  // mixed, decode and long steps, the exact masking check, and a graph replay.
  uint32_t seed = 1300;
  for (DType e : {DType::BF16, DType::F16})
    for (int hd : {64, 128, 256})
      for (int variant = 0; variant < 4; variant++) {
        Config c;
        c.fp8 = true, c.e = e, c.hd = hd;
        c.nq = variant & 1 ? 8 : 2, c.nkv = 2;
        c.window = variant & 1 ? 32 : 0;
        c.sinks = variant & 2;
        c.ld_pad = seed % 3 == 0 ? 4 : 8;
        c.seed = seed++;
        check_flash(c, kMixed);
      }
  for (int hd : {64, 128, 256}) {
    Config c;
    c.fp8 = true, c.hd = hd, c.nq = 8, c.nkv = 1, c.sinks = true, c.window = 20, c.seed = seed++;
    check_flash(c, kDecode);
    c.zero_q = true, c.window = 16, c.e = DType::F16, c.seed = seed++;
    check_flash(c, kMixed);
  }
  Config c;
  c.fp8 = true, c.graph = true, c.seed = seed++;
  check_flash(c, kLong);
}

TEST_CASE(flash_prefill_falls_back_to_paged_elsewhere) {
  // Head dims the flash kernel does not take go to paged_attention with one split (the partial
  // buffers are not used even when num_splits says otherwise): the same bits.
  std::mt19937 rng(77);
  const Step st = make_step(kMixed, rng);
  const int T = int(st.token_seq.size()), nq = 4, nkv = 2, hd = 48;
  const size_t slots = size_t(st.num_blocks) * st.bs;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> kc(slots * nkv * hd), vc(slots * nkv * hd);
  for (auto& v : kc) v = to_e(nd(rng), DType::BF16);
  for (auto& v : vc) v = to_e(nd(rng), DType::BF16);
  std::vector<float> q(size_t(T) * nq * hd);
  for (auto& v : q) v = nd(rng);
  Dev<float> dq(q);
  Dev<int32_t> dseq(st.token_seq), dpos(st.positions), dtab(st.tables), dstride(std::vector<int32_t>{st.stride});
  Dev<uint16_t> dk(kc), dv(vc), out_flash(size_t(T) * nq * hd), out_paged(size_t(T) * nq * hd);
  cuda::AttentionArgs a;
  a.q = dq.p, a.T = T, a.nq = nq, a.nkv = nkv, a.hd = hd, a.token_seq = dseq.p, a.positions = dpos.p;
  a.block_tables = dtab.p, a.table_stride = dstride.p, a.block_size = st.bs, a.k_cache = dk.p, a.v_cache = dv.p;
  a.scale = float(1.0 / std::sqrt(double(hd))), a.ld_out = nq * hd, a.window = 32;
  CHECK(!cuda::flash_prefill_supported(hd, nq, nkv));
  a.num_splits = 3;  // no partial buffers: the fallback must run one split
  a.out = out_flash.p;
  cuda::flash_prefill_attention(a, DType::BF16, nullptr);
  a.num_splits = 1;
  a.out = out_paged.p;
  cuda::paged_attention(a, DType::BF16, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto f = out_flash.read(), p = out_paged.read();
  CHECK(std::memcmp(f.data(), p.data(), f.size() * sizeof(uint16_t)) == 0);
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda flash attention")) return rc;
  return sluice_test::run_all("cuda flash attention");
}
