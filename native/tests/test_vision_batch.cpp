// The CPU vision towers' encode_batch (Qwen2.5-VL and Gemma 3 SigLIP) against encode() of each
// image alone: several images of different grids in one pass give every image bit for bit what it
// gets alone (the kernels are batch invariant), for f32 and bf16 weights and several thread
// counts; and every image is checked before anything is computed. The checkpoints are tiny random
// ones written here, so the test needs no Node and no downloads.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sluice/dtype.h"
#include "sluice/error.h"
#include "test_util.h"
#include "vision/qwen2_vl_encoder.h"
#include "vision/siglip_encoder.h"

using sluice::ErrorCode;
using sluice::vision::EncoderImage;
using sluice::vision::SiglipEncoder;
using sluice::vision::VisionEncoder;
using sluice_test::temp_dir;

namespace {

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  float scale, offset;  // values offset + scale * N(0, 1)
};

// model.safetensors (F32 or BF16, random values) and config.json in `dir`.
void write_checkpoint(const std::string& dir, const std::vector<Tensor>& tensors, bool bf16, const std::string& config) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  const size_t esize = bf16 ? 2 : 4;
  std::string header = "{";
  std::vector<uint8_t> data;
  for (const Tensor& t : tensors) {
    size_t n = 1;
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); i++) {
      n *= size_t(t.shape[i]);
      shape += (i ? "," : "") + std::to_string(t.shape[i]);
    }
    header += "\"" + t.name + "\":{\"dtype\":\"" + (bf16 ? "BF16" : "F32") + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(data.size()) + "," + std::to_string(data.size() + n * esize) + "]},";
    for (size_t i = 0; i < n; i++) {
      const float v = t.offset + t.scale * normal(rng);
      if (bf16) {
        const uint16_t h = sluice::f32_to_bf16(v);
        data.push_back(uint8_t(h & 0xff));
        data.push_back(uint8_t(h >> 8));
      } else {
        uint8_t b[4];
        std::memcpy(b, &v, 4);
        data.insert(data.end(), b, b + 4);
      }
    }
  }
  header += "\"__metadata__\":{\"format\":\"pt\"}}";
  while (header.size() % 8) header += ' ';
  std::system(("mkdir -p '" + dir + "'").c_str());
  std::ofstream st(dir + "/model.safetensors", std::ios::binary);
  const uint64_t len = header.size();
  st.write(reinterpret_cast<const char*>(&len), 8);
  st.write(header.data(), std::streamsize(header.size()));
  st.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  std::ofstream(dir + "/config.json") << config;
}

// Qwen2.5-VL tower: patch 2 (patch_dim 24), hidden 32 in 2 heads, windows of 2x2 merged tokens,
// block 1 attending over whole frames.
constexpr int64_t kQH = 32, kQI = 40, kQOut = 24, kQDepth = 3, kQMerged = kQH * 4;

void write_qwen(const std::string& dir, bool bf16) {
  std::vector<Tensor> t;
  const float s = 1.f / std::sqrt(float(kQH));
  t.push_back({"visual.patch_embed.proj.weight", {kQH, 3, 2, 2, 2}, 0.2f, 0.f});
  for (int64_t l = 0; l < kQDepth; l++) {
    const std::string p = "visual.blocks." + std::to_string(l) + ".";
    t.push_back({p + "norm1.weight", {kQH}, 0.1f, 1.f});
    t.push_back({p + "norm2.weight", {kQH}, 0.1f, 1.f});
    t.push_back({p + "attn.qkv.weight", {3 * kQH, kQH}, s, 0.f});
    t.push_back({p + "attn.qkv.bias", {3 * kQH}, 0.1f, 0.f});
    t.push_back({p + "attn.proj.weight", {kQH, kQH}, s, 0.f});
    t.push_back({p + "attn.proj.bias", {kQH}, 0.1f, 0.f});
    t.push_back({p + "mlp.gate_proj.weight", {kQI, kQH}, s, 0.f});
    t.push_back({p + "mlp.gate_proj.bias", {kQI}, 0.1f, 0.f});
    t.push_back({p + "mlp.up_proj.weight", {kQI, kQH}, s, 0.f});
    t.push_back({p + "mlp.up_proj.bias", {kQI}, 0.1f, 0.f});
    t.push_back({p + "mlp.down_proj.weight", {kQH, kQI}, 1.f / std::sqrt(float(kQI)), 0.f});
    t.push_back({p + "mlp.down_proj.bias", {kQH}, 0.1f, 0.f});
  }
  t.push_back({"visual.merger.ln_q.weight", {kQH}, 0.1f, 1.f});
  t.push_back({"visual.merger.mlp.0.weight", {kQMerged, kQMerged}, 1.f / std::sqrt(float(kQMerged)), 0.f});
  t.push_back({"visual.merger.mlp.0.bias", {kQMerged}, 0.1f, 0.f});
  t.push_back({"visual.merger.mlp.2.weight", {kQOut, kQMerged}, 1.f / std::sqrt(float(kQMerged)), 0.f});
  t.push_back({"visual.merger.mlp.2.bias", {kQOut}, 0.1f, 0.f});
  write_checkpoint(dir, t, bf16,
                   "{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"vision_config\":{\"depth\":" +
                       std::to_string(kQDepth) + ",\"hidden_size\":" + std::to_string(kQH) +
                       ",\"intermediate_size\":" + std::to_string(kQI) + ",\"num_heads\":2,\"in_chans\":3,\"patch_size\":2," +
                       "\"spatial_merge_size\":2,\"temporal_patch_size\":2,\"window_size\":8,\"out_hidden_size\":" +
                       std::to_string(kQOut) + ",\"fullatt_block_indexes\":[1],\"hidden_act\":\"silu\"}}");
}

// Gemma 3 SigLIP: 16x16 images of 2x2 patches (64 patches), pooled 2x2 into 16 tokens.
constexpr int64_t kGD = 32, kGI = 48, kGText = 24, kGLayers = 2, kGPatches = 64;

void write_gemma(const std::string& dir, bool bf16) {
  std::vector<Tensor> t;
  const float s = 1.f / std::sqrt(float(kGD));
  const std::string v = "vision_tower.vision_model.";
  t.push_back({v + "embeddings.patch_embedding.weight", {kGD, 3, 2, 2}, 0.3f, 0.f});
  t.push_back({v + "embeddings.patch_embedding.bias", {kGD}, 0.1f, 0.f});
  t.push_back({v + "embeddings.position_embedding.weight", {kGPatches, kGD}, 0.5f, 0.f});
  for (int64_t l = 0; l < kGLayers; l++) {
    const std::string p = v + "encoder.layers." + std::to_string(l) + ".";
    for (const char* n : {"layer_norm1", "layer_norm2"}) {
      t.push_back({p + n + ".weight", {kGD}, 0.1f, 1.f});
      t.push_back({p + n + ".bias", {kGD}, 0.1f, 0.f});
    }
    for (const char* n : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      t.push_back({p + "self_attn." + n + ".weight", {kGD, kGD}, s, 0.f});
      t.push_back({p + "self_attn." + n + ".bias", {kGD}, 0.1f, 0.f});
    }
    t.push_back({p + "mlp.fc1.weight", {kGI, kGD}, s, 0.f});
    t.push_back({p + "mlp.fc1.bias", {kGI}, 0.1f, 0.f});
    t.push_back({p + "mlp.fc2.weight", {kGD, kGI}, 1.f / std::sqrt(float(kGI)), 0.f});
    t.push_back({p + "mlp.fc2.bias", {kGD}, 0.1f, 0.f});
  }
  t.push_back({v + "post_layernorm.weight", {kGD}, 0.1f, 1.f});
  t.push_back({v + "post_layernorm.bias", {kGD}, 0.1f, 0.f});
  t.push_back({"multi_modal_projector.mm_soft_emb_norm.weight", {kGD}, 0.1f, 0.f});
  t.push_back({"multi_modal_projector.mm_input_projection_weight", {kGD, kGText}, s, 0.f});
  write_checkpoint(dir, t, bf16,
                   "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"mm_tokens_per_image\":16,"
                   "\"text_config\":{\"hidden_size\":" +
                       std::to_string(kGText) + "},\"vision_config\":{\"hidden_size\":" + std::to_string(kGD) +
                       ",\"intermediate_size\":" + std::to_string(kGI) + ",\"num_hidden_layers\":" + std::to_string(kGLayers) +
                       ",\"num_attention_heads\":2,\"image_size\":16,\"patch_size\":2,\"hidden_act\":\"gelu_pytorch_tanh\"}}");
}

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool all_finite(const std::vector<float>& a) {
  for (float v : a)
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

TEST_CASE(qwen_batch_matches_single) {
  // Grids with several windows, partial windows at the edges and two frames.
  const int grids[][3] = {{1, 4, 4}, {1, 8, 12}, {1, 6, 4}, {2, 6, 10}};
  for (bool bf16 : {false, true}) {
    const std::string dir = temp_dir(bf16 ? "qwen-bf16" : "qwen-f32");
    write_qwen(dir, bf16);
    for (int threads : {1, 3}) {
      auto enc = VisionEncoder::load(dir, threads);
      const int64_t pd = enc->config().patch_dim();
      CHECK(pd == 24);
      std::vector<std::vector<float>> px;
      std::vector<EncoderImage> images;
      for (int i = 0; i < 4; i++) px.push_back(random_values(int64_t(grids[i][0]) * grids[i][1] * grids[i][2] * pd, 11 + i));
      for (int i = 0; i < 4; i++) images.push_back({px[size_t(i)].data(), int64_t(px[size_t(i)].size()), grids[i][0], grids[i][1], grids[i][2]});
      const auto batch = enc->encode_batch(images);
      CHECK(batch.size() == 4);
      for (int i = 0; i < 4 && i < int(batch.size()); i++) {
        const auto& g = grids[i];
        const auto alone = enc->encode(px[size_t(i)].data(), int64_t(px[size_t(i)].size()) / pd, pd, g[0], g[1], g[2]);
        CHECK(int64_t(alone.size()) == enc->tokens_for(g[0], g[1], g[2]) * kQOut);
        CHECK(all_finite(alone));
        CHECK(same_bits(batch[size_t(i)], alone));
      }
      // The same image twice in one batch, and a batch of one.
      const auto twice = enc->encode_batch({images[1], images[1]});
      CHECK(twice.size() == 2 && same_bits(twice[0], batch[1]) && same_bits(twice[1], batch[1]));
      const auto one = enc->encode_batch({images[3]});
      CHECK(one.size() == 1 && same_bits(one[0], batch[3]));
    }
  }
}

TEST_CASE(qwen_batch_checks_every_image_first) {
  const std::string dir = temp_dir("qwen-checks");
  write_qwen(dir, false);
  auto enc = VisionEncoder::load(dir, 2);
  const int64_t pd = enc->config().patch_dim();
  const auto a = random_values(16 * pd, 1), b = random_values(24 * pd, 2);
  const EncoderImage good{a.data(), int64_t(a.size()), 1, 4, 4};
  CHECK(enc->encode_batch({}).empty());
  CHECK_THROWS_CODE(enc->encode_batch({good, EncoderImage{b.data(), int64_t(b.size()), 1, 6, 5}}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(enc->encode_batch({good, EncoderImage{b.data(), int64_t(b.size()), 1, 4, 4}}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(enc->encode_batch({good, EncoderImage{b.data(), int64_t(b.size()) - 1, 1, 6, 4}}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(enc->encode_batch({good, EncoderImage{nullptr, int64_t(b.size()), 1, 6, 4}}), ErrorCode::kInvalidArgument);
  try {
    enc->encode_batch({good, EncoderImage{b.data(), int64_t(b.size()), 1, 6, 5}});
  } catch (const sluice::Error& e) {
    CHECK(std::string(e.what()).find("image 1: ") != std::string::npos);
  }
  CHECK_THROWS_CODE(enc->encode(a.data(), 16, pd - 1, 1, 4, 4), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(enc->encode(a.data(), 15, pd, 1, 4, 4), ErrorCode::kInvalidArgument);
}

TEST_CASE(siglip_batch_matches_single) {
  for (bool bf16 : {false, true}) {
    const std::string dir = temp_dir(bf16 ? "gemma-bf16" : "gemma-f32");
    write_gemma(dir, bf16);
    for (int threads : {1, 3}) {
      auto enc = SiglipEncoder::load(dir, threads);
      const auto& c = enc->config();
      const int side = int(c.side());
      CHECK(side == 8 && c.pool() == 2);
      std::vector<std::vector<float>> px;
      std::vector<EncoderImage> images;
      for (int i = 0; i < 3; i++) px.push_back(random_values(c.pixel_values(), 21 + i));
      for (int i = 0; i < 3; i++) images.push_back({px[size_t(i)].data(), int64_t(px[size_t(i)].size()), 1, side, side});
      const auto batch = enc->encode_batch(images);
      CHECK(batch.size() == 3);
      for (int i = 0; i < 3 && i < int(batch.size()); i++) {
        const auto alone = enc->encode(px[size_t(i)].data(), int64_t(px[size_t(i)].size()), 1, side, side);
        CHECK(int64_t(alone.size()) == c.mm_tokens * kGText);
        CHECK(all_finite(alone));
        CHECK(same_bits(batch[size_t(i)], alone));
      }
      CHECK(!same_bits(batch[0], batch[1]));
    }
  }
}

TEST_CASE(siglip_batch_checks_every_image_first) {
  const std::string dir = temp_dir("gemma-checks");
  write_gemma(dir, false);
  auto enc = SiglipEncoder::load(dir, 2);
  const auto& c = enc->config();
  const int side = int(c.side());
  const auto a = random_values(c.pixel_values(), 1);
  const EncoderImage good{a.data(), int64_t(a.size()), 1, side, side};
  CHECK(enc->encode_batch({}).empty());
  CHECK_THROWS_CODE(enc->encode_batch({good, EncoderImage{a.data(), int64_t(a.size()) - 1, 1, side, side}}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(enc->encode_batch({good, EncoderImage{a.data(), int64_t(a.size()), 2, side, side}}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(enc->encode_batch({good, EncoderImage{nullptr, int64_t(a.size()), 1, side, side}}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(enc->encode(a.data(), int64_t(a.size()), 1, side, side + 1), ErrorCode::kInvalidArgument);
}

int main() {
  const int rc = sluice_test::run_all("vision_batch");
  std::system(("rm -rf '" + temp_dir("") + "'").c_str());
  return rc;
}
