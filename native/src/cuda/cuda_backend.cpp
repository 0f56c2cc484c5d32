// The CUDA backend: the decoder of engine/decoder.h (the one the CPU backend runs) over the
// kernels in kernels.h, for every family of the architecture table: dense and mixture-of-experts
// MLPs (a grouped GEMM over the experts, row counts on the device), sandwich norms, sliding-window
// layers with KV blocks of their own, per-layer rope bases, attention sinks and logit soft caps;
// the paged KV cache in device memory and sampling on the GPU. Pure decode steps replay a CUDA graph captured per
// padded batch size; other steps (prefill chunks, mixed batches) launch the kernels directly.
// With cuda_device_tokens (pipelined steps) sampled tokens stay on the device for the next
// step's embedding gather, sampling returns before its tokens reach the host (two output slots),
// and step inputs go up through two pinned buffers, so the host never waits on the copy of the
// step before; with cuda_graphs_at_load every decode bucket up to max_num_seqs is captured at load.
// Vision-language models (Qwen2-VL's M-RoPE): the rope table reads each token's (t, h, w) rope
// position from the step inputs (so graphs replay it), and a step's given input rows (images)
// replace their embeddings; such a step always runs without graphs. LoRA adapters (lora.h): after
// each base projection, one shrink/expand pair of launches adds every adapter's low-rank product
// to its sequences' rows; a step with adapters runs without graphs too (its tables change).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "cuda/check.h"
#include "cuda/cublaslt.h"
#include "cuda/device_weights.h"
#include "cuda/flash_attention.h"
#include "cuda/flash_decode.h"
#include "cuda/sampling_wide.h"
#include "cuda/kernels.h"
#include "cuda/fp8_gemm.h"
#include "cuda/lora.h"
#include "cuda/q4_gemm.h"
#include "engine/backend.h"
#include "engine/decoder.h"
#include "sample/sampler.h"

namespace sluice {

namespace {

using cuda::DeviceBuffer;

constexpr int kMaxTopN = 32;
// Decode batch sizes with a captured graph; a batch runs the smallest bucket that holds it.
constexpr int kGraphBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
constexpr int kMaxGraphBatch = 256;
// Steps with prefill chunks (cuda_mixed_graphs): token counts padded up to one of these, each
// with its decoder captured in pieces between the attention calls.
constexpr int kMixedBuckets[] = {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
constexpr int kMaxAttnSplits = 16;
constexpr int kMaxQ4GemvTokens = 8;  // q4_gemv's limit
constexpr int kFp8GateUpChunk = 1024;  // tokens per FP8 gate/up GEMM (the f32 pre-activations' scratch)
constexpr int kLoraGateUpChunk = 256;  // tokens per gate/up GEMM of a step with LoRA adapters (lora_gu_)

// Engines of this process per device and the fraction of its memory each was given
// (gpu_memory_utilization): one device is shared only by explicit fractions adding up to <= 1.
class DeviceShares {
 public:
  static DeviceShares& get() {
    static DeviceShares shares;
    return shares;
  }
  void take(int device, double fraction) {
    std::lock_guard<std::mutex> lock(mu_);
    double& used = used_[device];
    if (used + fraction > 1.0 + 1e-9)
      throw Error(ErrorCode::kInvalidArgument,
                  "CUDA device " + std::to_string(device) + " already serves another model with gpu_memory_utilization " +
                      std::to_string(used) + "; one engine per device, or give each engine an explicit share " +
                      "(gpu_memory_utilization values adding up to at most 1)");
    used += fraction;
  }
  void give_back(int device, double fraction) {
    std::lock_guard<std::mutex> lock(mu_);
    used_[device] = std::max(0.0, used_[device] - fraction);
  }

 private:
  std::mutex mu_;
  std::map<int, double> used_;
};

// Holds a device share for the lifetime of a backend (released if its constructor throws).
class DeviceShareLease {
 public:
  DeviceShareLease(int device, double fraction) : device_(device), fraction_(fraction) {
    DeviceShares::get().take(device, fraction);
  }
  ~DeviceShareLease() { DeviceShares::get().give_back(device_, fraction_); }
  DeviceShareLease(const DeviceShareLease&) = delete;
  DeviceShareLease& operator=(const DeviceShareLease&) = delete;

 private:
  int device_;
  double fraction_;
};

// Runs f; when it throws kOutOfMemory, the failed allocation's error is cleared first: the CUDA
// runtime keeps it as the last error (not sticky), which a later launch check must not report.
template <typename F>
void clearing_oom(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kOutOfMemory) cudaGetLastError();
    throw;
  }
}

int graph_bucket(int64_t n) {
  for (int b : kGraphBuckets)
    if (n <= b) return b;
  return 0;
}

int mixed_bucket(int64_t n) {
  for (int b : kMixedBuckets)
    if (n <= b) return b;
  return 0;
}

// Pinned host memory (for asynchronous copies).
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    SLUICE_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
    bytes_ = bytes;
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// What a config asks beyond this backend's kernels' limits; empty when it runs the model.
std::string cuda_unsupported_pieces(const ModelConfig& c) {
  std::string out;
  const auto add = [&](const std::string& what) { out += (out.empty() ? "" : ", ") + what; };
  if (c.num_experts > 1024) add("more than 1024 experts (" + std::to_string(c.num_experts) + ")");
  if (c.num_experts > 0 && c.experts_per_token > 32)
    add("more than 32 experts per token (" + std::to_string(c.experts_per_token) + ")");
  return out;
}

// The GEMM of a projection y = x · W^T (+ bias) of T rows; the caller sets the epilogue and output.
cuda::GemmArgs projection(const void* x, int64_t ld_x, const void* w, int64_t ld_w, const float* bias, int64_t T,
                          int64_t N, int64_t K) {
  cuda::GemmArgs g;
  g.x = x;
  g.ld_x = int(ld_x);
  g.w = w;
  g.ld_w = int(ld_w);
  g.bias = bias;
  g.T = int(T);
  g.N = int(N);
  g.K = int(K);
  return g;
}

cuda::GateAct gate_act(Activation a) {
  switch (a) {
    case Activation::GeluTanh: return cuda::GateAct::kGeluTanh;
    case Activation::SwigluClamped: return cuda::GateAct::kSwigluClamped;
    default: return cuda::GateAct::kSilu;
  }
}

class CudaBackend final : public Backend, private DecoderOps {
 public:
  CudaBackend(const ModelConfig& c, const ModelWeights& w, const EngineOptions& opts);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string kernel_info() const override {
    std::lock_guard<std::mutex> lock(info_mu_);  // info() may run beside a step that notes a failed capture
    std::string notes = graph_notes_;
    if (graphs_at_load_)
      notes += ", decode graphs captured: " + std::to_string(graphs_live_.load()) + " of " + std::to_string(graphs_wanted_) +
               " buckets (at load)";
    if (device_tokens_) notes += ", device tokens: on";
    return device_desc_ + notes;
  }
  int num_threads() const override { return num_sms_; }
  DType kv_dtype() const override { return fp8_kv_ ? DType::F8E4M3 : e_; }
  // Sliding-window layers keep their KV in window blocks of their own (freed as they leave every
  // window); the full-attention layers in the ordinary blocks.
  size_t kv_bytes_per_block(int64_t block_size) const override {
    return size_t(c_.num_layers - num_window_layers_) * layer_block_bytes(block_size);
  }
  size_t kv_bytes_per_window_block(int64_t block_size) const override {
    return size_t(num_window_layers_) * layer_block_bytes(block_size);
  }
  size_t kv_budget_bytes(size_t requested) const override;
  void allocate_kv(int64_t num_blocks, int64_t num_window_blocks, int64_t block_size) override;
  void forward(const ForwardBatch& b) override;
  void sample(const SampleRow* rows, int64_t R, const SampleOutput& out) override;
  void read_logits(float* out) override;
  size_t device_bytes() const override;
  bool resolves_device_tokens() const override { return device_tokens_; }
  void sample_launch(const SampleRow* rows, int64_t R, int top_n, int slot) override;
  // Speculative decoding: the block sampler verifies drafts (the wide one does not yet).
  bool verifies_drafts() const override { return !wide_sampler_; }
  void sample_collect(int slot, const SampleOutput& out) override;
  bool sample_ready(int slot) const override;
  bool applies_lora() const override { return true; }

 private:
  // Step inputs live at fixed device offsets so that captured graphs can replay them.
  // M-RoPE models add the rope positions after the slots (off_rpos: [3 * tokens], (t, h, w) per
  // token), then models with bidirectional image attention the last position each token attends
  // to (off_last: [tokens]); with window layers, their slots and block tables follow the tables
  // (off_wslot, off_wtables).
  struct StepLayout {
    int64_t tokens = 0, rows = 0, seqs = 0, table = 0;  // capacities
    size_t off_ids = 0, off_pos = 0, off_seq = 0, off_slot = 0, off_rows = 0, off_stride = 0, off_tables = 0;
    size_t off_rpos = 0;  // M-RoPE models only
    size_t off_last = 0;  // ModelConfig::image_attention_bidirectional only
    size_t off_wslot = 0, off_wtables = 0;
    size_t bytes = 0;
  };
  void ensure_capacity(int64_t T, int64_t R, int64_t S, int64_t table_width);
  void allocate_activations(int64_t tokens, int64_t rows);
  void allocate_step(const StepLayout& want);
  cudaGraphExec_t capture_decode_graph(int bucket, int splits);
  void set_step(int64_t T, int64_t R, int attn_splits);
  void run_layers(int64_t T, int64_t R, int attn_splits);
  // Mixed-step graphs (cuda_mixed_graphs): the decoder of a padded token bucket captured in
  // pieces, piece l ending where layer l's attention begins and the last one before the logits;
  // attention (whose launch shape follows the contexts) and the logits (the sampled rows) run
  // eagerly between them. No pieces: the bucket's capture failed and it runs eagerly.
  struct PiecewiseGraph {
    std::vector<cudaGraphExec_t> pieces;  // num_layers + 1
  };
  PiecewiseGraph capture_mixed(int bucket, int64_t R, int splits);
  void replay_mixed(const PiecewiseGraph& g, int bucket, int64_t R, int splits);
  void begin_piece();
  void end_piece();
  void attention_now(int64_t layer);
  void logits_now();
  // DecoderOps for the step run_layers() set up (step_*).
  void embed() override;
  void norm(int64_t layer, LayerNorm which) override;
  void qkv(int64_t layer) override;
  void rope_kv_write(int64_t layer) override;
  void attention(int64_t layer) override;
  void attention_out(int64_t layer, BlockOut out) override;
  void mlp(int64_t layer, BlockOut out) override;
  void experts(int64_t layer, BlockOut out) override;
  void add_normed(int64_t layer, LayerNorm which) override;
  void logits() override;
  // The base projections of qkv(), attention_out() and mlp(), which add the adapters after them.
  void project_qkv(int64_t layer);
  void project_o(int64_t layer, BlockOut out);
  void project_mlp(int64_t layer, BlockOut out);
  // LoRA (step_lora_): the launch of `target` in `layer` over the step's rows t0 .. t0 + T - 1
  // (T < 0: to the end), x and y pointing at row t0's input (E, ld_x) and output (f32, ld_y).
  cuda::LoraArgs lora_args(int64_t layer, LoraTarget target, const void* x, int64_t ld_x, float* y, int64_t ld_y,
                           int t0 = 0, int T = -1) const;
  // Gate and up of rows t0 .. t0 + T - 1 into g: [T, ld_g] f32 interleaved as gate_up_w's rows.
  void lora_gate_up(int64_t layer, int t0, int T, float* g, int64_t ld_g);
  void ensure_lora_scratch(int64_t T);
  size_t layer_block_bytes(int64_t block_size) const {
    return 2 * size_t(block_size) * size_t(c_.num_kv_heads * c_.head_dim) * kv_esz_;
  }
  bool windowed(int64_t layer) const { return c_.window(layer) > 0; }
  size_t layer_kv_bytes(int64_t layer) const;
  uint8_t* k_cache(int64_t layer) const;
  uint8_t* v_cache(int64_t layer) const;
  // Q4 layers: a step of 1..8 tokens runs the W4A16 GEMVs, a larger one dequantizes the layer's
  // matrices into the q4_*_w_ scratch and runs the GEMM.
  bool q4_gemv_step() const { return step_T_ >= 1 && step_T_ <= kMaxQ4GemvTokens; }
  void q4_project(const cuda::DeviceQ4& w, const void* x, int64_t ld_x, const float* bias, void* y, int64_t ld_y,
                  cuda::Q4Out out);
  // FP8 layers: fp8_quantize turns the step's x [T, ld_x] E (K columns) into fp8_x_ codes and
  // fp8_xs_ scales (per token, or per token per 128 columns for block-scaled weights);
  // fp8_project runs fp8_gemm on rows t0 .. t0 + T - 1 of them.
  void fp8_quantize(const void* x, int64_t ld_x, int64_t K);
  void fp8_project(const cuda::DeviceFp8& w, int t0, int T, int64_t N, int64_t K, const float* bias, float* y,
                   int64_t ld_y, bool accumulate);
  int step_T_ = 0;
  int64_t step_R_ = 0;
  int step_splits_ = 1;
  bool step_prefill_ = false;  // the step holds a prefill chunk (some sequence computes > 1 token)
  // The step's attn_last sends some token past its own position (bidirectional image attention):
  // attention reads off_last, and never through flash decode or a decode graph.
  bool step_last_ = false;
  cuda::GemmWorkspace step_ws_{};
  int choose_attn_splits(int64_t T, int64_t max_ctx) const;
  void upload_step(const ForwardBatch& b, int64_t T_pad, int64_t R_pad, int64_t table_width);
  void upload_embeds(const ForwardBatch& b);
  // Vision-language models: steps may give input rows (ForwardBatch::input_embeds).
  bool takes_input_embeds() const { return c_.image_token_id >= 0 || c_.mrope(); }
  void capture_graphs_at_load();
  const int32_t* dev_i32(size_t off) const { return reinterpret_cast<const int32_t*>(step_dev_.get<uint8_t>() + off); }

  const ModelConfig c_;
  int device_ = 0;
  std::unique_ptr<DeviceShareLease> share_;
  size_t free_at_start_ = 0;  // device memory free before this backend allocated anything
  int num_sms_ = 0;
  size_t total_mem_ = 0;
  double mem_util_;
  // Kept out of the KV pool for the LoRA adapters' device copies (EngineOptions::lora_reserve_bytes,
  // plus a sixteenth for the copies' alignment and tables).
  size_t lora_reserve_;
  std::string device_desc_;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceWeights w_;
  DType e_;
  size_t esz_ = 2;
  // --kv-cache-dtype fp8: the cache holds e4m3 codes (one byte) with each layer's k/v scales.
  bool fp8_kv_ = false;
  size_t kv_esz_ = 2;
  std::vector<float> k_scale_, v_scale_;

  // KV: per full-attention layer k then v, each [num_blocks + 1, block_size, nkv, hd] E, then per
  // window layer k then v, each [num_window_blocks + 1, ...]; the extra block of each is scratch
  // for the padding tokens of graph batches.
  DeviceBuffer kv_;
  int64_t num_blocks_ = 0, num_window_blocks_ = 0, block_size_ = 0;
  int32_t scratch_block_ = 0, scratch_window_block_ = 0;
  int64_t num_window_layers_ = 0;
  std::vector<int64_t> kv_index_;  // [layers] the layer's place among the full (or the window) layers

  // Activations, sized for cap_tokens_ tokens and cap_rows_ logit rows.
  int64_t cap_tokens_ = 0, cap_rows_ = 0;
  DeviceBuffer x_, xn_, qkv_, q_, attn_, h_, cos_sin_, last_, logits_, attn_part_acc_, attn_part_ml_;
  DeviceBuffer y_;               // [T, H] f32, a block's output before its sandwich norm
  DeviceBuffer cos_sin_local_;   // [T, rotary_dim] f32, the local layers' rope table
  // Mixture of experts, for T tokens x k routes: router logits [T, E], the routes [T, k] (experts,
  // weights, grouped rows), the plan (cuda::MoePlan), grouped activations [T*k, moe_inter_pad] E
  // and outputs [T*k, H] f32.
  DeviceBuffer router_logits_, route_ids_, route_w_, route_row_, row_token_, expert_offsets_, tile_expert_,
      tile_row0_, num_tiles_, moe_h_, moe_y_;
  DeviceBuffer gemm_partials_, gemm_tickets_;
  // Q4 layers (w_.any_q4_attn / any_q4_mlp): one dequantization target per kind of matrix, laid
  // out as the bf16 path's weights, zero-filled at load; the dequantizer writes only weight rows'
  // first K columns, so the padding rows and columns the GEMM reads stay zero.
  DeviceBuffer q4_qkv_w_;      // [qkv_rows, ld_h] E: q, k, v rows
  DeviceBuffer q4_o_w_;        // [H, ld_attn] E
  DeviceBuffer q4_gate_up_w_;  // [2 * inter_pad, ld_h] E, 16-row groups [gate 8 | up 8]
  DeviceBuffer q4_down_w_;     // [H, inter_pad] E
  DeviceBuffer q4_gate_, q4_up_;  // [8, inter_pad] f32: the decode GEMVs' gate and up outputs
  // FP8 layers (w_.any_fp8_attn / any_fp8_mlp): the step's activations quantized, sized with the
  // other activations (allocate_activations), and the gate/up GEMM's f32 output for a chunk of
  // kFp8GateUpChunk tokens.
  DeviceBuffer fp8_x_;    // [tokens, fp8_ld_] e4m3 codes, zero past K
  DeviceBuffer fp8_xs_;   // [tokens] f32, or [tokens, fp8_scale_cols_] with block scales
  DeviceBuffer fp8_gu_;   // [kFp8GateUpChunk, 2 * inter_pad] f32, gate/up interleaved as gate_up_w
  int64_t fp8_ld_ = 0;          // max over the FP8 projections' K, rounded up to 32
  int64_t fp8_scale_cols_ = 1;  // ceil(that K / 128) with block scales, else 1
  // LoRA: the step's slots and tables (set by forward() for an eager step whose rows use some
  // adapter), the shrink's output and, for dense MLPs not in FP8, gate/up before the activation
  // (the fused GEMM epilogue cannot take the adapters' additions); allocated on first use.
  cuda::LoraSteps lora_;
  bool step_lora_ = false;
  DeviceBuffer lora_tmp_;  // [lora_tmp_rows_, kMaxLoraRank] f32
  int64_t lora_tmp_rows_ = 0;
  DeviceBuffer lora_gu_;   // [kLoraGateUpChunk, 2 * inter_pad] f32, gate/up interleaved as gate_up_w
  std::unique_ptr<cuda::CublasLt> lt_;  // when options.cuda_gemm picked cuBLASLt
  DeviceBuffer lt_workspace_, lt_scratch_;
  size_t attn_part_capacity_ = 0;  // floats of attn_part_acc_
  StepLayout layout_;
  DeviceBuffer step_dev_;
  // Pinned copies of the step inputs: one, or two used in turn with device tokens (the host
  // writes one while the copy from the other may still be queued behind the step in flight).
  PinnedBuffer step_host_[2];
  cudaEvent_t step_copied_[2] = {nullptr, nullptr};  // the last upload from step_host_[i] has been read
  int step_slot_ = 0;      // the pinned step buffer of the next upload
  int64_t last_rows_ = 0;  // logit rows of the last forward()

  DeviceBuffer sample_params_, sample_out_, sample_stats_;
  // One launch's sampling, from sample_launch() to sample_collect(). Its pinned buffer carries the
  // row parameters up and [tokens R | logprobs R | top ids R*n | top logprobs R*n] down.
  struct SampleSlot {
    PinnedBuffer host;
    cudaEvent_t done = nullptr;  // the download into `host` has landed
    int64_t R = 0;
    int top_n = 0;
    std::vector<uint8_t> allows_nothing, inject_fault;  // [R]
  };
  SampleSlot sample_slots_[2];
  // Device tokens: [device_token_rows_] the tokens of the last sample launch, which the next
  // forward()'s resolve_device_tokens reads (captured graphs hold its address).
  bool device_tokens_ = false;
  DeviceBuffer device_token_buf_;
  int64_t device_token_rows_ = 0;
  DeviceBuffer token_masks_;  // [rows, mask words] of a step with grammar-constrained rows
  PinnedBuffer token_masks_host_;
  // Given input rows (ForwardBatch::input_embeds) of an eager step, scattered over x_ by embed():
  // device [embeds_cap_, H] f32 then [embeds_cap_] int32 row indices, sized with the activations
  // for vision-language models (so a step's rows always fit) and grown by a step that needs more;
  // the pinned copy holds [n, H] f32 then [n] int32 of the last such step. Steps with given rows
  // never run as captured graphs (their row count varies), so nothing captured holds these.
  DeviceBuffer embeds_dev_;
  int64_t embeds_cap_ = 0;
  PinnedBuffer embeds_host_;
  cudaEvent_t embeds_copied_ = nullptr;  // the last upload from embeds_host_ has been read
  int step_embeds_ = 0;                  // rows embed() scatters in the step being run (eager steps only)

  // Decode batch bucket -> graph; nullptr marks a bucket whose capture failed, which then runs
  // eagerly (a capture that fails once fails again: retrying it every step would fail them all).
  std::map<int, cudaGraphExec_t> graphs_;
  std::map<int, PiecewiseGraph> mixed_graphs_;
  bool mixed_graphs_enabled_ = false;  // cuda_mixed_graphs
  bool capturing_pieces_ = false;      // capture_mixed() is running: attention/logits end a piece
  std::vector<cudaGraphExec_t> pieces_;  // the pieces capture_mixed() has captured so far
  bool flash_prefill_ = false;  // cuda_attention "flash": steps with prefill chunks use the flash kernel
  bool wide_sampler_ = false;   // cuda_sampler "wide": many blocks per sampled row
  bool graphs_enabled_ = true;  // SLUICE_CUDA_GRAPHS=0 turns decode graphs off (to bisect a graph problem)
  bool graphs_at_load_ = false;     // cuda_graphs_at_load
  int graph_limit_ = kMaxGraphBatch;  // decode batches captured at load: up to max_num_seqs' bucket
  int graphs_wanted_ = 0;           // buckets captured at load
  std::atomic<int> graphs_live_{0};  // captured graphs now (kernel_info() reads it beside a step)
  mutable std::mutex info_mu_;
  std::string graph_notes_;  // appended to kernel_info(): graphs off, buckets that fell back to eager
  void drop_graphs();
  void open_cublaslt(const EngineOptions& opts);
};

CudaBackend::CudaBackend(const ModelConfig& c, const ModelWeights& w, const EngineOptions& opts)
    : c_(c), mem_util_(opts.gpu_memory_utilization), lora_reserve_(opts.lora_reserve_bytes) {
  if (!(mem_util_ > 0.0 && mem_util_ <= 1.0))
    throw Error(ErrorCode::kInvalidArgument, "gpu_memory_utilization must be in (0, 1]");
  if (opts.cuda_attention != "paged" && opts.cuda_attention != "flash")
    throw Error(ErrorCode::kInvalidArgument, "cuda_attention must be paged or flash (got '" + opts.cuda_attention + "')");
  if (opts.cuda_sampler != "block" && opts.cuda_sampler != "wide")
    throw Error(ErrorCode::kInvalidArgument, "cuda_sampler must be block or wide (got '" + opts.cuda_sampler + "')");
  flash_prefill_ = opts.cuda_attention == "flash";
  wide_sampler_ = opts.cuda_sampler == "wide";
  if (const std::string missing = cuda_unsupported_pieces(c); !missing.empty())
    throw Error(ErrorCode::kUnsupportedModel, "the CUDA backend does not run this " + c.architecture + " (" + missing +
                                                  "); the CPU backend does");
  kv_index_.resize(size_t(c.num_layers));
  fp8_kv_ = opts.kv_cache_dtype == "fp8" || opts.kv_cache_dtype == "fp8_e4m3";
  kv_esz_ = fp8_kv_ ? 1 : esz_;
  for (const LayerWeights& l : w.layers) {
    k_scale_.push_back(l.k_scale);
    v_scale_.push_back(l.v_scale);
  }
  for (int64_t l = 0, full = 0; l < c.num_layers; l++)
    kv_index_[size_t(l)] = windowed(l) ? num_window_layers_++ : full++;
  if (c.head_dim % 8 != 0 || c.head_dim > 256)
    throw Error(ErrorCode::kUnsupportedModel, "the CUDA backend needs head_dim a multiple of 8, at most 256 (got " +
                                                  std::to_string(c.head_dim) + ")");
  SLUICE_CUDA_CHECK(cudaSetDevice(device_));
  share_ = std::make_unique<DeviceShareLease>(device_, mem_util_);
  {
    size_t total = 0;
    SLUICE_CUDA_CHECK(cudaMemGetInfo(&free_at_start_, &total));
  }
  cudaDeviceProp prop{};
  SLUICE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  num_sms_ = prop.multiProcessorCount;
  total_mem_ = prop.totalGlobalMem;
  device_desc_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
                 std::to_string(num_sms_) + " SMs)";
  if (prop.major < 8)
    throw Error(ErrorCode::kBackendUnavailable, device_desc_ + " is older than compute capability 8.0 (Ampere)");
  SLUICE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (const char* g = std::getenv("SLUICE_CUDA_GRAPHS"); g && std::string(g) == "0") {
    graphs_enabled_ = false;
    graph_notes_ = ", decode graphs: off (SLUICE_CUDA_GRAPHS=0)";
  }
  {
    const char* mixed = std::getenv("SLUICE_CUDA_MIXED_GRAPHS");
    mixed_graphs_enabled_ = graphs_enabled_ && (opts.cuda_mixed_graphs || (mixed && std::string(mixed) == "1"));
  }
  for (cudaEvent_t* ev :
       {&step_copied_[0], &step_copied_[1], &sample_slots_[0].done, &sample_slots_[1].done, &embeds_copied_})
    SLUICE_CUDA_CHECK(cudaEventCreateWithFlags(ev, cudaEventDisableTiming));
  device_tokens_ = opts.cuda_device_tokens;
  const char* at_load = std::getenv("SLUICE_CUDA_GRAPHS_AT_LOAD");
  graphs_at_load_ = graphs_enabled_ && (opts.cuda_graphs_at_load || (at_load && std::string(at_load) == "1"));
  w_ = cuda::upload_weights(c, w);
  e_ = w_.dtype;
  const size_t H = size_t(c.hidden_size);
  if (w_.any_q4_attn) {
    q4_qkv_w_.allocate(size_t(w_.qkv_rows) * size_t(w_.ld_h) * esz_, stream_);
    q4_o_w_.allocate(H * size_t(w_.ld_attn) * esz_, stream_);
  }
  if (w_.any_q4_mlp) {
    q4_gate_up_w_.allocate(size_t(2 * w_.inter_pad) * size_t(w_.ld_h) * esz_, stream_);
    q4_down_w_.allocate(H * size_t(w_.inter_pad) * esz_, stream_);
    q4_gate_.allocate(size_t(kMaxQ4GemvTokens) * size_t(w_.inter_pad) * 4, stream_);
    q4_up_.allocate(size_t(kMaxQ4GemvTokens) * size_t(w_.inter_pad) * 4, stream_);
  }
  if (w_.any_q4_attn || w_.any_q4_mlp) device_desc_ += ", q4 layers: w4a16";
  if (w_.any_fp8_attn || w_.any_fp8_mlp) {
    const int64_t k_max = std::max<int64_t>({c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size});
    fp8_ld_ = (k_max + 31) / 32 * 32;
    if (w_.fp8_scales == Fp8Scales::Block) fp8_scale_cols_ = (k_max + cuda::kFp8BlockCols - 1) / cuda::kFp8BlockCols;
    if (w_.any_fp8_mlp) fp8_gu_.allocate(size_t(kFp8GateUpChunk) * size_t(2 * w_.inter_pad) * 4, stream_);
    cuda::fp8_gemm_prepare();  // before any graph capture
    device_desc_ += ", fp8 layers: w8a8 e4m3";
  }
  gemm_tickets_.allocate(sizeof(int) * 65536, stream_);
  gemm_partials_.allocate(sizeof(float) * (size_t(8) << 20), stream_);
  open_cublaslt(opts);
  sample_out_.allocate(size_t(kMaxGraphBatch) * (3 + 2 * kMaxTopN) * 4, stream_);
  // Activations for the largest step the scheduler plans, allocated before the KV pool is sized
  // (kv_budget_bytes), so that they never have to grow into memory the pool took.
  if (opts.max_num_seqs < 0 || opts.max_batched_tokens < 0)
    throw Error(ErrorCode::kInvalidArgument, "max_num_seqs and max_batched_tokens must be >= 0");
  const int64_t max_rows = std::max<int64_t>(kMaxGraphBatch, opts.max_num_seqs);
  const int64_t max_tokens = std::max<int64_t>({512, opts.max_batched_tokens, max_rows});
  ensure_capacity(max_tokens, max_rows, max_rows + 1, 1);
  token_masks_.allocate(size_t(max_rows) * size_t(token_mask_words(c_.vocab_size)) * 4, stream_);
  if (device_tokens_) {
    device_token_rows_ = max_rows;
    device_token_buf_.allocate(size_t(max_rows) * 4, stream_);
  }
  if (opts.max_num_seqs > 0) graph_limit_ = std::min(opts.max_num_seqs, kMaxGraphBatch);
}

CudaBackend::~CudaBackend() {
  drop_graphs();
  for (cudaEvent_t ev :
       {step_copied_[0], step_copied_[1], sample_slots_[0].done, sample_slots_[1].done, embeds_copied_})
    if (ev) cudaEventDestroy(ev);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::open_cublaslt(const EngineOptions& opts) {
  const std::string& mode = opts.cuda_gemm;
  if (mode != "native" && mode != "cublaslt" && mode != "auto")
    throw Error(ErrorCode::kInvalidArgument, "cuda_gemm must be native, cublaslt or auto (got '" + mode + "')");
  if (mode == "native") return;
  std::string why;
  lt_ = cuda::CublasLt::open(&why);
  if (!lt_) {
    if (mode == "cublaslt") throw Error(ErrorCode::kBackendUnavailable, "cuda_gemm cublaslt: " + why);
    device_desc_ += ", gemm: native (" + why + ")";
    return;
  }
  // 32 MiB is what cuBLASLt's Hopper kernels ask for; the SiLU-and-mul scratch holds up to 1024
  // tokens of gate/up pre-activations (longer prefills run in chunks).
  lt_workspace_.allocate(size_t(32) << 20, stream_);
  lt_scratch_.allocate(size_t(1024) * size_t(2 * w_.inter_pad) * sizeof(float), stream_);
  device_desc_ += ", gemm: " + lt_->describe();
}

void CudaBackend::drop_graphs() {
  for (auto& [bucket, exec] : graphs_)
    if (exec) cudaGraphExecDestroy(exec);
  graphs_.clear();
  for (auto& [bucket, g] : mixed_graphs_)
    for (cudaGraphExec_t piece : g.pieces) cudaGraphExecDestroy(piece);
  mixed_graphs_.clear();
  graphs_live_ = 0;
}

size_t CudaBackend::device_bytes() const {
  size_t n = w_.bytes + kv_.bytes() + gemm_partials_.bytes() + gemm_tickets_.bytes() + step_dev_.bytes() +
             lt_workspace_.bytes() + lt_scratch_.bytes() + device_token_buf_.bytes() + q4_qkv_w_.bytes() +
             q4_o_w_.bytes() + q4_gate_up_w_.bytes() + q4_down_w_.bytes() + q4_gate_.bytes() + q4_up_.bytes() +
             fp8_x_.bytes() + fp8_xs_.bytes() + fp8_gu_.bytes() + lora_tmp_.bytes() + lora_gu_.bytes() +
             lora_.device_bytes();
  for (const DeviceBuffer* b :
       {&x_, &xn_, &qkv_, &q_, &attn_, &h_, &cos_sin_, &last_, &logits_, &attn_part_acc_, &attn_part_ml_, &sample_params_,
        &sample_out_, &sample_stats_, &token_masks_, &y_, &cos_sin_local_, &router_logits_, &route_ids_, &route_w_,
        &route_row_, &row_token_, &expert_offsets_, &tile_expert_, &tile_row0_, &num_tiles_, &moe_h_, &moe_y_,
        &embeds_dev_})
    n += b->bytes();
  return n;
}

size_t CudaBackend::kv_budget_bytes(size_t requested) const {
  size_t free_mem = 0, total = 0;
  SLUICE_CUDA_CHECK(cudaMemGetInfo(&free_mem, &total));
  // Headroom for graphs, the CUDA context and steps beyond the planned limits.
  const size_t reserve = (size_t(512) << 20) + lora_reserve_ + lora_reserve_ / 16;
  // This engine's share of the device, less what it holds already (weights, activations): other
  // engines on the device hold their own shares (DeviceShares).
  const double own = double(free_at_start_) - double(free_mem);
  const double allowed = std::min(mem_util_ * double(total) - own - double(reserve), double(free_mem) - double(reserve));
  if (requested) {
    if (double(requested) > double(free_mem) - double(reserve))
      throw Error(ErrorCode::kOutOfMemory, "a KV cache of " + std::to_string(requested) + " bytes does not fit: " +
                                               std::to_string(free_mem >> 20) + " MiB of device memory are free");
    return requested;
  }
  if (allowed < double(kv_bytes_per_block(16)))
    throw Error(ErrorCode::kOutOfMemory, "gpu_memory_utilization " + std::to_string(mem_util_) +
                                             " leaves no room for the KV cache after the weights (" +
                                             std::to_string(w_.bytes >> 20) + " MiB)");
  return size_t(allowed);
}

void CudaBackend::allocate_kv(int64_t num_blocks, int64_t num_window_blocks, int64_t block_size) {
  if ((num_window_blocks > 0) != (num_window_layers_ > 0))
    throw Error(ErrorCode::kInternal, "window blocks are for the sliding-window layers alone");
  num_blocks_ = num_blocks;
  num_window_blocks_ = num_window_blocks;
  block_size_ = block_size;
  scratch_block_ = int32_t(num_blocks);
  scratch_window_block_ = int32_t(num_window_blocks);
  kv_.allocate(kv_bytes_per_block(block_size) * size_t(num_blocks + 1) +
                   (num_window_layers_ ? kv_bytes_per_window_block(block_size) * size_t(num_window_blocks + 1) : 0),
               stream_);
  // Block tables get a fixed stride capacity (the longest context) so growing sequences never
  // move the step buffers, which would invalidate the captured graphs.
  const int64_t max_blocks = (c_.max_position_embeddings + block_size - 1) / block_size;
  ensure_capacity(cap_tokens_, cap_rows_, layout_.seqs, max_blocks);
  if (graphs_at_load_) capture_graphs_at_load();
}

// Captures the decode graph of every bucket up to graph_limit_'s, each over a batch of padding
// tokens only (token 0 at position 0 of the scratch sequence: it writes the scratch block alone),
// so that no decode step pays a capture. A bucket whose capture fails runs eagerly, as when
// captured lazily (capture_decode_graph).
void CudaBackend::capture_graphs_at_load() {
  const int32_t none = 0;
  const int32_t* no_table = &none;
  ForwardBatch padding;
  padding.token_ids = padding.positions = padding.token_seq = padding.slots = padding.logit_rows = &none;
  padding.block_tables = &no_table;
  padding.num_seq_blocks = &none;
  const int last = graph_bucket(graph_limit_);
  int captured = 0, wanted = 0;
  for (int bucket : kGraphBuckets) {
    if (bucket > last) break;
    wanted++;
    ensure_capacity(bucket, bucket, bucket + 1, 1);
    upload_step(padding, bucket, bucket, 1);
    const cudaGraphExec_t exec = capture_decode_graph(bucket, choose_attn_splits(bucket, c_.max_position_embeddings));
    graphs_.emplace(bucket, exec);
    captured += exec != nullptr;
  }
  // Mixed-step buckets up to the tokens a step may hold (the activations' capacity).
  for (int bucket : kMixedBuckets) {
    if (!mixed_graphs_enabled_ || bucket > cap_tokens_) break;
    wanted++;
    ensure_capacity(bucket, 1, 2, 1);
    upload_step(padding, bucket, 1, 1);
    PiecewiseGraph g = capture_mixed(bucket, 1, 1);
    captured += !g.pieces.empty();
    mixed_graphs_.emplace(bucket, std::move(g));
  }
  SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::lock_guard<std::mutex> lock(info_mu_);
  graphs_wanted_ = wanted;
  graphs_live_ = captured;
}

// Growth is geometric (x1.5) so that a run of slowly larger steps reallocates, and drops the
// graphs, a few times rather than at every step; if the larger size does not fit, the exact one
// is tried. Recorded capacities are zeroed before the old buffers are freed and set only once every
// new one exists: after a failed allocation (an out-of-memory step) the next step must reallocate,
// not run with a freed or too small buffer, or write a larger step layout into the old pinned one.
void CudaBackend::ensure_capacity(int64_t T, int64_t R, int64_t S, int64_t table_width) {
  const bool grow_acts = T > cap_tokens_ || R > cap_rows_;
  const bool grow_step = T > layout_.tokens || R > layout_.rows || S > layout_.seqs || table_width > layout_.table;
  if (!grow_acts && !grow_step) return;
  drop_graphs();  // graphs hold the old addresses
  SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  auto grown = [](int64_t have, int64_t need) { return need > have ? std::max(need, have + have / 2) : have; };
  // Runs alloc(geometric sizes...), and on running out of memory alloc(exact sizes...).
  auto with_fallback = [](auto&& alloc, auto... sizes) {
    try {
      alloc(sizes.first...);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kOutOfMemory) throw;
      cudaGetLastError();  // the failed cudaMalloc left its (non-sticky) error behind: later launch checks must not see it
      alloc(sizes.second...);
    }
  };
  if (grow_acts) {
    const int64_t t_exact = std::max(cap_tokens_, T), r_exact = std::max(cap_rows_, R);
    const int64_t t_geo = grown(cap_tokens_, T), r_geo = grown(cap_rows_, R);
    cap_tokens_ = 0;
    cap_rows_ = 0;
    with_fallback([&](int64_t t, int64_t r) { allocate_activations(t, r); }, std::make_pair(t_geo, t_exact),
                  std::make_pair(r_geo, r_exact));
  }
  if (grow_step) {
    StepLayout exact, geo;
    exact.tokens = std::max(layout_.tokens, T);
    exact.rows = std::max(layout_.rows, R);
    exact.seqs = std::max(layout_.seqs, S);
    exact.table = std::max(layout_.table, table_width);  // the table stride is fixed by allocate_kv: no growth
    geo = exact;
    geo.tokens = grown(layout_.tokens, T);
    geo.rows = grown(layout_.rows, R);
    geo.seqs = grown(layout_.seqs, S);
    layout_ = StepLayout{};
    with_fallback([&](const StepLayout& L) { allocate_step(L); }, std::make_pair(geo, exact));
  }
}

// (Re)allocates the activations for `tokens` tokens and `rows` logit rows; sets the capacities
// only when all of them exist.
void CudaBackend::allocate_activations(int64_t tokens, int64_t rows) {
  const size_t H = size_t(c_.hidden_size), nq = size_t(c_.num_heads), hd = size_t(c_.head_dim);
  const size_t t = size_t(tokens), r = size_t(rows);
  if (c_.sandwich_norms) y_.allocate(t * H * 4, stream_);
  if (c_.any_local_rope()) cos_sin_local_.allocate(t * size_t(c_.rotary_dim()) * 4 + 4, stream_);
  if (c_.num_experts > 0) {
    const int E = int(c_.num_experts);
    const size_t routes = t * size_t(c_.experts_per_token);
    const size_t tiles = size_t(cuda::grouped_max_tiles(int(routes), E, 8));  // 8-row tiles: the most tiles
    router_logits_.allocate(t * size_t(E) * 4, stream_);
    route_ids_.allocate(routes * 4, stream_);
    route_w_.allocate(routes * 4, stream_);
    route_row_.allocate(routes * 4, stream_);
    row_token_.allocate(routes * 4, stream_);
    expert_offsets_.allocate(size_t(E + 1) * 4, stream_);
    tile_expert_.allocate(tiles * 4, stream_);
    tile_row0_.allocate(tiles * 4, stream_);
    num_tiles_.allocate(4, stream_);
    moe_h_.allocate(routes * size_t(w_.moe_inter_pad) * esz_, stream_);
    moe_y_.allocate(routes * H * 4, stream_);
  }
  // The old buffers are freed first (DeviceBuffer::allocate) so that growth never needs the old
  // and the new size at once.
  x_.allocate(t * H * 4, stream_);
  if (takes_input_embeds()) {
    embeds_cap_ = 0;
    embeds_dev_.allocate(t * H * 4 + t * 4, stream_);
    embeds_cap_ = tokens;
  }
  xn_.allocate(t * size_t(w_.ld_h) * esz_, stream_);
  qkv_.allocate(t * size_t(w_.qkv_rows) * 4, stream_);
  q_.allocate(t * nq * hd * 4, stream_);
  attn_.allocate(t * size_t(w_.ld_attn) * esz_, stream_);
  h_.allocate(t * size_t(w_.inter_pad) * esz_, stream_);
  if (fp8_ld_ > 0) {
    fp8_x_.allocate(t * size_t(fp8_ld_), stream_);
    fp8_xs_.allocate(t * size_t(fp8_scale_cols_) * 4, stream_);
  }
  cos_sin_.allocate(t * size_t(c_.rotary_dim()) * 4 + 4, stream_);
  last_.allocate(r * size_t(w_.ld_h) * esz_, stream_);
  logits_.allocate(r * size_t(c_.vocab_size) * 4, stream_);
  // Split attention is used for up to kMaxGraphBatch tokens (decode); prefill uses one split.
  const size_t split_tokens = std::min<size_t>(t, kMaxGraphBatch);
  attn_part_capacity_ = 0;
  attn_part_acc_.allocate(split_tokens * nq * kMaxAttnSplits * hd * 4, stream_);
  attn_part_ml_.allocate(split_tokens * nq * kMaxAttnSplits * 2 * 4, stream_);
  sample_params_.allocate(r * sizeof(cuda::SampleRowParams), stream_);
  sample_out_.allocate(r * (3 + 2 * kMaxTopN) * 4, stream_);
  // The wide sampler's workspace takes the row statistics' place (zeroed here, left zeroed by it).
  const size_t stats_bytes = r * cuda::kSampleStatsFloatsPerRow * 4;
  sample_stats_.allocate(
      wide_sampler_ ? std::max(stats_bytes, cuda::sample_wide_workspace_bytes(int(r), int(c_.vocab_size))) : stats_bytes,
      stream_);
  attn_part_capacity_ = split_tokens * nq * kMaxAttnSplits * hd;
  cap_tokens_ = tokens;
  cap_rows_ = rows;
}

// Lays out the step inputs for the capacities in `want` and (re)allocates their device and
// pinned buffers; layout_ is set only when both exist.
void CudaBackend::allocate_step(const StepLayout& want) {
  StepLayout L = want;
  size_t off = 0;
  auto take = [&](int64_t n) {
    const size_t o = off;
    off += (size_t(n) * 4 + 255) / 256 * 256;
    return o;
  };
  L.off_ids = take(L.tokens);
  L.off_pos = take(L.tokens);
  L.off_seq = take(L.tokens);
  L.off_slot = take(L.tokens);
  if (c_.mrope()) L.off_rpos = take(3 * L.tokens);
  if (c_.image_attention_bidirectional) L.off_last = take(L.tokens);
  L.off_rows = take(L.rows);
  L.off_stride = take(1);
  L.off_tables = take(L.seqs * L.table);
  if (num_window_layers_) {
    L.off_wslot = take(L.tokens);
    L.off_wtables = take(L.seqs * L.table);
  }
  L.bytes = off;
  // The last uploads may still be reading the pinned buffers that reserve() is about to free.
  const int slots = device_tokens_ ? 2 : 1;
  for (int i = 0; i < slots; i++) SLUICE_CUDA_CHECK(cudaEventSynchronize(step_copied_[i]));
  step_dev_.allocate(off, stream_);
  for (int i = 0; i < slots; i++) step_host_[i].reserve(off);
  layout_ = L;
}

int CudaBackend::choose_attn_splits(int64_t T, int64_t max_ctx) const {
  if (T > kMaxGraphBatch) return 1;
  if (flash_prefill_)  // the flash decode kernel's blocks (a GQA group per block) fill the device differently
    return cuda::flash_decode_splits(int(T), int(c_.num_heads), int(c_.num_kv_heads), int(c_.head_dim), max_ctx, num_sms_,
                                     kMaxAttnSplits);
  const int64_t heads_blocks = T * c_.num_kv_heads * std::max<int64_t>(1, (c_.num_heads / c_.num_kv_heads + 7) / 8);
  int64_t splits = (2 * num_sms_ + heads_blocks - 1) / heads_blocks;
  splits = std::min<int64_t>({splits, kMaxAttnSplits, std::max<int64_t>(1, max_ctx / 64)});
  return int(std::max<int64_t>(1, splits));
}

void CudaBackend::upload_step(const ForwardBatch& b, int64_t T_pad, int64_t R_pad, int64_t width) {
  // The asynchronous copy out of this pinned buffer may still be queued: the previous step's (one
  // buffer), or with device tokens the one before it, whose step has ended (so it never waits).
  const int slot = step_slot_;
  if (device_tokens_) step_slot_ ^= 1;
  SLUICE_CUDA_CHECK(cudaEventSynchronize(step_copied_[slot]));
  uint8_t* h = step_host_[slot].get<uint8_t>();
  const StepLayout& L = layout_;
  auto i32 = [&](size_t off) { return reinterpret_cast<int32_t*>(h + off); };
  const int64_t T = b.num_tokens, S = b.num_seqs;
  std::memcpy(i32(L.off_ids), b.token_ids, size_t(T) * 4);
  std::memcpy(i32(L.off_pos), b.positions, size_t(T) * 4);
  std::memcpy(i32(L.off_seq), b.token_seq, size_t(T) * 4);
  std::memcpy(i32(L.off_slot), b.slots, size_t(T) * 4);
  for (int64_t t = T; t < T_pad; t++) {  // graph padding: token 0 at position 0 of a scratch sequence
    i32(L.off_ids)[t] = 0;
    i32(L.off_pos)[t] = 0;
    i32(L.off_seq)[t] = int32_t(S);
    i32(L.off_slot)[t] = int32_t(scratch_block_ * block_size_);
  }
  if (c_.mrope()) {
    if (T > 0) {  // (capture_graphs_at_load's padding batches have no tokens)
      if (!b.rope_positions) throw Error(ErrorCode::kInternal, "an M-RoPE step without rope_positions");
      std::memcpy(i32(L.off_rpos), b.rope_positions, size_t(3 * T) * 4);
    }
    std::fill(i32(L.off_rpos) + 3 * T, i32(L.off_rpos) + 3 * T_pad, 0);  // padding: position (0, 0, 0)
  }
  if (c_.image_attention_bidirectional) {  // causal where the step gives no attn_last
    if (T > 0) std::memcpy(i32(L.off_last), b.attn_last ? b.attn_last : b.positions, size_t(T) * 4);
    std::fill(i32(L.off_last) + T, i32(L.off_last) + T_pad, 0);  // padding: position 0
  }
  std::memcpy(i32(L.off_rows), b.logit_rows, size_t(b.num_logit_rows) * 4);
  for (int64_t r = b.num_logit_rows; r < R_pad; r++) i32(L.off_rows)[r] = int32_t(r);
  *i32(L.off_stride) = int32_t(width);
  int32_t* tables = i32(L.off_tables);
  for (int64_t s = 0; s < S; s++) {
    std::memcpy(tables + s * width, b.block_tables[s], size_t(b.num_seq_blocks[s]) * 4);
    std::fill(tables + s * width + b.num_seq_blocks[s], tables + (s + 1) * width, scratch_block_);
  }
  if (T_pad > T) std::fill(tables + S * width, tables + (S + 1) * width, scratch_block_);
  const int64_t table_rows = S + (T_pad > T ? 1 : 0);
  // Everything up to the end of the used table rows, in one copy.
  size_t bytes = L.off_tables + size_t(table_rows * width) * 4;
  if (num_window_layers_) {
    // The window layers' slots and tables (entries before a window are -1: never read).
    if (T > 0) std::memcpy(i32(L.off_wslot), b.window_slots, size_t(T) * 4);
    for (int64_t t = T; t < T_pad; t++) i32(L.off_wslot)[t] = int32_t(scratch_window_block_ * block_size_);
    int32_t* wtables = i32(L.off_wtables);
    for (int64_t s = 0; s < S; s++) {
      std::memcpy(wtables + s * width, b.window_block_tables[s], size_t(b.num_seq_blocks[s]) * 4);
      std::fill(wtables + s * width + b.num_seq_blocks[s], wtables + (s + 1) * width, scratch_window_block_);
    }
    if (T_pad > T) std::fill(wtables + S * width, wtables + (S + 1) * width, scratch_window_block_);
    bytes = L.off_wtables + size_t(table_rows * width) * 4;
  }
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(step_dev_.get(), h, bytes, cudaMemcpyHostToDevice, stream_));
  SLUICE_CUDA_CHECK(cudaEventRecord(step_copied_[slot], stream_));
}

// Stages the step's given input rows (f32, as the residual stream x_) and their indices for
// embed()'s scatter. Only eager steps carry them (forward()).
void CudaBackend::upload_embeds(const ForwardBatch& b) {
  const int64_t n = b.num_input_embeds, H = c_.hidden_size;
  if (n > embeds_cap_) {  // a model that did not declare image tokens, or more rows than the activations
    SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    embeds_cap_ = 0;
    embeds_dev_.allocate(size_t(n) * size_t(H) * 4 + size_t(n) * 4, stream_);
    embeds_cap_ = n;
  }
  SLUICE_CUDA_CHECK(cudaEventSynchronize(embeds_copied_));  // the last upload from the pinned copy was read
  const size_t row_bytes = size_t(H) * 4, floats_bytes = size_t(n) * row_bytes;
  embeds_host_.reserve(floats_bytes + size_t(n) * 4);
  uint8_t* h = embeds_host_.get<uint8_t>();
  for (int64_t i = 0; i < n; i++) std::memcpy(h + size_t(i) * row_bytes, b.input_embeds[i], row_bytes);
  std::memcpy(h + floats_bytes, b.input_embed_rows, size_t(n) * 4);
  uint8_t* d = embeds_dev_.get<uint8_t>();
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(d, h, floats_bytes, cudaMemcpyHostToDevice, stream_));
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(d + size_t(embeds_cap_) * row_bytes, h + floats_bytes, size_t(n) * 4,
                                    cudaMemcpyHostToDevice, stream_));
  SLUICE_CUDA_CHECK(cudaEventRecord(embeds_copied_, stream_));
  step_embeds_ = int(n);
}

void CudaBackend::set_step(int64_t T, int64_t R, int splits) {
  cuda::GemmWorkspace ws{gemm_partials_.get<float>(), gemm_partials_.bytes() / 4, gemm_tickets_.get<int>(),
                         int(gemm_tickets_.bytes() / 4), num_sms_};
  if (lt_) {
    ws.lt = lt_.get();
    ws.lt_workspace = lt_workspace_.get();
    ws.lt_workspace_bytes = lt_workspace_.bytes();
    ws.lt_scratch = lt_scratch_.get<float>();
    ws.lt_scratch_floats = lt_scratch_.bytes() / 4;
  }
  step_ws_ = ws;
  step_T_ = int(T);
  step_R_ = R;
  step_splits_ = splits;
}

void CudaBackend::run_layers(int64_t T, int64_t R, int splits) {
  set_step(T, R, splits);
  run_decoder(c_, *this);
}

// A layer's K cache, then its V cache: each [blocks + 1, block_size, nkv, hd] E, over the full
// blocks, or for a window layer the window blocks (after every full layer's).
size_t CudaBackend::layer_kv_bytes(int64_t layer) const {
  const int64_t blocks = windowed(layer) ? num_window_blocks_ : num_blocks_;
  return size_t(blocks + 1) * size_t(block_size_) * size_t(c_.num_kv_heads * c_.head_dim) * kv_esz_;
}
uint8_t* CudaBackend::k_cache(int64_t layer) const {
  const size_t full_layer = size_t(num_blocks_ + 1) * size_t(block_size_) * size_t(c_.num_kv_heads * c_.head_dim) * kv_esz_;
  const size_t region = windowed(layer) ? size_t(c_.num_layers - num_window_layers_) * 2 * full_layer : 0;
  return kv_.get<uint8_t>() + region + size_t(2 * kv_index_[size_t(layer)]) * layer_kv_bytes(layer);
}
uint8_t* CudaBackend::v_cache(int64_t layer) const { return k_cache(layer) + layer_kv_bytes(layer); }

void CudaBackend::embed() {
  const int32_t* ids = dev_i32(layout_.off_ids);
  // Tokens the step before sampled and this one computes are still refs (< 0): read them here.
  if (device_tokens_)
    cuda::resolve_device_tokens(reinterpret_cast<int32_t*>(step_dev_.get<uint8_t>() + layout_.off_ids), step_T_,
                                device_token_buf_.get<int32_t>(), int(device_token_rows_), int(c_.vocab_size), stream_);
  const int H = int(c_.hidden_size);
  cuda::embedding(ids, step_T_, w_.embed.get(), int(w_.ld_h), e_, H, float(c_.embed_scale), x_.get<float>(), stream_);
  if (step_embeds_ > 0) {  // given input rows replace their tokens' (unscaled)
    const uint8_t* d = embeds_dev_.get<uint8_t>();
    cuda::scatter_rows(reinterpret_cast<const float*>(d),
                       reinterpret_cast<const int32_t*>(d + size_t(embeds_cap_) * size_t(H) * 4), step_embeds_, H,
                       x_.get<float>(), stream_);
  }
  const int half = int(c_.rotary_dim() / 2);
  auto table = [&](const float* inv_freq, float* cos_sin) {
    if (c_.mrope())
      cuda::rope_table_mrope(dev_i32(layout_.off_rpos), step_T_, inv_freq, half, int(c_.mrope_section[0]),
                             int(c_.mrope_section[1]), cos_sin, stream_);
    else
      cuda::rope_table(dev_i32(layout_.off_pos), step_T_, inv_freq, half, cos_sin, stream_);
  };
  table(w_.inv_freq.get<float>(), cos_sin_.get<float>());
  if (c_.any_local_rope()) table(w_.local_inv_freq.get<float>(), cos_sin_local_.get<float>());
}

void CudaBackend::norm(int64_t layer, LayerNorm which) {
  const cuda::DeviceLayer& L = w_.layers[size_t(layer)];
  if (which != LayerNorm::kAttnIn && which != LayerNorm::kMlpIn)
    throw Error(ErrorCode::kInternal, "norm() takes a block's input norm (add_normed() its output's)");
  const DeviceBuffer& w = which == LayerNorm::kAttnIn ? L.input_norm : L.post_norm;
  cuda::rmsnorm(x_.get<float>(), step_T_, int(c_.hidden_size), nullptr, w.get<float>(), float(c_.rms_norm_eps),
                xn_.get(), int(w_.ld_h), e_, stream_);
}

void CudaBackend::q4_project(const cuda::DeviceQ4& w, const void* x, int64_t ld_x, const float* bias, void* y,
                             int64_t ld_y, cuda::Q4Out out) {
  cuda::Q4GemvArgs a;
  a.x = x;
  a.ld_x = int(ld_x);
  a.rows = step_T_;
  a.bias = bias;
  a.y = y;
  a.ld_y = int(ld_y);
  a.out = out;
  a.num_sms = num_sms_;
  cuda::q4_gemv(w.w, a, e_, stream_);
}

void CudaBackend::fp8_quantize(const void* x, int64_t ld_x, int64_t K) {
  if (w_.fp8_scales == Fp8Scales::Block)
    cuda::quantize_rows_fp8_blocks(x, e_, step_T_, int(K), int(ld_x), fp8_x_.get<uint8_t>(), int(fp8_ld_),
                                   fp8_xs_.get<float>(), int(fp8_scale_cols_), stream_);
  else
    cuda::quantize_rows_fp8(x, e_, step_T_, int(K), int(ld_x), fp8_x_.get<uint8_t>(), int(fp8_ld_),
                            fp8_xs_.get<float>(), stream_);
}

void CudaBackend::fp8_project(const cuda::DeviceFp8& w, int t0, int T, int64_t N, int64_t K, const float* bias,
                              float* y, int64_t ld_y, bool accumulate) {
  cuda::Fp8GemmArgs a;
  a.x = fp8_x_.get<uint8_t>() + size_t(t0) * size_t(fp8_ld_);
  a.ld_x = int(fp8_ld_);
  a.x_block_scales = w_.fp8_scales == Fp8Scales::Block;
  a.x_scale = fp8_xs_.get<float>() + size_t(t0) * size_t(a.x_block_scales ? fp8_scale_cols_ : 1);
  a.ld_x_scale = int(fp8_scale_cols_);
  a.w = w.codes.get<uint8_t>();
  a.ld_w = w.ld;
  a.w_scale = w.scale.get<float>();
  a.w_scales = w.scales;
  a.w_block_rows = 1;  // block scales are expanded per row at upload
  a.bias = bias;
  a.T = T;
  a.N = int(N);
  a.K = int(K);
  a.y = y;
  a.ld_y = int(ld_y);
  a.y_type = DType::F32;
  a.accumulate = accumulate;
  cuda::fp8_gemm(a, stream_);
}

// The adapters add to qkv_'s q | k | v columns after the base projection.
void CudaBackend::qkv(int64_t layer) {
  project_qkv(layer);
  if (!step_lora_) return;
  const int64_t q = c_.num_heads * c_.head_dim, kv = c_.num_kv_heads * c_.head_dim;
  float* y = qkv_.get<float>();
  cuda::lora_add(lora_args(layer, LoraTarget::kQ, xn_.get(), w_.ld_h, y, w_.qkv_rows), e_, stream_);
  cuda::lora_add(lora_args(layer, LoraTarget::kK, xn_.get(), w_.ld_h, y + q, w_.qkv_rows), e_, stream_);
  cuda::lora_add(lora_args(layer, LoraTarget::kV, xn_.get(), w_.ld_h, y + q + kv, w_.qkv_rows), e_, stream_);
}

// Q4 layers: three GEMVs into qkv_'s q | k | v columns (1..8 tokens), else q, k and v dequantized
// into the fused matrix's rows and the GEMM. FP8 layers: x quantized, one FP8 GEMM.
void CudaBackend::project_qkv(int64_t layer) {
  const cuda::DeviceLayer& L = w_.layers[size_t(layer)];
  if (L.fp8_attn) {
    fp8_quantize(xn_.get(), w_.ld_h, c_.hidden_size);
    fp8_project(L.fp8_qkv, 0, step_T_, w_.qkv_rows, c_.hidden_size, L.qkv_b.get<float>(), qkv_.get<float>(),
                w_.qkv_rows, false);
    return;
  }
  const void* w = L.qkv_w.get();
  if (L.q4_attn) {
    const int64_t q_rows = c_.num_heads * c_.head_dim, kv_rows = c_.num_kv_heads * c_.head_dim;
    if (q4_gemv_step()) {
      const float* b = L.qkv_b.get<float>();
      float* y = qkv_.get<float>();
      q4_project(L.q4_q, xn_.get(), w_.ld_h, b, y, w_.qkv_rows, cuda::Q4Out::kStoreF32);
      q4_project(L.q4_k, xn_.get(), w_.ld_h, b ? b + q_rows : nullptr, y + q_rows, w_.qkv_rows, cuda::Q4Out::kStoreF32);
      q4_project(L.q4_v, xn_.get(), w_.ld_h, b ? b + q_rows + kv_rows : nullptr, y + q_rows + kv_rows, w_.qkv_rows,
                 cuda::Q4Out::kStoreF32);
      return;
    }
    uint8_t* dst = q4_qkv_w_.get<uint8_t>();
    const size_t row_bytes = size_t(w_.ld_h) * esz_;
    cuda::q4_dequantize(L.q4_q.w, dst, int(w_.ld_h), e_, stream_);
    cuda::q4_dequantize(L.q4_k.w, dst + size_t(q_rows) * row_bytes, int(w_.ld_h), e_, stream_);
    cuda::q4_dequantize(L.q4_v.w, dst + size_t(q_rows + kv_rows) * row_bytes, int(w_.ld_h), e_, stream_);
    w = dst;
  }
  cuda::GemmArgs g = projection(xn_.get(), w_.ld_h, w, w_.ld_h, L.qkv_b.get<float>(),
                                step_T_, w_.qkv_rows, c_.hidden_size);
  g.epilogue = cuda::Epilogue::kStore;
  g.y = qkv_.get<float>();
  g.ld_y = int(w_.qkv_rows);
  cuda::gemm(g, e_, step_ws_, stream_);
}

// One kernel: q/k norms, rope from the step's cos/sin table, K/V into the cache.
void CudaBackend::rope_kv_write(int64_t layer) {
  const cuda::DeviceLayer& L = w_.layers[size_t(layer)];
  cuda::QkvPostArgs qa;
  qa.qkv = qkv_.get<float>();
  qa.T = step_T_;
  qa.nq = int(c_.num_heads);
  qa.nkv = int(c_.num_kv_heads);
  qa.hd = int(c_.head_dim);
  qa.rot_half = int(c_.rotary_dim() / 2);
  qa.q_norm = L.q_norm.get<float>();
  qa.k_norm = L.k_norm.get<float>();
  qa.eps = float(c_.rms_norm_eps);
  qa.cos_sin = c_.local_rope(layer) ? cos_sin_local_.get<float>() : cos_sin_.get<float>();
  qa.slots = dev_i32(windowed(layer) ? layout_.off_wslot : layout_.off_slot);
  qa.k_cache = k_cache(layer);
  qa.v_cache = v_cache(layer);
  qa.kv_fp8 = fp8_kv_;
  qa.k_scale = k_scale_[size_t(layer)];
  qa.v_scale = v_scale_[size_t(layer)];
  qa.q_out = q_.get<float>();
  cuda::qkv_post(qa, e_, stream_);
}

void CudaBackend::attention(int64_t layer) {
  if (capturing_pieces_) end_piece();
  attention_now(layer);
  if (capturing_pieces_) begin_piece();
}

void CudaBackend::attention_now(int64_t layer) {
  cuda::AttentionArgs aa;
  aa.q = q_.get<float>();
  aa.T = step_T_;
  aa.nq = int(c_.num_heads);
  aa.nkv = int(c_.num_kv_heads);
  aa.hd = int(c_.head_dim);
  aa.token_seq = dev_i32(layout_.off_seq);
  aa.positions = dev_i32(layout_.off_pos);
  aa.last = step_last_ ? dev_i32(layout_.off_last) : nullptr;  // else causal: no extra reads
  aa.block_tables = dev_i32(windowed(layer) ? layout_.off_wtables : layout_.off_tables);
  aa.table_stride = dev_i32(layout_.off_stride);
  aa.block_size = int(block_size_);
  aa.k_cache = k_cache(layer);
  aa.v_cache = v_cache(layer);
  aa.kv_fp8 = fp8_kv_;
  aa.k_scale = k_scale_[size_t(layer)];
  aa.v_scale = v_scale_[size_t(layer)];
  aa.scale = float(c_.softmax_scale());  // YaRN's attention factor included
  aa.num_splits = step_splits_;
  aa.partial_acc = attn_part_acc_.get<float>();
  aa.partial_ml = attn_part_ml_.get<float>();
  aa.out = attn_.get();
  aa.ld_out = int(w_.ld_attn);
  aa.window = int(c_.window(layer));
  aa.sinks = w_.layers[size_t(layer)].sinks.get<float>();
  // cuda_attention "flash": a step with prefill chunks (more tokens than sequences) runs the
  // tensor-core prefill kernel, a decode step (and its graph) the tensor-core split-KV decode
  // kernel, whose splits merge in the same launch through the GEMM's tickets (never in use
  // between the two kernels on this stream). A decode-shaped step whose tokens attend past their
  // positions (a one-token chunk of an image) runs the paged kernel: flash decode is causal only.
  if (flash_prefill_ && step_prefill_) cuda::flash_prefill_attention(aa, e_, stream_);
  else if (flash_prefill_ && !aa.last) cuda::flash_decode_attention(aa, e_, gemm_tickets_.get<int>(), stream_);
  else cuda::paged_attention(aa, e_, stream_);
}

// The adapters add into the same output as the base projection (their sum is the block's output).
void CudaBackend::attention_out(int64_t layer, BlockOut out) {
  project_o(layer, out);
  if (!step_lora_) return;
  float* y = out == BlockOut::kToY ? y_.get<float>() : x_.get<float>();
  cuda::lora_add(lora_args(layer, LoraTarget::kO, attn_.get(), w_.ld_attn, y, c_.hidden_size), e_, stream_);
}

// The o projection's GEMM adds into the residual stream in its epilogue (or stores into y for a
// sandwich norm).
void CudaBackend::project_o(int64_t layer, BlockOut out) {
  const cuda::DeviceLayer& L = w_.layers[size_t(layer)];
  if (L.fp8_attn) {
    const bool to_y = out == BlockOut::kToY;
    const int64_t K = c_.num_heads * c_.head_dim;
    fp8_quantize(attn_.get(), w_.ld_attn, K);
    fp8_project(L.fp8_o, 0, step_T_, c_.hidden_size, K, L.o_b.get<float>(), to_y ? y_.get<float>() : x_.get<float>(),
                c_.hidden_size, !to_y);
    return;
  }
  const void* w = L.o_w.get();
  if (L.q4_attn) {
    if (q4_gemv_step()) {
      const bool to_y = out == BlockOut::kToY;
      q4_project(L.q4_o, attn_.get(), w_.ld_attn, L.o_b.get<float>(), to_y ? y_.get<float>() : x_.get<float>(),
                 c_.hidden_size, to_y ? cuda::Q4Out::kStoreF32 : cuda::Q4Out::kAddF32);
      return;
    }
    cuda::q4_dequantize(L.q4_o.w, q4_o_w_.get(), int(w_.ld_attn), e_, stream_);
    w = q4_o_w_.get();
  }
  cuda::GemmArgs g = projection(attn_.get(), w_.ld_attn, w, w_.ld_attn, L.o_b.get<float>(),
                                step_T_, c_.hidden_size, c_.num_heads * c_.head_dim);
  g.epilogue = out == BlockOut::kToY ? cuda::Epilogue::kStore : cuda::Epilogue::kAddTo;
  g.y = out == BlockOut::kToY ? y_.get<float>() : x_.get<float>();
  g.ld_y = int(c_.hidden_size);
  cuda::gemm(g, e_, step_ws_, stream_);
}

// The adapters of gate and up add to their f32 outputs before the gated activation (project_mlp),
// down's into the block's output after the base projection.
void CudaBackend::mlp(int64_t layer, BlockOut out) {
  project_mlp(layer, out);
  if (!step_lora_) return;
  float* y = out == BlockOut::kToY ? y_.get<float>() : x_.get<float>();
  cuda::lora_add(lora_args(layer, LoraTarget::kDown, h_.get(), w_.inter_pad, y, c_.hidden_size), e_, stream_);
}

// gate/up in one GEMM whose epilogue applies the family's gated activation; down adds into the
// residual stream (or stores into y). Q4 layers: for 1..8 tokens a GEMV each for gate and up, the
// gated activation, and a GEMV for down; else the matrices dequantized and the same GEMMs. FP8
// layers: x quantized, the gate/up FP8 GEMM into f32 and the gated activation (in chunks of
// kFp8GateUpChunk tokens), h quantized and the down FP8 GEMM. A step with adapters stores gate/up
// in f32 (the FP8 path's, the Q4 GEMVs', else lora_gu_ in chunks of kLoraGateUpChunk tokens), adds
// theirs, then runs the gated activation.
void CudaBackend::project_mlp(int64_t layer, BlockOut out) {
  const cuda::DeviceLayer& L = w_.layers[size_t(layer)];
  if (L.fp8_mlp) {
    const bool to_y = out == BlockOut::kToY;
    const int64_t H = c_.hidden_size, I = c_.intermediate_size, N = 2 * w_.inter_pad;
    fp8_quantize(xn_.get(), w_.ld_h, H);
    for (int t0 = 0; t0 < step_T_; t0 += kFp8GateUpChunk) {
      const int T = std::min(kFp8GateUpChunk, step_T_ - t0);
      fp8_project(L.fp8_gate_up, t0, T, N, H, nullptr, fp8_gu_.get<float>(), N, false);
      if (step_lora_) lora_gate_up(layer, t0, T, fp8_gu_.get<float>(), N);
      cuda::gated_mul_interleaved(fp8_gu_.get<float>(), T, int(N), L.gate_up_b.get<float>(), gate_act(c_.activation),
                                  float(c_.swiglu_limit), h_.get<uint8_t>() + size_t(t0) * size_t(w_.inter_pad) * esz_,
                                  int(w_.inter_pad), e_, stream_);
    }
    fp8_quantize(h_.get(), w_.inter_pad, I);
    fp8_project(L.fp8_down, 0, step_T_, H, I, L.down_b.get<float>(), to_y ? y_.get<float>() : x_.get<float>(), H,
                !to_y);
    return;
  }
  const void* gate_up_w = L.gate_up_w.get();
  const void* down_w = L.down_w.get();
  if (L.q4_mlp) {
    if (q4_gemv_step()) {
      const bool to_y = out == BlockOut::kToY;
      q4_project(L.q4_gate, xn_.get(), w_.ld_h, L.gate_b.get<float>(), q4_gate_.get(), w_.inter_pad,
                 cuda::Q4Out::kStoreF32);
      q4_project(L.q4_up, xn_.get(), w_.ld_h, L.up_b.get<float>(), q4_up_.get(), w_.inter_pad, cuda::Q4Out::kStoreF32);
      if (step_lora_) {
        cuda::lora_add(lora_args(layer, LoraTarget::kGate, xn_.get(), w_.ld_h, q4_gate_.get<float>(), w_.inter_pad), e_,
                       stream_);
        cuda::lora_add(lora_args(layer, LoraTarget::kUp, xn_.get(), w_.ld_h, q4_up_.get<float>(), w_.inter_pad), e_,
                       stream_);
      }
      cuda::gated_mul(q4_gate_.get<float>(), q4_up_.get<float>(), step_T_, int(c_.intermediate_size), int(w_.inter_pad),
                      gate_act(c_.activation), float(c_.swiglu_limit), h_.get(), int(w_.inter_pad), e_, stream_);
      q4_project(L.q4_down, h_.get(), w_.inter_pad, L.down_b.get<float>(), to_y ? y_.get<float>() : x_.get<float>(),
                 c_.hidden_size, to_y ? cuda::Q4Out::kStoreF32 : cuda::Q4Out::kAddF32);
      return;
    }
    cuda::q4_dequantize(L.q4_gate.w, q4_gate_up_w_.get(), int(w_.ld_h), e_, stream_, cuda::Q4Rows::kGateRows);
    cuda::q4_dequantize(L.q4_up.w, q4_gate_up_w_.get(), int(w_.ld_h), e_, stream_, cuda::Q4Rows::kUpRows);
    cuda::q4_dequantize(L.q4_down.w, q4_down_w_.get(), int(w_.inter_pad), e_, stream_);
    gate_up_w = q4_gate_up_w_.get();
    down_w = q4_down_w_.get();
  }
  cuda::GemmArgs g = projection(xn_.get(), w_.ld_h, gate_up_w, w_.ld_h, L.gate_up_b.get<float>(),
                                step_T_, 2 * w_.inter_pad, c_.hidden_size);
  if (step_lora_) {
    const int64_t N = 2 * w_.inter_pad;
    for (int t0 = 0; t0 < step_T_; t0 += kLoraGateUpChunk) {
      const int T = std::min(kLoraGateUpChunk, step_T_ - t0);
      cuda::GemmArgs chunk = projection(xn_.get<uint8_t>() + size_t(t0) * size_t(w_.ld_h) * esz_, w_.ld_h, gate_up_w,
                                        w_.ld_h, nullptr, T, N, c_.hidden_size);
      chunk.epilogue = cuda::Epilogue::kStore;
      chunk.y = lora_gu_.get<float>();
      chunk.ld_y = int(N);
      cuda::gemm(chunk, e_, step_ws_, stream_);
      lora_gate_up(layer, t0, T, lora_gu_.get<float>(), N);
      cuda::gated_mul_interleaved(lora_gu_.get<float>(), T, int(N), L.gate_up_b.get<float>(), gate_act(c_.activation),
                                  float(c_.swiglu_limit), h_.get<uint8_t>() + size_t(t0) * size_t(w_.inter_pad) * esz_,
                                  int(w_.inter_pad), e_, stream_);
    }
  } else {
    g.epilogue = cuda::Epilogue::kGatedMul;
    g.act = gate_act(c_.activation);
    g.act_limit = float(c_.swiglu_limit);
    g.h = h_.get();
    g.ld_h = int(w_.inter_pad);
    cuda::gemm(g, e_, step_ws_, stream_);
  }

  g.x = h_.get();
  g.ld_x = int(w_.inter_pad);
  g.w = down_w;
  g.ld_w = int(w_.inter_pad);
  g.bias = L.down_b.get<float>();
  g.N = int(c_.hidden_size);
  g.K = int(w_.inter_pad);
  g.epilogue = out == BlockOut::kToY ? cuda::Epilogue::kStore : cuda::Epilogue::kAddTo;
  g.y = out == BlockOut::kToY ? y_.get<float>() : x_.get<float>();
  g.ld_y = int(c_.hidden_size);
  cuda::gemm(g, e_, step_ws_, stream_);
}

cuda::LoraArgs CudaBackend::lora_args(int64_t layer, LoraTarget target, const void* x, int64_t ld_x, float* y,
                                      int64_t ld_y, int t0, int T) const {
  const int64_t H = c_.hidden_size, q = c_.num_heads * c_.head_dim, kv = c_.num_kv_heads * c_.head_dim,
                I = c_.intermediate_size;
  int64_t in = H, out = H;  // as LoraAdapter's shapes: [out, r] x [r, in]
  switch (target) {
    case LoraTarget::kQ: out = q; break;
    case LoraTarget::kK:
    case LoraTarget::kV: out = kv; break;
    case LoraTarget::kO: in = q; break;
    case LoraTarget::kGate:
    case LoraTarget::kUp: out = I; break;
    case LoraTarget::kDown: in = I; break;
  }
  cuda::LoraArgs a;
  a.slots = lora_.slots() + t0;
  a.tables = lora_.tables();
  a.entry = int(layer * kNumLoraTargets + int64_t(target));
  a.T = T < 0 ? step_T_ - t0 : T;
  a.x = x;
  a.ld_x = int(ld_x);
  a.in = int(in);
  a.tmp = lora_tmp_.get<float>();
  a.y = y;
  a.ld_y = int(ld_y);
  a.out = int(out);
  return a;
}

void CudaBackend::lora_gate_up(int64_t layer, int t0, int T, float* g, int64_t ld_g) {
  const void* x = xn_.get<uint8_t>() + size_t(t0) * size_t(w_.ld_h) * esz_;
  for (const LoraTarget target : {LoraTarget::kGate, LoraTarget::kUp}) {
    cuda::LoraArgs a = lora_args(layer, target, x, w_.ld_h, g, ld_g, t0, T);
    a.col0 = target == LoraTarget::kGate ? 0 : 8;  // 16-column groups [gate 8 | up 8]
    a.group = 8;
    a.group_stride = 16;
    cuda::lora_add(a, e_, stream_);
  }
}

// The scratch of an eager step of T <= cap_tokens_ tokens with adapters.
void CudaBackend::ensure_lora_scratch(int64_t T) {
  if (lora_tmp_rows_ < T) {
    lora_tmp_rows_ = 0;
    lora_tmp_.allocate(size_t(cap_tokens_) * size_t(kMaxLoraRank) * 4, stream_);
    lora_tmp_rows_ = cap_tokens_;
  }
  bool fused_gate_up = false;  // some dense layer's gate/up GEMM would fuse the activation
  for (int64_t l = 0; l < c_.num_layers; l++)
    fused_gate_up = fused_gate_up || (!c_.is_sparse(l) && !w_.layers[size_t(l)].fp8_mlp);
  if (fused_gate_up && !lora_gu_.bytes())
    lora_gu_.allocate(size_t(kLoraGateUpChunk) * size_t(2 * w_.inter_pad) * 4, stream_);
}

// Router GEMM, top-k routing, the routes grouped by expert on the device (moe_plan), the grouped
// gate/up GEMM (gathering each route's token row, the gated activation in its epilogue), the
// grouped down GEMM, and the combine of each token's experts in rank order. No host sync: the
// row counts stay on the device, so decode steps replay as graphs whatever the routing.
void CudaBackend::experts(int64_t layer, BlockOut out) {
  const cuda::DeviceLayer& L = w_.layers[size_t(layer)];
  const int T = step_T_, E = int(c_.num_experts), K = int(c_.experts_per_token), H = int(c_.hidden_size);
  const int mip = int(w_.moe_inter_pad), routes = T * K;
  cuda::GemmArgs g = projection(xn_.get(), w_.ld_h, L.router_w.get(), w_.ld_h, L.router_b.get<float>(), T, E, H);
  g.epilogue = cuda::Epilogue::kStore;
  g.y = router_logits_.get<float>();
  g.ld_y = E;
  cuda::gemm(g, e_, step_ws_, stream_);
  cuda::moe_route(router_logits_.get<float>(), T, E, K, c_.routing == Routing::SoftmaxTopK, c_.norm_topk_prob,
                  route_ids_.get<int32_t>(), route_w_.get<float>(), stream_);

  const int tile_rows = cuda::grouped_tile_rows(routes, E);
  cuda::MoePlan plan;
  plan.expert_offsets = expert_offsets_.get<int32_t>();
  plan.route_row = route_row_.get<int32_t>();
  plan.row_token = row_token_.get<int32_t>();
  plan.tile_expert = tile_expert_.get<int32_t>();
  plan.tile_row0 = tile_row0_.get<int32_t>();
  plan.num_tiles = num_tiles_.get<int32_t>();
  cuda::moe_plan(route_ids_.get<int32_t>(), T, K, E, tile_rows, plan, stream_);

  cuda::GroupedRows rows;
  rows.gather = plan.row_token;
  rows.expert_offsets = plan.expert_offsets;
  rows.tile_expert = plan.tile_expert;
  rows.tile_row0 = plan.tile_row0;
  rows.num_tiles = plan.num_tiles;
  rows.tile_rows = tile_rows;
  rows.max_tiles = cuda::grouped_max_tiles(routes, E, tile_rows);
  rows.w_stride = size_t(2 * mip) * size_t(w_.ld_h);
  rows.bias_stride = 2 * mip;
  cuda::GemmArgs gu = projection(xn_.get(), w_.ld_h, L.experts_gate_up_w.get(), w_.ld_h,
                                 L.experts_gate_up_b.get<float>(), routes, 2 * mip, H);
  gu.epilogue = cuda::Epilogue::kGatedMul;
  gu.act = gate_act(c_.activation);
  gu.act_limit = float(c_.swiglu_limit);
  gu.h = moe_h_.get();
  gu.ld_h = mip;
  gu.grouped = &rows;
  cuda::gemm(gu, e_, step_ws_, stream_);

  cuda::GroupedRows down_rows = rows;
  down_rows.gather = nullptr;  // h is in grouped order already
  down_rows.w_stride = size_t(H) * size_t(mip);
  down_rows.bias_stride = H;
  cuda::GemmArgs dn = projection(moe_h_.get(), mip, L.experts_down_w.get(), mip, L.experts_down_b.get<float>(),
                                 routes, H, mip);
  dn.epilogue = cuda::Epilogue::kStore;
  dn.y = moe_y_.get<float>();
  dn.ld_y = H;
  dn.grouped = &down_rows;
  cuda::gemm(dn, e_, step_ws_, stream_);

  const bool to_y = out == BlockOut::kToY;
  cuda::moe_combine(moe_y_.get<float>(), plan.route_row, route_w_.get<float>(), T, K, H,
                    to_y ? y_.get<float>() : x_.get<float>(), !to_y, stream_);
}

// x += rmsnorm(y) * w: the block output's sandwich norm.
void CudaBackend::add_normed(int64_t layer, LayerNorm which) {
  const cuda::DeviceLayer& L = w_.layers[size_t(layer)];
  if (which != LayerNorm::kAttnOut && which != LayerNorm::kMlpOut)
    throw Error(ErrorCode::kInternal, "add_normed() takes a block's output norm");
  const DeviceBuffer& w = which == LayerNorm::kAttnOut ? L.attn_out_norm : L.mlp_out_norm;
  cuda::add_rmsnorm(x_.get<float>(), y_.get<float>(), step_T_, int(c_.hidden_size), w.get<float>(),
                    float(c_.rms_norm_eps), stream_);
}

void CudaBackend::logits() {
  if (capturing_pieces_) end_piece();
  logits_now();
}

void CudaBackend::logits_now() {
  if (step_R_ == 0) return;
  // Only the rows that sample need the final norm and the vocabulary projection.
  cuda::rmsnorm(x_.get<float>(), int(step_R_), int(c_.hidden_size), dev_i32(layout_.off_rows), w_.final_norm.get<float>(),
                float(c_.rms_norm_eps), last_.get(), int(w_.ld_h), e_, stream_);
  cuda::GemmArgs g = projection(last_.get(), w_.ld_h, w_.lm_head_ptr(), w_.ld_h, nullptr,
                                step_R_, c_.vocab_size, c_.hidden_size);
  g.epilogue = cuda::Epilogue::kStore;
  g.y = logits_.get<float>();
  g.ld_y = int(c_.vocab_size);
  cuda::gemm(g, e_, step_ws_, stream_);
  if (c_.final_logit_softcap > 0)
    cuda::soft_cap(logits_.get<float>(), size_t(step_R_) * size_t(c_.vocab_size), float(c_.final_logit_softcap), stream_);
}

// Captures the decode forward pass of `bucket` tokens into a graph. A capture that fails (an
// operation the capture does not support, instantiation running out of memory...) returns
// nullptr after leaving the stream out of capture mode, and kernel_info() names the bucket: the
// caller runs that bucket eagerly from then on. A sticky device error still throws (the engine
// must stop), as does a failure of the eager warm-up, which is an ordinary forward pass.
cudaGraphExec_t CudaBackend::capture_decode_graph(int bucket, int splits) {
  step_last_ = false;  // decode graphs attend causally (forward() sends no other step to them)
  run_layers(bucket, bucket, splits);  // warm-up outside the capture (first launches load modules, fill plan caches)
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::string why;
  try {
    SLUICE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      run_layers(bucket, bucket, splits);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);  // ends the (invalidated) capture; the partial graph is dropped
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    SLUICE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    SLUICE_CUDA_CHECK(err);
    return exec;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kDeviceFault) throw;
    why = e.what();
  }
  // A failed capture leaves its error as the last error: a later launch check must not report it.
  const cudaError_t last = cudaGetLastError();
  if (cuda::is_sticky_cuda_error(last)) cuda::throw_cuda_error(last, "decode graph capture", __FILE__, __LINE__);
  // (Reallocation drops the graphs, nullptr entries included, so the bucket is captured again then.)
  const std::string note = ", decode graph for batch " + std::to_string(bucket) + " failed, runs eagerly";
  std::lock_guard<std::mutex> lock(info_mu_);
  if (graph_notes_.find(note) == std::string::npos) graph_notes_ += note + " (" + why + ")";
  return nullptr;
}

void CudaBackend::begin_piece() {
  SLUICE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
}

// Ends the piece being captured, keeps its instantiation and launches it (the capture run
// computes its step: attention runs eagerly between the pieces, on their results).
void CudaBackend::end_piece() {
  cudaGraph_t graph = nullptr;
  SLUICE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  SLUICE_CUDA_CHECK(err);
  pieces_.push_back(exec);
  SLUICE_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

// Captures the pieces of a mixed step of `bucket` (padded) tokens while computing it, after an
// eager warm-up (first launches set kernel attributes and fill plan caches). A failed capture
// leaves the stream out of capture mode and returns no pieces (the bucket then runs eagerly,
// noted in kernel_info()); a sticky device error throws.
CudaBackend::PiecewiseGraph CudaBackend::capture_mixed(int bucket, int64_t R, int splits) {
  run_layers(bucket, R, splits);
  pieces_.clear();
  std::string why;
  try {
    capturing_pieces_ = true;
    begin_piece();
    run_layers(bucket, R, splits);
    capturing_pieces_ = false;
    PiecewiseGraph g{std::move(pieces_)};
    pieces_.clear();
    return g;
  } catch (const Error& e) {
    capturing_pieces_ = false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
    }
    for (cudaGraphExec_t piece : pieces_) cudaGraphExecDestroy(piece);
    pieces_.clear();
    if (e.code() == ErrorCode::kDeviceFault) throw;
    why = e.what();
  }
  const cudaError_t last = cudaGetLastError();
  if (cuda::is_sticky_cuda_error(last)) cuda::throw_cuda_error(last, "mixed-step graph capture", __FILE__, __LINE__);
  const std::string note = ", mixed-step graphs for " + std::to_string(bucket) + " tokens failed, run eagerly";
  std::lock_guard<std::mutex> lock(info_mu_);
  if (graph_notes_.find(note) == std::string::npos) graph_notes_ += note + " (" + why + ")";
  return {};
}

void CudaBackend::replay_mixed(const PiecewiseGraph& g, int bucket, int64_t R, int splits) {
  set_step(bucket, R, splits);
  for (int64_t l = 0; l < c_.num_layers; l++) {
    SLUICE_CUDA_CHECK(cudaGraphLaunch(g.pieces[size_t(l)], stream_));
    attention_now(l);
  }
  SLUICE_CUDA_CHECK(cudaGraphLaunch(g.pieces.back(), stream_));
  logits_now();
}

void CudaBackend::forward(const ForwardBatch& b) {
  SLUICE_CUDA_CHECK(cudaSetDevice(device_));
  const int64_t T = b.num_tokens, R = b.num_logit_rows, S = b.num_seqs;
  int64_t width = 1, max_ctx = 1;
  for (int64_t s = 0; s < S; s++) width = std::max<int64_t>(width, b.num_seq_blocks[s]);
  for (int64_t t = 0; t < T; t++) max_ctx = std::max<int64_t>(max_ctx, int64_t(b.positions[t]) + 1);
  // Bidirectional image attention: tokens may attend past their positions (the split count and
  // the kernel choice follow the furthest one).
  step_last_ = false;
  if (c_.image_attention_bidirectional && b.attn_last) {
    for (int64_t t = 0; t < T; t++) {
      if (b.attn_last[t] < b.positions[t])
        throw Error(ErrorCode::kInternal, "attn_last before the token's position in a step");
      step_last_ = step_last_ || b.attn_last[t] > b.positions[t];
      max_ctx = std::max<int64_t>(max_ctx, int64_t(b.attn_last[t]) + 1);
    }
  }
  last_rows_ = R;
  step_prefill_ = T > S;  // (capture_graphs_at_load leaves it false: its steps are decodes)
  step_embeds_ = 0;
  // Given input rows (image placeholders) make the step run eagerly: a graph captures embed()'s
  // launches with one step's row count. Such steps are prefill chunks (a one-token chunk can look
  // like a decode step), few beside the decode steps.
  const bool embeds = b.num_input_embeds > 0;
  if (embeds) {
    if (!b.input_embed_rows || !b.input_embeds || b.num_input_embeds > T)
      throw Error(ErrorCode::kInternal, "malformed input embeddings in a step");
    for (int64_t i = 0; i < b.num_input_embeds; i++) {
      const int32_t row = b.input_embed_rows[i];
      if (row < 0 || row >= T || (i > 0 && row <= b.input_embed_rows[i - 1]) || !b.input_embeds[i])
        throw Error(ErrorCode::kInternal, "input embedding rows must be ascending token indices of the step");
    }
  }

  // LoRA: the step's row slots and adapter tables (lora_), read by the step's launches; such a step
  // runs eagerly: a graph would hold the launches of one step's adapters.
  step_lora_ = false;
  if (b.seq_adapters) clearing_oom([&] { step_lora_ = lora_.prepare(b, device_, stream_); });

  // A pure decode step (one token per sequence, every one sampling) replays a graph; not one whose
  // tokens attend past their positions (its attention differs from the captured one).
  const int bucket = graphs_enabled_ && !embeds && !step_lora_ && !step_last_ && T == S && R == T ? graph_bucket(T) : 0;
  if (bucket) {
    ensure_capacity(bucket, bucket, bucket + 1, width);
    upload_step(b, bucket, bucket, width);
    // Splits chosen for the longest context the model allows: a replay adapts the per-split
    // ranges to the actual contexts in the kernel.
    const int splits = choose_attn_splits(bucket, c_.max_position_embeddings);
    auto it = graphs_.find(bucket);
    if (it == graphs_.end()) {
      it = graphs_.emplace(bucket, capture_decode_graph(bucket, splits)).first;
      if (it->second) graphs_live_++;
    }
    if (it->second) {
      SLUICE_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    } else {
      run_layers(bucket, bucket, splits);  // this bucket's capture failed: eager, on the padded inputs
    }
    return;
  }
  // A step with prefill chunks, with cuda_mixed_graphs: padded to its token bucket (within the
  // activations sized at load, so that no step reallocates and drops the graphs), its pieces
  // replayed around eager attention; the first step of a bucket captures them as it computes.
  const int mixed = mixed_graphs_enabled_ && !embeds && !step_lora_ && T > S ? mixed_bucket(T) : 0;
  if (mixed && mixed <= cap_tokens_) {
    ensure_capacity(mixed, R, S + 1, width);
    upload_step(b, mixed, R, width);
    const int splits = choose_attn_splits(mixed, max_ctx);
    auto it = mixed_graphs_.find(mixed);
    if (it == mixed_graphs_.end()) {
      PiecewiseGraph g = capture_mixed(mixed, R, splits);
      const bool captured = !g.pieces.empty();
      mixed_graphs_.emplace(mixed, std::move(g));
      if (captured) return;  // the capture run computed the step
      run_layers(mixed, R, splits);
    } else if (it->second.pieces.empty()) {
      run_layers(mixed, R, splits);  // this bucket's capture failed: eager, on the padded inputs
    } else {
      replay_mixed(it->second, mixed, R, splits);
    }
    return;
  }
  ensure_capacity(T, R, S, width);
  if (step_lora_) clearing_oom([&] { ensure_lora_scratch(T); });
  upload_step(b, T, R, width);
  if (embeds) upload_embeds(b);
  run_layers(T, R, choose_attn_splits(T, max_ctx));
  step_embeds_ = 0;
  step_lora_ = false;
}

void CudaBackend::sample(const SampleRow* rows, int64_t R, const SampleOutput& out) {
  if (R == 0) return;
  sample_launch(rows, R, out.top_n, 0);
  sample_collect(0, out);
}

void CudaBackend::sample_launch(const SampleRow* rows, int64_t R, int top_n, int slot_index) {
  SLUICE_CUDA_CHECK(cudaSetDevice(device_));
  SampleSlot& slot = sample_slots_[slot_index & 1];
  slot.R = 0;
  if (R == 0) return;
  if (R != last_rows_) throw Error(ErrorCode::kInternal, "sample() rows differ from the last forward()");
  if (top_n > kMaxTopN) throw Error(ErrorCode::kInvalidArgument, "at most 32 logprobs alternatives on CUDA");
  if (device_tokens_ && R > device_token_rows_) {
    // More sampling rows than load sized for: the captured graphs read the old buffer.
    SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    drop_graphs();
    device_token_rows_ = 0;
    device_token_buf_.allocate(size_t(R) * 4, stream_);
    device_token_rows_ = R;
  }
  const size_t params_bytes = size_t(R) * sizeof(cuda::SampleRowParams);
  // [tokens | logprobs | top ids | top logprobs | accepted]
  const size_t out_bytes = size_t(R) * (3 + 2 * size_t(top_n)) * 4;
  // The slot's last download was collected (the engine ends a step before reusing its slot).
  slot.host.reserve(std::max(params_bytes, out_bytes));
  auto* p = slot.host.get<cuda::SampleRowParams>();
  for (int64_t r = 0; r < R; r++) {
    Rng rng(rows[r].stream_seed);
    const double u = rng.next_double();
    // A verifying row's second draw picks the replacement of a rejected draft.
    const double u2 = rows[r].draft >= 0 ? rng.next_double() : 0.0;
    p[r] = {rows[r].params, u, u2, rows[r].draft};
  }
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(sample_params_.get(), p, params_bytes, cudaMemcpyHostToDevice, stream_));
  int32_t* d_tokens = sample_out_.get<int32_t>();
  float* d_logprobs = reinterpret_cast<float*>(d_tokens + R);
  int32_t* d_top_ids = reinterpret_cast<int32_t*>(d_logprobs + R);
  float* d_top_lps = reinterpret_cast<float*>(d_top_ids + R * top_n);
  cuda::SampleArgs a;
  a.logits = logits_.get<float>();
  a.R = int(R);
  a.V = int(c_.vocab_size);
  a.params = sample_params_.get<cuda::SampleRowParams>();
  a.top_n = top_n;
  a.tokens = d_tokens;
  a.logprobs = d_logprobs;
  a.top_ids = d_top_ids;
  a.top_logprobs = d_top_lps;
  a.row_stats = sample_stats_.get<float>();
  a.accepted = reinterpret_cast<int32_t*>(d_top_lps + R * top_n);
  // Grammar-constrained rows: their masks go up as one [R, words] array (all ones for the
  // others) and disallowed logits become -inf on the device; a row allowing nothing fails.
  slot.allows_nothing.assign(size_t(R), 0);
  slot.inject_fault.assign(size_t(R), 0);
  bool any_mask = false;
  for (int64_t r = 0; r < R; r++) {
    any_mask = any_mask || rows[r].allow;
    slot.inject_fault[size_t(r)] = rows[r].inject_fault;
  }
  if (any_mask) {
    const int64_t words = token_mask_words(c_.vocab_size);
    const size_t bytes = size_t(R) * size_t(words) * 4;
    if (token_masks_.bytes() < bytes) token_masks_.allocate(bytes, stream_);
    // NOTE: one pinned mask buffer serves both slots: a step with masks is begun only after the
    // step before it has ended (its masks depend on that step's tokens), so no copy from it is queued.
    token_masks_host_.reserve(bytes);
    auto* hm = token_masks_host_.get<uint32_t>();
    for (int64_t r = 0; r < R; r++) {
      uint32_t* dst = hm + r * words;
      if (!rows[r].allow) {
        std::fill(dst, dst + words, 0xffffffffu);
        continue;
      }
      std::memcpy(dst, rows[r].allow, size_t(words) * 4);
      // As on the CPU (mask_row_generic), bits past V do not count: a mask whose only set bits
      // lie there allows nothing. Such a row gets an all-ones mask instead, so that the device
      // samples a real row, and fails below.
      const uint32_t tail = c_.vocab_size % 32 ? (uint32_t(1) << (c_.vocab_size % 32)) - 1 : 0xffffffffu;
      bool any = (dst[words - 1] & tail) != 0;
      for (int64_t w = 0; w + 1 < words && !any; w++) any = dst[w] != 0;
      if (!any) {
        slot.allows_nothing[size_t(r)] = 1;
        std::fill(dst, dst + words, 0xffffffffu);
      }
    }
    SLUICE_CUDA_CHECK(cudaMemcpyAsync(token_masks_.get(), hm, bytes, cudaMemcpyHostToDevice, stream_));
    // (The wide sampler applies the masks as it reads the logits, leaving them unmasked.)
    if (!wide_sampler_)
      cuda::apply_token_masks(logits_.get<float>(), int(R), int(c_.vocab_size), token_masks_.get<uint32_t>(), stream_);
  }
  if (wide_sampler_) cuda::sample_wide(a, any_mask ? token_masks_.get<uint32_t>() : nullptr, stream_);
  else cuda::sample(a, stream_);
  // The next forward() reads these tokens on the device (resolve_device_tokens).
  if (device_tokens_)
    SLUICE_CUDA_CHECK(cudaMemcpyAsync(device_token_buf_.get(), d_tokens, size_t(R) * 4, cudaMemcpyDeviceToDevice, stream_));
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(slot.host.get<uint8_t>(), d_tokens, out_bytes, cudaMemcpyDeviceToHost, stream_));
  SLUICE_CUDA_CHECK(cudaEventRecord(slot.done, stream_));
  slot.R = R;
  slot.top_n = top_n;
}

bool CudaBackend::sample_ready(int slot_index) const {
  const SampleSlot& slot = sample_slots_[slot_index & 1];
  if (slot.R == 0) return true;
  // Anything but "not ready" (done, or an error that sample_collect() then reports) ends the wait.
  return cudaEventQuery(slot.done) != cudaErrorNotReady;
}

// The host's one wait of a step: for the download of its samples.
void CudaBackend::sample_collect(int slot_index, const SampleOutput& out) {
  SLUICE_CUDA_CHECK(cudaSetDevice(device_));
  SampleSlot& slot = sample_slots_[slot_index & 1];
  const int64_t R = slot.R;
  if (R == 0) return;
  if (out.top_n != slot.top_n) throw Error(ErrorCode::kInternal, "sample_collect() top_n differs from its launch");
  SLUICE_CUDA_CHECK(cudaEventSynchronize(slot.done));
  const uint8_t* h = slot.host.get<uint8_t>();
  std::memcpy(out.tokens, h, size_t(R) * 4);
  std::memcpy(out.logprobs, h + size_t(R) * 4, size_t(R) * 4);
  if (out.top_n > 0) {
    std::memcpy(out.top_ids, h + size_t(R) * 8, size_t(R) * size_t(out.top_n) * 4);
    std::memcpy(out.top_logprobs, h + size_t(R) * (8 + 4 * size_t(out.top_n)), size_t(R) * size_t(out.top_n) * 4);
  }
  if (out.accepted) {
    const int32_t* acc = reinterpret_cast<const int32_t*>(h + size_t(R) * (8 + 8 * size_t(out.top_n)));
    for (int64_t r = 0; r < R; r++) out.accepted[r] = acc[r] ? 1 : 0;
  }
  // All rows are sampled by one kernel, so nothing fails per row on the device; an injected
  // fault (testing hook) is reported for its row as the CPU backend does.
  const int64_t V = c_.vocab_size;
  for (int64_t r = 0; r < R; r++) {
    if (slot.allows_nothing[size_t(r)]) {
      out.tokens[r] = -1;
      if (out.row_errors)
        out.row_errors->push_back({r, ErrorCode::kInvalidArgument, "the output grammar allows no token at this point"});
      continue;
    }
    // The kernel writes -1 for a row without a finite logit (NaN or inf from an overflow): the
    // engine must never append a token outside the vocabulary (the next step would embed it).
    if (out.tokens[r] < 0 || out.tokens[r] >= V) {
      const int32_t bad = out.tokens[r];
      out.tokens[r] = -1;
      if (out.row_errors)
        out.row_errors->push_back({r, ErrorCode::kInternal,
                                   bad == -1 ? std::string("the logits have no finite value (a numeric overflow?)")
                                             : "the CUDA sampler returned token " + std::to_string(bad) +
                                                   " outside the vocabulary"});
      continue;
    }
    if (!slot.inject_fault[size_t(r)]) continue;
    out.tokens[r] = -1;
    if (out.row_errors) out.row_errors->push_back({r, ErrorCode::kInternal, "injected sampler fault"});
  }
  slot.R = 0;
}

void CudaBackend::read_logits(float* out) {
  SLUICE_CUDA_CHECK(cudaSetDevice(device_));
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(out, logits_.get(), size_t(last_rows_) * size_t(c_.vocab_size) * 4,
                                    cudaMemcpyDeviceToHost, stream_));
  SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace

bool cuda_backend_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    // "no CUDA device found" only for a host without one (tests skip on it); a device the runtime
    // cannot use (an old driver) says why.
    if (why)
      *why = err == cudaSuccess || cuda::means_no_cuda_device(err)
                 ? std::string("no CUDA device found") +
                       (err == cudaSuccess ? "" : std::string(" (") + cudaGetErrorString(err) + ")")
                 : std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // the failed query leaves a (non-sticky) error behind: clear it
    return false;
  }
  return true;
}

std::unique_ptr<Backend> create_cuda_backend(const ModelConfig& config, const ModelWeights& weights,
                                            const EngineOptions& options) {
  std::string why;
  if (!cuda_backend_available(&why)) throw Error(ErrorCode::kBackendUnavailable, why);
  return std::make_unique<CudaBackend>(config, weights, options);
}

}  // namespace sluice
