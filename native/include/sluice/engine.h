// The engine: one loaded model, one backend, one paged KV pool, and the sequences using it.
//
// Contract: the caller (the TypeScript scheduler) decides what runs when. A sequence is
// added with its prompt once; each step names, per sequence, how many of its known but not
// yet computed tokens to compute. A sequence whose known tokens are all computed after the
// step samples one new token, which the engine appends (so the next step decodes it).
// Not thread-safe: one call at a time (the addon serializes calls).
//
// Failure isolation: a problem with one sequence (a bad plan row, a sampler that throws for one
// row) is reported for that row as a value (StepResult::errors) and the other rows run. A fault
// that leaves the device unusable (a sticky CUDA error) puts the whole engine out of service:
// that step throws kDeviceFault and every later add/step throws kEngineBroken with the reason.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/error.h"
#include "sluice/model_config.h"

namespace sluice {

struct EngineOptions {
  std::string model_dir;
  std::string backend = "cpu";        // "cpu" | "cuda"
  // KV pool bytes; 0 = the backend's default (CPU: 1 GiB; CUDA: what gpu_memory_utilization
  // leaves after weights and activations).
  size_t kv_cache_bytes = 0;
  // CUDA: the fraction of the device's memory this engine may hold (weights, activations, KV).
  double gpu_memory_utilization = 0.9;
  int block_size = 16;                // tokens per KV block
  int num_threads = 0;                // CPU compute threads; 0 = all online CPUs
  // Activations against bf16 weights: "f32" tracks an f32 computation (activations carried as
  // two bf16 terms on AVX512-BF16 hardware); "bf16" rounds them to bf16 once, as llama.cpp and
  // vLLM do on CPU, for twice the arithmetic throughput of large batches and prefill.
  std::string matmul_precision = "f32";
  // Prefix caching: full KV blocks stay cached (under a hash chained over their tokens, their
  // parent block and the model) after their sequences end, and a new sequence starts from the
  // longest cached prefix of its prompt. Off: every prompt is computed in full.
  bool prefix_caching = true;
  // The secret key of the keyed block hash (SipHash-2-4, see kv/block_hash.h): random per
  // deployment, so callers cannot predict or collide block hashes. All zero is allowed (tests).
  std::array<uint64_t, 2> prefix_hash_key{0, 0};
};

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  int top_k = 0;             // 0 = off
  uint64_t seed = 0;         // the draw for position p depends only on (seed, p): same seed, same tokens
  int logprobs = 0;          // top-N alternatives reported with each sampled token (0..20)
};

struct StepPlan {
  std::vector<uint32_t> seq_ids;     // [n]
  std::vector<uint32_t> num_tokens;  // [n] tokens to compute this step for seq_ids[i]
};

// A row of a step that failed on its own: its sequence gained nothing from the step (no token);
// the other rows ran. E.g. a plan row naming an unknown sequence, or a sampler exception.
struct RowError {
  uint32_t seq_id = 0;
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

// Where inject_fault() makes a step fail (a testing hook for the isolation guarantees).
enum class FaultPoint {
  kPrepareRow,  // the row fails while the step is being prepared (validated, given blocks)
  kSampleRow,   // the row's sampling throws (its K/V was computed; no token is appended)
  kDevice,      // the next step fails as an unrecoverable device fault: the engine breaks
};

struct StepResult {
  std::vector<uint32_t> seq_ids;      // [m] sequences that sampled a token
  std::vector<int32_t> tokens;        // [m]
  std::vector<float> logprobs;        // [m] log-softmax of the raw logits at the sampled token
  int top_n = 0;
  std::vector<int32_t> top_ids;       // [m * top_n], best first
  std::vector<float> top_logprobs;    // [m * top_n]
  std::vector<RowError> errors;       // rows that failed on their own (not in seq_ids)
};

struct EngineInfo {
  ModelConfig config;
  std::string weight_dtype;
  size_t weight_bytes = 0;
  size_t kv_cache_bytes = 0;
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  std::string backend;
  std::string simd;              // CPU: SIMD level; CUDA: the device
  size_t device_bytes = 0;       // accelerator memory held (CUDA: weights + activations + KV)
  int num_threads = 0;
  std::string matmul_precision;
  bool prefix_caching = false;
  int64_t num_cached_blocks = 0;  // blocks in the prefix cache now (in use or evictable)
  std::string broken_reason;      // non-empty once a device fault put the engine out of service
};

class Engine {
 public:
  // Loads config.json and the safetensors weights (memory-mapped) from options.model_dir.
  static std::unique_ptr<Engine> load(const EngineOptions& options);
  virtual ~Engine() = default;

  virtual EngineInfo info() const = 0;
  // Registers a sequence and maps the longest cached prefix of its prompt into its block table
  // (whole blocks, at most prompt.size() - 1 tokens: the last prompt token is always computed,
  // since its logits give the first sample). Returns that prefix's length, the sequence's
  // computed-token count to start from: the first step computes from there. keyed: the request
  // carried a prompt_cache_key; its cached blocks, once unreferenced, are evicted only after every
  // unkeyed evictable block (retention class, see kv/block_pool.h). cache_scope: the owner of
  // the sequence's cached blocks (an organization id); sequences of different scopes never share
  // a cached block. Throws kInvalidArgument for a bad prompt or sampling parameter (nothing added).
  virtual int64_t add_sequence(uint32_t seq_id, const std::vector<int32_t>& prompt, const SamplingParams& params,
                               bool keyed = false, const std::string& cache_scope = "") = 0;
  // Unknown ids are ignored. Its full blocks stay in the prefix cache (evictable once unreferenced).
  virtual void free_sequence(uint32_t seq_id) = 0;
  // Blocks a step can get: free ones plus unreferenced cached ones (evicted on demand).
  virtual int64_t num_free_blocks() const = 0;
  virtual int64_t num_sequence_blocks(uint32_t seq_id) const = 0;
  // Runs the plan's valid rows; an invalid row (unknown or repeated sequence, a token count out of
  // range) is reported in StepResult::errors and skipped. Throws Error(kNoKvBlocks) before doing
  // anything when the valid rows need more blocks than are free.
  virtual StepResult step(const StepPlan& plan) = 0;
  // Testing hook: the next step that holds seq_id fails that row at `point` (kDevice: the next
  // step fails as a device fault whatever it holds; seq_id is ignored). One fault per sequence.
  virtual void inject_fault(uint32_t seq_id, FaultPoint point) = 0;
};

// Streaming read bandwidth of main memory in bytes/s with `num_threads` threads.
double measure_memory_bandwidth(int num_threads, size_t bytes = size_t(1) << 30, int repeats = 5);

// Device-to-device copy bandwidth of the CUDA device in bytes/s (bytes read + bytes written),
// best of `repeats`. Throws Error(kBackendUnavailable) without the CUDA backend or a device.
double measure_device_bandwidth(size_t bytes = size_t(1) << 30, int repeats = 10);

// Whether the CUDA backend is compiled in and a device is usable; if not, *why says why.
bool cuda_available(std::string* why = nullptr);

}  // namespace sluice
