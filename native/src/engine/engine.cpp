// Engine: sequences, block tables and sampling around one backend.
#include "sluice/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <unordered_map>

#include "cpu/kernels.h"
#include "engine/backend.h"
#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "model/model_weights.h"
#include "model/quantize.h"
#include "model/resident_weights.h"
#include "model/safetensors.h"
#include "sample/sampler.h"
#include "sluice/error.h"
#include "lora/lora_adapter.h"
#include "speculative/eagle3_head.h"

namespace sluice {

namespace {

struct Sequence {
  std::vector<int32_t> tokens;   // prompt + sampled tokens, all known tokens
  int64_t num_computed = 0;      // tokens whose K/V are in the cache
  std::vector<int32_t> blocks;   // block table: blocks[i] holds positions [i*bs, (i+1)*bs)
  // [num full computed blocks] chained hash of blocks[i]'s tokens. blocks[0..size) are full and
  // read-only from here on (offered to the prefix cache); K/V is written only past them.
  std::vector<BlockHash> block_hashes;
  // Models with sliding-window layers: their own block table, blocks[i]'s positions too; entries
  // that fell out of the window are -1 (released, cached when full).
  std::vector<int32_t> window_blocks;
  SamplingParams params;
  bool keyed = false;            // added with a prompt_cache_key: its blocks are released as keyed
  BlockHash root;                // parent hash of blocks[0]: the model and the cache scope
  uint64_t planned_in_step = 0;  // the step counter when the sequence last got a plan row
  // Vision-language prompts: the images (placeholders at images[k].offset..), and for M-RoPE the
  // rope position of each image's first placeholder and the offset (rope position - index) of the
  // text after it; text before the first image has offset 0.
  std::vector<SequenceImage> images;
  std::vector<int64_t> image_rope_start, image_rope_after;
  // Its LoRA adapter (held: a retired adapter stays with the sequences that use it); null: none.
  std::shared_ptr<const LoraAdapter> adapter;
  uint64_t model_key = 0;        // the model key its blocks are hashed with (the adapter's, with one)
  // Pipelined steps: which incarnation of seq_id this is (a step in flight may end after its
  // sequence was freed and the id added again), and tokens may hold placeholders
  // (Backend::device_token_ref(r), < 0): row r of the step in flight samples them.
  uint64_t uid = 0;
};

// The mask rows of a plan's TokenMaskSource (see its wait()): each constrained sequence's first
// row into *first (when given), and the count of all of them.
size_t mask_row_layout(const StepPlan& plan, std::unordered_map<uint32_t, size_t>* first) {
  std::unordered_map<uint32_t, size_t> planned;  // seq id -> drafts its row planned
  for (size_t i = 0; i < plan.seq_ids.size() && i < plan.num_drafts.size(); i++) planned[plan.seq_ids[i]] = plan.num_drafts[i];
  size_t at = 0;
  for (uint32_t id : plan.constrained) {
    if (first) first->emplace(id, at);
    auto d = planned.find(id);
    at += 1 + (d == planned.end() ? 0 : d->second);
  }
  return at;
}

std::string join_path(const std::string& dir, const char* name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

class EngineImpl final : public Engine {
 public:
  explicit EngineImpl(const EngineOptions& opts) : opts_(opts) {
    if (opts.block_size <= 0 || opts.block_size > 1024)
      throw Error(ErrorCode::kInvalidArgument, "block_size must be in 1..1024");
    const std::string config_path = join_path(opts.model_dir, "config.json");
    const std::string config_text = read_text_file(config_path);
    config_ = parse_model_config(config_text, config_path);
    if (opts.kv_cache_dtype != "auto" && opts.kv_cache_dtype != "fp8" && opts.kv_cache_dtype != "fp8_e4m3")
      throw Error(ErrorCode::kInvalidArgument,
                  "kv_cache_dtype must be \"auto\", \"fp8\" or \"fp8_e4m3\", got \"" + opts.kv_cache_dtype + "\"");
    const bool fp8_kv = opts.kv_cache_dtype != "auto";
    // The model key: blocks are only shared between computations that give the same K/V.
    model_key_ = fnv1a64(config_text + "\n" + opts.matmul_precision +
                         (opts.quantization == "none" ? "" : "\n" + opts.quantization) + (fp8_kv ? "\nkv fp8" : ""));
    if (opts.quantization != "none" && opts.quantization != "int8" && opts.quantization != "fp8")
      throw Error(ErrorCode::kInvalidArgument,
                  "quantization must be \"none\", \"int8\" or \"fp8\", got \"" + opts.quantization + "\"");
    if (opts.quantization == "int8" && opts.backend != "cpu")
      throw Error(ErrorCode::kInvalidArgument,
                  "quantization \"int8\" is supported by the cpu backend only (the " + opts.backend +
                      " backend serves the checkpoint's own dtype; drop --quantization or use --backend cpu)");
    if (opts.quantization == "fp8" && opts.backend != "cuda")
      throw Error(ErrorCode::kInvalidArgument,
                  "quantization \"fp8\" is supported by the cuda backend only (FP8 GEMMs); on the " + opts.backend +
                      " backend use \"int8\"");
    if (opts.quantization == "fp8" && !config_.quantization.method.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "quantization \"fp8\" quantizes a bf16/f16/f32 checkpoint, but this one is already quantized (" +
                      config_.quantization.method + "); drop --quantization");
    st_ = SafetensorsModel::open_dir(opts.model_dir);
    // The CUDA backend runs FP8 projections as stored (cuda/fp8_gemm.h) where its device can, and
    // dequantizes them itself where not (dequantize_fp8_weights at upload).
    const bool cuda = opts.backend == "cuda";
    weights_ = bind_weights(*st_, config_, opts.model_dir, /*keep_fp8=*/cuda);
    // NOTE: the binder dequantizes FP8 checkpoints' F8E4M3 weights to bf16 (for CUDA: all but the
    // layers' projections), unpacks MXFP4 and repacks AWQ / GPTQ words (I32) as Q4 or Q8_0. The
    // CPU kernels read both; the CUDA backend reads dense layers' Q4 projections (cuda/q4_gemm.h)
    // and gets the rest as bf16.
    if (opts.backend != "cpu") dequantize_packed_weights(weights_, opts.num_threads, cuda);
    for (const TensorView* t : streamed_matrices(weights_))
      if ((t->dtype == DType::F8E4M3 && !cuda) || t->dtype == DType::U8 || t->dtype == DType::I32)
        throw Error(ErrorCode::kInternal, "weight \"" + t->name + "\" reached the backend as " + dtype_name(t->dtype) +
                                              " (the binder dequantizes packed and FP8 weights at load)");
    // The CPU streams the projections and the lm_head every decode step: from anonymous huge-page
    // memory (quantized, or copied as stored) rather than the checkpoint's page cache.
    // --quantization fp8: per-channel FP8 weights, bound as an FP8 checkpoint with channel scales
    // would be (the backend reads the scales' layout from the config it gets).
    ModelConfig backend_config = config_;
    if (opts.quantization == "fp8") {
      quantize_weights_fp8(weights_, opts.num_threads);
      backend_config.quantization.fp8 = Fp8Scales::Channel;
    }
    if (opts.quantization == "int8") quantize_weights_q8(weights_, opts.num_threads);
    else if (opts.backend == "cpu" && cpu_weights_copied_from_env()) copy_weights_to_host_memory(weights_, opts.num_threads);

    if (opts.matmul_precision != "f32" && opts.matmul_precision != "bf16")
      throw Error(ErrorCode::kInvalidArgument,
                  "matmul_precision must be \"f32\" or \"bf16\", got \"" + opts.matmul_precision + "\"");
    const char* env = std::getenv("SLUICE_CUDA_DEVICE_TOKENS");
    pipelined_ = opts.cuda_device_tokens || (opts.backend == "cuda" && env && std::string(env) == "1");
    if (opts.backend == "cpu") {
      backend_ = create_cpu_backend(config_, weights_, opts.num_threads, opts.matmul_precision == "bf16", fp8_kv);
    } else if (opts.backend == "cuda") {
      EngineOptions cuda_opts = opts;
      cuda_opts.cuda_device_tokens = pipelined_;  // the backend resolves the refs of pipelined steps
      backend_ = create_cuda_backend(backend_config, weights_, cuda_opts);
    } else {
      throw Error(ErrorCode::kInvalidArgument, "unknown backend \"" + opts.backend + "\" (expected cpu or cuda)");
    }
    const int64_t bs = opts.block_size;
    const size_t per_block = backend_->kv_bytes_per_block(bs);
    const size_t per_window_block = backend_->kv_bytes_per_window_block(bs);
    const size_t kv_bytes = backend_->kv_budget_bytes(opts.kv_cache_bytes);
    int64_t num_blocks = int64_t(kv_bytes / (per_block + per_window_block));
    int64_t num_window_blocks = 0;
    if (per_window_block > 0) {
      for (int64_t l = 0; l < config_.num_layers; l++) window_ = std::max(window_, config_.window(l));
      // A sequence holds the window's blocks and the ones its step writes: with a known batch
      // (max_num_seqs, max_batched_tokens) the window pool is sized for that and the rest of the
      // budget goes to full-attention blocks; without one, both pools get the same count.
      num_window_blocks = num_blocks;
      if (opts.max_num_seqs > 0) {
        const int64_t step_tokens = std::max<int64_t>(opts.max_batched_tokens, opts.max_num_seqs);
        const int64_t held = int64_t(opts.max_num_seqs) * ((window_ - 1 + bs - 1) / bs + 2) + (step_tokens + bs - 1) / bs;
        num_window_blocks = std::min(num_window_blocks, held);
        num_blocks = int64_t((kv_bytes - size_t(num_window_blocks) * per_window_block) / per_block);
      }
    }
    if (num_blocks < 1 || (per_window_block > 0 && num_window_blocks < 1))
      throw Error(ErrorCode::kInvalidArgument, "the KV cache budget of " + std::to_string(kv_bytes) +
                                                   " bytes is smaller than one KV block (" +
                                                   std::to_string(per_block + per_window_block) + " bytes)");
    backend_->allocate_kv(num_blocks, num_window_blocks, bs);
    blocks_ = std::make_unique<BlockPool>(num_blocks);
    if (num_window_blocks > 0) window_pool_ = std::make_unique<BlockPool>(num_window_blocks);
    if (!opts.eagle3_dir.empty()) load_eagle3(num_blocks * bs);
    if (!opts.lora_adapters.empty()) {
      if (!backend_->applies_lora())
        throw Error(ErrorCode::kInvalidArgument,
                    "the " + backend_->name() + " backend does not apply LoRA adapters (the cpu and cuda backends do)");
      if (opts.lora_adapters.size() > kMaxAdapters)
        throw Error(ErrorCode::kInvalidArgument, "at most " + std::to_string(kMaxAdapters) + " LoRA adapters per engine");
      for (const std::string& dir : opts.lora_adapters) install_adapter(std::make_shared<const LoraAdapter>(dir, config_));
    }
  }

  int32_t install_adapter(std::shared_ptr<const LoraAdapter> adapter) override {
    check_in_service();
    if (!adapter) throw Error(ErrorCode::kInvalidArgument, "install_adapter: no adapter");
    if (!backend_->applies_lora())
      throw Error(ErrorCode::kInvalidArgument,
                  "the " + backend_->name() + " backend does not apply LoRA adapters (the cpu and cuda backends do)");
    // Its blocks are hashed under a key of its own: never shared with another adapter or the base.
    const uint64_t key = fnv1a64(std::to_string(model_key_) + "\nlora " + std::to_string(adapter->content_key()));
    // A retired slot is taken again (its sequences hold their adapter themselves).
    auto free = std::find(adapters_.begin(), adapters_.end(), nullptr);
    if (free == adapters_.end()) {
      if (adapters_.size() >= kMaxAdapters)
        throw Error(ErrorCode::kInvalidArgument, "at most " + std::to_string(kMaxAdapters) + " LoRA adapters per engine");
      adapters_.push_back(std::move(adapter));
      adapter_keys_.push_back(key);
      return int32_t(adapters_.size());
    }
    *free = std::move(adapter);
    const size_t slot = size_t(free - adapters_.begin());
    adapter_keys_[slot] = key;
    return int32_t(slot + 1);
  }

  void retire_adapter(int32_t id) override {
    if (id < 1 || size_t(id) > adapters_.size() || !adapters_[size_t(id - 1)])
      throw Error(ErrorCode::kInvalidArgument, "LoRA adapter " + std::to_string(id) + " is not loaded");
    adapters_[size_t(id - 1)].reset();
  }

  EngineInfo info() const override {
    EngineInfo i;
    i.config = config_;
    i.weight_dtype = dtype_name(weights_.main_dtype);
    i.weight_bytes = weights_.total_bytes;
    i.block_size = opts_.block_size;
    i.num_blocks = blocks_->num_blocks();
    i.kv_cache_bytes = backend_->kv_bytes_per_block(opts_.block_size) * size_t(i.num_blocks);
    i.kv_cache_dtype = dtype_name(backend_->kv_dtype());
    if (window_pool_) {
      i.window = window_;
      i.num_window_blocks = window_pool_->num_blocks();
      i.window_blocks_in_use = window_pool_->num_blocks() - window_pool_->num_free();
      i.window_kv_bytes = backend_->kv_bytes_per_window_block(opts_.block_size) * size_t(i.num_window_blocks);
      i.kv_cache_bytes += i.window_kv_bytes;
    }
    i.backend = backend_->name();
    i.simd = backend_->kernel_info();
    i.device_bytes = backend_->device_bytes();
    i.num_threads = backend_->num_threads();
    i.draft_verification = backend_->verifies_drafts() && !pipelined_;
    i.matmul_precision = opts_.matmul_precision;
    i.prefix_caching = opts_.prefix_caching;
    i.num_cached_blocks = blocks_->num_cached();
    i.broken_reason = broken_reason_;
    for (size_t k = 0; k < adapters_.size(); k++) {
      if (!adapters_[k]) continue;
      i.lora_ids.push_back(int32_t(k + 1));
      i.lora_ranks.push_back(adapters_[k]->rank());
      i.lora_bytes.push_back(adapters_[k]->bytes());
    }
    if (eagle_) {
      i.eagle3_draft_vocab = eagle_->config().draft_vocab;
      i.eagle3_aux_layers = eagle_->config().aux_layers;
      i.eagle3_weight_bytes = eagle_->weight_bytes();
      i.eagle3_kv_bytes = eagle_->kv_bytes();
    }
    return i;
  }

  int64_t add_sequence(uint32_t seq_id, const std::vector<int32_t>& prompt, const SamplingParams& p,
                       bool keyed, const std::string& cache_scope, const std::vector<SequenceImage>& images,
                       int32_t adapter) override {
    check_in_service();
    if (seqs_.count(seq_id)) throw Error(ErrorCode::kSequenceExists, "sequence " + std::to_string(seq_id) + " already exists");
    if (prompt.empty()) throw Error(ErrorCode::kInvalidArgument, "a sequence needs at least one prompt token");
    if (int64_t(prompt.size()) > config_.max_position_embeddings)
      throw Error(ErrorCode::kInvalidArgument, "prompt of " + std::to_string(prompt.size()) +
                                                   " tokens exceeds the context length " +
                                                   std::to_string(config_.max_position_embeddings));
    for (int32_t t : prompt)
      if (t < 0 || t >= config_.vocab_size)
        throw Error(ErrorCode::kInvalidArgument, "token id " + std::to_string(t) + " is outside the vocabulary (size " +
                                                     std::to_string(config_.vocab_size) + ")");
    if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature) || !(p.top_p > 0.f && p.top_p <= 1.f) ||
        p.top_k < 0 || p.top_k > config_.vocab_size || p.logprobs < 0 || p.logprobs > 20 ||
        !(p.min_p >= 0.f && p.min_p <= 1.f))
      throw Error(ErrorCode::kInvalidArgument,
                  "sampling parameters out of range (temperature >= 0, 0 < top_p <= 1, 0 <= top_k <= vocabulary size " +
                      std::to_string(config_.vocab_size) + ", logprobs 0..20, 0 <= min_p <= 1)");
    if (adapter < 0 || size_t(adapter) > adapters_.size() || (adapter > 0 && !adapters_[size_t(adapter - 1)]))
      throw Error(ErrorCode::kInvalidArgument, "LoRA adapter " + std::to_string(adapter) + " is not loaded");
    Sequence s;
    if (!images.empty()) place_images(s, prompt, images);
    s.tokens = prompt;
    s.params = p;
    s.keyed = keyed;
    s.uid = ++num_seqs_added_;
    if (adapter > 0) s.adapter = adapters_[size_t(adapter - 1)];
    s.model_key = adapter > 0 ? adapter_keys_[size_t(adapter - 1)] : model_key_;
    s.root = root_block_hash(opts_.prefix_hash_key, s.model_key, cache_scope);
    if (opts_.prefix_caching) map_cached_prefix(s);
    const int64_t num_cached = s.num_computed;
    seqs_.emplace(seq_id, std::move(s));
    return num_cached;
  }

  void free_sequence(uint32_t seq_id) override {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) return;
    // Tail first: of one sequence's evictable blocks the last are evicted first, so a cached
    // chain loses its leaves before its root (a child without its parent can never be hit).
    const std::vector<int32_t>& b = it->second.blocks;
    blocks_->release(std::vector<int32_t>(b.rbegin(), b.rend()), it->second.keyed);
    if (window_pool_) {
      std::vector<int32_t> held;
      for (auto w = it->second.window_blocks.rbegin(); w != it->second.window_blocks.rend(); ++w)
        if (*w >= 0) held.push_back(*w);
      window_pool_->release(held, it->second.keyed);
    }
    seqs_.erase(it);
    if (eagle_) eagle_->remove(seq_id);
  }

  int64_t num_free_blocks() const override { return blocks_->num_free(); }

  int64_t num_sequence_blocks(uint32_t seq_id) const override {
    auto it = seqs_.find(seq_id);
    return it == seqs_.end() ? 0 : int64_t(it->second.blocks.size());
  }

  StepResult step(const StepPlan& plan) override;
  bool pipelined() const override { return pipelined_; }
  void begin_step(const StepPlan& plan) override;
  StepResult end_step() override;
  bool step_ready() const override {
    if (in_flight_.empty() || in_flight_.front().done || in_flight_.front().samples.empty()) return true;
    return backend_->sample_ready(in_flight_.front().slot);
  }

  void inject_fault(uint32_t seq_id, FaultPoint point) override {
    if (point == FaultPoint::kDevice) device_fault_pending_ = true;
    else injected_faults_[seq_id] = point;
  }

 private:
  void check_in_service() const {
    if (!broken_reason_.empty())
      throw Error(ErrorCode::kEngineBroken, "the engine is out of service after a device fault: " + broken_reason_);
  }

  // Whether an injected fault for seq_id at `point` is pending; consumes it.
  bool take_fault(uint32_t seq_id, FaultPoint point) {
    if (injected_faults_.empty()) return false;
    auto it = injected_faults_.find(seq_id);
    if (it == injected_faults_.end() || it->second != point) return false;
    injected_faults_.erase(it);
    return true;
  }

  // Validates one plan row and returns its token count (the bound clamped to what is left); throws
  // (with the row's message) when the row cannot run.
  int64_t check_row(uint32_t seq_id, int64_t bound);
  // The drafts plan row i verifies (none when they do not apply; see StepPlan::drafts), cut to
  // what the row's bound and the context allow; throws for a draft outside the vocabulary.
  int64_t row_drafts(const StepPlan& plan, size_t i, const Sequence& s, int64_t bound, const int32_t** drafts) const;
  // After a verification: gives back the blocks past the kept tokens (never hashed: hashing
  // follows num_computed, which already excludes them).
  void release_unkept_blocks(Sequence& s);
  // Validates plan row i and claims its blocks (status kNoKvBlocks when they are not there).
  void claim_row(const StepPlan& plan, size_t i, StepResult& result);
  void attach_token_masks(const StepPlan& plan);
  std::vector<uint8_t> mask_missing_;  // per sampling row: constrained, and its mask never came
  // Adds one sequence when its prompt fits beside the blocks claimed so far.
  AddStatus admit(const SequenceAdd& add, StepResult& result, int32_t* num_cached);
  // Steps 1-4 of StepPlan: frees, claims, adds; fills the flattened batch of plan_rows_ and
  // marks them kRan. Returns whether any row runs.
  bool prepare_step(const StepPlan& plan, StepResult& result);
  // Fills sample_rows_ / sampling_rows_ (the rows that sample, in logit-row order); returns top_n.
  int collect_sampling_rows();
  ForwardBatch forward_batch() const;
  // forward() + sample() of the rows in plan_rows_; a device fault breaks the engine.
  void run_backend(const StepPlan& plan, StepResult& result);
  // EAGLE-3: the head's context gains the positions the step kept; rows that ask get drafts.
  void load_eagle3(int64_t max_entries);
  void run_eagle3(const StepPlan& plan, StepResult& result);
  // The forward pass, the plan's token masks, then `sample` (the serial sample or the pipelined
  // launch); a device fault (a real one, or the test hook's) breaks the engine, others fail the step.
  template <typename Sample>
  void forward_and_sample(const StepPlan& plan, const ForwardBatch& fb, Sample&& sample);

  // Pipelined steps (see begin_step). A step begun and not yet ended.
  struct InFlight {
    StepResult result;  // rows, adds and errors of its preparation; samples added when it ends
    struct Sample {
      uint32_t seq_id;
      uint64_t uid;
      size_t pos;         // the placeholder's index in the sequence's tokens
      size_t index;       // plan row
      bool mask_missing;  // constrained and its mask never came
    };
    std::vector<Sample> samples;  // [m] logit-row order
    std::vector<std::pair<uint32_t, uint64_t>> ran;  // (seq_id, uid) of its rows: prefix-cache their blocks at the end
    int top_n = 0;
    int slot = 0;       // the backend's sample output slot
    bool done = false;  // its result is final
  };
  void launch_pipelined(const StepPlan& plan, InFlight& f);
  void finish_pipelined(InFlight& f);
  Sequence* find_live(uint32_t seq_id, uint64_t uid) {
    auto it = seqs_.find(seq_id);
    return it != seqs_.end() && it->second.uid == uid ? &it->second : nullptr;
  }
  StepResult step_serial(const StepPlan& plan);

  BlockHash block_hash(const Sequence& s, size_t block) const {
    const int64_t bs = opts_.block_size;
    return hash_block(opts_.prefix_hash_key, block == 0 ? s.root : s.block_hashes[block - 1],
                      s.tokens.data() + int64_t(block) * bs, size_t(bs), block_extra_key(s, block));
  }

  // The extra key of a block's hash: the model key, and for a block holding image placeholders
  // (whose token ids say nothing of the image) each such image's content hash, grid and place
  // relative to the block, so only the same image at the same place shares the block.
  uint64_t block_extra_key(const Sequence& s, size_t block) const {
    if (s.images.empty()) return s.model_key;
    const int64_t bs = opts_.block_size, first = int64_t(block) * bs, last = first + bs;
    SipHasher h(opts_.prefix_hash_key);
    bool any = false;
    for (const SequenceImage& img : s.images) {
      const int64_t end = img.offset + image_tokens(img);
      if (end <= first || img.offset >= last) continue;
      if (!any) h.bytes("sluice.image", 12).u64(s.model_key);
      any = true;
      for (uint64_t w : img.content_hash) h.u64(w);
      h.u64(uint64_t(img.offset - first)).u32(uint32_t(img.grid_t)).u32(uint32_t(img.grid_h)).u32(uint32_t(img.grid_w));
    }
    return any ? h.finish() : s.model_key;
  }

  static int64_t image_tokens(const SequenceImage& img) {
    return int64_t(img.grid_t) * int64_t(img.grid_h) * int64_t(img.grid_w);
  }

  // Validates a prompt's images and gives them to s with their M-RoPE offsets.
  void place_images(Sequence& s, const std::vector<int32_t>& prompt, const std::vector<SequenceImage>& images) const {
    if (config_.image_token_id < 0)
      throw Error(ErrorCode::kInvalidArgument, "this model takes no image input (" + config_.architecture + ")");
    if (images.size() > kMaxImagesPerSequence)
      throw Error(ErrorCode::kInvalidArgument, "a sequence holds at most " + std::to_string(kMaxImagesPerSequence) + " images");
    int64_t end = 0, offset = 0;  // offset: rope position - index of the text at `end`
    for (size_t k = 0; k < images.size(); k++) {
      const SequenceImage& img = images[k];
      const std::string which = "image " + std::to_string(k);
      if (img.grid_t != 1) throw Error(ErrorCode::kInvalidArgument, which + ": grid_t must be 1 (video is not supported)");
      if (img.grid_h < 1 || img.grid_w < 1 || img.grid_h > 65536 || img.grid_w > 65536)
        throw Error(ErrorCode::kInvalidArgument, which + ": grid_h and grid_w must be in 1..65536");
      const int64_t n = image_tokens(img);
      if (img.offset < end || img.offset + n > int64_t(prompt.size()))
        throw Error(ErrorCode::kInvalidArgument, which + ": its " + std::to_string(n) + " placeholders at " +
                                                     std::to_string(img.offset) +
                                                     " overlap the image before or run past the prompt");
      for (int64_t j = img.offset; j < img.offset + n; j++)
        if (prompt[size_t(j)] != config_.image_token_id)
          throw Error(ErrorCode::kInvalidArgument, which + ": prompt token " + std::to_string(j) + " is not the image token " +
                                                       std::to_string(config_.image_token_id));
      if (int64_t(img.embeds.size()) != n * config_.hidden_size)
        throw Error(ErrorCode::kInvalidArgument, which + ": embeddings hold " + std::to_string(img.embeds.size()) +
                                                     " values, expected " + std::to_string(n) + " x hidden size " +
                                                     std::to_string(config_.hidden_size));
      for (float v : img.embeds)
        if (!std::isfinite(v)) throw Error(ErrorCode::kInvalidArgument, which + ": embeddings must be finite");
      s.image_rope_start.push_back(img.offset + offset);
      offset += std::max<int64_t>(img.grid_h, img.grid_w) - n;
      s.image_rope_after.push_back(offset);
      end = img.offset + n;
    }
    s.images = images;
  }

  // For s's tokens [b, e) (batch token indices from batch_base): the input rows of its image
  // placeholders (embed lists), M-RoPE positions (rope_positions_) and, for bidirectional images,
  // the last position each attends to (attn_last_).
  void add_image_rows(const Sequence& s, int64_t b, int64_t e, int64_t batch_base) {
    const bool mrope = config_.mrope(), bidirectional = config_.image_attention_bidirectional;
    size_t k = 0;
    int64_t offset = 0;
    for (int64_t j = b; j < e; j++) {
      while (k < s.images.size() && j >= s.images[k].offset + image_tokens(s.images[k])) offset = s.image_rope_after[k++];
      if (k < s.images.size() && j >= s.images[k].offset) {
        const SequenceImage& img = s.images[k];
        const int64_t i = j - img.offset, p = s.image_rope_start[k];
        const int64_t w = img.grid_w, hw = int64_t(img.grid_h) * w;
        if (mrope) {
          rope_positions_.push_back(int32_t(p));  // one frame: time adds nothing
          rope_positions_.push_back(int32_t(p + (i % hw) / w));
          rope_positions_.push_back(int32_t(p + i % w));
        }
        if (bidirectional) attn_last_[size_t(batch_base + (j - b))] = int32_t(img.offset + image_tokens(img) - 1);
        embed_rows_.push_back(int32_t(batch_base + (j - b)));
        embed_ptrs_.push_back(img.embeds.data() + i * config_.hidden_size);
      } else if (mrope) {
        for (int c = 0; c < 3; c++) rope_positions_.push_back(int32_t(j + offset));
      }
    }
  }

  // Bidirectional images: a chunk [s.num_computed, +count) may not end inside an image (its tokens
  // must all be in the cache when any of them attends). It is cut back to the image's start, or,
  // when it starts inside the image (a prefix hit ended there), extended to the image's end.
  int64_t whole_images(const Sequence& s, int64_t count) const {
    if (!config_.image_attention_bidirectional) return count;
    const int64_t b = s.num_computed, e = b + count;
    for (const SequenceImage& img : s.images) {
      const int64_t end = img.offset + image_tokens(img);
      if (e <= img.offset || e >= end) continue;
      return img.offset > b ? img.offset - b : end - b;
    }
    return count;
  }

  // Maps the longest chain of cached blocks matching s's prompt into s (a new sequence), whole
  // blocks only and leaving at least one prompt token to compute.
  void map_cached_prefix(Sequence& s) {
    const int64_t bs = opts_.block_size;
    const size_t max_blocks = size_t((int64_t(s.tokens.size()) - 1) / bs);
    while (s.blocks.size() < max_blocks) {
      const BlockHash h = block_hash(s, s.blocks.size());
      const int32_t b = blocks_->lookup(h);
      if (b < 0) break;
      blocks_->acquire(b);
      s.blocks.push_back(b);
      s.block_hashes.push_back(h);
    }
    if (window_pool_) {
      // The window layers need the window before the first token computed: the longest prefix
      // whose last window's blocks are cached too (the blocks before it are never read).
      while (!s.blocks.empty() && !window_cached(s, s.blocks.size())) {
        blocks_->release({s.blocks.back()}, s.keyed);
        s.blocks.pop_back();
        s.block_hashes.pop_back();
      }
      const size_t n = s.blocks.size();
      s.window_blocks.assign(n, -1);
      for (size_t i = first_window_block(int64_t(n) * bs); i < n; i++) {
        s.window_blocks[i] = window_pool_->lookup(s.block_hashes[i]);
        window_pool_->acquire(s.window_blocks[i]);
      }
    }
    s.num_computed = int64_t(s.blocks.size()) * bs;
  }

  // The first block a token at position `pos` reads in the window layers.
  size_t first_window_block(int64_t pos) const { return size_t(std::max<int64_t>(0, pos - window_ + 1) / opts_.block_size); }
  // Whether the window pool caches every block the token after the first n blocks reads.
  bool window_cached(const Sequence& s, size_t n) const {
    for (size_t i = first_window_block(int64_t(n) * opts_.block_size); i < n; i++)
      if (window_pool_->lookup(s.block_hashes[i]) < 0) return false;
    return true;
  }
  // Releases s's window blocks that no later token reads (cached when full: a later prompt with
  // this prefix may still hit them).
  void drop_out_of_window(Sequence& s) {
    if (!window_pool_) return;
    // (one token of margin: a pipelined step whose sample failed takes its token back)
    const size_t first = std::min(first_window_block(s.num_computed - 1), s.window_blocks.size());
    std::vector<int32_t> out;
    for (size_t i = 0; i < first; i++) {
      if (s.window_blocks[i] < 0) continue;
      out.push_back(s.window_blocks[i]);
      s.window_blocks[i] = -1;
    }
    if (!out.empty()) window_pool_->release(out, s.keyed);
  }
  // Window blocks a row computing up to position `end` (exclusive) allocates.
  int64_t window_need(const Sequence& s, int64_t end) const {
    if (!window_pool_) return 0;
    return std::max<int64_t>(0, (end + opts_.block_size - 1) / opts_.block_size - int64_t(s.window_blocks.size()));
  }

  // Offers s's newly completed blocks to the prefix cache (a hash already cached keeps its
  // block; s's copy stays uncached and is freed with s).
  void cache_full_blocks(Sequence& s) {
    const size_t num_full = size_t(s.num_computed / opts_.block_size);
    while (s.block_hashes.size() < num_full) {
      const size_t i = s.block_hashes.size();
      // Pipelined: a block holding a token still on the device is hashed once its step ends.
      if (pipelined_ && holds_placeholder(s, i)) break;
      s.block_hashes.push_back(block_hash(s, i));
      blocks_->register_block(s.blocks[i], s.block_hashes[i]);
      if (window_pool_ && s.window_blocks[i] >= 0) window_pool_->register_block(s.window_blocks[i], s.block_hashes[i]);
    }
  }

  bool holds_placeholder(const Sequence& s, size_t block) const {
    const auto first = s.tokens.begin() + long(block) * opts_.block_size;
    return std::any_of(first, first + opts_.block_size, [](int32_t t) { return t < 0; });
  }

  EngineOptions opts_;
  ModelConfig config_;
  std::unique_ptr<SafetensorsModel> st_;
  ModelWeights weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Eagle3Head> eagle_;
  static constexpr size_t kMaxAdapters = 256;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;  // by id - 1; null: retired
  std::vector<uint64_t> adapter_keys_;              // [adapters] the model key of each one's blocks
  std::vector<const LoraAdapter*> seq_adapters_;    // per-step scratch: [plan rows]
  std::vector<std::vector<int32_t>> eagle_drafts_;  // [plan_rows_] scratch
  std::unique_ptr<BlockPool> blocks_;
  // Blocks of the sliding-window layers (their KV apart: Backend::kv_bytes_per_window_block), or
  // null. window_: the widest window of those layers.
  std::unique_ptr<BlockPool> window_pool_;
  int64_t window_ = 0;
  std::unordered_map<uint32_t, Sequence> seqs_;
  uint64_t model_key_ = 0;  // extra key of every block hash (config.json + matmul precision)
  std::string broken_reason_;  // set by a device fault; the engine refuses work from then on
  uint64_t num_steps_ = 0;
  uint64_t num_seqs_added_ = 0;  // Sequence::uid source
  bool pipelined_ = false;       // cuda_device_tokens: begin_step / end_step overlap
  std::deque<InFlight> in_flight_;  // begun steps, oldest first (at most two)
  int next_slot_ = 0;               // the backend sample slot of the next launch
  std::unordered_map<uint32_t, FaultPoint> injected_faults_;  // seq_id -> pending testing fault
  bool device_fault_pending_ = false;

  // Per-step scratch, reused to keep the decode loop free of allocations.
  std::vector<int32_t> token_ids_, positions_, token_seq_, slots_, window_slots_, logit_rows_;
  std::vector<int32_t> rope_positions_, embed_rows_;  // M-RoPE models: [3T]; image placeholder rows
  std::vector<int32_t> attn_last_;                    // bidirectional images: [T], else empty
  std::vector<const float*> embed_ptrs_;
  static constexpr size_t kMaxImagesPerSequence = 256;
  std::vector<const int32_t*> tables_, window_tables_;
  std::vector<int32_t> table_lens_;
  struct PlanRow {
    Sequence* seq;
    uint32_t seq_id;
    int64_t count;  // tokens computed; after a verification, those kept (1 + accepted)
    size_t index;   // in the plan
    // Speculative decoding: drafts verified after the pending token (count = 1 + num_drafts).
    int64_t num_drafts = 0;
    const int32_t* drafts = nullptr;
    int64_t accepted = 0;
    int64_t first_token = 0;  // the row's first token in the forward batch
  };
  std::vector<PlanRow> plan_rows_;          // the plan's valid rows, in plan order
  int64_t claimed_blocks_ = 0;              // blocks the step's rows will allocate (not yet taken)
  int64_t claimed_window_blocks_ = 0;       // likewise, of the window pool
  std::vector<uint8_t> row_deferred_;       // [n] row of a sequence added by this step
  std::vector<SampleRow> sample_rows_;      // [m] one per sequence that samples this step
  std::vector<const PlanRow*> sampling_rows_;  // [m]
  std::vector<size_t> sample_plan_row_;        // [m] index in plan_rows_ of sampling row r
  std::vector<size_t> draft_offsets_;          // [n] each plan row's first draft in StepPlan::drafts
  std::vector<uint8_t> sample_accepted_;       // [m] verified drafts: kept or not
  std::vector<uint8_t> plan_row_failed_;       // [plan_rows_] a sampling row of it failed
  std::vector<SampleRowError> sample_errors_;
  std::vector<int32_t> sample_tokens_, sample_top_ids_;  // [m], [m * top_n]
  std::vector<float> sample_logprobs_, sample_top_lps_;  // [m], [m * top_n]
};

int64_t EngineImpl::check_row(uint32_t seq_id, int64_t bound) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end())
    throw Error(ErrorCode::kSequenceUnknown, "step plan names unknown sequence " + std::to_string(seq_id));
  Sequence& s = it->second;
  if (s.planned_in_step == num_steps_)
    throw Error(ErrorCode::kInvalidArgument, "step plan names sequence " + std::to_string(seq_id) + " twice");
  s.planned_in_step = num_steps_;
  const int64_t uncomputed = int64_t(s.tokens.size()) - s.num_computed;
  if (bound < 1) throw Error(ErrorCode::kInvalidArgument, "step plan asks sequence " + std::to_string(seq_id) + " for 0 tokens");
  if (uncomputed < 1)
    throw Error(ErrorCode::kInvalidArgument, "sequence " + std::to_string(seq_id) + " has no token left to compute");
  const int64_t count = whole_images(s, std::min(bound, uncomputed));
  if (s.num_computed + count > config_.max_position_embeddings)
    throw Error(ErrorCode::kInvalidArgument, "sequence " + std::to_string(seq_id) + " would exceed the context length " +
                                                 std::to_string(config_.max_position_embeddings));
  if (take_fault(seq_id, FaultPoint::kPrepareRow))
    throw Error(ErrorCode::kInternal, "injected fault while preparing sequence " + std::to_string(seq_id));
  return count;
}

int64_t EngineImpl::row_drafts(const StepPlan& plan, size_t i, const Sequence& s, int64_t bound, const int32_t** drafts) const {
  if (plan.num_drafts.empty() || plan.num_drafts[i] == 0) return 0;
  // Only a decode row, on a backend that verifies, in serial steps.
  if (pipelined_ || !backend_->verifies_drafts() || int64_t(s.tokens.size()) - s.num_computed != 1) return 0;
  const int64_t room = config_.max_position_embeddings - (s.num_computed + 1);
  const int64_t k = std::max<int64_t>(0, std::min({int64_t(plan.num_drafts[i]), bound - 1, room}));
  const int32_t* d = plan.drafts.data() + draft_offsets_[i];
  for (int64_t j = 0; j < k; j++)
    if (d[j] < 0 || d[j] >= config_.vocab_size)
      throw Error(ErrorCode::kInvalidArgument, "step plan drafts token " + std::to_string(d[j]) + " for sequence " +
                                                   std::to_string(plan.seq_ids[i]) + ", outside the vocabulary");
  *drafts = d;
  return k;
}

void EngineImpl::release_unkept_blocks(Sequence& s) {
  const int64_t bs = opts_.block_size;
  const size_t keep = size_t((s.num_computed + bs - 1) / bs);
  if (s.blocks.size() > keep) {
    blocks_->release(std::vector<int32_t>(s.blocks.rbegin(), s.blocks.rend() - long(keep)), s.keyed);
    s.blocks.resize(keep);
  }
  if (window_pool_ && s.window_blocks.size() > keep) {
    std::vector<int32_t> held;
    for (size_t b = s.window_blocks.size(); b-- > keep;)
      if (s.window_blocks[b] >= 0) held.push_back(s.window_blocks[b]);
    window_pool_->release(held, s.keyed);
    s.window_blocks.resize(keep);
  }
}

void EngineImpl::claim_row(const StepPlan& plan, size_t i, StepResult& result) {
  const uint32_t seq_id = plan.seq_ids[i];
  try {
    int64_t count = check_row(seq_id, plan.num_tokens[i]);
    Sequence& s = seqs_.at(seq_id);
    const int32_t* drafts = nullptr;
    const int64_t num_drafts = row_drafts(plan, i, s, plan.num_tokens[i], &drafts);
    count += num_drafts;
    const int64_t bs = opts_.block_size;
    const int64_t need = std::max<int64_t>(0, (s.num_computed + count + bs - 1) / bs - int64_t(s.blocks.size()));
    const int64_t window = window_need(s, s.num_computed + count);
    if (need > blocks_->num_free() - claimed_blocks_ ||
        (window_pool_ && window > window_pool_->num_free() - claimed_window_blocks_)) {
      result.row_status[i] = uint8_t(RowStatus::kNoKvBlocks);
      return;
    }
    claimed_blocks_ += need;
    claimed_window_blocks_ += window;
    plan_rows_.push_back({&s, seq_id, count, i, num_drafts, drafts, 0});
  } catch (const Error& e) {
    result.errors.push_back({seq_id, e.code(), e.what()});
  } catch (const std::exception& e) {
    result.errors.push_back({seq_id, ErrorCode::kInternal, e.what()});
  }
}

AddStatus EngineImpl::admit(const SequenceAdd& add, StepResult& result, int32_t* num_cached) {
  try {
    const int64_t cached = add_sequence(add.seq_id, add.prompt, add.params, add.keyed, add.cache_scope, add.images, add.adapter);
    const Sequence& s = seqs_.at(add.seq_id);
    const int64_t bs = opts_.block_size;
    // Admission wants the whole prompt's blocks (a running prefill then rarely needs more than it
    // can get); the prefix hit's blocks are in the table already.
    const int64_t need = (int64_t(s.tokens.size()) + bs - 1) / bs - int64_t(s.blocks.size());
    // The window layers: at least the window's blocks and one more (a long prompt prefills in
    // chunks, each freeing what falls out of the window).
    const int64_t window = std::min(window_need(s, int64_t(s.tokens.size())), (window_ - 1 + bs - 1) / bs + 2);
    if (need > blocks_->num_free() - claimed_blocks_ ||
        (window_pool_ && window > window_pool_->num_free() - claimed_window_blocks_)) {
      free_sequence(add.seq_id);
      return AddStatus::kNoKvBlocks;
    }
    *num_cached = int32_t(cached);
    return AddStatus::kAdmitted;
  } catch (const Error& e) {
    result.errors.push_back({add.seq_id, e.code(), e.what()});
  } catch (const std::exception& e) {
    result.errors.push_back({add.seq_id, ErrorCode::kInternal, e.what()});
  }
  return AddStatus::kFailed;
}

StepResult EngineImpl::step(const StepPlan& plan) {
  if (!pipelined_) return step_serial(plan);
  if (!in_flight_.empty())
    throw Error(ErrorCode::kInvalidArgument, "step() while begun steps are in flight: end_step() them first");
  begin_step(plan);
  return end_step();
}

StepResult EngineImpl::step_serial(const StepPlan& plan) {
  StepResult result;
  if (prepare_step(plan, result)) run_backend(plan, result);  // marks rows whose sampling failed
  for (const PlanRow& row : plan_rows_) {
    const Sequence& s = *row.seq;
    result.row_computed[row.index] = uint32_t(row.count);
    result.row_pending[row.index] = uint32_t(int64_t(s.tokens.size()) - s.num_computed);
    result.row_blocks[row.index] = uint32_t(s.blocks.size());
  }
  result.num_free_blocks = blocks_->num_free();
  result.num_evictable_blocks = blocks_->num_evictable();
  result.num_cached_blocks = blocks_->num_cached();
  return result;
}

bool EngineImpl::prepare_step(const StepPlan& plan, StepResult& result) {
  check_in_service();
  const size_t n = plan.seq_ids.size();
  if (plan.num_tokens.size() != n) throw Error(ErrorCode::kInvalidArgument, "plan seq_ids and num_tokens differ in length");
  const int64_t bs = opts_.block_size;
  num_steps_++;
  result.row_status.assign(n, uint8_t(RowStatus::kFailed));
  result.row_computed.assign(n, 0);
  result.row_pending.assign(n, 0);
  result.row_blocks.assign(n, 0);
  result.row_drafted.assign(n, 0);
  result.row_accepted.assign(n, 0);
  if (!plan.num_next_drafts.empty() && plan.num_next_drafts.size() != n)
    throw Error(ErrorCode::kInvalidArgument, "plan num_next_drafts and seq_ids differ in length");
  if (eagle_) result.row_next_drafts.assign(n, 0);
  if (!plan.num_drafts.empty() && plan.num_drafts.size() != n)
    throw Error(ErrorCode::kInvalidArgument, "plan num_drafts and seq_ids differ in length");
  draft_offsets_.assign(n, 0);
  for (size_t i = 0, off = 0; i < plan.num_drafts.size(); i++) {
    draft_offsets_[i] = off;
    off += plan.num_drafts[i];
    if (off > plan.drafts.size()) throw Error(ErrorCode::kInvalidArgument, "plan num_drafts add up to more than its drafts");
  }
  result.add_status.assign(plan.adds.size(), uint8_t(AddStatus::kFailed));
  result.add_cached.assign(plan.adds.size(), -1);

  for (uint32_t id : plan.frees) free_sequence(id);
  // Blocks are claimed (counted, not yet taken) before any is allocated: the rows of running
  // sequences first, then each add with its rows.
  plan_rows_.clear();
  claimed_blocks_ = 0;
  claimed_window_blocks_ = 0;
  std::vector<uint8_t>& deferred = row_deferred_;
  deferred.assign(n, 0);
  for (size_t i = 0; i < n; i++) {
    if (seqs_.count(plan.seq_ids[i])) claim_row(plan, i, result);
    else deferred[i] = 1;
  }
  // An admitted add claims its row's blocks at once, so the next add sees them taken.
  for (size_t a = 0; a < plan.adds.size(); a++) {
    const uint32_t id = plan.adds[a].seq_id;
    const AddStatus st = admit(plan.adds[a], result, &result.add_cached[a]);
    result.add_status[a] = uint8_t(st);
    if (st == AddStatus::kFailed) continue;
    for (size_t i = 0; i < n; i++) {
      if (!deferred[i] || plan.seq_ids[i] != id) continue;
      deferred[i] = 0;
      if (st == AddStatus::kAdmitted) claim_row(plan, i, result);
      else result.row_status[i] = uint8_t(RowStatus::kNoKvBlocks);  // its add was not admitted
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (deferred[i]) claim_row(plan, i, result);  // unknown sequences: errors of their rows
  }
  std::sort(plan_rows_.begin(), plan_rows_.end(), [](const PlanRow& x, const PlanRow& y) { return x.index < y.index; });
  if (plan_rows_.empty()) return false;
  {
    token_ids_.clear();
    positions_.clear();
    rope_positions_.clear();
    embed_rows_.clear();
    embed_ptrs_.clear();
    attn_last_.clear();
    token_seq_.clear();
    slots_.clear();
    window_slots_.clear();
    logit_rows_.clear();
    tables_.assign(plan_rows_.size(), nullptr);
    seq_adapters_.assign(plan_rows_.size(), nullptr);
    window_tables_.assign(window_pool_ ? plan_rows_.size() : 0, nullptr);
    table_lens_.assign(plan_rows_.size(), 0);
    for (size_t i = 0; i < plan_rows_.size(); i++) {
      Sequence& s = *plan_rows_[i].seq;
      const int64_t end = s.num_computed + plan_rows_[i].count;
      blocks_->allocate((end + bs - 1) / bs - int64_t(s.blocks.size()), &s.blocks);
      tables_[i] = s.blocks.data();
      seq_adapters_[i] = s.adapter.get();
      table_lens_[i] = int32_t(s.blocks.size());
      if (window_pool_) {
        window_pool_->allocate(window_need(s, end), &s.window_blocks);
        window_tables_[i] = s.window_blocks.data();
      }
      const int64_t base = int64_t(token_ids_.size()), known = int64_t(s.tokens.size());
      plan_rows_[i].first_token = base;
      for (int64_t pos = s.num_computed; pos < end; pos++) {
        token_ids_.push_back(pos < known ? s.tokens[size_t(pos)] : plan_rows_[i].drafts[pos - known]);
        positions_.push_back(int32_t(pos));
        if (config_.image_attention_bidirectional) attn_last_.push_back(int32_t(pos));
        token_seq_.push_back(int32_t(i));
        slots_.push_back(int32_t(int64_t(s.blocks[size_t(pos / bs)]) * bs + pos % bs));
        if (window_pool_) window_slots_.push_back(int32_t(int64_t(s.window_blocks[size_t(pos / bs)]) * bs + pos % bs));
      }
      if (config_.mrope() || !s.images.empty()) add_image_rows(s, s.num_computed, end, base);
      // A verifying row wants the logits of its pending token and of every draft.
      const int64_t num_drafts = plan_rows_[i].num_drafts;
      if (end == known + num_drafts)
        for (int64_t r = num_drafts; r >= 0; r--) logit_rows_.push_back(int32_t(token_ids_.size()) - 1 - int32_t(r));
    }
    for (const PlanRow& row : plan_rows_) result.row_status[row.index] = uint8_t(RowStatus::kRan);
  }
  return true;
}

// Points each constrained sampling row at its mask, waiting (after the forward pass) for the
// scheduler to provide them.
void EngineImpl::attach_token_masks(const StepPlan& plan) {
  mask_missing_.assign(sample_rows_.size(), 0);
  if (plan.constrained.empty()) return;
  std::unordered_map<uint32_t, size_t> first;
  mask_row_layout(plan, &first);
  bool any = false;
  for (const PlanRow* row : sampling_rows_) any = any || first.count(row->seq_id);
  if (!any) return;
  const uint32_t* masks = plan.masks ? plan.masks->wait() : nullptr;
  const int64_t words = token_mask_words(config_.vocab_size);
  // A verifying row's logit rows follow each other: the j-th reads the mask after j drafts.
  size_t j = 0;
  for (size_t r = 0; r < sampling_rows_.size(); r++) {
    j = r > 0 && sampling_rows_[r - 1] == sampling_rows_[r] ? j + 1 : 0;
    auto it = first.find(sampling_rows_[r]->seq_id);
    if (it == first.end()) continue;
    if (masks) sample_rows_[r].allow = masks + int64_t(it->second + j) * words;
    else mask_missing_[r] = 1;
  }
}

ForwardBatch EngineImpl::forward_batch() const {
  ForwardBatch fb;
  fb.num_tokens = int64_t(token_ids_.size());
  fb.token_ids = token_ids_.data();
  fb.positions = positions_.data();
  fb.token_seq = token_seq_.data();
  fb.slots = slots_.data();
  if (window_pool_) {
    fb.window_slots = window_slots_.data();
    fb.window_block_tables = window_tables_.data();
  }
  if (config_.mrope()) fb.rope_positions = rope_positions_.data();
  if (config_.image_attention_bidirectional) fb.attn_last = attn_last_.data();
  fb.num_input_embeds = int64_t(embed_rows_.size());
  fb.input_embed_rows = embed_rows_.data();
  fb.input_embeds = embed_ptrs_.data();
  fb.num_seqs = int64_t(plan_rows_.size());
  fb.block_tables = tables_.data();
  fb.num_seq_blocks = table_lens_.data();
  if (std::any_of(seq_adapters_.begin(), seq_adapters_.end(), [](const LoraAdapter* a) { return a != nullptr; }))
    fb.seq_adapters = seq_adapters_.data();
  fb.num_logit_rows = int64_t(logit_rows_.size());
  fb.logit_rows = logit_rows_.data();
  return fb;
}

int EngineImpl::collect_sampling_rows() {
  // The sequences whose known tokens are all computed after this step sample, in plan order
  // (= logit row order).
  int top_n = 0;
  sample_rows_.clear();
  sampling_rows_.clear();
  sample_plan_row_.clear();
  for (size_t p = 0; p < plan_rows_.size(); p++) {
    const PlanRow& row = plan_rows_[p];
    const Sequence& s = *row.seq;
    if (s.num_computed + row.count != int64_t(s.tokens.size()) + row.num_drafts) continue;
    top_n = std::max(top_n, s.params.logprobs);
    const bool fault = take_fault(row.seq_id, FaultPoint::kSampleRow);
    // A fresh stream per (seed, position): a preempted and recomputed sequence draws the same.
    // A verifying row's j-th logit row draws the token at position tokens.size() + j.
    for (int64_t j = 0; j <= row.num_drafts; j++) {
      sampling_rows_.push_back(&row);
      sample_plan_row_.push_back(p);
      SampleRow sr{s.params, s.params.seed ^ (0x9e3779b97f4a7c15ull * uint64_t(int64_t(s.tokens.size()) + j)), fault && j == 0};
      if (j < row.num_drafts) sr.draft = row.drafts[j];
      sample_rows_.push_back(sr);
    }
  }
  return top_n;
}

template <typename Sample>
void EngineImpl::forward_and_sample(const StepPlan& plan, const ForwardBatch& fb, Sample&& sample) {
  try {
    if (device_fault_pending_) {
      device_fault_pending_ = false;
      throw Error(ErrorCode::kDeviceFault, "injected device fault");
    }
    backend_->forward(fb);
    attach_token_masks(plan);
    sample();
  } catch (const Error& e) {
    // NOTE: nothing of the step was applied to the sequences yet; only a device fault breaks
    // the engine (its memory can no longer be trusted), other failures fail just this step.
    if (e.code() == ErrorCode::kDeviceFault) broken_reason_ = e.what();
    throw;
  }
}

void EngineImpl::run_backend(const StepPlan& plan, StepResult& result) {
  const ForwardBatch fb = forward_batch();
  const int top_n = collect_sampling_rows();
  const size_t m = sample_rows_.size();
  std::vector<int32_t>& tokens = sample_tokens_;
  std::vector<float>& logprobs = sample_logprobs_;
  std::vector<int32_t>& top_ids = sample_top_ids_;
  std::vector<float>& top_lps = sample_top_lps_;
  tokens.assign(m, -1);
  logprobs.assign(m, 0.f);
  top_ids.assign(m * size_t(top_n), -1);
  top_lps.assign(m * size_t(top_n), -INFINITY);
  sample_accepted_.assign(m, 0);
  sample_errors_.clear();
  forward_and_sample(plan, fb, [&] {
    SampleOutput out{tokens.data(), logprobs.data(), top_n, top_ids.data(), top_lps.data(), &sample_errors_,
                     sample_accepted_.data()};
    backend_->sample(sample_rows_.data(), int64_t(m), out);
  });

  // Failures are a plan row's: a verifying row whose any logit row failed gains no token.
  std::vector<uint8_t>& row_failed = plan_row_failed_;
  row_failed.assign(plan_rows_.size(), 0);
  auto fail = [&](size_t r, ErrorCode code, const std::string& message) {
    const size_t p = sample_plan_row_[r];
    if (row_failed[p]) return;
    row_failed[p] = 1;
    result.errors.push_back({plan_rows_[p].seq_id, code, message});
    result.row_status[plan_rows_[p].index] = uint8_t(RowStatus::kFailed);
  };
  for (size_t r = 0; r < m; r++)
    if (mask_missing_[r]) fail(r, ErrorCode::kInvalidArgument, "the token mask of this constrained row was not provided");
  for (const SampleRowError& e : sample_errors_)
    if (e.row >= 0 && size_t(e.row) < m) fail(size_t(e.row), e.code, e.message);
  // A backend must fail a row it could not sample; a token outside the vocabulary that slipped
  // through anyway would be appended and embedded by the next step (an out-of-bounds read).
  for (size_t r = 0; r < m; r++)
    if (tokens[r] < 0 || tokens[r] >= config_.vocab_size)
      fail(r, ErrorCode::kInternal,
           "the " + backend_->name() + " sampler returned token " + std::to_string(tokens[r]) + " outside the vocabulary");

  // Each verifying row keeps its pending token and the drafts accepted before the first rejected
  // one; the K/V of the rest is dropped before any block holding it is hashed.
  for (size_t r = 0; r < m;) {
    PlanRow& row = plan_rows_[sample_plan_row_[r]];
    if (row.num_drafts > 0) {
      int64_t a = 0;
      if (!row_failed[sample_plan_row_[r]])
        while (a < row.num_drafts && sample_accepted_[r + size_t(a)] && tokens[r + size_t(a)] == row.drafts[a]) a++;
      row.accepted = a;
      row.count = 1 + a;
      result.row_drafted[row.index] = uint32_t(row.num_drafts);
      result.row_accepted[row.index] = uint32_t(a);
    }
    r += size_t(row.num_drafts) + 1;
  }
  for (PlanRow& row : plan_rows_) {
    Sequence& s = *row.seq;
    s.num_computed += row.count;
    if (row.num_drafts > 0) release_unkept_blocks(s);
    if (opts_.prefix_caching) cache_full_blocks(s);
    drop_out_of_window(s);
  }
  result.top_n = top_n;
  for (size_t r = 0; r < m;) {
    const size_t p = sample_plan_row_[r];
    const PlanRow& row = plan_rows_[p];
    const size_t emitted = row_failed[p] ? 0 : size_t(row.num_drafts > 0 ? row.accepted + 1 : 1);
    for (size_t j = r; j < r + emitted; j++) {
      row.seq->tokens.push_back(tokens[j]);
      result.seq_ids.push_back(row.seq_id);
      result.tokens.push_back(tokens[j]);
      result.logprobs.push_back(logprobs[j]);
      result.top_ids.insert(result.top_ids.end(), top_ids.begin() + long(j * size_t(top_n)),
                            top_ids.begin() + long((j + 1) * size_t(top_n)));
      result.top_logprobs.insert(result.top_logprobs.end(), top_lps.begin() + long(j * size_t(top_n)),
                                 top_lps.begin() + long((j + 1) * size_t(top_n)));
    }
    r += size_t(row.num_drafts) + 1;
  }
  // A plan without num_next_drafts (the scheduler's speculation is off under load) leaves the head
  // alone: what this step computed is absent from its context, which costs acceptance later, not
  // correctness, and costs nothing now.
  if (eagle_ && !plan.num_next_drafts.empty()) run_eagle3(plan, result);
}

void EngineImpl::load_eagle3(int64_t max_entries) {
  cpu::ThreadPool* threads = backend_->cpu_threads();
  if (!threads || pipelined_)
    throw Error(ErrorCode::kInvalidArgument, "EAGLE-3 heads run on the cpu backend with serial steps (the " + backend_->name() +
                                                 " backend does not run them yet)");
  eagle_ = std::make_unique<Eagle3Head>(opts_.eagle3_dir, config_, weights_.embed, *threads, max_entries);
  if (!backend_->capture_hidden(eagle_->config().aux_layers))
    throw Error(ErrorCode::kInvalidArgument, "the " + backend_->name() + " backend cannot give an EAGLE-3 head its hidden states");
}

void EngineImpl::run_eagle3(const StepPlan& plan, StepResult& result) {
  const float* features = backend_->captured_hidden();
  const int64_t F = 3 * config_.hidden_size;
  const int64_t max_pos = config_.max_position_embeddings;
  std::vector<Eagle3Head::Update> updates;
  updates.reserve(plan_rows_.size());
  eagle_drafts_.resize(plan_rows_.size());
  for (size_t p = 0; p < plan_rows_.size(); p++) {
    const PlanRow& row = plan_rows_[p];
    const Sequence& s = *row.seq;
    eagle_drafts_[p].clear();
    // The positions the step kept, each with the token after it (known now, unless the row
    // failed to sample its last one).
    const int64_t first = s.num_computed - row.count;
    const int64_t n = std::min<int64_t>(row.count, int64_t(s.tokens.size()) - 1 - first);
    if (n <= 0) continue;
    Eagle3Head::Update u;
    u.seq_id = row.seq_id;
    u.features = features + row.first_token * F;
    u.stride = F;
    u.next_tokens = s.tokens.data() + first + 1;
    u.first = first;
    u.n = n;
    // Drafts follow a token the row just sampled, within the context.
    const bool sampled = !plan_row_failed_.empty() && !plan_row_failed_[p] && int64_t(s.tokens.size()) == s.num_computed + 1;
    const int64_t want = plan.num_next_drafts.empty() ? 0 : int64_t(plan.num_next_drafts[row.index]);
    u.k = sampled ? int(std::clamp<int64_t>(std::min(want, max_pos - int64_t(s.tokens.size())), 0, 64)) : 0;
    u.drafts = &eagle_drafts_[p];
    updates.push_back(u);
  }
  eagle_->run(updates);
  for (size_t p = 0; p < plan_rows_.size(); p++) {
    const std::vector<int32_t>& d = eagle_drafts_[p];
    result.row_next_drafts[plan_rows_[p].index] = uint32_t(d.size());
    result.next_drafts.insert(result.next_drafts.end(), d.begin(), d.end());
  }
}

// Pipelined steps (cuda_device_tokens). begin_step() applies a step to the sequences as if it
// succeeded: rows advance num_computed, and each sampling row appends a placeholder
// (device_token_ref(r)) that the next step's decode row computes on the device, where the token
// already is. end_step() collects the samples: a placeholder becomes its token, or, when the
// sample failed, the sequence is cut back to before it (the row of a step begun since that
// computed it then fails as well). Invariant: every placeholder in a sequence belongs to the
// last launched step that is not done, which is the backend's last sample_launch().
void EngineImpl::begin_step(const StepPlan& plan) {
  if (in_flight_.size() >= 2) throw Error(ErrorCode::kInvalidArgument, "two steps are in flight already: end_step() one first");
  if (!pipelined_) {
    InFlight f;
    f.result = step_serial(plan);
    f.done = true;
    in_flight_.push_back(std::move(f));
    return;
  }
  // A plan with constrained rows waits for masks that depend on the last step's tokens: the
  // scheduler sees them only once that step has ended.
  if (!plan.constrained.empty() && !in_flight_.empty() && !in_flight_.back().done) finish_pipelined(in_flight_.back());
  InFlight f;
  if (prepare_step(plan, f.result)) launch_pipelined(plan, f);
  else f.done = true;
  for (const PlanRow& row : plan_rows_) {
    const Sequence& s = *row.seq;
    f.result.row_computed[row.index] = uint32_t(row.count);
    f.result.row_pending[row.index] = uint32_t(int64_t(s.tokens.size()) - s.num_computed);
    f.result.row_blocks[row.index] = uint32_t(s.blocks.size());
  }
  if (f.done) {
    f.result.num_free_blocks = blocks_->num_free();
    f.result.num_evictable_blocks = blocks_->num_evictable();
    f.result.num_cached_blocks = blocks_->num_cached();
  }
  in_flight_.push_back(std::move(f));
}

StepResult EngineImpl::end_step() {
  if (in_flight_.empty()) throw Error(ErrorCode::kInvalidArgument, "end_step() without a begun step");
  InFlight& f = in_flight_.front();
  struct Pop {
    std::deque<InFlight>& q;
    ~Pop() { q.pop_front(); }  // a step whose end threw (a device fault) is over too
  } pop{in_flight_};
  if (!f.done) finish_pipelined(f);
  return std::move(f.result);
}

void EngineImpl::launch_pipelined(const StepPlan& plan, InFlight& f) {
  // Tokens still on the device: a backend that cannot read them there gets them from its host copy.
  if (!backend_->resolves_device_tokens())
    backend_->resolve_host_refs(token_ids_.data(), int64_t(token_ids_.size()), config_.vocab_size);
  const ForwardBatch fb = forward_batch();
  f.top_n = collect_sampling_rows();
  f.slot = next_slot_;
  forward_and_sample(plan, fb, [&] {
    if (!sample_rows_.empty()) backend_->sample_launch(sample_rows_.data(), int64_t(sample_rows_.size()), f.top_n, f.slot);
  });
  if (!sample_rows_.empty()) next_slot_ ^= 1;
  for (const PlanRow& row : plan_rows_) {
    Sequence& s = *row.seq;
    s.num_computed += row.count;
    if (opts_.prefix_caching) cache_full_blocks(s);
    drop_out_of_window(s);
    f.ran.emplace_back(row.seq_id, s.uid);
  }
  for (size_t r = 0; r < sampling_rows_.size(); r++) {
    Sequence& s = *sampling_rows_[r]->seq;
    s.tokens.push_back(Backend::device_token_ref(int64_t(r)));
    f.samples.push_back({sampling_rows_[r]->seq_id, s.uid, s.tokens.size() - 1, sampling_rows_[r]->index,
                         mask_missing_[r] != 0});
  }
}

void EngineImpl::finish_pipelined(InFlight& f) {
  f.done = true;
  check_in_service();  // a device fault of the step before: this one's samples cannot be trusted
  StepResult& result = f.result;
  const size_t m = f.samples.size();
  const size_t tn = size_t(f.top_n);
  std::vector<int32_t>& tokens = sample_tokens_;
  tokens.assign(m, -1);
  sample_logprobs_.assign(m, 0.f);
  sample_top_ids_.assign(m * tn, -1);
  sample_top_lps_.assign(m * tn, -INFINITY);
  sample_errors_.clear();
  if (m) {
    try {
      backend_->sample_collect(f.slot, {tokens.data(), sample_logprobs_.data(), f.top_n, sample_top_ids_.data(),
                                        sample_top_lps_.data(), &sample_errors_});
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kDeviceFault) broken_reason_ = e.what();
      throw;
    }
  }
  // The same failures as run_backend(), in the same order.
  std::vector<std::string> why(m);
  std::vector<ErrorCode> code(m, ErrorCode::kInternal);
  for (size_t r = 0; r < m; r++)
    if (f.samples[r].mask_missing) why[r] = "the token mask of this constrained row was not provided", code[r] = ErrorCode::kInvalidArgument;
  for (const SampleRowError& e : sample_errors_)
    if (e.row >= 0 && size_t(e.row) < m && why[size_t(e.row)].empty()) why[size_t(e.row)] = e.message, code[size_t(e.row)] = e.code;
  for (size_t r = 0; r < m; r++)
    if (why[r].empty() && !(tokens[r] >= 0 && tokens[r] < config_.vocab_size))
      why[r] = "the " + backend_->name() + " sampler returned token " + std::to_string(tokens[r]) + " outside the vocabulary";
  result.top_n = f.top_n;
  for (size_t r = 0; r < m; r++) {
    const InFlight::Sample& smp = f.samples[r];
    Sequence* s = find_live(smp.seq_id, smp.uid);
    // Freed by a step begun since: its sample is still this step's result (as in a serial loop).
    const bool present = s && s->tokens.size() > smp.pos && s->tokens[smp.pos] < 0;
    if (s && !present && why[r].empty()) {
      // Cut back by the failed sample of the step before, whose placeholder this row computed.
      why[r] = "sequence " + std::to_string(smp.seq_id) + " has no token left to compute (its last sample failed)";
      code[r] = ErrorCode::kInvalidArgument;
      result.row_computed[smp.index] = 0;
    }
    if (!why[r].empty()) {
      result.errors.push_back({smp.seq_id, code[r], why[r]});
      result.row_status[smp.index] = uint8_t(RowStatus::kFailed);
      result.row_pending[smp.index] = 0;
      if (present) {
        s->tokens.resize(smp.pos);
        s->num_computed = std::min<int64_t>(s->num_computed, int64_t(smp.pos));
      }
      continue;
    }
    if (present) s->tokens[smp.pos] = tokens[r];
    result.seq_ids.push_back(smp.seq_id);
    result.tokens.push_back(tokens[r]);
    result.logprobs.push_back(sample_logprobs_[r]);
    result.top_ids.insert(result.top_ids.end(), sample_top_ids_.begin() + long(r * tn),
                          sample_top_ids_.begin() + long((r + 1) * tn));
    result.top_logprobs.insert(result.top_logprobs.end(), sample_top_lps_.begin() + long(r * tn),
                               sample_top_lps_.begin() + long((r + 1) * tn));
  }
  if (opts_.prefix_caching)
    for (const auto& [seq_id, uid] : f.ran)
      if (Sequence* s = find_live(seq_id, uid)) cache_full_blocks(*s);
  result.num_free_blocks = blocks_->num_free();
  result.num_evictable_blocks = blocks_->num_evictable();
  result.num_cached_blocks = blocks_->num_cached();
}

}  // namespace

int64_t token_mask_rows(const StepPlan& plan) { return int64_t(mask_row_layout(plan, nullptr)); }

std::unique_ptr<Engine> Engine::load(const EngineOptions& options) { return std::make_unique<EngineImpl>(options); }

bool cuda_available(std::string* why) { return cuda_backend_available(why); }

double measure_memory_bandwidth(int num_threads, size_t bytes, int repeats, bool keep_buffer) {
  cpu::ThreadPool pool(num_threads);
  return cpu::measure_read_bandwidth(pool, bytes, repeats, keep_buffer);
}

}  // namespace sluice
