// Shared by the CUDA engine tests: loading an engine on a backend, generating through the test
// driver, and comparing a continuation with a reference one within the CUDA tolerances.
//
// Tolerances: CUDA keeps activations between kernels in bf16 (f16 for f16 models), so its
// logprobs differ from the f32 CPU path by up to 0.05 + 0.5% of their magnitude on these models
// (and from another CUDA run that computed the same KV in other chunks by far less). Greedy tokens
// must agree until the first step where the reference's two best logprobs are within 0.1 (a near
// tie, which the test reports and after which the continuations may legitimately differ).
#pragma once
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "engine_driver.h"
#include "sluice/engine.h"
#include "test_util.h"
#include "util/e4m3.h"

namespace sluice_cuda_test {

constexpr float kLogprobTol = 0.05f;
inline bool close_logprobs(float got, float want) { return std::fabs(got - want) <= kLogprobTol + 0.005f * std::fabs(want); }
constexpr float kNearTie = 0.1f;

inline std::string temp_dir(const std::string& name) {
  return "/tmp/sluice-cuda-test-" + std::to_string(::getpid()) + "/" + name;
}

// What a test main returns before running anything: 0 to run the tests, 77 (ctest: skipped) when
// the host has no CUDA device (none found, or no NVIDIA driver at all), 1 for any other failure
// to query the devices. An old driver (cudaErrorInsufficientDriver with libcuda present: a CUDA
// 13 runtime needs R580+) or a broken install must fail, not look like a host without a GPU.
inline int cuda_device_check(const char* suite) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (sluice::cuda::means_no_cuda_device(err) || (err == cudaSuccess && count == 0)) {
    std::printf("%s: no CUDA device, skipped\n", suite);
    return 77;
  }
  if (err != cudaSuccess) {
    std::printf("%s: cudaGetDeviceCount failed: %s (%s)\n", suite, cudaGetErrorName(err), cudaGetErrorString(err));
    return 1;
  }
  return 0;
}

// SLUICE_TEST_CUDA_GEMM=cublaslt (or auto) runs the CUDA engines of these tests with that
// cuda_gemm, so that cuBLASLt is exercised inside an engine (captured graphs, fused bias, SiLU
// chunks, the in-place residual add); unset, the default (native) kernels run.
inline void apply_test_env(sluice::EngineOptions& o) {
  if (o.backend != "cuda") return;
  if (const char* gemm = std::getenv("SLUICE_TEST_CUDA_GEMM"); gemm && *gemm) o.cuda_gemm = gemm;
  // SLUICE_TEST_CUDA_ATTENTION=flash / SLUICE_TEST_CUDA_SAMPLER=wide: the same tests on issue 32's kernels.
  if (const char* attn = std::getenv("SLUICE_TEST_CUDA_ATTENTION"); attn && *attn) o.cuda_attention = attn;
  if (const char* sampler = std::getenv("SLUICE_TEST_CUDA_SAMPLER"); sampler && *sampler) o.cuda_sampler = sampler;
  if (const char* mixed = std::getenv("SLUICE_TEST_CUDA_MIXED_GRAPHS"); mixed && *mixed == '1') o.cuda_mixed_graphs = true;
}

inline std::unique_ptr<sluice::Engine> load(const std::string& dir, const std::string& backend, bool prefix_caching = true,
                                            size_t kv_cache_bytes = size_t(64) << 20) {
  sluice::EngineOptions o;
  o.model_dir = dir;
  o.backend = backend;
  o.kv_cache_bytes = kv_cache_bytes;
  o.block_size = 16;
  o.num_threads = 2;
  o.prefix_caching = prefix_caching;
  // Each CUDA engine is charged its gpu_memory_utilization share of the device even with an
  // explicit KV size, and the default 0.9 leaves no room for a second: tests hold two at once
  // (cache on and off), so each takes less than half.
  if (kv_cache_bytes) o.gpu_memory_utilization = 0.45;
  apply_test_env(o);
  return sluice::Engine::load(o);
}

using Step = sluice_test::SampledStep;

// CUDA_OK(call): a CHECK that a CUDA runtime call returned cudaSuccess.
#define CUDA_OK(call) CHECK((call) == cudaSuccess)

// A device buffer of the kernel tests: `count` elements (plus 16 bytes of slack), poisoned with
// 0xff bytes (NaN for f32, bf16, f16 and E, -1 for ints) unless the host values are given.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    cudaMalloc(&p, count * sizeof(T) + 16);
    cudaMemset(p, 0xff, count * sizeof(T) + 16);
  }
  explicit Dev(const std::vector<T>& host) : Dev(host.size()) { write(host); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void zero() { cudaMemset(p, 0, n * sizeof(T)); }
  // Overwrites the n elements (host must hold n).
  void write(const std::vector<T>& host) { cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> read() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// The fp8 (e4m3) KV cache of the kernel tests (AttentionArgs::kv_fp8): per-tensor scales that are
// not powers of two, and values N(0, 1) * 2^k with k uniform in [lo_exp, hi_exp], so that the
// codes of value / scale span many binades (subnormal codes, and saturation where hi_exp allows).
constexpr float kFp8KScale = 0.05f, kFp8VScale = 0.02f;
inline float wide_normal(std::mt19937& rng, int lo_exp, int hi_exp) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ex(lo_exp, hi_exp);
  const float n = nd(rng);
  return std::ldexp(n, ex(rng));
}
// code -> the value a reader must see: e4m3_to_float(code) * scale (NaN for the NaN codes).
inline std::vector<double> e4m3_values(float scale) {
  std::vector<double> t(256);
  for (int c = 0; c < 256; c++) t[size_t(c)] = double(sluice::e4m3_to_float(uint8_t(c))) * double(scale);
  return t;
}
// Codes held in 16-bit host arrays (so a test keeps one layout for E and fp8) as the cache's bytes.
inline std::vector<uint8_t> narrow_codes(const std::vector<uint16_t>& codes) {
  return std::vector<uint8_t>(codes.begin(), codes.end());
}

inline std::vector<Step> generate(sluice::Engine& e, const std::vector<int32_t>& prompt, int n, int others, int chunk,
                                  sluice::SamplingParams params = {0.f, 1.f, 0, 0, 2}) {
  return sluice_test::run_sequence(e, prompt, n, others, chunk, params);
}

// Compares a CUDA continuation with the reference one; returns the number of steps that agree.
// Stops at a divergence, which must sit at a near tie of the reference.
inline int compare(const std::vector<Step>& ref, const std::vector<Step>& got, const std::string& what) {
  int agree = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); i++) {
    const Step& a = ref[i];
    const Step& b = got[i];
    if (a.token != b.token) {
      const float gap = a.top_logprobs.size() >= 2 ? a.top_logprobs[0] - a.top_logprobs[1] : 1.f;
      const bool tie_with_choice = std::find(a.top_ids.begin(), a.top_ids.begin() + 2, b.token) != a.top_ids.begin() + 2;
      std::printf("  %s: near tie at step %zu (reference gap %.3g): tokens agree before it\n", what.c_str(), i, gap);
      CHECK(gap <= kNearTie && tie_with_choice);
      return agree;
    }
    if (!close_logprobs(b.logprob, a.logprob))
      std::printf("  %s: step %zu logprob %.5f vs reference %.5f\n", what.c_str(), i, b.logprob, a.logprob);
    CHECK(close_logprobs(b.logprob, a.logprob));
    agree++;
  }
  return agree;
}

}  // namespace sluice_cuda_test
