// Tiny random vision-tower checkpoints written in C++ (no Node, no downloads) for the native
// vision tests: a Qwen2.5-VL tower (patch 2, so patch_dim 24; windows of 2x2 merged tokens; block
// 1 attending over whole frames) and a Gemma 3 SigLIP tower with its projector (16x16 images of
// 2x2 patches, 64 patches pooled 2x2 into 16 tokens). Sizes are parameters, so the CUDA tests can
// use the real towers' head dims (80 and 72) and intermediate sizes that are not multiples of 8.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "safetensors_file.h"
#include "sluice/dtype.h"

namespace sluice_test {

struct VisionTensor {
  std::string name;
  std::vector<int64_t> shape;
  float scale, offset;  // values offset + scale * N(0, 1)
};

// model.safetensors (F32 or BF16, random values) and config.json in `dir`.
inline void write_vision_checkpoint(const std::string& dir, const std::vector<VisionTensor>& tensors, bool bf16,
                                    const std::string& config) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<RawTensor> raw;
  for (const VisionTensor& t : tensors) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= size_t(d);
    RawTensor r{t.name, bf16 ? "BF16" : "F32", t.shape, {}};
    r.bytes.reserve(n * (bf16 ? 2 : 4));
    for (size_t i = 0; i < n; i++) {
      const float v = t.offset + t.scale * normal(rng);
      if (bf16) {
        const uint16_t h = sluice::f32_to_bf16(v);
        r.bytes.push_back(uint8_t(h & 0xff));
        r.bytes.push_back(uint8_t(h >> 8));
      } else {
        uint8_t b[4];
        std::memcpy(b, &v, 4);
        r.bytes.insert(r.bytes.end(), b, b + 4);
      }
    }
    raw.push_back(std::move(r));
  }
  write_safetensors(dir, raw);
  std::ofstream(dir + "/config.json") << config;
}

struct QwenTowerShape {
  int64_t hidden = 32, intermediate = 40, out = 24, depth = 3, heads = 2;
};

inline void write_qwen_tower(const std::string& dir, bool bf16, const QwenTowerShape& q = {}) {
  const int64_t H = q.hidden, I = q.intermediate, merged = H * 4;
  std::vector<VisionTensor> t;
  const float s = 1.f / std::sqrt(float(H));
  t.push_back({"visual.patch_embed.proj.weight", {H, 3, 2, 2, 2}, 0.2f, 0.f});
  for (int64_t l = 0; l < q.depth; l++) {
    const std::string p = "visual.blocks." + std::to_string(l) + ".";
    t.push_back({p + "norm1.weight", {H}, 0.1f, 1.f});
    t.push_back({p + "norm2.weight", {H}, 0.1f, 1.f});
    t.push_back({p + "attn.qkv.weight", {3 * H, H}, s, 0.f});
    t.push_back({p + "attn.qkv.bias", {3 * H}, 0.1f, 0.f});
    t.push_back({p + "attn.proj.weight", {H, H}, s, 0.f});
    t.push_back({p + "attn.proj.bias", {H}, 0.1f, 0.f});
    t.push_back({p + "mlp.gate_proj.weight", {I, H}, s, 0.f});
    t.push_back({p + "mlp.gate_proj.bias", {I}, 0.1f, 0.f});
    t.push_back({p + "mlp.up_proj.weight", {I, H}, s, 0.f});
    t.push_back({p + "mlp.up_proj.bias", {I}, 0.1f, 0.f});
    t.push_back({p + "mlp.down_proj.weight", {H, I}, 1.f / std::sqrt(float(I)), 0.f});
    t.push_back({p + "mlp.down_proj.bias", {H}, 0.1f, 0.f});
  }
  t.push_back({"visual.merger.ln_q.weight", {H}, 0.1f, 1.f});
  t.push_back({"visual.merger.mlp.0.weight", {merged, merged}, 1.f / std::sqrt(float(merged)), 0.f});
  t.push_back({"visual.merger.mlp.0.bias", {merged}, 0.1f, 0.f});
  t.push_back({"visual.merger.mlp.2.weight", {q.out, merged}, 1.f / std::sqrt(float(merged)), 0.f});
  t.push_back({"visual.merger.mlp.2.bias", {q.out}, 0.1f, 0.f});
  write_vision_checkpoint(dir, t, bf16,
                          "{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"vision_config\":{\"depth\":" +
                              std::to_string(q.depth) + ",\"hidden_size\":" + std::to_string(H) +
                              ",\"intermediate_size\":" + std::to_string(I) + ",\"num_heads\":" + std::to_string(q.heads) +
                              ",\"in_chans\":3,\"patch_size\":2,\"spatial_merge_size\":2,\"temporal_patch_size\":2," +
                              "\"window_size\":8,\"out_hidden_size\":" + std::to_string(q.out) +
                              ",\"fullatt_block_indexes\":[1],\"hidden_act\":\"silu\"}}");
}

struct SiglipTowerShape {
  int64_t hidden = 32, intermediate = 48, text = 24, layers = 2, heads = 2;
};
constexpr int64_t kSiglipTestPatches = 64;  // 16x16 images of 2x2 patches

inline void write_siglip_tower(const std::string& dir, bool bf16, const SiglipTowerShape& g = {}) {
  const int64_t D = g.hidden, I = g.intermediate;
  std::vector<VisionTensor> t;
  const float s = 1.f / std::sqrt(float(D));
  const std::string v = "vision_tower.vision_model.";
  t.push_back({v + "embeddings.patch_embedding.weight", {D, 3, 2, 2}, 0.3f, 0.f});
  t.push_back({v + "embeddings.patch_embedding.bias", {D}, 0.1f, 0.f});
  t.push_back({v + "embeddings.position_embedding.weight", {kSiglipTestPatches, D}, 0.5f, 0.f});
  for (int64_t l = 0; l < g.layers; l++) {
    const std::string p = v + "encoder.layers." + std::to_string(l) + ".";
    for (const char* n : {"layer_norm1", "layer_norm2"}) {
      t.push_back({p + n + ".weight", {D}, 0.1f, 1.f});
      t.push_back({p + n + ".bias", {D}, 0.1f, 0.f});
    }
    for (const char* n : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      t.push_back({p + "self_attn." + n + ".weight", {D, D}, s, 0.f});
      t.push_back({p + "self_attn." + n + ".bias", {D}, 0.1f, 0.f});
    }
    t.push_back({p + "mlp.fc1.weight", {I, D}, s, 0.f});
    t.push_back({p + "mlp.fc1.bias", {I}, 0.1f, 0.f});
    t.push_back({p + "mlp.fc2.weight", {D, I}, 1.f / std::sqrt(float(I)), 0.f});
    t.push_back({p + "mlp.fc2.bias", {D}, 0.1f, 0.f});
  }
  t.push_back({v + "post_layernorm.weight", {D}, 0.1f, 1.f});
  t.push_back({v + "post_layernorm.bias", {D}, 0.1f, 0.f});
  t.push_back({"multi_modal_projector.mm_soft_emb_norm.weight", {D}, 0.1f, 0.f});
  t.push_back({"multi_modal_projector.mm_input_projection_weight", {D, g.text}, s, 0.f});
  write_vision_checkpoint(dir, t, bf16,
                          "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"mm_tokens_per_image\":16,"
                          "\"text_config\":{\"hidden_size\":" +
                              std::to_string(g.text) + "},\"vision_config\":{\"hidden_size\":" + std::to_string(D) +
                              ",\"intermediate_size\":" + std::to_string(I) + ",\"num_hidden_layers\":" +
                              std::to_string(g.layers) + ",\"num_attention_heads\":" + std::to_string(g.heads) +
                              ",\"image_size\":16,\"patch_size\":2,\"hidden_act\":\"gelu_pytorch_tanh\"}}");
}

// n values uniform in [-1, 1), seeded.
inline std::vector<float> random_pixel_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace sluice_test
