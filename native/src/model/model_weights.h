// Binds the tensors of a checkpoint to the Llama-family graph, checking every name and shape
// against the config. The views point into the memory map; nothing is copied here (see
// resident_weights.h and quantize.h for the copies the CPU backend makes at load).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "sluice/model_config.h"
#include "util/host_memory.h"

namespace sluice {

struct LayerWeights {
  TensorView input_norm;                // [hidden]
  TensorView q, k, v, o;                // [heads*hd, hidden], [kv*hd, hidden] x2, [hidden, heads*hd]
  TensorView q_bias, k_bias, v_bias;    // present when config.qkv_bias
  TensorView o_bias;                    // present when config.o_bias
  TensorView q_norm, k_norm;            // [head_dim], present when config.qk_norm
  TensorView post_norm;                 // [hidden]
  TensorView gate, up;                  // [inter, hidden]
  TensorView down;                      // [hidden, inter]
  TensorView gate_bias, up_bias, down_bias;  // present when config.mlp_bias
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

// The matrices a decode step streams whole: every layer's q, k, v, o, gate, up, down and the
// lm_head (the embedding when tied), in that order. A tied lm_head is listed once, as lm_head.
std::vector<TensorView*> streamed_matrices(ModelWeights& w);

// Throws sluice::Error naming the tensor (and file) that is missing or has the wrong shape.
ModelWeights bind_weights(const SafetensorsModel& st, const ModelConfig& config, const std::string& dir);

}  // namespace sluice
