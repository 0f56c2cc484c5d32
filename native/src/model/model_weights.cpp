#include "model/model_weights.h"

#include <set>

#include "sluice/error.h"

namespace sluice {

namespace {

class Binder {
 public:
  Binder(const SafetensorsModel& st, const std::string& dir) : st_(st), dir_(dir) {}

  TensorView get(const std::string& name, std::vector<int64_t> shape) {
    const TensorView* t = st_.find(name);
    if (!t)
      throw Error(ErrorCode::kModelFileInvalid,
                  dir_ + ": the checkpoint has no tensor \"" + name + "\" (required by the config)");
    if (t->shape != shape) {
      TensorView want;
      want.shape = shape;
      throw Error(ErrorCode::kModelFileInvalid, t->file + ": tensor \"" + name + "\" has shape " +
                                                    t->shape_string() + ", expected " + want.shape_string() +
                                                    " from config.json");
    }
    if (seen_.insert(name).second) bytes_ += t->nbytes;
    return *t;
  }
  bool has(const std::string& name) const { return st_.find(name) != nullptr; }
  size_t bytes() const { return bytes_; }

 private:
  const SafetensorsModel& st_;
  std::string dir_;
  std::set<std::string> seen_;
  size_t bytes_ = 0;
};

}  // namespace

ModelWeights bind_weights(const SafetensorsModel& st, const ModelConfig& c, const std::string& dir) {
  Binder b(st, dir);
  ModelWeights w;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t q_out = c.num_heads * hd, kv_out = c.num_kv_heads * hd;
  w.embed = b.get("model.embed_tokens.weight", {c.vocab_size, H});
  w.final_norm = b.get("model.norm.weight", {H});
  // Tied checkpoints usually omit lm_head; when one ships it anyway, it is used as is.
  if (b.has("lm_head.weight") || !c.tie_word_embeddings) w.lm_head = b.get("lm_head.weight", {c.vocab_size, H});
  else w.lm_head = w.embed;

  w.layers.resize(size_t(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; i++) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[size_t(i)];
    l.input_norm = b.get(p + "input_layernorm.weight", {H});
    l.q = b.get(p + "self_attn.q_proj.weight", {q_out, H});
    l.k = b.get(p + "self_attn.k_proj.weight", {kv_out, H});
    l.v = b.get(p + "self_attn.v_proj.weight", {kv_out, H});
    l.o = b.get(p + "self_attn.o_proj.weight", {H, q_out});
    if (c.qkv_bias) {
      l.q_bias = b.get(p + "self_attn.q_proj.bias", {q_out});
      l.k_bias = b.get(p + "self_attn.k_proj.bias", {kv_out});
      l.v_bias = b.get(p + "self_attn.v_proj.bias", {kv_out});
    }
    if (c.o_bias) l.o_bias = b.get(p + "self_attn.o_proj.bias", {H});
    if (c.qk_norm) {
      l.q_norm = b.get(p + "self_attn.q_norm.weight", {hd});
      l.k_norm = b.get(p + "self_attn.k_norm.weight", {hd});
    }
    l.post_norm = b.get(p + "post_attention_layernorm.weight", {H});
    l.gate = b.get(p + "mlp.gate_proj.weight", {I, H});
    l.up = b.get(p + "mlp.up_proj.weight", {I, H});
    l.down = b.get(p + "mlp.down_proj.weight", {H, I});
    if (c.mlp_bias) {
      l.gate_bias = b.get(p + "mlp.gate_proj.bias", {I});
      l.up_bias = b.get(p + "mlp.up_proj.bias", {I});
      l.down_bias = b.get(p + "mlp.down_proj.bias", {H});
    }
  }
  w.total_bytes = b.bytes();
  w.main_dtype = w.layers.empty() ? w.embed.dtype : w.layers[0].q.dtype;
  return w;
}

std::vector<TensorView*> streamed_matrices(ModelWeights& w) {
  std::vector<TensorView*> out;
  for (LayerWeights& l : w.layers)
    for (TensorView* t : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) out.push_back(t);
  out.push_back(&w.lm_head);
  return out;
}

}  // namespace sluice
