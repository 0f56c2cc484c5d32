// CPU kernels used by the model forward pass. Every function is batch invariant: the result
// for one row (token) does not depend on which other rows are in the call, bit for bit.
// That is what makes a sequence generate the same tokens alone, in a batch, or prefilled in
// chunks. Shapes are given as [rows, cols], row-major.
#pragma once
#include <cstdint>
#include <vector>

#include "cpu/thread_pool.h"
#include "sluice/dtype.h"

namespace sluice::cpu {

// Which SIMD level the dispatcher picked (for logs, stats and the bench).
const char* simd_level_name();

// How activations meet bf16 weights on AVX512-BF16 hardware (other dtypes and levels always
// compute in f32). F32: activations carried as two bf16 terms (~16 mantissa bits), which tracks
// an f32 computation; BF16: activations rounded to bf16 once, twice the arithmetic throughput.
enum class MatmulPrecision { F32, BF16 };

// y[T, N] = x[T, K] · W[N, K]^T (+ bias[N] when bias != nullptr).
// W is the Hugging Face Linear layout [out_features, in_features] in its stored dtype,
// used in place (never converted to a copy). bias has the same dtype as `bias_dtype`.
// x and y are f32. For bf16 weights on AVX512-BF16 hardware the products use vdpbf16ps with
// f32 accumulation, activations as `precision` says.
void matmul(ThreadPool& pool, const float* x, int64_t T, int64_t K, const void* W, DType w_dtype,
            int64_t N, const void* bias, DType bias_dtype, float* y,
            MatmulPrecision precision = MatmulPrecision::F32);

// Several projections of the same activations in one parallel region (q/k/v, gate/up):
// y_i[T, N_i] = x[T, K] · W_i[N_i, K]^T (+ bias_i). Same results as matmul().
struct LinearOut {
  const void* w;
  DType w_dtype;
  int64_t N;
  const void* bias;
  DType bias_dtype;
  float* y;
};
void matmul_multi(ThreadPool& pool, const float* x, int64_t T, int64_t K, const LinearOut* outs, int num_outs,
                  MatmulPrecision precision = MatmulPrecision::F32);

// Projections of several activation groups in one parallel region: each group's x[T, K] times
// each of its outputs' weights (mixture-of-experts layers: one group per expert, holding the
// rows routed to it). Every row's result is what matmul() gives it alone.
struct MatmulGroup {
  const float* x;
  int64_t T;
  int64_t K;
  const LinearOut* outs;
  int num_outs;
};
void matmul_groups(ThreadPool& pool, const MatmulGroup* groups, int num_groups,
                   MatmulPrecision precision = MatmulPrecision::F32);

// How matmul_multi cuts its outputs into the chunks the threads take in turn: rows [begin, end)
// of output `out`; every row of every output in exactly one chunk, in order.
struct MatmulChunk {
  int out;
  int64_t begin, end;
};
void matmul_chunks(const LinearOut* outs, int num_outs, int64_t K, int threads, std::vector<MatmulChunk>& chunks);

// out[T, D] = x[T, D] / rms(x) * weight[D]; out may alias x.
void rmsnorm(ThreadPool& pool, const float* x, int64_t T, int64_t D, const void* weight, DType w_dtype,
             float eps, float* out);

// out[T, D] = silu(gate_up[T, 0:D]) * gate_up[T, D:2D]   (gate_up is [T, 2D])
void silu_mul(ThreadPool& pool, const float* gate_up, int64_t T, int64_t D, float* out);

// out[T, D] = gelu_tanh(gate[T, D]) * up[T, D]; out may alias gate. gelu_tanh(x) =
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_tanh_mul_split(ThreadPool& pool, const float* gate, const float* up, int64_t T, int64_t D, float* out);

// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
// out = (u + 1) * g * sigmoid(1.702 g); out may alias gate.
void swiglu_clamped_mul_split(ThreadPool& pool, const float* gate, const float* up, int64_t T, int64_t D, float limit,
                              float* out);

// out[T, D] = silu(gate[T, D]) * up[T, D]; out may alias gate.
void silu_mul_split(ThreadPool& pool, const float* gate, const float* up, int64_t T, int64_t D, float* out);

// x[i] += y[i]
void add_inplace(ThreadPool& pool, float* x, const float* y, int64_t n);

// out[T, D] = table[ids[t], :] converted to f32
void embedding(ThreadPool& pool, const int32_t* ids, int64_t T, const void* table, DType dtype, int64_t D,
               float* out);

// Rotary embedding, rotate-half (GPT-NeoX / Hugging Face Llama) convention, in place.
// x: [T, n_heads, head_dim]; inv_freq: [rot_dim/2] (already scaled for llama3/linear);
// positions: [T]. Only the first rot_dim dims of each head rotate.
// M-RoPE (Qwen2-VL): with mrope_positions [3T] and mrope_section [3], pair i rotates by component
// 0 (time), 1 (height) or 2 (width) of its token's position, by the section holding i.
void rope(ThreadPool& pool, float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
          const float* inv_freq, const int32_t* positions, const int32_t* mrope_positions = nullptr,
          const int64_t* mrope_section = nullptr);

// Paged KV cache layout, one per layer: k and v each [num_blocks, block_size, n_kv_heads, head_dim]
// in `dtype`: f32; bf16 to halve the bytes attention reads (rounded to nearest even on write); or
// F8E4M3 (the --kv-cache-dtype fp8 option) for a quarter of f32's: each element holds
// value / k_scale (v_scale for V), rounded to nearest even and saturated to +-448, and reads back
// as code * scale.
struct PagedKV {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F32;
  // F8E4M3 only: the layer's per-tensor scales (the checkpoint's k_scale / v_scale, else 1).
  float k_scale = 1.f;
  float v_scale = 1.f;
  int64_t block_size = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  // The first position attention reads (a sliding window's start); paged_attention sets it per
  // token, the cache itself always holds every position.
  int64_t first = 0;
  // An attention sink (gpt-oss): a logit that joins the softmax of the head being computed.
  bool has_sink = false;
  float sink = 0.f;
};

// Writes k[T, n_kv_heads, head_dim], v[...] into the cache at slots[t] = block * block_size + offset.
void kv_write(ThreadPool& pool, const PagedKV& cache, const float* k, const float* v, const int32_t* slots,
              int64_t T);

// Causal attention over the paged cache for a flattened batch.
// q: [T, n_heads, head_dim]; token t belongs to sequence token_seq[t] and sits at absolute
// position token_pos[t]; it attends to positions 0..token_pos[t] of its sequence, read via
// block_tables[token_seq[t]] (a list of block ids). Those K/V must already be in the cache.
// out: [T, n_heads, head_dim]. GQA: head h reads kv head h / (n_heads / n_kv_heads).
struct AttentionBatch {
  const int32_t* token_seq = nullptr;       // [T]
  const int32_t* token_pos = nullptr;       // [T]
  // [T] or nullptr: the last position token t attends to when it is not token_pos[t] (a token of
  // an image its later tokens see too); the window's start stays token_pos[t] - window + 1.
  const int32_t* token_last = nullptr;
  const int32_t* const* block_tables = nullptr;  // [num_seqs] -> [blocks of that sequence]
  int64_t n_heads = 0;
  float scale = 0.f;  // usually 1/sqrt(head_dim)
  int64_t window = 0;  // > 0: token at pos attends to positions pos - window + 1 .. pos only
  const float* sinks = nullptr;  // [n_heads] per-head sink logits (gpt-oss), or nullptr
};
void paged_attention(ThreadPool& pool, const float* q, int64_t T, const AttentionBatch& batch,
                     const PagedKV& cache, float* out);

// Per row of logits[R, V]: the argmax (lowest index on ties) and log(sum(exp(row))).
// Each row is reduced in a fixed order, independent of R.
void logits_stats(ThreadPool& pool, const float* logits, int64_t R, int64_t V, int32_t* argmax, float* log_sum_exp);

// Token masks on logits[R, V]: for each row r with allow[r] != nullptr (a bitmask of
// ceil(V / 32) words, bit v of word v / 32 = token v allowed), the logits of disallowed tokens
// become -inf; allows_any[r] = whether the mask allowed any token (1 for rows without a mask).
void apply_token_masks(ThreadPool& pool, float* logits, int64_t R, int64_t V, const uint32_t* const* allow,
                       uint8_t* allows_any);

// Read bandwidth of main memory in bytes/s, measured by streaming `bytes` with all threads of
// the pool, each its contiguous slice (best of `repeats`). bytes = 0: probe_bytes(). Used by the
// bench for the decode roofline.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeats, bool keep_buffer = false);
// max(1 GiB, 8 x the largest CPU cache sysfs reports): a buffer no cache level can hold.
size_t probe_bytes();

}  // namespace sluice::cpu
