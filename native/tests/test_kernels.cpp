// CPU kernels against plain double-precision loops, at every SIMD level this machine runs,
// with odd sizes, plus bit-exact batch invariance (a row's result never depends on the batch).
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cpu/ops_simd.h"
#include "model/fp8.h"
#include "test_util.h"
#include "util/e4m3.h"

using namespace sluice;
using namespace sluice::cpu;

namespace {

std::mt19937 rng(12345);

std::vector<float> randn(size_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Weights stored in `dt`, plus their exact values as doubles.
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<double> exact;
};
Weights make_weights(size_t n, DType dt, float scale) {
  Weights w;
  w.bytes.resize(n * dtype_size(dt));
  w.exact.resize(n);
  std::vector<float> v = randn(n, scale);
  for (size_t i = 0; i < n; i++) {
    if (dt == DType::F32) {
      std::memcpy(w.bytes.data() + 4 * i, &v[i], 4);
      w.exact[i] = v[i];
    } else {
      uint16_t h = dt == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      std::memcpy(w.bytes.data() + 2 * i, &h, 2);
      w.exact[i] = dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return w;
}

std::vector<const char*> levels() {
  std::vector<const char*> out{"generic"};
  if (detected_simd_level() >= SimdLevel::Avx2) out.push_back("avx2");
  if (detected_simd_level() >= SimdLevel::Avx512) out.push_back("avx512");
  if (detected_simd_level() >= SimdLevel::Avx512Bf16) out.push_back("avx512bf16");
  return out;
}

bool bits_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// K/V for an fp8 cache (RandomCache, kv_write tests): sign * scale * 2^u, u uniform in [-11, 8],
// so the codes span every binade from the subnormals (and below: some round to 0) up; 3% of the
// values lie beyond 448 * scale (up to ~2.2x), and kv_write saturates them.
std::vector<float> fp8_range_values(size_t n, float scale) {
  std::uniform_real_distribution<float> u(-11.f, 8.f), big(448.f, 1000.f), unit(0.f, 1.f);
  std::vector<float> out(n);
  for (float& x : out) {
    const float mag = unit(rng) < 0.03f ? big(rng) : std::exp2(u(rng));
    x = (unit(rng) < 0.5f ? -mag : mag) * scale;
  }
  return out;
}

// A random paged K/V cache of `slots` token slots in `dtype`. k and v hold what the kernels read,
// so references computed from them use exactly the cache's values: for bf16 the rounded values,
// for fp8 (written through kv_write, k_scale 0.05, v_scale 0.02) e4m3_to_float(code) * scale,
// computed in double and rounded to f32.
struct RandomCache {
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;
  std::vector<uint8_t> k8, v8;
  PagedKV cache;
  RandomCache(DType dtype, int64_t slots, int64_t block_size, int64_t n_kv, int64_t hd)
      : k(randn(size_t(slots * n_kv * hd))), v(randn(size_t(slots * n_kv * hd))), k16(k.size()), v16(v.size()) {
    cache.dtype = dtype;
    cache.block_size = block_size;
    cache.n_kv_heads = n_kv;
    cache.head_dim = hd;
    if (dtype == DType::F8E4M3) {
      cache.k_scale = 0.05f;
      cache.v_scale = 0.02f;
      k = fp8_range_values(k.size(), cache.k_scale);
      v = fp8_range_values(v.size(), cache.v_scale);
      k8.resize(k.size());
      v8.resize(v.size());
      cache.k = k8.data();
      cache.v = v8.data();
      std::vector<int32_t> all(static_cast<size_t>(slots));
      for (int64_t i = 0; i < slots; i++) all[size_t(i)] = int32_t(i);
      ThreadPool pool(1);
      kv_write(pool, cache, k.data(), v.data(), all.data(), slots);
      for (size_t i = 0; i < k.size(); i++) {
        k[i] = float(double(e4m3_to_float(k8[i])) * double(cache.k_scale));
        v[i] = float(double(e4m3_to_float(v8[i])) * double(cache.v_scale));
      }
      return;
    }
    for (size_t i = 0; i < k.size(); i++) {
      k16[i] = f32_to_bf16(k[i]);
      v16[i] = f32_to_bf16(v[i]);
      if (dtype == DType::BF16) {
        k[i] = bf16_to_f32(k16[i]);
        v[i] = bf16_to_f32(v16[i]);
      }
    }
    cache.k = dtype == DType::BF16 ? static_cast<void*>(k16.data()) : static_cast<void*>(k.data());
    cache.v = dtype == DType::BF16 ? static_cast<void*>(v16.data()) : static_cast<void*>(v.data());
  }
  // The largest error allowed in attention's output against the double reference: 1e-4 for
  // f32 and bf16 (v ~ N(0, 1)); for fp8 2.5e-5 times the largest |v| (448 * v_scale = 8.96, so
  // 2.2e-4: the wide-range K makes larger scores, and f32 sums carry their rounding).
  double tolerance() const {
    if (cache.dtype != DType::F8E4M3) return 1e-4;
    double m = 0;
    for (float x : v) m = std::max(m, std::fabs(double(x)));
    return 2.5e-5 * m;
  }
};

}  // namespace

TEST_CASE(half_conversions_round_trip_and_round_to_nearest_even) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    CHECK(f32_to_f16(f) == h);  // every f16 value survives the round trip
  }
  CHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0xc000) == -2.0f && f16_to_f32(0x0001) == std::ldexp(1.f, -24));
  CHECK(f32_to_f16(1.0f + std::ldexp(1.f, -11)) == 0x3c00);  // tie -> even
  CHECK(f32_to_f16(1e6f) == 0x7c00);
  CHECK(f32_to_bf16(1.0f + std::ldexp(1.f, -8)) == 0x3f80);  // tie -> even
  CHECK(bf16_to_f32(f32_to_bf16(3.140625f)) == 3.140625f);
}

TEST_CASE(matmul_matches_double_reference_at_every_level) {
  ThreadPool pool(2);
  // T <= 3 takes the AVX2 decode tiles, larger T the prefill ones; {6, 1536, 1500} spans several
  // L2 blocks of weight rows per work chunk.
  const int64_t shapes[][3] = {{1, 64, 10},  {3, 100, 37}, {17, 96, 13},  {5, 896, 70},
                               {70, 33, 9},  {2, 136, 45}, {1, 904, 203}, {6, 1536, 1500}};
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16};
  for (const char* level : levels()) {
    force_simd_level(level);
    for (auto& s : shapes) {
      const int64_t T = s[0], K = s[1], N = s[2];
      for (DType dt : dtypes) {
        for (MatmulPrecision prec : {MatmulPrecision::F32, MatmulPrecision::BF16}) {
          std::vector<float> x = randn(size_t(T * K));
          Weights w = make_weights(size_t(N * K), dt, 0.2f);
          Weights bias = make_weights(size_t(N), dt, 0.5f);
          std::vector<float> y(size_t(T * N));
          matmul(pool, x.data(), T, K, w.bytes.data(), dt, N, bias.bytes.data(), dt, y.data(), prec);
          // bf16-rounded activations (precision BF16 with vdpbf16ps) carry 8 mantissa bits: the
          // error bound scales with sum |x w|; every other path is f32 arithmetic.
          const bool rounded = prec == MatmulPrecision::BF16 && dt == DType::BF16 && !std::strcmp(level, "avx512bf16");
          const double rel = rounded ? std::ldexp(1.0, -8) : (dt == DType::BF16 && !std::strcmp(level, "avx512bf16") ? 2e-5 : 2e-6);
          for (int64_t t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++) {
              double want = bias.exact[size_t(n)], mag = std::fabs(want);
              for (int64_t k = 0; k < K; k++) {
                want += double(x[size_t(t * K + k)]) * w.exact[size_t(n * K + k)];
                mag += std::fabs(double(x[size_t(t * K + k)]) * w.exact[size_t(n * K + k)]);
              }
              const double err = std::fabs(double(y[size_t(t * N + n)]) - want);
              if (!(err <= rel * mag + 1e-6)) {
                std::printf("  level %s dtype %s T=%ld K=%ld N=%ld: err %g > %g\n", level, dtype_name(dt), long(T), long(K),
                            long(N), err, rel * mag);
                CHECK(false);
                t = T;
                break;
              }
            }
        }
      }
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(matmul_rows_are_bit_identical_whatever_the_batch_and_threads) {
  ThreadPool one(1), two(2);
  const int64_t K = 200, N = 53, T = 37;
  for (const char* level : levels()) {
    force_simd_level(level);
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      Weights w = make_weights(size_t(N * K), dt, 0.1f);
      std::vector<float> x = randn(size_t(T * K));
      std::vector<float> all(size_t(T * N)), single(static_cast<size_t>(N)), all1(size_t(T * N));
      matmul(two, x.data(), T, K, w.bytes.data(), dt, N, nullptr, DType::F32, all.data());
      matmul(one, x.data(), T, K, w.bytes.data(), dt, N, nullptr, DType::F32, all1.data());
      CHECK(bits_equal(all.data(), all1.data(), all.size()));
      for (int64_t t : {int64_t(0), int64_t(5), int64_t(36)}) {
        matmul(two, x.data() + t * K, 1, K, w.bytes.data(), dt, N, nullptr, DType::F32, single.data());
        CHECK(bits_equal(single.data(), all.data() + t * N, size_t(N)));
      }
      // Every decode (T <= 3) and prefill tile height, from odd offsets.
      for (int64_t t0 : {int64_t(1), int64_t(30)})
        for (int64_t rows = 2; rows <= 6; rows++) {
          std::vector<float> part(size_t(rows * N));
          matmul(two, x.data() + t0 * K, rows, K, w.bytes.data(), dt, N, nullptr, DType::F32, part.data());
          CHECK(bits_equal(part.data(), all.data() + t0 * N, part.size()));
        }
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(matmul_multi_equals_separate_matmuls) {
  ThreadPool pool(2);
  const int64_t T = 9, K = 130;
  const int64_t Ns[3] = {70, 19, 301};
  for (const char* level : levels()) {
    force_simd_level(level);
    std::vector<float> x = randn(size_t(T * K));
    std::vector<Weights> ws;
    std::vector<std::vector<float>> fused, alone;
    std::vector<LinearOut> outs;
    for (int i = 0; i < 3; i++) {
      ws.push_back(make_weights(size_t(Ns[i] * K), i == 1 ? DType::F32 : DType::BF16, 0.1f));
      fused.emplace_back(size_t(T * Ns[i]));
      alone.emplace_back(size_t(T * Ns[i]));
    }
    for (int i = 0; i < 3; i++) {
      DType dt = i == 1 ? DType::F32 : DType::BF16;
      outs.push_back({ws[size_t(i)].bytes.data(), dt, Ns[i], nullptr, DType::F32, fused[size_t(i)].data()});
      matmul(pool, x.data(), T, K, ws[size_t(i)].bytes.data(), dt, Ns[i], nullptr, DType::F32, alone[size_t(i)].data());
    }
    matmul_multi(pool, x.data(), T, K, outs.data(), 3);
    for (int i = 0; i < 3; i++) CHECK(bits_equal(fused[size_t(i)].data(), alone[size_t(i)].data(), fused[size_t(i)].size()));
  }
  force_simd_level(nullptr);
}

TEST_CASE(matmul_chunks_cover_every_row_once_large_first_small_last) {
  // qwen2.5-0.5b's q/k/v and gate/up, and its lm_head, as int8 and bf16; a few odd shapes.
  struct Shape {
    std::vector<int64_t> Ns;
    int64_t K;
    DType dt;
  };
  const std::vector<Shape> shapes{{{896, 128, 128}, 896, DType::Q8_0}, {{4864, 4864}, 896, DType::BF16},
                                  {{151936}, 896, DType::Q8_0},       {{896}, 4864, DType::BF16},
                                  {{7, 1, 30}, 33, DType::F32},       {{100000}, 64, DType::F16}};
  for (const Shape& s : shapes)
    for (int threads : {1, 2, 16}) {
      std::vector<LinearOut> outs;
      for (int64_t N : s.Ns) outs.push_back({nullptr, s.dt, N, nullptr, DType::F32, nullptr});
      std::vector<MatmulChunk> chunks;
      matmul_chunks(outs.data(), int(outs.size()), s.K, threads, chunks);
      // In order, contiguous, each output from row 0 to row N.
      size_t c = 0;
      for (int i = 0; i < int(outs.size()); i++) {
        int64_t row = 0;
        while (c < chunks.size() && chunks[c].out == i) {
          CHECK(chunks[c].begin == row);
          CHECK(chunks[c].end > chunks[c].begin);
          // Whole multiples of 12 rows, except the last chunk of an output.
          if (chunks[c].end != outs[size_t(i)].N) CHECK((chunks[c].end - chunks[c].begin) % 12 == 0);
          row = chunks[c].end;
          c++;
        }
        CHECK(row == outs[size_t(i)].N);
      }
      CHECK(c == chunks.size());
      // Within an output, no chunk is larger than the one before it (the last may be cut short).
      for (size_t k = 1; k < chunks.size(); k++)
        if (chunks[k].out == chunks[k - 1].out) CHECK(chunks[k].end - chunks[k].begin <= chunks[k - 1].end - chunks[k - 1].begin);
    }
  // The lm_head at two threads: the first chunk a quarter of the rows, the last ones about
  // 128 KiB of int8 rows (952 bytes each), so at least 16 chunks and far more than 8.
  std::vector<MatmulChunk> chunks;
  const LinearOut lm{nullptr, DType::Q8_0, 151936, nullptr, DType::F32, nullptr};
  matmul_chunks(&lm, 1, 896, 2, chunks);
  const int64_t first = chunks.front().end - chunks.front().begin;
  CHECK(first >= 151936 / 4 - 12 && first <= 151936 / 4 + 12);
  CHECK(chunks.size() > 16);
  CHECK(chunks[chunks.size() - 2].end - chunks[chunks.size() - 2].begin == 144);
}

TEST_CASE(paged_attention_matches_reference_with_scattered_blocks_and_gqa) {
  ThreadPool pool(2);
  for (const char* level : levels()) {
   force_simd_level(level);
   for (DType kv_dtype : {DType::F32, DType::BF16, DType::F8E4M3}) {
    for (int64_t group : {1, 2, 7}) {
      for (int64_t hd : {16, 48, 64, 128}) {
        const int64_t n_kv = 2, H = n_kv * group, bs = 4, num_blocks = 40;
        RandomCache rc(kv_dtype, num_blocks * bs, bs, n_kv, hd);
        const PagedKV& c = rc.cache;
        const std::vector<float>& k = rc.k;
        const std::vector<float>& v = rc.v;
        // Two sequences with non-contiguous, shuffled block tables.
        std::vector<int32_t> table0{7, 3, 19, 0, 11, 25}, table1{2, 39, 14, 5};
        const int32_t* tables[] = {table0.data(), table1.data()};
        std::vector<int32_t> seq{0, 0, 1, 0, 1}, pos{0, 22, 15, 9, 3};
        const int64_t T = int64_t(seq.size());
        std::vector<float> q = randn(size_t(T * H * hd)), out(size_t(T * H * hd));
        AttentionBatch b;
        b.token_seq = seq.data();
        b.token_pos = pos.data();
        b.block_tables = tables;
        b.n_heads = H;
        b.scale = float(1.0 / std::sqrt(double(hd)));
        paged_attention(pool, q.data(), T, b, c, out.data());
        double worst = 0;
        for (int64_t t = 0; t < T; t++)
          for (int64_t h = 0; h < H; h++) {
            const int32_t* tab = tables[seq[size_t(t)]];
            const int64_t P = pos[size_t(t)] + 1, kvh = h / group;
            std::vector<double> s(static_cast<size_t>(P));
            double mx = -1e300, sum = 0;
            for (int64_t p = 0; p < P; p++) {
              const float* kr = k.data() + ((int64_t(tab[p / bs]) * bs + p % bs) * n_kv + kvh) * hd;
              double d = 0;
              for (int64_t i = 0; i < hd; i++) d += double(q[size_t((t * H + h) * hd + i)]) * kr[i];
              s[size_t(p)] = d * b.scale;
              mx = std::max(mx, s[size_t(p)]);
            }
            for (auto& e : s) sum += (e = std::exp(e - mx));
            for (int64_t i = 0; i < hd; i++) {
              double o = 0;
              for (int64_t p = 0; p < P; p++)
                o += s[size_t(p)] / sum * v[size_t(((int64_t(tab[p / bs]) * bs + p % bs) * n_kv + kvh) * hd + i)];
              worst = std::max(worst, std::fabs(o - out[size_t((t * H + h) * hd + i)]));
            }
          }
        CHECK(worst < rc.tolerance());
        // The same token alone gives the same bits.
        std::vector<float> alone(size_t(H * hd));
        AttentionBatch b1 = b;
        b1.token_seq = seq.data() + 1;
        b1.token_pos = pos.data() + 1;
        paged_attention(pool, q.data() + H * hd, 1, b1, c, alone.data());
        CHECK(bits_equal(alone.data(), out.data() + H * hd, size_t(H * hd)));
      }
    }
   }
  }
  force_simd_level(nullptr);
}

TEST_CASE(elementwise_kernels_match_reference) {
  ThreadPool pool(2);
  for (const char* level : levels()) {
    force_simd_level(level);
    const int64_t T = 7, D = 45;
    std::vector<float> x = randn(size_t(T * D)), out(size_t(T * D));
    Weights w = make_weights(size_t(D), DType::BF16, 1.f);
    rmsnorm(pool, x.data(), T, D, w.bytes.data(), DType::BF16, 1e-5f, out.data());
    for (int64_t t = 0; t < T; t++) {
      double ss = 0;
      for (int64_t d = 0; d < D; d++) ss += double(x[size_t(t * D + d)]) * x[size_t(t * D + d)];
      const double r = 1 / std::sqrt(ss / D + 1e-5);
      for (int64_t d = 0; d < D; d++) CHECK(std::fabs(out[size_t(t * D + d)] - x[size_t(t * D + d)] * r * w.exact[size_t(d)]) < 1e-5);
    }
    std::vector<float> g = randn(1000, 4.f), u = randn(1000), s(1000);
    silu_mul_split(pool, g.data(), u.data(), 1, 1000, s.data());
    for (size_t i = 0; i < 1000; i++) {
      const double want = double(g[i]) / (1 + std::exp(-double(g[i]))) * u[i];
      CHECK(std::fabs(s[i] - want) <= 1e-6 * (1 + std::fabs(want)));
    }
    // RoPE: position 0 is the identity; rotation preserves each pair's norm.
    std::vector<float> inv{1.f, 0.1f, 0.01f, 0.001f}, q = randn(2 * 3 * 8), q0 = q;
    std::vector<int32_t> p{0, 1000};
    rope(pool, q.data(), 2, 3, 8, 8, inv.data(), p.data());
    CHECK(bits_equal(q.data(), q0.data(), 24));
    for (int h = 0; h < 3; h++)
      for (int i = 0; i < 4; i++) {
        const float* a = q0.data() + 24 + h * 8;
        const float* b = q.data() + 24 + h * 8;
        CHECK(std::fabs(std::hypot(a[i], a[i + 4]) - std::hypot(b[i], b[i + 4])) < 1e-5);
      }
  }
  force_simd_level(nullptr);
}

TEST_CASE(logits_stats_match_reference) {
  ThreadPool pool(2);
  for (const char* level : levels()) {
    force_simd_level(level);
    const int64_t R = 3, V = 1001;
    std::vector<float> logits = randn(size_t(R * V), 3.f);
    logits[size_t(V + 500)] = 50.f;  // row 1: a clear winner
    logits[size_t(2 * V + 7)] = logits[size_t(2 * V + 900)] = 60.f;  // row 2: a tie goes to the lower id
    std::vector<int32_t> am(static_cast<size_t>(R));
    std::vector<float> lse(static_cast<size_t>(R));
    logits_stats(pool, logits.data(), R, V, am.data(), lse.data());
    CHECK(am[1] == 500 && am[2] == 7);
    for (int64_t r = 0; r < R; r++) {
      double mx = -1e300, sum = 0;
      for (int64_t i = 0; i < V; i++) mx = std::max(mx, double(logits[size_t(r * V + i)]));
      for (int64_t i = 0; i < V; i++) sum += std::exp(double(logits[size_t(r * V + i)]) - mx);
      CHECK(std::fabs(lse[size_t(r)] - (mx + std::log(sum))) < 1e-5 * (1 + std::fabs(mx)));
      CHECK(logits[size_t(r * V + am[size_t(r)])] == float(mx));
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(token_masks_match_reference_at_every_level) {
  // Widths that end mid-word and mid-vector; masks with empty, full and mixed words; a row with no
  // mask is left alone; a mask whose only set bits lie past V allows nothing.
  ThreadPool pool(2);
  std::mt19937 rng(17);
  for (const char* level : levels()) {
    force_simd_level(level);
    for (int64_t V : {int64_t(1), int64_t(7), int64_t(31), int64_t(32), int64_t(45), int64_t(1001), int64_t(4096 + 19)}) {
      const int64_t R = 5, words = (V + 31) / 32;
      std::vector<float> logits = randn(size_t(R * V), 2.f), before = logits;
      std::vector<std::vector<uint32_t>> masks(size_t(R), std::vector<uint32_t>(static_cast<size_t>(words), 0u));
      for (int64_t w = 0; w < words; w++) {
        const int kind = int(rng() % 3);
        masks[0][size_t(w)] = kind == 0 ? 0u : kind == 1 ? 0xffffffffu : uint32_t(rng());
        masks[1][size_t(w)] = uint32_t(rng()) & uint32_t(rng());  // sparse
        masks[3][size_t(w)] = 0xffffffffu;
      }
      if (V % 32 != 0) masks[4][size_t(words - 1)] = ~((uint32_t(1) << (V % 32)) - 1);  // bits past V only
      std::vector<const uint32_t*> allow{masks[0].data(), masks[1].data(), nullptr, masks[3].data(), masks[4].data()};
      std::vector<uint8_t> any(size_t(R), 7);
      apply_token_masks(pool, logits.data(), R, V, allow.data(), any.data());
      for (int64_t r = 0; r < R; r++) {
        bool want_any = allow[size_t(r)] == nullptr;
        for (int64_t i = 0; i < V; i++) {
          const bool allowed = allow[size_t(r)] == nullptr || ((allow[size_t(r)][size_t(i >> 5)] >> (i & 31)) & 1u);
          want_any = want_any || allowed;
          const float got = logits[size_t(r * V + i)];
          CHECK(allowed ? got == before[size_t(r * V + i)] : (std::isinf(got) && got < 0));
        }
        CHECK(any[size_t(r)] == (want_any ? 1 : 0));
      }
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(avx2_level_runs_on_avx2_hardware) {
  // The level list above must include the AVX2 kernels wherever the CPU has them, and forcing
  // that level must select them (a machine without AVX-512 runs nothing else).
  if (detected_simd_level() < SimdLevel::Avx2) return;
  force_simd_level("avx2");
  CHECK(std::strcmp(simd_level_name(), "avx2") == 0);
  force_simd_level(nullptr);
}

TEST_CASE(matmul_rows_are_bit_identical_across_l2_blocks_and_decode_tiles) {
  // Large enough that an AVX2 work chunk spans several L2 blocks of weight rows, and N % 4 != 0
  // leaves rows outside the four-row decode tiles.
  ThreadPool one(1), two(2);
  const int64_t K = 1536, N = 1003, T = 7;
  for (const char* level : levels()) {
    force_simd_level(level);
    for (DType dt : {DType::BF16, DType::F32}) {
      Weights w = make_weights(size_t(N * K), dt, 0.05f);
      std::vector<float> x = randn(size_t(T * K));
      std::vector<float> all(size_t(T * N)), all1(size_t(T * N));
      matmul(two, x.data(), T, K, w.bytes.data(), dt, N, nullptr, DType::F32, all.data());
      matmul(one, x.data(), T, K, w.bytes.data(), dt, N, nullptr, DType::F32, all1.data());
      CHECK(bits_equal(all.data(), all1.data(), all.size()));
      for (int64_t rows = 1; rows <= 3; rows++) {
        std::vector<float> part(size_t(rows * N));
        matmul(two, x.data() + (T - rows) * K, rows, K, w.bytes.data(), dt, N, nullptr, DType::F32, part.data());
        CHECK(bits_equal(part.data(), all.data() + (T - rows) * N, part.size()));
      }
      // Precision bf16 (activations rounded once): batch 1 streams W row by row on AVX512-BF16,
      // larger batches run tiles; every row the same bits, with a bias too.
      std::vector<float> bias = randn(size_t(N));
      matmul(two, x.data(), T, K, w.bytes.data(), dt, N, bias.data(), DType::F32, all.data(), MatmulPrecision::BF16);
      for (int64_t t = 0; t < T; t++) {
        std::vector<float> single(static_cast<size_t>(N));
        matmul(t % 2 ? one : two, x.data() + t * K, 1, K, w.bytes.data(), dt, N, bias.data(), DType::F32, single.data(),
               MatmulPrecision::BF16);
        CHECK(bits_equal(single.data(), all.data() + t * N, size_t(N)));
      }
    }
  }
  force_simd_level(nullptr);
}

namespace {

// Attention of query head h of token (q_row, pos) in double, over cache values given as f32
// (k, v: [slots, n_kv, hd], already rounded when the cache is bf16).
std::vector<double> attention_reference(const float* q_row, const std::vector<float>& k, const std::vector<float>& v,
                                        const int32_t* table, int64_t pos, int64_t bs, int64_t n_kv, int64_t kvh,
                                        int64_t hd, double scale, int64_t first = 0) {
  const int64_t P = pos + 1;
  std::vector<double> s(static_cast<size_t>(P)), out(static_cast<size_t>(hd), 0.0);
  double mx = -1e300, sum = 0;
  for (int64_t p = first; p < P; p++) {
    const int64_t row = ((int64_t(table[p / bs]) * bs + p % bs) * n_kv + kvh) * hd;
    double d = 0;
    for (int64_t i = 0; i < hd; i++) d += double(q_row[i]) * k[size_t(row + i)];
    s[size_t(p)] = d * scale;
    mx = std::max(mx, s[size_t(p)]);
  }
  for (int64_t p = first; p < P; p++) sum += (s[size_t(p)] = std::exp(s[size_t(p)] - mx));
  for (int64_t p = first; p < P; p++) {
    const int64_t row = ((int64_t(table[p / bs]) * bs + p % bs) * n_kv + kvh) * hd;
    for (int64_t i = 0; i < hd; i++) out[size_t(i)] += s[size_t(p)] / sum * v[size_t(row + i)];
  }
  return out;
}

}  // namespace

TEST_CASE(paged_attention_long_contexts_odd_head_dims_and_wide_groups) {
  // Contexts past 100 positions (many 8-lane softmax blocks plus tails), a head_dim with a
  // remainder after 8-lane chunks (single-head path), and 9 query heads per kv head (more than
  // one pass of grouped heads). Every token's output must also be the same bits alone.
  ThreadPool pool(2);
  for (const char* level : levels()) {
    force_simd_level(level);
    for (DType kv_dtype : {DType::F32, DType::BF16, DType::F8E4M3}) {
      for (int64_t hd : {20, 64}) {
        const int64_t group = 9, n_kv = 2, H = n_kv * group, bs = 16, num_blocks = 12;
        RandomCache rc(kv_dtype, num_blocks * bs, bs, n_kv, hd);
        const PagedKV& c = rc.cache;
        const std::vector<float>& k = rc.k;
        const std::vector<float>& v = rc.v;
        std::vector<int32_t> table0{5, 0, 11, 2, 9, 7, 1, 10}, table1{3, 8, 4, 6};
        const int32_t* tables[] = {table0.data(), table1.data()};
        std::vector<int32_t> seq{0, 1, 0, 1, 0}, pos{127, 63, 100, 7, 0};
        const int64_t T = int64_t(seq.size());
        std::vector<float> q = randn(size_t(T * H * hd), 2.f), out(size_t(T * H * hd));
        AttentionBatch b;
        b.token_seq = seq.data();
        b.token_pos = pos.data();
        b.block_tables = tables;
        b.n_heads = H;
        b.scale = float(1.0 / std::sqrt(double(hd)));
        paged_attention(pool, q.data(), T, b, c, out.data());
        double worst = 0;
        for (int64_t t = 0; t < T; t++)
          for (int64_t h = 0; h < H; h++) {
            const std::vector<double> want =
                attention_reference(q.data() + (t * H + h) * hd, k, v, tables[seq[size_t(t)]], pos[size_t(t)], bs, n_kv,
                                    h / group, hd, b.scale);
            for (int64_t i = 0; i < hd; i++)
              worst = std::max(worst, std::fabs(want[size_t(i)] - out[size_t((t * H + h) * hd + i)]));
          }
        CHECK(worst < rc.tolerance());
        for (int64_t t = 0; t < T; t++) {
          std::vector<float> alone(size_t(H * hd));
          AttentionBatch b1 = b;
          b1.token_seq = seq.data() + t;
          b1.token_pos = pos.data() + t;
          paged_attention(pool, q.data() + t * H * hd, 1, b1, c, alone.data());
          CHECK(bits_equal(alone.data(), out.data() + t * H * hd, size_t(H * hd)));
        }
      }
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(sliding_window_attention_reads_only_the_window) {
  // Windows that start mid-block, on a block boundary, and that cover the whole context; head
  // dims of the grouped kernels, of the single-head path, and Gemma 3's 256.
  ThreadPool pool(2);
  for (const char* level : levels()) {
    force_simd_level(level);
    for (DType kv_dtype : {DType::F32, DType::BF16, DType::F8E4M3})
      for (int64_t hd : {20, 64, 256})
        for (int64_t window : {1, 5, 16, 37, 500}) {
          const int64_t group = 2, n_kv = 2, H = n_kv * group, bs = 16, num_blocks = 10;
          RandomCache rc(kv_dtype, num_blocks * bs, bs, n_kv, hd);
          std::vector<int32_t> table0{5, 0, 9, 2, 8, 7, 1}, table1{3, 6, 4};
          const int32_t* tables[] = {table0.data(), table1.data()};
          std::vector<int32_t> seq{0, 1, 0, 1}, pos{100, 40, 16, 0};
          const int64_t T = int64_t(seq.size());
          std::vector<float> q = randn(size_t(T * H * hd), 2.f), out(size_t(T * H * hd));
          AttentionBatch b;
          b.token_seq = seq.data();
          b.token_pos = pos.data();
          b.block_tables = tables;
          b.n_heads = H;
          b.scale = 0.2f;
          b.window = window;
          paged_attention(pool, q.data(), T, b, rc.cache, out.data());
          double worst = 0;
          for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
              const int64_t first = std::max<int64_t>(0, pos[size_t(t)] - window + 1);
              const std::vector<double> want = attention_reference(q.data() + (t * H + h) * hd, rc.k, rc.v,
                                                                   tables[seq[size_t(t)]], pos[size_t(t)], bs, n_kv,
                                                                   h / group, hd, b.scale, first);
              for (int64_t i = 0; i < hd; i++)
                worst = std::max(worst, std::fabs(want[size_t(i)] - out[size_t((t * H + h) * hd + i)]));
            }
          CHECK(worst < rc.tolerance());
        }
  }
  force_simd_level(nullptr);
}

TEST_CASE(image_tokens_attend_past_their_position_within_the_window_start) {
  // Gemma 3's images: a token reads keys first..last where last (token_last) may lie past its own
  // position (the image's last token) while a sliding window still starts at pos - window + 1.
  ThreadPool pool(2);
  for (const char* level : levels()) {
    force_simd_level(level);
    for (DType kv_dtype : {DType::F32, DType::BF16})
      for (int64_t hd : {20, 64, 256})
        for (int64_t window : {0, 5, 37}) {
          const int64_t group = 2, n_kv = 2, H = n_kv * group, bs = 16, num_blocks = 10;
          RandomCache rc(kv_dtype, num_blocks * bs, bs, n_kv, hd);
          std::vector<int32_t> table0{5, 0, 9, 2, 8, 7, 1}, table1{3, 6, 4};
          const int32_t* tables[] = {table0.data(), table1.data()};
          // Sequence 0's image covers 60..75, sequence 1's 3..9; the last token of each is itself.
          std::vector<int32_t> seq{0, 0, 0, 1, 1, 0}, pos{60, 67, 75, 3, 9, 100}, last{75, 75, 75, 9, 9, 100};
          const int64_t T = int64_t(seq.size());
          std::vector<float> q = randn(size_t(T * H * hd), 2.f), out(size_t(T * H * hd));
          AttentionBatch b;
          b.token_seq = seq.data();
          b.token_pos = pos.data();
          b.token_last = last.data();
          b.block_tables = tables;
          b.n_heads = H;
          b.scale = 0.2f;
          b.window = window;
          paged_attention(pool, q.data(), T, b, rc.cache, out.data());
          double worst = 0;
          for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
              const int64_t first = window > 0 ? std::max<int64_t>(0, pos[size_t(t)] - window + 1) : 0;
              const std::vector<double> want = attention_reference(q.data() + (t * H + h) * hd, rc.k, rc.v,
                                                                   tables[seq[size_t(t)]], last[size_t(t)], bs, n_kv,
                                                                   h / group, hd, b.scale, first);
              for (int64_t i = 0; i < hd; i++)
                worst = std::max(worst, std::fabs(want[size_t(i)] - out[size_t((t * H + h) * hd + i)]));
            }
          CHECK(worst < rc.tolerance());
          // Reading past the position changes the result (the test would not notice a kernel ignoring last).
          std::vector<float> causal(out.size());
          b.token_last = nullptr;
          paged_attention(pool, q.data(), T, b, rc.cache, causal.data());
          double moved = 0;
          for (int64_t i = 0; i < H * hd; i++) moved = std::max(moved, double(std::fabs(causal[size_t(i)] - out[size_t(i)])));
          if (!(moved > 1e-3)) std::printf("  level %s dtype %d hd %lld window %lld moved %g\n", level, int(kv_dtype), (long long)hd, (long long)window, moved);
          CHECK(moved > 1e-3);
        }
  }
  force_simd_level(nullptr);
}

TEST_CASE(matmul_groups_equal_each_groups_own_matmuls) {
  // Experts of a mixture-of-experts layer: groups of different row counts (one empty), each with
  // its own weights; every row as matmul() gives it alone, in one parallel region.
  ThreadPool pool(2);
  const int64_t K = 96, N = 40;
  const int64_t rows[4] = {3, 0, 1, 7};
  for (const char* level : levels()) {
    force_simd_level(level);
    for (DType dt : {DType::F32, DType::BF16}) {
      std::vector<std::vector<float>> xs, got, want;
      std::vector<Weights> ws;
      std::vector<LinearOut> outs;
      std::vector<MatmulGroup> groups;
      for (int g = 0; g < 4; g++) {
        xs.push_back(randn(size_t(std::max<int64_t>(1, rows[g]) * K)));
        ws.push_back(make_weights(size_t(2 * N * K), dt, 0.1f));
        got.emplace_back(size_t(std::max<int64_t>(1, rows[g]) * 2 * N));
        want.emplace_back(size_t(std::max<int64_t>(1, rows[g]) * 2 * N));
      }
      outs.reserve(8);
      for (int g = 0; g < 4; g++) {
        const size_t half = size_t(N * K) * dtype_size(dt);
        outs.push_back({ws[size_t(g)].bytes.data(), dt, N, nullptr, DType::F32, got[size_t(g)].data()});
        outs.push_back({ws[size_t(g)].bytes.data() + half, dt, N, nullptr, DType::F32, got[size_t(g)].data() + rows[g] * N});
        groups.push_back({xs[size_t(g)].data(), rows[g], K, &outs[outs.size() - 2], 2});
        for (int64_t t = 0; t < rows[g]; t++) {
          matmul(pool, xs[size_t(g)].data() + t * K, 1, K, ws[size_t(g)].bytes.data(), dt, N, nullptr, DType::F32,
                 want[size_t(g)].data() + t * N);
          matmul(pool, xs[size_t(g)].data() + t * K, 1, K, ws[size_t(g)].bytes.data() + half, dt, N, nullptr, DType::F32,
                 want[size_t(g)].data() + rows[g] * N + t * N);
        }
      }
      matmul_groups(pool, groups.data(), 4);
      for (int g = 0; g < 4; g++)
        CHECK(bits_equal(got[size_t(g)].data(), want[size_t(g)].data(), size_t(rows[g] * 2 * N)));
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(gelu_tanh_mul_matches_reference) {
  ThreadPool pool(2);
  const int64_t T = 3, D = 37;
  std::vector<float> g = randn(size_t(T * D), 3.f), u = randn(size_t(T * D)), out(size_t(T * D));
  gelu_tanh_mul_split(pool, g.data(), u.data(), T, D, out.data());
  double worst = 0;
  for (size_t i = 0; i < out.size(); i++) {
    const double x = g[i];
    const double want = 0.5 * x * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x))) * u[i];
    worst = std::max(worst, std::fabs(want - out[i]) / std::max(1.0, std::fabs(want)));
  }
  CHECK(worst < 1e-5);
}

TEST_CASE(grouped_attention_equals_single_head_bit_for_bit_avx2_and_avx512) {
  // The grouped kernels share K/V loads across heads but must keep the single-head arithmetic
  // (AVX-512: scores summed 16 positions at a time; contexts here end mid-block of 16, and the
  // cache's blocks of 8 or 16 positions are scattered).
  struct Level {
    SimdLevel need;
    bool (*group)(const float*, int64_t, const int32_t*, int64_t, int64_t, const PagedKV&, float, float*, float*);
    detail::AttendFn single;
    std::vector<int64_t> head_dims;
  };
  const std::vector<Level> kinds{{SimdLevel::Avx2, detail::attend_group_avx2, detail::attend_avx2, {8, 64, 128}},
                                 {SimdLevel::Avx512, detail::attend_group_avx512, detail::attend_avx512, {16, 32, 48, 64, 128}}};
  for (const Level& lv : kinds) {
    if (detected_simd_level() < lv.need) continue;
    for (DType kv_dtype : {DType::F32, DType::BF16, DType::F8E4M3})
      for (int64_t hd : lv.head_dims)
        for (int64_t G : {1, 3, 7, 11})
          for (int64_t bs : {8, 16})
            for (int64_t pos : {0, 15, 45}) {
              const int64_t n_kv = 1;
              RandomCache rc(kv_dtype, 6 * 8 * 2, bs, n_kv, hd);
              const PagedKV& c = rc.cache;
              std::vector<int32_t> table{4, 1, 5, 0, 3, 2};
              std::vector<float> q = randn(size_t(G * hd)), grouped(size_t(G * hd)), single(size_t(G * hd));
              std::vector<float> scores(size_t(G * (pos + 16)));
              const float scale = 0.125f;
              CHECK(lv.group(q.data(), G, table.data(), pos, 0, c, scale, scores.data(), grouped.data()));
              for (int64_t g = 0; g < G; g++)
                lv.single(q.data() + g * hd, table.data(), pos, 0, c, scale, scores.data(), single.data() + g * hd);
              CHECK(bits_equal(grouped.data(), single.data(), grouped.size()));
            }
  }
}

TEST_CASE(kv_write_fp8_stores_the_nearest_code_of_value_over_scale) {
  // Scales that are not powers of two, scattered slots, values over every binade and beyond the
  // largest code, and the specials: every element is f32_to_e4m3(x / scale), nothing else moves.
  ThreadPool pool(1);
  const int64_t n_kv = 3, hd = 20, bs = 4, slots = 8 * bs, row = n_kv * hd;
  std::vector<uint8_t> kc(size_t(slots * row), 0xaa), vc(kc.size(), 0xaa);
  PagedKV c;
  c.k = kc.data();
  c.v = vc.data();
  c.dtype = DType::F8E4M3;
  c.k_scale = 0.05f;
  c.v_scale = 0.02f;
  c.block_size = bs;
  c.n_kv_heads = n_kv;
  c.head_dim = hd;
  const std::vector<int32_t> where{17, 3, 30, 0, 9};
  const int64_t T = int64_t(where.size());
  std::vector<float> k = fp8_range_values(size_t(T * row), c.k_scale), v = fp8_range_values(size_t(T * row), c.v_scale);
  const float specials[] = {INFINITY, -INFINITY, NAN, 0.f, -0.f, 1e30f, -1e-30f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float); i++) k[i * 7] = v[i * 11] = specials[i];
  k[1] = c.k_scale;  // exactly code 1.0
  kv_write(pool, c, k.data(), v.data(), where.data(), T);
  std::vector<bool> written(static_cast<size_t>(slots), false);
  for (int64_t t = 0; t < T; t++) {
    written[size_t(where[size_t(t)])] = true;
    for (int64_t i = 0; i < row; i++) {
      const size_t at = size_t(where[size_t(t)] * row + i), from = size_t(t * row + i);
      CHECK(kc[at] == f32_to_e4m3(k[from] / c.k_scale));
      CHECK(vc[at] == f32_to_e4m3(v[from] / c.v_scale));
    }
  }
  CHECK(kc[size_t(17 * row + 1)] == 0x38);
  CHECK(kc[size_t(17 * row)] == 0x7e && kc[size_t(17 * row + 7)] == 0xfe && e4m3_is_nan(kc[size_t(17 * row + 14)]));
  for (int64_t s = 0; s < slots; s++)
    if (!written[size_t(s)])
      for (int64_t i = 0; i < row; i++) CHECK(kc[size_t(s * row + i)] == 0xaa && vc[size_t(s * row + i)] == 0xaa);
}

TEST_CASE(fp8_cache_reads_every_code_exactly_at_every_level) {
  // One position: its softmax weight is exactly 1, so each output element is the V element the
  // kernel read, code * v_scale rounded once. All 254 finite codes (subnormals, -0, +-448),
  // through the grouped kernels (hd 16, 128), the single-head ones with a tail (hd 20), and the
  // generic path.
  ThreadPool pool(1);
  for (const char* level : levels()) {
    force_simd_level(level);
    for (int64_t hd : {16, 20, 128}) {
      const int64_t n_kv = (256 + hd - 1) / hd, group = 3, H = n_kv * group, bs = 4, row = n_kv * hd;
      std::vector<uint8_t> kc(size_t(2 * bs * row)), vc(kc.size());
      for (size_t i = 0; i < kc.size(); i++) {
        const uint8_t code = uint8_t(i % 256);
        vc[i] = e4m3_is_nan(code) ? 0 : code;
        kc[i] = uint8_t(vc[i] ^ 0x80);
      }
      PagedKV c;
      c.k = kc.data();
      c.v = vc.data();
      c.dtype = DType::F8E4M3;
      c.k_scale = 0.05f;
      c.v_scale = 0.02f;
      c.block_size = bs;
      c.n_kv_heads = n_kv;
      c.head_dim = hd;
      const std::vector<int32_t> table{1, 0}, seq{0}, pos{0};
      const int32_t* tables[] = {table.data()};
      std::vector<float> q = randn(size_t(H * hd)), out(size_t(H * hd));
      AttentionBatch b;
      b.token_seq = seq.data();
      b.token_pos = pos.data();
      b.block_tables = tables;
      b.n_heads = H;
      b.scale = 0.3f;
      paged_attention(pool, q.data(), 1, b, c, out.data());
      int64_t wrong = 0;
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < hd; i++) {
          const uint8_t code = vc[size_t(bs * row + (h / group) * hd + i)];  // slot 4: block 1, offset 0
          const float want = e4m3_to_float(code) * c.v_scale;
          const float got = out[size_t(h * hd + i)];
          if (!(got == want) && wrong++ < 3)  // (-0 reads as -0 and sums to +0: equal as values)
            std::printf("  level %s hd %ld code 0x%02x: got %.9g, want %.9g\n", level, long(hd), code, double(got),
                        double(want));
        }
      CHECK(wrong == 0);
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(silu_and_rmsnorm_match_reference_at_extremes_and_tails) {
  ThreadPool pool(2);
  // Gate values across the whole range of the vector exp: underflow, overflow and the clamps.
  std::vector<float> g = randn(1003, 4.f), u = randn(1003);
  const float extremes[] = {0.f, -0.f, 1e-3f, -1e-3f, 20.f, -20.f, 87.f, -87.f, 87.5f, -87.5f,
                            88.5f, -88.5f, 100.f, -100.f, 1000.f, -1000.f, 1e30f, -1e30f};
  for (size_t i = 0; i < sizeof(extremes) / sizeof(float); i++) g[i * 50] = extremes[i];
  for (const char* level : levels()) {
    force_simd_level(level);
    std::vector<float> s(g.size());
    silu_mul_split(pool, g.data(), u.data(), 1, int64_t(g.size()), s.data());
    for (size_t i = 0; i < g.size(); i++) {
      const double gd = g[i], want = gd / (1 + std::exp(-gd)) * u[i];
      CHECK(std::fabs(s[i] - want) <= 1e-6 * (1 + std::fabs(want)));
    }
    // Fused [T, 2D] layout with D % 8 != 0: every row ends in a masked tail.
    const int64_t T = 3, D = 45;
    std::vector<float> gu = randn(size_t(T * 2 * D), 3.f), out(size_t(T * D));
    silu_mul(pool, gu.data(), T, D, out.data());
    for (int64_t t = 0; t < T; t++)
      for (int64_t d = 0; d < D; d++) {
        const double gd = gu[size_t(t * 2 * D + d)], want = gd / (1 + std::exp(-gd)) * gu[size_t(t * 2 * D + D + d)];
        CHECK(std::fabs(out[size_t(t * D + d)] - want) <= 1e-6 * (1 + std::fabs(want)));
      }
    // RMSNorm: every weight dtype, rows shorter than one vector and with tails, in place.
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      for (int64_t Dn : {7, 64, 901}) {
        std::vector<float> x = randn(size_t(5 * Dn), 2.f), y = x;
        Weights w = make_weights(size_t(Dn), dt, 1.f);
        rmsnorm(pool, y.data(), 5, Dn, w.bytes.data(), dt, 1e-6f, y.data());
        for (int64_t t = 0; t < 5; t++) {
          double ss = 0;
          for (int64_t d = 0; d < Dn; d++) ss += double(x[size_t(t * Dn + d)]) * x[size_t(t * Dn + d)];
          const double r = 1 / std::sqrt(ss / double(Dn) + 1e-6);
          for (int64_t d = 0; d < Dn; d++) {
            const double want = x[size_t(t * Dn + d)] * r * w.exact[size_t(d)];
            CHECK(std::fabs(y[size_t(t * Dn + d)] - want) <= 1e-5 * (1 + std::fabs(want)));
          }
        }
      }
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(logits_stats_full_vocabulary_masked_entries_and_tail_maximum) {
  ThreadPool pool(2);
  for (const char* level : levels()) {
    force_simd_level(level);
    const int64_t V = 151936 + 5;  // a real vocabulary size, plus a tail after 8- and 16-lane blocks
    std::vector<float> logits = randn(size_t(2 * V), 4.f);
    for (int64_t i = 0; i < V; i += 3) logits[size_t(i)] = -INFINITY;  // row 0: masked entries
    logits[size_t(V - 1)] = 40.f;                                       // row 0: the maximum in the tail
    logits[size_t(V + 9)] = logits[size_t(V + 150000)] = 30.f;          // row 1: a tie far apart
    std::vector<int32_t> am(2);
    std::vector<float> lse(2);
    logits_stats(pool, logits.data(), 2, V, am.data(), lse.data());
    CHECK(am[0] == int32_t(V - 1) && am[1] == 9);
    for (int64_t r = 0; r < 2; r++) {
      double mx = -1e300, sum = 0;
      for (int64_t i = 0; i < V; i++) mx = std::max(mx, double(logits[size_t(r * V + i)]));
      for (int64_t i = 0; i < V; i++) sum += std::exp(double(logits[size_t(r * V + i)]) - mx);
      CHECK(std::fabs(lse[size_t(r)] - (mx + std::log(sum))) < 1e-5 * (1 + std::fabs(mx)));
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(bandwidth_measurement_is_plausible) {
  ThreadPool pool(2);
  const double bw = measure_read_bandwidth(pool, size_t(64) << 20, 2);
  CHECK(bw > 1e9 && bw < 1e13);
}

int main() { return sluice_test::run_all("kernels"); }
