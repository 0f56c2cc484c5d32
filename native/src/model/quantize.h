// Weight quantization at load: "int8" turns the matmul weights of a bound checkpoint into Q8_0
// copies (cpu/gemm_q8.h) that the views then point to.
#pragma once
#include <string>

#include "model/model_weights.h"

namespace sluice {

// Quantizes every projection (q, k, v, o, gate, up, down) and lm_head to Q8_0, in parallel on
// num_threads threads (0 = all online CPUs). The embedding table stays as stored (a lookup reads
// a few rows per step); a tied lm_head becomes its own quantized copy. Norms and biases stay
// float. Updates total_bytes (quantized tensors at their new size) and main_dtype.
void quantize_weights_q8(ModelWeights& w, int num_threads);

// --quantization fp8 (CUDA): every layer's q/k/v/o (when all four are float) and dense layers'
// gate/up/down (when all three are) become F8E4M3 codes with one f32 scale per output row
// (amax / 448, QuantizationConfig Fp8Scales::Channel, in LayerWeights::fp8_scale): the layout an
// FP8 checkpoint with per-channel scales binds to under keep_fp8. Experts, routers, embeddings
// and lm_head stay as stored. main_dtype follows layer 0's q.
void quantize_weights_fp8(ModelWeights& w, int num_threads);

// For backends that read float weights (CUDA): every Q4 and Q8_0 matrix (AWQ / GPTQ checkpoints
// repacked at load) becomes bf16, each weight's exact value rounded once. keep_dense_q4 (the CUDA
// backend, which has W4A16 kernels: cuda/q4_gemm.h) keeps as Q4 a layer's q/k/v/o when all four
// are Q4 with groups a multiple of 32, and a dense layer's gate/up/down when all three are;
// experts and Q8_0 matrices still become bf16. main_dtype follows layer 0's q.
void dequantize_packed_weights(ModelWeights& w, int num_threads, bool keep_dense_q4 = false);

// FP8 projections that bind_weights kept as F8E4M3 (keep_fp8) times their scales as bf16, each
// weight rounded once: the same bits the binder makes without keep_fp8 (model/fp8.h). keep_fp8_groups
// (a backend that runs FP8 GEMMs on these scales) keeps a layer's q/k/v/o when all four are F8E4M3,
// and a dense layer's gate/up/down when all three are. Clears the converted weights' fp8_scale
// views; main_dtype follows layer 0's q.
void dequantize_fp8_weights(ModelWeights& w, const QuantizationConfig& q, int num_threads,
                            bool keep_fp8_groups = false);

}  // namespace sluice
