// Host-side launchers of the CUDA kernels used by the CUDA backend's forward pass and sampler.
// Every launcher enqueues on `stream` and checks the launch. Element type E of activations,
// weights and KV is bf16 or f16 (the model's dtype); residuals, norms and logits are f32.
// Row-major shapes; `ld_*` are row strides in elements. GEMM operands have ld % 8 == 0 and
// zero padding past K, so 16-byte copies never need a ragged tail.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sluice/dtype.h"
#include "sluice/engine.h"

namespace sluice::cuda {

class CublasLt;

// x[T, H] f32 = table[ids[t], 0:H] * scale (E, rows of ld_table elements; Gemma scales by sqrt(H)).
void embedding(const int32_t* ids, int T, const void* table, int ld_table, DType e, int H, float scale, float* x,
               cudaStream_t stream);

// out[r, 0:D] (E) = x[src, 0:D] * rsqrt(mean(x[src]^2) + eps) * w, src = rows ? rows[r] : r.
// Pipelined steps: ids[t] < 0 names row -2 - ids[t] of the last sampled tokens ([num_sampled]),
// which replaces it in place; a token outside [0, V) (a failed row) or a row past num_sampled
// becomes 0 (the engine discards what a failed row's successor computed).
void resolve_device_tokens(int32_t* ids, int T, const int32_t* sampled, int num_sampled, int V, cudaStream_t stream);
void rmsnorm(const float* x, int R, int D, const int32_t* rows, const float* w, float eps, void* out, int ld_out,
             DType e, cudaStream_t stream);

// Sandwich norms (Gemma): x[t] += rmsnorm(y[t]) * w, both [T, D] f32.
void add_rmsnorm(float* x, const float* y, int T, int D, const float* w, float eps, cudaStream_t stream);

// Logit soft-capping (Gemma): v = cap * tanh(v / cap) over n floats.
void soft_cap(float* v, size_t n, float cap, cudaStream_t stream);

// cos_sin[T, 2 * half]: cos then sin of positions[t] * inv_freq[i], angles in double (as the CPU).
void rope_table(const int32_t* positions, int T, const float* inv_freq, int half, float* cos_sin,
                cudaStream_t stream);
// M-RoPE (Qwen2-VL, ModelConfig::mrope_section): the same table from rope_positions [3T], token
// t's (time, height, width) at 3t..3t+2; pair i takes component 0 if i < section0, 1 if
// i < section0 + section1, else 2. Three equal components give rope_table's values bit for bit.
void rope_table_mrope(const int32_t* rope_positions, int T, const float* inv_freq, int half, int section0,
                      int section1, float* cos_sin, cudaStream_t stream);

// Input rows given instead of the embedding (image placeholders): x[rows[i], 0:H] = src[i, 0:H]
// for i < n, all f32 (src: [n, H] device memory; rows distinct).
void scatter_rows(const float* src, const int32_t* rows, int n, int H, float* x, cudaStream_t stream);

// After the fused q/k/v projection: optional per-head RMSNorm of q and k (Qwen3), rotary
// embedding (rotate-half) of the first 2*rot_half dims of every q and k head, q to q_out (f32),
// k and v into the paged cache at slots[t] (E).
struct QkvPostArgs {
  const float* qkv = nullptr;  // [T, (nq + 2 nkv) * hd]: q heads, k heads, v heads
  int T = 0, nq = 0, nkv = 0, hd = 0, rot_half = 0;
  const float* q_norm = nullptr;  // [hd] or nullptr
  const float* k_norm = nullptr;  // [hd] or nullptr
  float eps = 1e-6f;
  const float* cos_sin = nullptr;  // [T, 2 * rot_half]
  const int32_t* slots = nullptr;  // [T]
  void* k_cache = nullptr;         // [slots, nkv, hd] E (or e4m3 when kv_fp8), this layer
  void* v_cache = nullptr;
  float* q_out = nullptr;          // [T, nq * hd]
  // --kv-cache-dtype fp8: the cache holds e4m3 codes of k / k_scale and v / v_scale (rounded to
  // nearest even, saturated to +-448), as the CPU's PagedKV F8E4M3 (cpu/kernels.h).
  bool kv_fp8 = false;
  float k_scale = 1.f, v_scale = 1.f;
};
void qkv_post(const QkvPostArgs& a, DType e, cudaStream_t stream);

// y = x · W^T (+ bias), then the epilogue. x: [T, K] E (ld_x), W: [N, K] E (ld_w, the Hugging
// Face Linear layout). Tensor cores (mma.sync m16n8k16, f32 accumulate). Small grids split K;
// the last block of a tile adds the partial sums in split order, so results are deterministic.
enum class Epilogue {
  kStore,     // y[t, n] = acc + bias[n]                       (f32, ld_y)
  kAddTo,     // y[t, n] += acc + bias[n]  (residual add)       (f32, ld_y)
  kGatedMul,  // W rows interleaved in 16-row groups [gate 8 | up 8]: h[t, i] = act(gate_i, up_i) (E, ld_h)
};
// The gated activation of kGatedMul, as the CPU kernels define them (cpu/kernels.cpp):
enum class GateAct : uint8_t {
  kSilu,           // silu(gate) * up
  kGeluTanh,       // gelu_tanh(gate) * up (Gemma)
  kSwigluClamped,  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(1.702 g)
};
// Mixture of experts: the GEMM over the step's routes grouped by expert (moe_plan's layout). Grid
// row tile i covers grouped rows tile_row0[i].. of expert tile_expert[i], up to that expert's end
// (expert_offsets[e + 1]); W and bias are the expert's (w + e * w_stride, bias + e * bias_stride).
// The grid is sized for the most tiles a step of T routes can have (grouped_max_tiles) and tiles
// past *num_tiles exit, so a captured graph replays whatever the routing: the row counts live on
// the device. Rows index x through gather (x row gather[g]) or directly (x in grouped order);
// outputs go to row g. A row's result depends only on its own inputs, not on where it lands.
struct GroupedRows {
  const int32_t* gather = nullptr;          // [rows] or nullptr
  const int32_t* expert_offsets = nullptr;  // [experts + 1]
  const int32_t* tile_expert = nullptr;     // [max_tiles]
  const int32_t* tile_row0 = nullptr;       // [max_tiles]
  const int32_t* num_tiles = nullptr;       // device scalar
  int max_tiles = 0;
  int tile_rows = 0;     // rows per tile: grouped_tile_rows()
  size_t w_stride = 0;   // elements between experts' weight matrices
  int bias_stride = 0;   // floats between experts' biases
};
// Rows per tile of a grouped GEMM over `routes` rows of `experts` experts (8, 32 or 128: about
// the rows an expert gets on average), and the most tiles such a step can have.
int grouped_tile_rows(int routes, int experts);
inline int grouped_max_tiles(int routes, int experts, int tile_rows) {
  return (routes + tile_rows - 1) / tile_rows + experts;
}
struct GemmArgs {
  const void* x = nullptr;
  int ld_x = 0;
  const void* w = nullptr;
  int ld_w = 0;
  const float* bias = nullptr;  // [N] or nullptr
  int T = 0, N = 0, K = 0;
  Epilogue epilogue = Epilogue::kStore;
  float* y = nullptr;
  int ld_y = 0;
  void* h = nullptr;
  int ld_h = 0;
  GateAct act = GateAct::kSilu;  // kGatedMul's activation
  float act_limit = 0.f;         // kSwigluClamped's limit
  int splits = 0;  // tensor-core path with this many K splits; 0 chooses (T <= 8 runs a GEMV kernel)
  // Set: the grouped (mixture-of-experts) GEMM; T is then the routes' row capacity. Always our
  // tensor-core kernel (no GEMV, no cuBLASLt).
  const GroupedRows* grouped = nullptr;
};
struct GemmWorkspace {
  float* partials = nullptr;  // split-K partial sums
  size_t partial_floats = 0;
  int* tickets = nullptr;     // one per output tile, zero between launches (the last block resets it)
  int num_tickets = 0;
  int num_sms = 0;
  // cuBLASLt (cuda/cublaslt.h), when the engine runs it: problems of more than 8 tokens go to
  // it, and fall back to our kernels only where it has no algorithm.
  CublasLt* lt = nullptr;
  void* lt_workspace = nullptr;
  size_t lt_workspace_bytes = 0;
  float* lt_scratch = nullptr;  // f32 pre-activations of SiLU-and-mul chunks
  size_t lt_scratch_floats = 0;
};
void gemm(const GemmArgs& a, DType e, const GemmWorkspace& ws, cudaStream_t stream);
// Helpers of the cuBLASLt path. y[t, 0:N] += bias (f32, ld_y).
void add_bias_rows(float* y, int T, int N, int ld_y, const float* bias, cudaStream_t stream);
// g: [T, N] f32 with rows interleaved in 16-row groups [gate 8 | up 8] (as kGatedMul's W), plus
// bias[N] when given; h[t, i] (E, ld_h) = act(gate_i, up_i), as the fused epilogue computes it.
void gated_mul_interleaved(const float* g, int T, int N, const float* bias, GateAct act, float act_limit, void* h,
                           int ld_h, DType e, cudaStream_t stream);
// gate and up: [T, ld_g] f32 each (I columns used); h[t, i] (E, ld_h >= I) = act(gate_i, up_i) for
// i < I and 0 for I <= i < ld_h (the padding a GEMM over ld_h columns reads), as kGatedMul rounds.
void gated_mul(const float* gate, const float* up, int T, int I, int ld_g, GateAct act, float act_limit, void* h,
               int ld_h, DType e, cudaStream_t stream);
// Benchmarks only: the decode GEMV (T = 1, bf16) with `rows` weight rows per warp (2, 4, 8) and
// `unroll` 16-byte chunks per row in flight (2, 4, 8; not 8 with 8 rows).
void gemv_variant(const GemmArgs& a, int rows, int unroll, cudaStream_t stream);

// Causal attention over the paged cache. Token t (query heads q[t]) attends to positions
// 0..positions[t] of sequence token_seq[t], read through block_tables[seq * (*table_stride) + i].
// With `last` (bidirectional image attention, Gemma 3) it attends to 0..last[t] instead
// (last[t] >= positions[t], those K/V rows already written); a window's start still follows
// positions[t]. The KV range is cut into num_splits parts (flash-decoding) combined by a second kernel.
struct AttentionArgs {
  const float* q = nullptr;  // [T, nq, hd]
  int T = 0, nq = 0, nkv = 0, hd = 0;
  const int32_t* token_seq = nullptr;     // [T]
  const int32_t* positions = nullptr;     // [T]
  const int32_t* last = nullptr;          // [T] or nullptr (= positions): the last position token t attends to
  const int32_t* block_tables = nullptr;  // [S, *table_stride]
  const int32_t* table_stride = nullptr;  // device scalar (so a captured graph stays valid)
  int block_size = 0;
  const void* k_cache = nullptr;  // [slots, nkv, hd] E, or e4m3 codes when kv_fp8
  const void* v_cache = nullptr;
  bool kv_fp8 = false;             // K/V read as code * k_scale / v_scale (QkvPostArgs::kv_fp8)
  float k_scale = 1.f, v_scale = 1.f;
  float scale = 0.f;
  int num_splits = 1;
  float* partial_acc = nullptr;  // [T, nq, num_splits, hd] when num_splits > 1
  float* partial_ml = nullptr;   // [T, nq, num_splits, 2]
  void* out = nullptr;           // [T, nq * hd] E (ld_out)
  int ld_out = 0;
  int window = 0;                // > 0: token at pos attends to positions pos - window + 1 .. pos (or last[t]) only
  const float* sinks = nullptr;  // [nq] per-head sink logits (gpt-oss): join the softmax's sum, add nothing
};
void paged_attention(const AttentionArgs& a, DType e, cudaStream_t stream);

// Mixture-of-experts routing, one warp per token: the k best experts of logits[t] ([T, E] f32, the
// router's output, its bias included) with the lower index first on ties. softmax_first: weights
// are the softmax over every expert, renormalised over the k when renormalize (Qwen3-MoE, Mixtral);
// else the softmax over the k chosen logits (gpt-oss). ids/weights: [T, k], best first. E <= 1024,
// k <= 32.
void moe_route(const float* logits, int T, int E, int k, bool softmax_first, bool renormalize, int32_t* ids,
               float* weights, cudaStream_t stream);
// Groups the T*k routes by expert for the grouped GEMMs (one block): expert_offsets[E + 1],
// route_row[r] (route r's grouped row), row_token[g] (the token of grouped row g: r / k), and the
// row tiles of tile_rows rows (tile_expert, tile_row0, *num_tiles <= grouped_max_tiles).
struct MoePlan {
  int32_t* expert_offsets = nullptr;
  int32_t* route_row = nullptr;
  int32_t* row_token = nullptr;
  int32_t* tile_expert = nullptr;
  int32_t* tile_row0 = nullptr;
  int32_t* num_tiles = nullptr;
};
void moe_plan(const int32_t* ids, int T, int k, int E, int tile_rows, const MoePlan& plan, cudaStream_t stream);
// out[t] (+)= sum over ranks j of weights[t, j] * y[route_row[t * k + j]], in rank order (so a
// token's sum does not depend on the batch); y: [T * k, H] f32, out: [T, H] f32.
void moe_combine(const float* y, const int32_t* route_row, const float* weights, int T, int k, int H, float* out,
                 bool add, cudaStream_t stream);

// Per logit row: sampling as the CPU sampler defines it (greedy; else min-p and top-k, then
// top-p over softmax(logits / temperature), then an inverse-CDF draw in (logit desc, id asc)
// order), and the log-softmax of the raw logits for the chosen token and the top_n best.
// The sequence's SamplingParams travel whole (seed and logprobs unused here): a new sampling
// parameter reaches the kernel without a copy written here or in the backend.
struct SampleRowParams {
  SamplingParams params;
  double uniform;  // the row's draw in [0, 1), from the sequence's seeded stream
  // Speculative decoding: >= 0, the draft this row verifies (kept when uniform < its probability,
  // else a token drawn by uniform2 from the distribution without it); -1: a plain row.
  double uniform2;
  int32_t draft;
};
struct SampleArgs {
  const float* logits = nullptr;  // [R, V]
  int R = 0, V = 0;
  const SampleRowParams* params = nullptr;  // [R] device
  int top_n = 0;
  int32_t* tokens = nullptr;        // [R] device
  float* logprobs = nullptr;        // [R]
  int32_t* top_ids = nullptr;       // [R, top_n]
  float* top_logprobs = nullptr;    // [R, top_n]
  float* row_stats = nullptr;       // scratch: [R, kSampleStatsFloatsPerRow]
  int32_t* accepted = nullptr;      // [R] rows with a draft: 1 when it was kept (may be null without drafts)
};
constexpr int kSampleStatsFloatsPerRow = 32 * 3;
// Structured outputs: logits[r, v] = -inf where bit v of masks[r] (ceil(V / 32) words) is clear.
void apply_token_masks(float* logits, int R, int V, const uint32_t* masks, cudaStream_t stream);
void sample(const SampleArgs& a, cudaStream_t stream);

}  // namespace sluice::cuda
