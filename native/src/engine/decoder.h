// The decoder, written once for every family: the order of a layer's operations, with the
// optional pieces (sandwich norms, mixture-of-experts blocks) the config turned on from the
// architecture table (model/architectures.h). Each backend implements DecoderOps over its own
// kernels and activation buffers; the CUDA backend's ops are its fused kernels (the q/k/v GEMM,
// one kernel for q/k norms + rope + KV write, GEMM epilogues that add into the residual).
//
// Activations the ops pass between them live in the backend: the residual stream x, the normed
// input xn, q/k/v, the attention output, and the block output y (where a sandwich norm reads).
#pragma once
#include <cstdint>

#include "model/model_weights.h"
#include "sluice/model_config.h"

namespace sluice {

// Which of a layer's RMSNorms.
enum class LayerNorm : uint8_t {
  kAttnIn,   // input_layernorm
  kAttnOut,  // Gemma's post_attention_layernorm (on the attention output)
  kMlpIn,    // post_attention_layernorm (Gemma: pre_feedforward_layernorm)
  kMlpOut,   // Gemma's post_feedforward_layernorm
};

// Where a block's output projection writes: added into x, or into y for a sandwich norm.
enum class BlockOut : uint8_t { kAddToResidual, kToY };

class DecoderOps {
 public:
  virtual ~DecoderOps() = default;
  // x = embed[tokens] * embed_scale (and whatever per-step setup the backend needs first).
  virtual void embed() = 0;
  // xn = rmsnorm(x) * w (the layer's kAttnIn or kMlpIn norm).
  virtual void norm(int64_t layer, LayerNorm which) = 0;
  // q, k, v = xn · W_q/k/v^T (+ biases).
  virtual void qkv(int64_t layer) = 0;
  // q/k per-head norms (when the family has them), rope (the layer's base), K/V into the cache.
  virtual void rope_kv_write(int64_t layer) = 0;
  // attn = softmax(q k^T * scale) v over the layer's window of the paged cache.
  virtual void attention(int64_t layer) = 0;
  // attn · W_o^T (+ bias), into x or y.
  virtual void attention_out(int64_t layer, BlockOut out) = 0;
  // The dense gated MLP of xn, into x or y.
  virtual void mlp(int64_t layer, BlockOut out) = 0;
  // The mixture-of-experts block of xn (router, top-k, the chosen experts' MLPs), into x or y.
  virtual void experts(int64_t layer, BlockOut out) = 0;
  // x += rmsnorm(y) * w (the layer's kAttnOut or kMlpOut norm).
  virtual void add_normed(int64_t layer, LayerNorm which) = 0;
  // Logits of the sampled rows: final norm, lm_head, the family's soft cap.
  virtual void logits() = 0;
  // Before each layer, with x its input (EAGLE-3 heads read the residual stream of some layers).
  virtual void layer_input(int64_t layer) { (void)layer; }
};

inline void run_decoder(const ModelConfig& c, DecoderOps& ops) {
  const BlockOut out = c.sandwich_norms ? BlockOut::kToY : BlockOut::kAddToResidual;
  ops.embed();
  for (int64_t l = 0; l < c.num_layers; l++) {
    ops.layer_input(l);
    ops.norm(l, LayerNorm::kAttnIn);
    ops.qkv(l);
    ops.rope_kv_write(l);
    ops.attention(l);
    ops.attention_out(l, out);
    if (c.sandwich_norms) ops.add_normed(l, LayerNorm::kAttnOut);

    ops.norm(l, LayerNorm::kMlpIn);
    if (c.is_sparse(l)) ops.experts(l, out);
    else ops.mlp(l, out);
    if (c.sandwich_norms) ops.add_normed(l, LayerNorm::kMlpOut);
  }
  ops.logits();
}

}  // namespace sluice
