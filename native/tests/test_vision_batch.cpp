// The CPU vision towers' encode_batch (Qwen2.5-VL and Gemma 3 SigLIP) against encode() of each
// image alone: several images of different grids in one pass give every image bit for bit what it
// gets alone (the kernels are batch invariant), for f32 and bf16 weights and several thread
// counts; and every image is checked before anything is computed. The checkpoints are tiny random
// ones (vision_checkpoints.h), so the test needs no Node and no downloads.
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
#include "vision_checkpoints.h"
#include "vision/qwen2_vl_encoder.h"
#include "vision/siglip_encoder.h"

using sluice::ErrorCode;
using sluice::vision::EncoderImage;
using sluice::vision::SiglipEncoder;
using sluice::vision::VisionEncoder;
using sluice_test::temp_dir;

namespace {

// The checkpoints' sizes (vision_checkpoints.h's defaults).
constexpr int64_t kQOut = 24, kGText = 24;

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
    sluice_test::write_qwen_tower(dir, bf16);
    for (int threads : {1, 3}) {
      auto enc = VisionEncoder::load(dir, threads);
      const int64_t pd = enc->config().patch_dim();
      CHECK(pd == 24);
      std::vector<std::vector<float>> px;
      std::vector<EncoderImage> images;
      for (int i = 0; i < 4; i++) px.push_back(sluice_test::random_pixel_values(int64_t(grids[i][0]) * grids[i][1] * grids[i][2] * pd, 11 + i));
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
  sluice_test::write_qwen_tower(dir, false);
  auto enc = VisionEncoder::load(dir, 2);
  const int64_t pd = enc->config().patch_dim();
  const auto a = sluice_test::random_pixel_values(16 * pd, 1), b = sluice_test::random_pixel_values(24 * pd, 2);
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
    sluice_test::write_siglip_tower(dir, bf16);
    for (int threads : {1, 3}) {
      auto enc = SiglipEncoder::load(dir, threads);
      const auto& c = enc->config();
      const int side = int(c.side());
      CHECK(side == 8 && c.pool() == 2);
      std::vector<std::vector<float>> px;
      std::vector<EncoderImage> images;
      for (int i = 0; i < 3; i++) px.push_back(sluice_test::random_pixel_values(c.pixel_values(), 21 + i));
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
  sluice_test::write_siglip_tower(dir, false);
  auto enc = SiglipEncoder::load(dir, 2);
  const auto& c = enc->config();
  const int side = int(c.side());
  const auto a = sluice_test::random_pixel_values(c.pixel_values(), 1);
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
