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

class LoraAdapter;  // native/src/lora/lora_adapter.h

struct EngineOptions {
  std::string model_dir;
  std::string backend = "cpu";        // "cpu" | "cuda"
  // KV pool bytes; 0 = the backend's default (CPU: 1 GiB; CUDA: what gpu_memory_utilization
  // leaves after weights and activations).
  size_t kv_cache_bytes = 0;
  // The KV cache's element type: "auto" keeps K/V in the activations' float type (CPU: f32, or
  // bf16 with matmul_precision bf16; CUDA: the model's bf16/f16); "fp8" (alias "fp8_e4m3") stores
  // OCP e4m3 codes with per-layer scales (the checkpoint's k_scale / v_scale, else 1): one byte per
  // element, so the same budget holds twice the blocks of bf16 (four times f32's).
  std::string kv_cache_dtype = "auto";
  // CUDA: the fraction of the device's memory this engine may hold (weights, activations, KV).
  // Engines sharing one device in a process must split it explicitly: their fractions may not add
  // up to more than 1 (a second engine that would is refused with kInvalidArgument).
  double gpu_memory_utilization = 0.9;
  // The scheduler's limits: the most sequences in one step and the most tokens one step computes.
  // CUDA sizes its activation buffers for them at load, before the KV pool takes what is left, so
  // a step within them never allocates. 0: the backend's default (256 sequences, 512 tokens).
  int max_num_seqs = 0;
  int max_batched_tokens = 0;
  int block_size = 16;                // tokens per KV block
  // CUDA GEMMs of more than 8 tokens: "native" (our tensor-core kernels), "cublaslt" (cuBLASLt,
  // loaded at run time; kBackendUnavailable when the host has none) or "auto" (cuBLASLt where
  // the host has it, else native).
  std::string cuda_gemm = "auto";
  // CUDA kernels of issue 32, off until they pass on a GPU: cuda_attention "flash" runs prefill
  // chunks through the tensor-core flash kernel and decode steps through the tensor-core split-KV
  // decode kernel, "paged" (default) today's kernel for every step; cuda_sampler "wide" samples with many blocks per
  // row, "block" (default) one block per row. Same results either way (the tests check it).
  std::string cuda_attention = "paged";
  std::string cuda_sampler = "block";
  // CUDA, off until measured on a GPU: steps with prefill chunks run under CUDA graphs too, their
  // token count padded to a bucket (16 .. 8192) and the decoder captured in pieces around the
  // attention calls (captured at load with cuda_graphs_at_load). SLUICE_CUDA_MIXED_GRAPHS=1.
  bool cuda_mixed_graphs = false;
  // Pipelined steps (the CUDA half of the step loop; off until measured on a GPU): a step's
  // sampled tokens stay on the device and the next step, begun before this one's tokens reach
  // the host (begin_step / end_step), reads them there. Environment: SLUICE_CUDA_DEVICE_TOKENS=1
  // turns it on for CUDA engines. On the CPU backend the option runs the same engine path with
  // the tokens resolved on the host (for tests; it gains nothing there).
  bool cuda_device_tokens = false;
  // CUDA: capture the decode graph of every batch bucket up to max_num_seqs at load instead of at
  // a bucket's first decode step (which then pays the capture). SLUICE_CUDA_GRAPHS_AT_LOAD=1.
  bool cuda_graphs_at_load = false;
  int num_threads = 0;                // CPU compute threads; 0 = all online CPUs
  // Activations against bf16 weights: "f32" tracks an f32 computation (activations carried as
  // two bf16 terms on AVX512-BF16 hardware); "bf16" rounds them to bf16 once, as llama.cpp and
  // vLLM do on CPU, for twice the arithmetic throughput of large batches and prefill.
  std::string matmul_precision = "f32";
  // Weights: "none" uses the checkpoint's as stored; "int8" quantizes the matmul weights
  // (projections and lm_head) of a bf16/f16/f32 checkpoint at load into Q8_0 blocks (32 int8
  // values, one f16 scale), with activations quantized likewise at each matmul. CPU only: a
  // CUDA engine refuses it (kInvalidArgument).
  std::string quantization = "none";
  // Prefix caching: full KV blocks stay cached (under a hash chained over their tokens, their
  // parent block and the model) after their sequences end, and a new sequence starts from the
  // longest cached prefix of its prompt. Off: every prompt is computed in full.
  bool prefix_caching = true;
  // The secret key of the keyed block hash (SipHash-2-4, see kv/block_hash.h): random per
  // deployment, so callers cannot predict or collide block hashes. All zero is allowed (tests).
  std::array<uint64_t, 2> prefix_hash_key{0, 0};
  // Speculative decoding with an EAGLE-3 head (the directory of its config.json and weights, in
  // the published layout): the engine keeps the head's context from the hidden states of the steps
  // that carry StepPlan::num_next_drafts and drafts for the rows that ask. CPU backend, serial steps.
  std::string eagle3_dir;
  // LoRA adapters in PEFT's layout (issue 36), loaded with the model: adapter i + 1 of
  // SequenceAdd::adapter is lora_adapters[i]. CPU and CUDA backends.
  std::vector<std::string> lora_adapters;
  // Device memory kept out of the KV pool for the LoRA adapters' device copies (CUDA: the pool
  // sized from gpu_memory_utilization is this much smaller; the facade passes the adapters' memory
  // budget, or the bytes of those loaded with the engine). 0: none; the CPU backend ignores it.
  size_t lora_reserve_bytes = 0;
};

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  int top_k = 0;             // 0 = off
  uint64_t seed = 0;         // the draw for position p depends only on (seed, p): same seed, same tokens
  int logprobs = 0;          // top-N alternatives reported with each sampled token (0..20)
  // vLLM's min_p, in [0, 1]; 0 = off. After temperature, a token whose probability is below
  // min_p times the most likely token's is never drawn (applied before top-k and top-p).
  // Last, so that positional initializers written before it stay valid.
  float min_p = 0.0f;
};

// An image in a prompt (vision-language models, ModelConfig::image_token_id): its vision encoder
// output replaces the input rows of grid_t * grid_h * grid_w consecutive placeholder tokens from
// prompt[offset], and those tokens' M-RoPE positions are (p, p + h, p + w) for the token at (t, h, w)
// of the grid (row-major), p being the position the first placeholder would have had (t adds
// nothing: images are one frame). Text after the image continues from p + max(grid_h, grid_w).
struct SequenceImage {
  int64_t offset = 0;
  int32_t grid_t = 1, grid_h = 0, grid_w = 0;  // in decoder tokens (merged patches)
  std::vector<float> embeds;                   // [grid_t * grid_h * grid_w, hidden_size]
  // Identifies the pixels fed to the encoder (the caller's SHA-256 of them): the prefix cache keys
  // every block holding part of the image by it, so only the same image shares those blocks.
  std::array<uint64_t, 4> content_hash{0, 0, 0, 0};
};

// A sequence to register at the start of a step (see Engine::add_sequence for the fields).
struct SequenceAdd {
  uint32_t seq_id = 0;
  std::vector<int32_t> prompt;
  SamplingParams params;
  bool keyed = false;
  std::string cache_scope;
  std::vector<SequenceImage> images;  // in prompt order, not overlapping
  int32_t adapter = 0;                // 0: the base model; i: EngineOptions::lora_adapters[i - 1]
};

// One step, the whole boundary between the scheduler and the engine. Applied in this order:
//   1. frees: sequences that ended or were preempted (unknown ids are ignored);
//   2. the rows of sequences that existed before this step claim the blocks they need, in plan
//      order (a row that does not fit is skipped: RowStatus::kNoKvBlocks);
//   3. adds, in order: each maps its cached prefix and is admitted only when its whole prompt's
//      remaining blocks fit beside what the rows before claimed (else AddStatus::kNoKvBlocks,
//      nothing kept); a bad add fails alone (AddStatus::kFailed, StepResult::errors);
//   4. the rows of the sequences just added claim their blocks;
//   5. the forward pass and sampling of every row that got its blocks.
// num_tokens[i] is an upper bound: the row computes min(num_tokens[i], its uncomputed tokens), so
// a scheduler planning ahead of the last result (a prefix hit, a sample it has not seen) stays
// valid. A row naming the same sequence twice, a bound of 0 or a sequence with nothing left to
// compute fails alone.
// The allowed next tokens of grammar-constrained sequences (structured outputs). The scheduler
// computes them while the step's forward pass runs (they depend on the token the previous step
// sampled), so the engine asks for them only when it is about to sample.
class TokenMaskSource {
 public:
  virtual ~TokenMaskSource() = default;
  // Blocks until the masks are ready: token_mask_rows(plan) rows of token_mask_words() words: for
  // each constrained sequence in StepPlan::constrained order, the mask of its next token and, when
  // its row carries drafts, one more after each of them (StepPlan::num_drafts as planned, whether
  // or not the engine cuts them); bit v % 32 of word v / 32 set = token v may be sampled. nullptr
  // when they will not come: the constrained rows that would sample fail instead.
  virtual const uint32_t* wait() = 0;
};

// Words of one token mask row: ceil(vocab_size / 32), vocab_size being the logits' width.
inline int64_t token_mask_words(int64_t vocab_size) { return (vocab_size + 31) / 32; }

struct StepPlan;
// Mask rows a plan's TokenMaskSource gives (see TokenMaskSource::wait).
int64_t token_mask_rows(const StepPlan& plan);

struct StepPlan {
  std::vector<uint32_t> seq_ids;     // [n]
  std::vector<uint32_t> num_tokens;  // [n] at most this many tokens computed for seq_ids[i]
  std::vector<uint32_t> frees;
  std::vector<SequenceAdd> adds;
  // Sequences whose next sample is constrained to a token mask (from `masks`); a row of one that
  // does not sample in this step (a prefill chunk) ignores its mask. A mask allowing no token
  // fails its row.
  std::vector<uint32_t> constrained;
  std::shared_ptr<TokenMaskSource> masks;
  // Speculative decoding: row i proposes num_drafts[i] tokens (empty: none) to follow its
  // pending token, drafts[sum of num_drafts[0..i) ..] in order. A decode row (one uncomputed
  // token) computes its pending token and the drafts in one chunk
  // (num_tokens[i] must allow 1 + drafts; the drafts are cut to it and to the context) and
  // verifies each draft with verify_draft_token (sample/sampler.h): it gains the accepted drafts
  // and one more sampled token, each following the distribution a token-by-token run samples from
  // (for greedy, the same tokens). A constrained sequence's drafts are verified under the masks
  // after each of them (TokenMaskSource::wait). Drafts of other rows, and of every row of an engine
  // whose info().draft_verification is false, are ignored. A draft outside the vocabulary fails its
  // row.
  std::vector<uint32_t> num_drafts;
  std::vector<int32_t> drafts;
  // An engine with an EAGLE-3 head: row i asks for up to num_next_drafts[i] drafts to follow the
  // token it samples (StepResult::next_drafts), for the next step's plan to verify. Non-empty (zeros
  // included), the head also adds the positions every row kept to its context; empty, the step
  // leaves the head alone (under load: those positions stay absent from its context).
  std::vector<uint32_t> num_next_drafts;
};

enum class RowStatus : uint8_t {
  kRan = 0,         // computed row_computed tokens (and sampled, if it reached its last token)
  kNoKvBlocks = 1,  // did not fit in the KV pool (or its add was not admitted): nothing done
  kFailed = 2,      // failed on its own; see StepResult::errors
};

enum class AddStatus : uint8_t {
  kAdmitted = 0,
  kNoKvBlocks = 1,  // its prompt did not fit: not added, nothing kept
  kFailed = 2,      // refused (bad prompt or sampling parameter, id in use); see StepResult::errors
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
  // A row that verified drafts gains 1 + row_accepted tokens: its entries follow each other in
  // position order.
  std::vector<uint32_t> seq_ids;      // [m] sequences that sampled a token
  std::vector<int32_t> tokens;        // [m]
  std::vector<float> logprobs;        // [m] log-softmax of the raw logits at the sampled token
  int top_n = 0;
  std::vector<int32_t> top_ids;       // [m * top_n], best first
  std::vector<float> top_logprobs;    // [m * top_n]
  std::vector<RowError> errors;       // rows and adds that failed on their own (not in seq_ids)
  // Per plan row (plan order):
  std::vector<uint8_t> row_status;    // [n] RowStatus
  std::vector<uint32_t> row_computed; // [n] tokens computed by this step
  std::vector<uint32_t> row_pending;  // [n] known but uncomputed tokens after the step (1 after a sample)
  std::vector<uint32_t> row_blocks;   // [n] KV blocks the sequence holds after the step
  std::vector<uint32_t> row_drafted;  // [n] drafts the row verified (0: none, or ignored)
  std::vector<uint32_t> row_accepted; // [n] of those, accepted (row_computed = 1 + accepted)
  // EAGLE-3 drafts per row (StepPlan::num_next_drafts): row i's are next_drafts[sum of
  // row_next_drafts[0..i) ..], to follow the last token it sampled. Empty without a head.
  std::vector<uint32_t> row_next_drafts;
  std::vector<int32_t> next_drafts;
  // Per add (plan order):
  std::vector<uint8_t> add_status;    // [a] AddStatus
  std::vector<int32_t> add_cached;    // [a] prompt tokens served from the prefix cache; -1 unless admitted
  // The pool after the step: what the next plan can count on.
  int64_t num_free_blocks = 0;        // free + evictable (what an allocation can get)
  int64_t num_evictable_blocks = 0;   // cached and unreferenced (evicted on demand)
  int64_t num_cached_blocks = 0;      // in the prefix cache (in use or evictable)
};

struct EngineInfo {
  ModelConfig config;
  std::string weight_dtype;
  size_t weight_bytes = 0;
  size_t kv_cache_bytes = 0;
  std::string kv_cache_dtype;    // "f32" | "bf16" | "f16" | "f8_e4m3": what the cache holds
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  std::string backend;
  std::string simd;              // CPU: SIMD level; CUDA: the device
  size_t device_bytes = 0;       // accelerator memory held (CUDA: weights + activations + KV)
  int num_threads = 0;
  std::string matmul_precision;
  bool prefix_caching = false;
  int64_t num_cached_blocks = 0;  // blocks in the prefix cache now (in use or evictable)
  // Models with sliding-window layers (CPU): their KV blocks, apart from the full-attention
  // layers' (num_blocks); a sequence holds only the blocks its window reads. kv_cache_bytes
  // counts both pools.
  int64_t window = 0;                // the widest window (tokens); 0: no window pool
  int64_t num_window_blocks = 0;
  int64_t window_blocks_in_use = 0;  // held by sequences now (not free, not evictable)
  size_t window_kv_bytes = 0;
  std::string broken_reason;      // non-empty once a device fault put the engine out of service
  // Whether step() verifies StepPlan::drafts (the CPU backend, serial steps); else it ignores them.
  bool draft_verification = false;
  // An EAGLE-3 head is loaded (EngineOptions::eagle3_dir): its draft vocabulary, the target layers
  // it reads, its weights and K/V pool. eagle3_draft_vocab 0: none.
  int64_t eagle3_draft_vocab = 0;
  std::vector<int64_t> eagle3_aux_layers;
  size_t eagle3_weight_bytes = 0;
  size_t eagle3_kv_bytes = 0;
  // The LoRA adapters loaded (EngineOptions::lora_adapters and install_adapter, by id): id, rank
  // and f32 bytes each.
  std::vector<int32_t> lora_ids;
  std::vector<int64_t> lora_ranks;
  std::vector<size_t> lora_bytes;
};

class Engine {
 public:
  // Loads config.json and the safetensors weights (memory-mapped) from options.model_dir.
  static std::unique_ptr<Engine> load(const EngineOptions& options);
  virtual ~Engine() = default;

  virtual EngineInfo info() const = 0;
  // add_sequence, free_sequence, num_free_blocks and num_sequence_blocks are for C++ callers
  // (native tests, tools, sluice_bench). The scheduler in TypeScript goes through step() only:
  // the addon exposes no per-sequence call, so planning never waits on the engine.
  // Registers a sequence and maps the longest cached prefix of its prompt into its block table
  // (whole blocks, at most prompt.size() - 1 tokens: the last prompt token is always computed,
  // since its logits give the first sample). Returns that prefix's length, the sequence's
  // computed-token count to start from: the first step computes from there. keyed: the request
  // carried a prompt_cache_key; its cached blocks, once unreferenced, are evicted only after every
  // unkeyed evictable block (retention class, see kv/block_pool.h). cache_scope: the owner of
  // the sequence's cached blocks (an organization id); sequences of different scopes never share
  // a cached block. images: see SequenceImage (a model without image input refuses any).
  // Throws kInvalidArgument for a bad prompt, image or sampling parameter (nothing added).
  // adapter: 0 for the base model, i for EngineOptions::lora_adapters[i - 1] (its blocks are cached
  // apart from every other adapter's and the base model's).
  virtual int64_t add_sequence(uint32_t seq_id, const std::vector<int32_t>& prompt, const SamplingParams& params,
                               bool keyed = false, const std::string& cache_scope = "",
                               const std::vector<SequenceImage>& images = {}, int32_t adapter = 0) = 0;
  // Unknown ids are ignored. Its full blocks stay in the prefix cache (evictable once unreferenced).
  virtual void free_sequence(uint32_t seq_id) = 0;
  // Blocks a step can get: free ones plus unreferenced cached ones (evicted on demand).
  virtual int64_t num_free_blocks() const = 0;
  virtual int64_t num_sequence_blocks(uint32_t seq_id) const = 0;
  // Runs one plan (see StepPlan for the order). Every per-row or per-add outcome is a value in the
  // result, a shortage of KV blocks included; it throws only for a malformed plan (arrays of
  // different lengths) and for faults of the whole step (kDeviceFault, then kEngineBroken).
  virtual StepResult step(const StepPlan& plan) = 0;
  // The same step in two halves, when pipelined() (cuda_device_tokens): begin_step() prepares the
  // plan, launches its forward pass and sampling and returns; end_step() waits for the oldest
  // begun step and returns its result (results come back in begin order). At most two steps are
  // in flight: begin_step() with two in flight throws kInvalidArgument. A plan begun while
  // another is in flight sees that one's samples as known tokens (a decode row computes them on
  // the device); when one of them fails, the row of the next step that computed it fails too
  // (its error says why) and nothing it computed is kept. A plan with constrained rows first
  // finishes the step in flight (its masks depend on that step's tokens). Not pipelined:
  // begin_step() runs the whole step and end_step() returns its result.
  virtual bool pipelined() const { return false; }
  virtual void begin_step(const StepPlan& plan) = 0;
  virtual StepResult end_step() = 0;
  // Whether end_step() would return without waiting for the device (true with nothing in flight).
  virtual bool step_ready() const = 0;
  // LoRA adapters while serving (LoraAdapter is read from its files anywhere, without the engine):
  // install_adapter() makes one available to sequences added from now on and returns its id (> 0,
  // a retired one's taken again); retire_adapter(id) takes it back from new sequences, while those
  // using it finish with it (they hold it). kInvalidArgument for an unknown id, a backend that does
  // not apply adapters, or more than 256 at once.
  virtual int32_t install_adapter(std::shared_ptr<const LoraAdapter> adapter) = 0;
  virtual void retire_adapter(int32_t id) = 0;
  // Testing hook: the next step that holds seq_id fails that row at `point` (kDevice: the next
  // step fails as a device fault whatever it holds; seq_id is ignored). One fault per sequence.
  virtual void inject_fault(uint32_t seq_id, FaultPoint point) = 0;
};

// Streaming read bandwidth of main memory in bytes/s with `num_threads` threads (<= 0: one per
// online CPU), best of `repeats`: each thread streams its contiguous slice of one buffer, as the
// batch-1 GEMV streams its slice of the weights. bytes = 0 picks max(1 GiB, 8 x the last-level
// cache), so no part of the buffer is still cached when it is read again.
// keep_buffer: keep the filled buffer for the next call of the same size (a bench sampling the
// bandwidth between short decode rounds then reads only, without mapping and filling a GiB each
// time); false frees a kept buffer after this call.
double measure_memory_bandwidth(int num_threads, size_t bytes = 0, int repeats = 5, bool keep_buffer = false);

// Device-to-device copy bandwidth of the CUDA device in bytes/s (bytes read + bytes written),
// best of `repeats`. Throws Error(kBackendUnavailable) without the CUDA backend or a device.
double measure_device_bandwidth(size_t bytes = size_t(1) << 30, int repeats = 10);

// Whether the CUDA backend is compiled in and a device is usable; if not, *why says why.
bool cuda_available(std::string* why = nullptr);

}  // namespace sluice
