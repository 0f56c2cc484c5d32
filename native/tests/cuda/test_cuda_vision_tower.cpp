// The CUDA vision towers (cuda/vision_tower.h) against the CPU towers on tiny random checkpoints
// with the real towers' head dims (Qwen2.5-VL 80, SigLIP 72: padded to the flash kernel's 128),
// intermediate sizes that are not multiples of 8, f32 and bf16 weights.
//
// Tolerance: the CUDA tower keeps activations between kernels in bf16, so an output may differ from
// the f32 CPU tower's by up to kRelTol of the largest output magnitude, and on average by at most
// kMeanTol of the average magnitude. Different images must differ by far more (the test checks it,
// so a tower that ignored its input or mixed images up would fail). Batching, and passes of whole
// images (kPassRows), must give each image what it gets alone, within kBatchTol. Attention runs
// through the flash kernel (the towers' default) and through the per-token paged kernel; both
// are held to the CPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda/vision_tower.h"
#include "cuda_test_util.h"
#include "sluice/error.h"
#include "test_util.h"
#include "vision/qwen2_vl_encoder.h"
#include "vision/siglip_encoder.h"
#include "vision_checkpoints.h"

using sluice::ErrorCode;
using sluice::cuda::VisionTower;
using sluice::vision::EncoderImage;
using sluice::vision::SiglipEncoder;
using sluice::vision::VisionEncoder;
using sluice_cuda_test::temp_dir;

namespace {

constexpr double kRelTol = 0.03, kMeanTol = 0.01, kBatchTol = 5e-3;

struct Diff {
  double max_rel = 0, mean_rel = 0;
};

// max |got - want| / max |want| and mean |got - want| / mean |want|.
Diff diff(const std::vector<float>& got, const std::vector<float>& want) {
  Diff d;
  if (got.size() != want.size() || want.empty()) return {1e9, 1e9};
  double max_abs = 0, max_want = 0, sum_abs = 0, sum_want = 0;
  for (size_t i = 0; i < want.size(); i++) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    if (!std::isfinite(got[i])) return {1e9, 1e9};
    max_abs = std::max(max_abs, e);
    max_want = std::max(max_want, std::fabs(double(want[i])));
    sum_abs += e;
    sum_want += std::fabs(double(want[i]));
  }
  d.max_rel = max_abs / max_want;
  d.mean_rel = sum_abs / sum_want;
  return d;
}

bool close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  const Diff d = diff(got, want);
  std::printf("  %s: max %.2e, mean %.2e of the reference's magnitude\n", what, d.max_rel, d.mean_rel);
  return d.max_rel <= kRelTol && d.mean_rel <= kMeanTol;
}

// The real towers' head dims, a hidden size per head that the padding must keep apart.
const sluice_test::QwenTowerShape kQwen{160, 92, 40, 3, 2};      // hd 80, intermediate pads to 96
const sluice_test::SiglipTowerShape kSiglip{144, 100, 40, 2, 2};  // hd 72, intermediate pads to 104

void check_qwen(const std::shared_ptr<const VisionEncoder>& cpu, bool flash, const char* what) {
  // Several windows, partial windows at the edges, two frames.
  const int grids[][3] = {{1, 4, 4}, {1, 8, 12}, {1, 6, 4}, {2, 6, 10}};
  std::printf(" %s, %s attention\n", what, flash ? "flash" : "paged");
  auto gpu = VisionTower::qwen2vl(cpu, 0, flash);
  const int64_t pd = cpu->config().patch_dim();
  std::vector<std::vector<float>> px;
  std::vector<EncoderImage> images;
  for (int i = 0; i < 4; i++) px.push_back(sluice_test::random_pixel_values(int64_t(grids[i][0]) * grids[i][1] * grids[i][2] * pd, 11 + i));
  for (int i = 0; i < 4; i++) images.push_back({px[size_t(i)].data(), int64_t(px[size_t(i)].size()), grids[i][0], grids[i][1], grids[i][2]});
  const auto want = cpu->encode_batch(images);
  const auto got = gpu->encode_batch(images);
  CHECK(got.size() == 4);
  for (size_t i = 0; i < 4 && i < got.size(); i++) {
    CHECK(got[i].size() == want[i].size());
    CHECK(close(got[i], want[i], "batch"));
    const auto alone = gpu->encode_batch({images[i]});
    CHECK(diff(alone[0], got[i]).max_rel <= kBatchTol);
  }
  // Another image of the same grid is far from this one's output.
  const auto other = sluice_test::random_pixel_values(int64_t(px[1].size()), 99);
  const auto moved = gpu->encode_batch({EncoderImage{other.data(), int64_t(other.size()), 1, 8, 12}});
  CHECK(diff(moved[0], want[1]).mean_rel > 20 * kMeanTol);
  std::printf("  device bytes %zu\n", gpu->device_bytes());
}

TEST_CASE(qwen_tower_matches_cpu) {
  for (bool bf16 : {false, true}) {
    const std::string dir = temp_dir(bf16 ? "qwen-bf16" : "qwen-f32");
    sluice_test::write_qwen_tower(dir, bf16, kQwen);
    std::shared_ptr<const VisionEncoder> cpu = VisionEncoder::load(dir, 8);
    for (bool flash : {true, false}) check_qwen(cpu, flash, bf16 ? "bf16 weights" : "f32 weights");
  }
}

TEST_CASE(qwen_tower_runs_large_batches_in_passes) {
  const std::string dir = temp_dir("qwen-passes");
  sluice_test::write_qwen_tower(dir, true, kQwen);
  std::shared_ptr<const VisionEncoder> cpu = VisionEncoder::load(dir, 8);
  auto gpu = VisionTower::qwen2vl(cpu, 0);
  const int64_t pd = cpu->config().patch_dim();
  // 9216 rows each: two passes of one image, then a small image that joins the second.
  const int side = 96;
  static_assert(2 * 96 * 96 > VisionTower::kPassRows, "two images must not fit one pass");
  const auto a = sluice_test::random_pixel_values(int64_t(side) * side * pd, 5);
  const auto b = sluice_test::random_pixel_values(int64_t(side) * side * pd, 6);
  const auto c = sluice_test::random_pixel_values(16 * pd, 7);
  const std::vector<EncoderImage> images = {{a.data(), int64_t(a.size()), 1, side, side},
                                            {b.data(), int64_t(b.size()), 1, side, side},
                                            {c.data(), int64_t(c.size()), 1, 4, 4}};
  const auto got = gpu->encode_batch(images);
  const auto want = cpu->encode_batch(images);
  CHECK(got.size() == 3);
  for (size_t i = 0; i < 3 && i < got.size(); i++) CHECK(close(got[i], want[i], "qwen pass"));
}

void check_siglip(const std::shared_ptr<const SiglipEncoder>& cpu, bool flash, const char* what) {
  std::printf(" %s, %s attention\n", what, flash ? "flash" : "paged");
  auto gpu = VisionTower::siglip(cpu, 0, flash);
  const auto& c = cpu->config();
  const int side = int(c.side());
  std::vector<std::vector<float>> px;
  std::vector<EncoderImage> images;
  for (int i = 0; i < 3; i++) px.push_back(sluice_test::random_pixel_values(c.pixel_values(), 21 + i));
  for (int i = 0; i < 3; i++) images.push_back({px[size_t(i)].data(), int64_t(px[size_t(i)].size()), 1, side, side});
  const auto want = cpu->encode_batch(images);
  const auto got = gpu->encode_batch(images);
  CHECK(got.size() == 3);
  for (size_t i = 0; i < 3 && i < got.size(); i++) {
    CHECK(close(got[i], want[i], "batch"));
    const auto alone = gpu->encode_batch({images[i]});
    CHECK(diff(alone[0], got[i]).max_rel <= kBatchTol);
  }
  CHECK(got.size() == 3 && diff(got[0], want[1]).mean_rel > 20 * kMeanTol);
}

TEST_CASE(siglip_tower_matches_cpu) {
  for (bool bf16 : {false, true}) {
    const std::string dir = temp_dir(bf16 ? "gemma-bf16" : "gemma-f32");
    sluice_test::write_siglip_tower(dir, bf16, kSiglip);
    std::shared_ptr<const SiglipEncoder> cpu = SiglipEncoder::load(dir, 8);
    for (bool flash : {true, false}) check_siglip(cpu, flash, bf16 ? "bf16 weights" : "f32 weights");
  }
}

TEST_CASE(towers_check_every_image_first) {
  const std::string qdir = temp_dir("qwen-checks"), gdir = temp_dir("gemma-checks");
  sluice_test::write_qwen_tower(qdir, false, kQwen);
  sluice_test::write_siglip_tower(gdir, false, kSiglip);
  std::shared_ptr<const VisionEncoder> qcpu = VisionEncoder::load(qdir, 2);
  std::shared_ptr<const SiglipEncoder> gcpu = SiglipEncoder::load(gdir, 2);
  auto q = VisionTower::qwen2vl(qcpu, 0);
  auto g = VisionTower::siglip(gcpu, 0);
  const int64_t pd = qcpu->config().patch_dim();
  const auto a = sluice_test::random_pixel_values(16 * pd, 1);
  const EncoderImage good{a.data(), int64_t(a.size()), 1, 4, 4};
  CHECK(q->encode_batch({}).empty());
  CHECK_THROWS_CODE(q->encode_batch({good, EncoderImage{a.data(), int64_t(a.size()), 1, 4, 6}}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(q->encode_batch({good, EncoderImage{nullptr, int64_t(a.size()), 1, 4, 4}}), ErrorCode::kInvalidArgument);
  const auto p = sluice_test::random_pixel_values(gcpu->config().pixel_values(), 2);
  const int side = int(gcpu->config().side());
  CHECK(g->encode_batch({}).empty());
  CHECK_THROWS_CODE(g->encode_batch({EncoderImage{p.data(), int64_t(p.size()) - 1, 1, side, side}}), ErrorCode::kInvalidArgument);
  // A refused batch leaves the tower usable.
  CHECK(q->encode_batch({good}).size() == 1);
}

}  // namespace

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda vision tower")) return rc;
  const int rc = sluice_test::run_all("cuda vision tower");
  std::system(("rm -rf '" + temp_dir("") + "'").c_str());
  return rc;
}
