// Writes a small random Llama-family checkpoint (config.json + model.safetensors) so the
// native tests need no Node and no downloads.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sluice/dtype.h"

namespace sluice_test {

struct TinyModelSpec {
  std::string architecture = "LlamaForCausalLM";
  std::string model_type = "llama";
  int hidden = 64, inter = 128, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, vocab = 96;
  bool tied = false, qkv_bias = false, qk_norm = false;
  std::string dtype = "BF16";  // F32 | F16 | BF16
  std::string extra_config;    // appended JSON members, e.g. ",\"rope_scaling\":{...}"
  uint32_t seed = 1;
};

inline void write_tiny_model(const std::string& dir, const TinyModelSpec& s) {
  std::mt19937 rng(s.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  struct T {
    std::vector<int64_t> shape;
    float scale, offset;
  };
  std::map<std::string, T> tensors;
  const int q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  tensors["model.embed_tokens.weight"] = {{s.vocab, s.hidden}, 1.f, 0.f};
  tensors["model.norm.weight"] = {{s.hidden}, 0.1f, 1.f};
  if (!s.tied) tensors["lm_head.weight"] = {{s.vocab, s.hidden}, 1.f / std::sqrt(float(s.hidden)), 0.f};
  for (int l = 0; l < s.layers; l++) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    float in_s = 1.f / std::sqrt(float(s.hidden));
    tensors[p + "input_layernorm.weight"] = {{s.hidden}, 0.1f, 1.f};
    tensors[p + "post_attention_layernorm.weight"] = {{s.hidden}, 0.1f, 1.f};
    tensors[p + "self_attn.q_proj.weight"] = {{q, s.hidden}, in_s, 0.f};
    tensors[p + "self_attn.k_proj.weight"] = {{kv, s.hidden}, in_s, 0.f};
    tensors[p + "self_attn.v_proj.weight"] = {{kv, s.hidden}, in_s, 0.f};
    tensors[p + "self_attn.o_proj.weight"] = {{s.hidden, q}, 1.f / std::sqrt(float(q)), 0.f};
    tensors[p + "mlp.gate_proj.weight"] = {{s.inter, s.hidden}, in_s, 0.f};
    tensors[p + "mlp.up_proj.weight"] = {{s.inter, s.hidden}, in_s, 0.f};
    tensors[p + "mlp.down_proj.weight"] = {{s.hidden, s.inter}, 1.f / std::sqrt(float(s.inter)), 0.f};
    if (s.qkv_bias) {
      tensors[p + "self_attn.q_proj.bias"] = {{q}, 0.1f, 0.f};
      tensors[p + "self_attn.k_proj.bias"] = {{kv}, 0.1f, 0.f};
      tensors[p + "self_attn.v_proj.bias"] = {{kv}, 0.1f, 0.f};
    }
    if (s.qk_norm) {
      tensors[p + "self_attn.q_norm.weight"] = {{s.head_dim}, 0.1f, 1.f};
      tensors[p + "self_attn.k_norm.weight"] = {{s.head_dim}, 0.1f, 1.f};
    }
  }
  const size_t esize = s.dtype == "F32" ? 4 : 2;
  std::string header = "{";
  size_t offset = 0;
  std::vector<uint8_t> data;
  for (auto& [name, t] : tensors) {
    size_t n = 1;
    for (auto d : t.shape) n *= size_t(d);
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); i++) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "\"" + name + "\":{\"dtype\":\"" + s.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(offset + n * esize) + "]},";
    for (size_t i = 0; i < n; i++) {
      float v = t.offset + t.scale * normal(rng);
      if (esize == 4) {
        uint8_t b[4];
        std::memcpy(b, &v, 4);
        data.insert(data.end(), b, b + 4);
      } else {
        uint16_t h = s.dtype == "BF16" ? sluice::f32_to_bf16(v) : sluice::f32_to_f16(v);
        data.push_back(uint8_t(h & 0xff));
        data.push_back(uint8_t(h >> 8));
      }
    }
    offset += n * esize;
  }
  header += "\"__metadata__\":{\"format\":\"pt\"}}";
  while (header.size() % 8) header += ' ';
  std::system(("mkdir -p '" + dir + "'").c_str());
  std::ofstream st(dir + "/model.safetensors", std::ios::binary);
  uint64_t len = header.size();
  st.write(reinterpret_cast<const char*>(&len), 8);
  st.write(header.data(), std::streamsize(header.size()));
  st.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  std::ofstream cfg(dir + "/config.json");
  cfg << "{\"architectures\":[\"" << s.architecture << "\"],\"model_type\":\"" << s.model_type
      << "\",\"hidden_size\":" << s.hidden << ",\"intermediate_size\":" << s.inter
      << ",\"num_hidden_layers\":" << s.layers << ",\"num_attention_heads\":" << s.heads
      << ",\"num_key_value_heads\":" << s.kv_heads << ",\"head_dim\":" << s.head_dim << ",\"vocab_size\":" << s.vocab
      << ",\"max_position_embeddings\":512,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":"
      << (s.tied ? "true" : "false") << ",\"hidden_act\":\"silu\"" << s.extra_config << "}";
}

}  // namespace sluice_test
