// Binds the tensors of a checkpoint to the decoder graph, checking every name and shape against
// the config; names and optional pieces come from the family's row in model/architectures.h. The views point into the memory map; nothing is copied here (see
// resident_weights.h and quantize.h for the copies the CPU backend makes at load).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "sluice/model_config.h"
#include "util/host_memory.h"

namespace sluice {

// One expert of a mixture-of-experts layer: a gated MLP of moe_intermediate_size.
struct ExpertWeights {
  TensorView gate, up;  // [moe_inter, hidden]
  TensorView down;      // [hidden, moe_inter]
  TensorView gate_bias, up_bias, down_bias;  // f32, when config.expert_bias (gpt-oss)
};

struct LayerWeights {
  TensorView input_norm;                // [hidden] before attention
  TensorView q, k, v, o;                // [heads*hd, hidden], [kv*hd, hidden] x2, [hidden, heads*hd]
  TensorView q_bias, k_bias, v_bias;    // present when config.qkv_bias
  TensorView o_bias;                    // present when config.o_bias
  TensorView q_norm, k_norm;            // [head_dim], present when config.qk_norm
  TensorView attn_out_norm;             // [hidden] on the attention output, when config.sandwich_norms
  TensorView post_norm;                 // [hidden] before the MLP (Gemma: pre_feedforward_layernorm)
  TensorView mlp_out_norm;              // [hidden] on the MLP output, when config.sandwich_norms
  // Dense layers:
  TensorView gate, up;                  // [inter, hidden]
  TensorView down;                      // [hidden, inter]
  TensorView gate_bias, up_bias, down_bias;  // present when config.mlp_bias
  // Sparse layers (config.is_sparse):
  TensorView router;                    // [experts, hidden]
  TensorView router_bias;               // [experts] f32, when config.router_bias
  TensorView sinks;                     // [heads] f32, when config.attention_sinks
  std::vector<ExpertWeights> experts;
  // The fp8 KV cache's per-tensor scales (--kv-cache-dtype fp8): the checkpoint's k_scale /
  // v_scale when it ships them (FP8 checkpoints calibrated for an fp8 KV cache), else 1. The
  // cache stores k / k_scale as e4m3 (largest finite 448). Unused with a bf16 / f32 cache.
  float k_scale = 1.f, v_scale = 1.f;
  bool kv_scales_from_checkpoint = false;
  // FP8 projections kept as stored (bind_weights' keep_fp8): the scale tensor beside each F8E4M3
  // weight above, shaped as QuantizationConfig::fp8 says ("<name>_scale_inv" for Block, else
  // "<name>_scale"); empty for weights that are not F8E4M3.
  struct Fp8ScaleViews {
    TensorView q, k, v, o, gate, up, down;
  } fp8_scale;
};

struct ModelWeights {
  TensorView embed;       // [vocab, hidden]
  TensorView final_norm;  // [hidden]
  TensorView lm_head;     // [vocab, hidden]; the embedding when tied
  std::vector<LayerWeights> layers;
  size_t total_bytes = 0;  // bytes of all bound tensors as stored (tied counted once)
  DType main_dtype = DType::F32;  // dtype of the projection weights, for reporting
  // Host memory made at load (resident or quantized copies) that views above point into; shared
  // so a copy of ModelWeights keeps it alive.
  std::vector<std::shared_ptr<HostBuffer>> owned;
};

// The matrices a decode step may stream: every layer's q, k, v, o, then its gate, up, down (or
// its router and each expert's gate, up, down), and the lm_head (the embedding when tied), in
// that order. A tied lm_head is listed once, as lm_head.
std::vector<TensorView*> streamed_matrices(ModelWeights& w);

// Throws sluice::Error naming the tensor (and file) that is missing or has the wrong shape.
// FP8 checkpoints' F8E4M3 weights come back dequantized to bf16 (model/fp8.h), except, with
// keep_fp8, every layer's q/k/v/o and dense layers' gate/up/down: those stay F8E4M3 views of the stored codes with
// their scales in LayerWeights::fp8_scale (for backends with FP8 kernels; see
// dequantize_fp8_weights in model/quantize.h). lm_head, embeddings and experts are bf16 either way.
ModelWeights bind_weights(const SafetensorsModel& st, const ModelConfig& config, const std::string& dir,
                          bool keep_fp8 = false);

}  // namespace sluice
