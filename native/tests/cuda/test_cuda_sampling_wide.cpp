// The wide sampler (cuda/sampling_wide.h) against the block sampler it replaces: on the same
// logits, masks and draws, sample_wide must give exactly (bit for bit) the tokens, logprobs, top
// ids and top logprobs of apply_token_masks + sample, over batch sizes that take every launch
// path (many blocks per row with the row in shared memory or re-read, one block per row), every
// sampling mode, ties, -inf logits and masks; repeat launches on one workspace, and CUDA graph
// replays, must give the same bits and leave the workspace zeroed. A few rows are also checked
// against the CPU sampler. Exits 77 (ctest: skipped) when no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/sampling_wide.h"
#include "sample/sampler.h"
#include "sluice/error.h"
#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace sluice;
using sluice_cuda_test::Dev;

namespace {

struct Case {
  float temperature, top_p;
  int top_k;
  float min_p;
};
// Greedy, temperature alone, top-k (1 = greedy, 40, 1000, V - 1 at V = 1000, past V), top-p
// (0.1, 0.9, 1), min-p (alone, with top-k, 1 = the max's ties only), combinations, a tiny and a
// large temperature.
const Case kCases[] = {
    {0.f, 1.f, 0, 0.f},     {1.f, 1.f, 0, 0.f},      {0.7f, 1.f, 0, 0.f},      {1.f, 1.f, 1, 0.f},
    {1.f, 1.f, 40, 0.f},    {0.8f, 1.f, 1000, 0.f},  {1.f, 0.1f, 0, 0.f},      {1.f, 0.9f, 0, 0.f},
    {1.f, 1.f, 999, 0.f},   {1.f, 1.f, 0, 0.05f},    {0.7f, 0.9f, 40, 0.f},    {1.f, 0.95f, 1000, 0.1f},
    {0.5f, 0.5f, 0, 0.2f},  {1.f, 1.f, 40, 1.f},     {2.f, 0.99f, 100000, 0.f}, {1e-3f, 1.f, 0, 0.f},
    {4.f, 0.9f, 0, 0.f},    {1.f, 1.f, 1000, 0.3f},
};
constexpr int kNumCases = int(sizeof(kCases) / sizeof(kCases[0]));

// Row contents.
enum RowKind {
  kNormal,     // N(0, 3)
  kRounded,    // N(0, 3) rounded: many exact ties
  kFewValues,  // 0, 1 or 2: huge ties at every cut
  kSomeInf,    // N(0, 3), a third of them -inf
  kFewFinite,  // three finite logits, the rest -inf (fewer than top-k / top-n)
  kWide,       // N(0, 40): most masses round to 0
  kMaxTies,    // N(0, 3) with five exact ties of the max
  kAllInf,     // no finite logit: the row is unsampled (token -1)
  kNumKinds
};
const char* const kKindNames[] = {"normal", "rounded", "few-values", "some-inf", "few-finite", "wide", "max-ties", "all-inf"};

void fill_row(float* row, int V, int kind, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, kind == kWide ? 40.f : 3.f);
  std::uniform_int_distribution<int> pick(0, V - 1);
  switch (kind) {
    case kFewValues:
      for (int i = 0; i < V; i++) row[i] = float(rng() % 3);
      break;
    case kFewFinite:
      for (int i = 0; i < V; i++) row[i] = -INFINITY;
      for (int j = 0; j < 3; j++) row[pick(rng)] = nd(rng);
      break;
    case kAllInf:
      for (int i = 0; i < V; i++) row[i] = -INFINITY;
      break;
    default: {
      float mx = -INFINITY;
      for (int i = 0; i < V; i++) {
        float v = nd(rng);
        if (kind == kRounded) v = std::round(v);
        if (kind == kSomeInf && rng() % 3 == 0) v = -INFINITY;
        row[i] = v;
        mx = std::max(mx, v);
      }
      if (kind == kMaxTies)
        for (int j = 0; j < 5; j++) row[pick(rng)] = mx + 1.f;
    }
  }
}

// Mask of one row: all allowed, random half, sparse, one token, none (the row is then unsampled).
enum MaskKind { kAllowAll, kHalf, kSparse, kOne, kNothing, kNumMaskKinds };

void fill_mask(uint32_t* m, int V, int kind, std::mt19937& rng) {
  const int words = (V + 31) / 32;
  for (int w = 0; w < words; w++) {
    switch (kind) {
      case kAllowAll: m[w] = 0xffffffffu; break;
      case kHalf: m[w] = uint32_t(rng()); break;
      case kSparse: m[w] = uint32_t(rng()) & uint32_t(rng()) & uint32_t(rng()) & uint32_t(rng()) & uint32_t(rng()); break;
      default: m[w] = 0u;
    }
  }
  if (kind == kOne) {
    const int v = int(rng() % uint32_t(V));
    m[v >> 5] |= uint32_t(1) << (v & 31);
  }
  if (kind == kSparse) m[0] |= 1u;  // at least one allowed
}

struct Inputs {
  int R = 0, V = 0;
  std::vector<float> logits;
  std::vector<uint32_t> masks;  // [R, words]
  std::vector<cuda::SampleRowParams> params;
  std::vector<int> kind, mask_kind, case_index;
};

// Row r of variant v: case (r * 5 + v) % kNumCases, a kind of contents, a mask on every third
// row (every third variant at R = 1; used when the case is masked), all ones on the others.
Inputs make_inputs(int R, int V, int variant, uint32_t seed) {
  Inputs in;
  in.R = R;
  in.V = V;
  const int words = (V + 31) / 32;
  in.logits.resize(size_t(R) * size_t(V));
  in.masks.resize(size_t(R) * size_t(words));
  in.params.resize(size_t(R));
  in.kind.resize(size_t(R));
  in.mask_kind.resize(size_t(R));
  in.case_index.resize(size_t(R));
  std::mt19937 rng(seed);
  for (int r = 0; r < R; r++) {
    const int ci = (r * 5 + variant) % kNumCases;
    // One row: normal rows for the first kNumCases variants, then every kind in turn; batches:
    // every kind in turn (all-inf rows: one in 8).
    const int kind = R == 1 ? (variant < kNumCases ? int(kNormal) : variant % kNumKinds) : (r + variant) % kNumKinds;
    const int mr = R == 1 ? variant : r;
    const int mk = mr % 3 == 1 ? 1 + (mr / 3 + variant) % (kNumMaskKinds - 1) : kAllowAll;
    in.kind[size_t(r)] = kind;
    in.mask_kind[size_t(r)] = mk;
    in.case_index[size_t(r)] = ci;
    fill_row(in.logits.data() + size_t(r) * size_t(V), V, kind, rng);
    fill_mask(in.masks.data() + size_t(r) * size_t(words), V, mk, rng);
    const Case& c = kCases[ci];
    SamplingParams p{c.temperature, c.top_p, c.top_k, uint64_t(seed) * 1000003u + uint64_t(r), 0, c.min_p};
    Rng draw(p.seed);
    in.params[size_t(r)] = {p, draw.next_double()};
  }
  return in;
}

struct Outputs {
  std::vector<int32_t> tokens, top_ids;
  std::vector<float> logprobs, top_logprobs;
};

struct OutBufs {
  Dev<int32_t> tokens, top_ids;
  Dev<float> logprobs, top_logprobs;
  OutBufs(int R, int top_n)
      : tokens(size_t(R)), top_ids(size_t(R) * size_t(std::max(top_n, 1))), logprobs(size_t(R)),
        top_logprobs(size_t(R) * size_t(std::max(top_n, 1))) {}
  cuda::SampleArgs args(const float* logits, int R, int V, const cuda::SampleRowParams* params, int top_n, float* ws) {
    cuda::SampleArgs a;
    a.logits = logits, a.R = R, a.V = V, a.params = params, a.top_n = top_n;
    a.tokens = tokens.p, a.logprobs = logprobs.p, a.top_ids = top_ids.p, a.top_logprobs = top_logprobs.p;
    a.row_stats = ws;
    return a;
  }
  Outputs read(int R, int top_n) const {
    Outputs o;
    o.tokens = tokens.read();
    o.logprobs = logprobs.read();
    o.top_ids = top_ids.read();
    o.top_logprobs = top_logprobs.read();
    o.top_ids.resize(size_t(R) * size_t(top_n));
    o.top_logprobs.resize(size_t(R) * size_t(top_n));
    return o;
  }
};

// One workspace for every launch of the test (zeroed once, as the engine would): each launch
// must leave it zeroed for the next.
struct Workspace {
  size_t bytes = cuda::sample_wide_workspace_bytes(256, 151936);
  Dev<uint8_t> buf{bytes};
  Workspace() { cudaMemset(buf.p, 0, bytes); }
  float* get() { return reinterpret_cast<float*>(buf.p); }
  // The part R rows use (the rows' areas come first).
  bool zeroed(int R, int V) const {
    std::vector<uint8_t> h(cuda::sample_wide_workspace_bytes(R, V));
    cudaMemcpy(h.data(), buf.p, h.size(), cudaMemcpyDeviceToHost);
    return std::all_of(h.begin(), h.end(), [](uint8_t b) { return b == 0; });
  }
};
Workspace& workspace() {
  static Workspace ws;
  return ws;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Bit-for-bit comparison; prints the first differences with what the row was.
int compare(const Inputs& in, int top_n, const Outputs& want, const Outputs& got, const std::string& what) {
  int bad_rows = 0;
  for (int r = 0; r < in.R; r++) {
    const size_t ri = size_t(r);
    bool ok = want.tokens[ri] == got.tokens[ri] && same_bits(want.logprobs[ri], got.logprobs[ri]);
    for (int k = 0; k < top_n; k++) {
      const size_t at = ri * size_t(top_n) + size_t(k);
      ok = ok && want.top_ids[at] == got.top_ids[at] && same_bits(want.top_logprobs[at], got.top_logprobs[at]);
    }
    if (ok) continue;
    if (bad_rows++ < 5) {
      const Case& c = kCases[in.case_index[ri]];
      std::printf("  %s row %d (%s, mask %d, T=%g top_p=%g top_k=%d min_p=%g): token %d lp %.9g, expected %d lp %.9g\n",
                  what.c_str(), r, kKindNames[in.kind[ri]], in.mask_kind[ri], c.temperature, c.top_p, c.top_k, c.min_p,
                  got.tokens[ri], got.logprobs[ri], want.tokens[ri], want.logprobs[ri]);
      for (int k = 0; k < top_n; k++) {
        const size_t at = ri * size_t(top_n) + size_t(k);
        if (want.top_ids[at] != got.top_ids[at] || !same_bits(want.top_logprobs[at], got.top_logprobs[at]))
          std::printf("    top %d: id %d lp %.9g, expected %d lp %.9g\n", k, got.top_ids[at], got.top_logprobs[at],
                      want.top_ids[at], want.top_logprobs[at]);
      }
    }
  }
  if (bad_rows) std::printf("  %s: %d of %d rows differ\n", what.c_str(), bad_rows, in.R);
  return bad_rows;
}

// apply_token_masks (when masked) + sample on a copy of the logits.
Outputs run_block(const Inputs& in, bool masked, int top_n, const Dev<cuda::SampleRowParams>& dp) {
  Dev<float> dl(in.logits);
  if (masked) {
    Dev<uint32_t> dm(in.masks);
    cuda::apply_token_masks(dl.p, in.R, in.V, dm.p, nullptr);
  }
  Dev<float> stats(size_t(in.R) * cuda::kSampleStatsFloatsPerRow);
  OutBufs out(in.R, top_n);
  cuda::sample(out.args(dl.p, in.R, in.V, dp.p, top_n, stats.p), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  return out.read(in.R, top_n);
}

void check_case(const Inputs& in, int top_n, bool masked, const std::string& label) {
  Dev<cuda::SampleRowParams> dp(in.params);
  const Outputs want = run_block(in, masked, top_n, dp);
  Dev<float> dl(in.logits);
  Dev<uint32_t> dm(in.masks);
  OutBufs out(in.R, top_n);
  const cuda::SampleArgs a = out.args(dl.p, in.R, in.V, dp.p, top_n, workspace().get());
  cuda::sample_wide(a, masked ? dm.p : nullptr, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const Outputs got = out.read(in.R, top_n);
  CHECK(compare(in, top_n, want, got, label) == 0);
  // The same launch on the same workspace: the same bits, and the workspace left zeroed.
  CHECK(workspace().zeroed(in.R, in.V));
  cuda::sample_wide(a, masked ? dm.p : nullptr, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(compare(in, top_n, got, out.read(in.R, top_n), label + " (repeat)") == 0);
  CHECK(workspace().zeroed(in.R, in.V));
  // The logits are read only (the masks are applied as they are read).
  CHECK(std::memcmp(dl.read().data(), in.logits.data(), in.logits.size() * sizeof(float)) == 0);
}

std::string label_of(int R, int V, int variant, int top_n, bool masked) {
  const cuda::SampleWidePlan p = cuda::sample_wide_plan(R, V);
  return "R=" + std::to_string(R) + " V=" + std::to_string(V) + " variant " + std::to_string(variant) +
         " top_n=" + std::to_string(top_n) + (masked ? " masked" : "") + " [" + std::to_string(p.blocks_per_row) +
         " blocks/row" + (p.cached ? ", cached" : "") + "]";
}

}  // namespace

TEST_CASE(wide_sampling_matches_the_block_sampler) {
  const int Vs[] = {1000, 32000, 151936};
  const int Rs[] = {1, 3, 64, 256};
  uint32_t seed = 1;
  for (int V : Vs)
    for (int R : Rs) {
      const cuda::SampleWidePlan p = cuda::sample_wide_plan(R, V);
      std::printf("  R=%d V=%d: %d blocks per row%s\n", R, V, p.blocks_per_row, p.cached ? ", row slices in shared memory" : "");
      // One row: every case on a normal row, then every case on the other kinds of rows; three
      // rows: a few mixes; the batches mix everything in one launch.
      const int variants = R == 1 ? 2 * kNumCases : R == 3 ? 6 : 1;
      for (int v = 0; v < variants; v++) {
        const Inputs in = make_inputs(R, V, v, seed++);
        for (int top_n : {0, 5, 20}) check_case(in, top_n, true, label_of(R, V, v, top_n, true));
        check_case(in, 5, false, label_of(R, V, v, 5, false));
      }
    }
}

TEST_CASE(wide_sampling_matches_the_cpu_sampler) {
  // As the block sampler's test: top ids and logprobs as the CPU computes them; the drawn token
  // equal where the CPU draws in sorted order (a draw within rounding of a boundary may differ).
  for (int V : {32000, 151936}) {
    const int R = 12;
    Inputs in = make_inputs(R, V, 3, 777u + uint32_t(V));
    for (int r = 0; r < R; r++) {  // normal or rounded rows, unmasked
      const int kind = r % 2 ? kRounded : kNormal;
      std::mt19937 rng(uint32_t(r + V));
      fill_row(in.logits.data() + size_t(r) * size_t(V), V, kind, rng);
      in.kind[size_t(r)] = kind;
    }
    const int top_n = 5;
    Dev<cuda::SampleRowParams> dp(in.params);
    Dev<float> dl(in.logits);
    OutBufs out(R, top_n);
    cuda::sample_wide(out.args(dl.p, R, V, dp.p, top_n, workspace().get()), nullptr, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const Outputs got = out.read(R, top_n);
    int token_mismatch = 0;
    std::vector<float> probs;
    std::vector<int32_t> order;
    for (int r = 0; r < R; r++) {
      const float* row = in.logits.data() + size_t(r) * size_t(V);
      int32_t best = 0;
      double m = row[0];
      for (int i = 1; i < V; i++)
        if (row[i] > m) m = row[i], best = i;
      double se = 0;
      for (int i = 0; i < V; i++) se += std::exp(double(row[i]) - m);
      const float lse = float(m + std::log(se));
      const SamplingParams& p = in.params[size_t(r)].params;
      Rng cpu_rng(p.seed);
      int32_t cti[5];
      float ctlp[5];
      const SampledToken ct = sample_token(row, V, best, lse, p, cpu_rng, top_n, cti, ctlp, probs, order);
      for (int i = 0; i < top_n; i++) {
        CHECK(got.top_ids[size_t(r) * top_n + size_t(i)] == cti[i]);
        CHECK(std::fabs(got.top_logprobs[size_t(r) * top_n + size_t(i)] - ctlp[i]) <= 1e-4f * (1 + std::fabs(ctlp[i])));
      }
      const bool greedy = p.temperature <= 0.f || p.top_k == 1;
      const bool sorted_cpu = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.f || p.min_p > 0.f;
      const int32_t t = got.tokens[size_t(r)];
      CHECK(t >= 0 && t < V);
      if (t < 0 || t >= V) continue;
      if (greedy) CHECK(t == best);
      if (p.min_p == 1.f) CHECK(row[t] == row[best]);
      else if (!greedy && sorted_cpu && t != ct.token) token_mismatch++;
      CHECK(std::fabs(got.logprobs[size_t(r)] - (row[t] - lse)) <= 1e-4f * (1 + std::fabs(got.logprobs[size_t(r)])));
    }
    if (token_mismatch) std::printf("  V=%d: %d of %d sampled rows differ from the CPU draw\n", V, token_mismatch, R);
    CHECK(token_mismatch <= 1);
  }
}

TEST_CASE(wide_sampling_replays_from_a_cuda_graph) {
  // Captured once, replayed twice: the eager launch's bits each time, the workspace zeroed after.
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int R : {1, 3, 64, 256}) {
    const int V = 151936, top_n = 20;
    const Inputs in = make_inputs(R, V, 1, 4242u + uint32_t(R));
    Dev<cuda::SampleRowParams> dp(in.params);
    Dev<float> dl(in.logits);
    Dev<uint32_t> dm(in.masks);
    OutBufs out(R, top_n);
    const cuda::SampleArgs a = out.args(dl.p, R, V, dp.p, top_n, workspace().get());
    cuda::sample_wide(a, dm.p, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    const Outputs eager = out.read(R, top_n);
    const std::string label = label_of(R, V, 1, top_n, true) + " graph";
    CHECK(compare(in, top_n, run_block(in, true, top_n, dp), eager, label + " eager") == 0);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    bool captured = true;
    try {
      cuda::sample_wide(a, dm.p, stream);
    } catch (const std::exception& e) {
      std::printf("  %s: capture failed: %s\n", label.c_str(), e.what());
      captured = false;
    }
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CHECK(captured && graph != nullptr);
    if (!captured || !graph) continue;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; replay++) {
      CUDA_OK(cudaMemsetAsync(out.tokens.p, 0xff, size_t(R) * 4, stream));
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      CHECK(compare(in, top_n, eager, out.read(R, top_n), label + " replay " + std::to_string(replay)) == 0);
      CHECK(workspace().zeroed(R, V));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST_CASE(wide_sampling_refuses_too_many_alternatives) {
  cuda::SampleArgs a;
  a.R = 1, a.V = 10, a.top_n = 33;
  CHECK_THROWS_CODE(cuda::sample_wide(a, nullptr, nullptr), ErrorCode::kInvalidArgument);
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda sampling wide")) return rc;
  return sluice_test::run_all("cuda sampling wide");
}
