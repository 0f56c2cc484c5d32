#include "vision/qwen2_vl_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "cpu/kernels.h"
#include "sluice/error.h"
#include "util/json.h"
#include "vision/qwen2_vl_layout.h"

namespace sluice::vision {

namespace {

constexpr const char* kArchitecture = "Qwen2_5_VLForConditionalGeneration";
constexpr float kNormEps = 1e-6f;

// q . k over n floats in 8 independent partial sums, which the compiler keeps in one vector
// register (a single running sum is a chain of dependent adds it may not reorder). The order is
// fixed, so results do not depend on anything but the inputs.
inline float dot_lanes(const float* a, const float* b, int64_t n) {
  float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t e = 0;
  for (; e + 8 <= n; e += 8)
    for (int l = 0; l < 8; l++) lane[l] += a[e + l] * b[e + l];
  float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; e < n; e++) sum += a[e] * b[e];
  return sum;
}

// Queries per attention task: enough tasks to keep the pool busy when a block attends over a
// whole frame (one segment per frame), small enough that a task's scores stay in cache.
constexpr int64_t kQueryChunk = 16;

[[noreturn]] void invalid_model(const std::string& msg) { throw Error(ErrorCode::kModelFileInvalid, "vision encoder: " + msg); }

int64_t get_int(const json::Value& obj, const char* key, int64_t def) {
  const json::Value* v = obj.find(key);
  if (!v || v->is_null()) return def;
  if (!v->is_number() || v->as_number() != std::floor(v->as_number()) || v->as_number() < 0)
    invalid_model(std::string("vision_config.") + key + " must be a non-negative integer");
  return int64_t(v->as_number());
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

std::unique_ptr<VisionEncoder> VisionEncoder::load(const std::string& model_dir, int num_threads) {
  const std::string config_path = model_dir + "/config.json";
  json::Value raw;
  try {
    raw = json::parse(read_text_file(config_path));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kModelFileInvalid, config_path + ": " + e.what());
  }
  std::string arch;
  if (const json::Value* a = raw.find("architectures"); a && a->is_array() && !a->as_array().empty() && a->as_array()[0].is_string())
    arch = a->as_array()[0].as_string();
  const json::Value* vc = raw.find("vision_config");
  if (arch != kArchitecture || !vc || !vc->is_object())
    throw Error(ErrorCode::kUnsupportedModel, "vision encoder: " + model_dir + " is not a Qwen2.5-VL model (architecture " +
                                                  (arch.empty() ? "unknown" : arch) + (vc ? "" : ", no vision_config") +
                                                  "; the vision encoder supports " + kArchitecture + " and Gemma3ForConditionalGeneration)");

  std::unique_ptr<VisionEncoder> enc(new VisionEncoder());
  VisionConfig& c = enc->cfg_;
  c.depth = get_int(*vc, "depth", c.depth);
  c.hidden = get_int(*vc, "hidden_size", c.hidden);
  c.intermediate = get_int(*vc, "intermediate_size", c.intermediate);
  c.num_heads = get_int(*vc, "num_heads", c.num_heads);
  c.in_chans = get_int(*vc, "in_chans", get_int(*vc, "in_channels", c.in_chans));
  c.patch = get_int(*vc, "patch_size", c.patch);
  c.merge = get_int(*vc, "spatial_merge_size", c.merge);
  c.temporal = get_int(*vc, "temporal_patch_size", c.temporal);
  c.window_size = get_int(*vc, "window_size", c.window_size);
  c.out_hidden = get_int(*vc, "out_hidden_size", c.out_hidden);
  if (const json::Value* fb = vc->find("fullatt_block_indexes"); fb && !fb->is_null()) {
    if (!fb->is_array()) invalid_model("vision_config.fullatt_block_indexes must be an array");
    c.fullatt_blocks.clear();
    for (const json::Value& v : fb->as_array()) {
      if (!v.is_number()) invalid_model("vision_config.fullatt_block_indexes must hold integers");
      c.fullatt_blocks.push_back(int64_t(v.as_number()));
    }
  }
  std::string act = "silu";
  if (const json::Value* a = vc->find("hidden_act"); a && a->is_string()) act = a->as_string();
  if (act != "silu")
    throw Error(ErrorCode::kUnsupportedModel, "vision encoder: vision_config.hidden_act " + act + " is not supported (silu only)");
  if (c.depth < 1 || c.hidden < 1 || c.intermediate < 1 || c.num_heads < 1 || c.in_chans < 1 || c.patch < 1 || c.merge < 1 ||
      c.temporal < 1 || c.out_hidden < 1)
    invalid_model("vision_config sizes must be positive");
  if (c.hidden % c.num_heads != 0 || c.head_dim() % 4 != 0)
    invalid_model("vision_config.hidden_size / num_heads (" + std::to_string(c.hidden) + " / " + std::to_string(c.num_heads) +
                  ") must be a whole head_dim that is a multiple of 4");
  if (c.window_size / c.merge / c.patch < 1)
    invalid_model("vision_config.window_size " + std::to_string(c.window_size) + " is below one merged token");

  enc->model_ = SafetensorsModel::open_dir(model_dir);
  const SafetensorsModel& m = *enc->model_;
  const std::string root = m.find("model.visual.patch_embed.proj.weight") ? "model.visual." : "visual.";
  auto get = [&](const std::string& name, std::vector<int64_t> shape) -> const TensorView* {
    const TensorView* t = m.find(root + name);
    if (!t) invalid_model("missing tensor " + root + name + " in " + model_dir);
    if (t->shape != shape) invalid_model(root + name + " has shape " + shape_str(t->shape) + ", expected " + shape_str(shape));
    if (!is_float_dtype(t->dtype))
      invalid_model(root + name + " has dtype " + dtype_name(t->dtype) + " (f32, bf16 or f16 expected)");
    return t;
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    return Linear{get(name + ".weight", {out, in}), get(name + ".bias", {out})};
  };
  const int64_t H = c.hidden, I = c.intermediate, merged = H * c.unit();
  enc->patch_embed_ = get("patch_embed.proj.weight", {H, c.in_chans, c.temporal, c.patch, c.patch});
  for (int64_t i = 0; i < c.depth; i++) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    Block b;
    b.norm1 = get(p + "norm1.weight", {H});
    b.norm2 = get(p + "norm2.weight", {H});
    b.qkv = linear(p + "attn.qkv", 3 * H, H);
    b.proj = linear(p + "attn.proj", H, H);
    b.gate = linear(p + "mlp.gate_proj", I, H);
    b.up = linear(p + "mlp.up_proj", I, H);
    b.down = linear(p + "mlp.down_proj", H, I);
    enc->blocks_.push_back(b);
  }
  enc->ln_q_ = get("merger.ln_q.weight", {H});
  enc->fc1_ = linear("merger.mlp.0", merged, merged);
  enc->fc2_ = linear("merger.mlp.2", c.out_hidden, merged);

  // visionInvFreq: head_dim / 4 frequencies 1 / 10000^(2k / (head_dim / 2)).
  const int64_t dim = c.head_dim() / 2;
  for (int64_t k = 0; k < dim / 2; k++) enc->inv_freq_.push_back(float(1.0 / std::pow(10000.0, double(2 * k) / double(dim))));
  enc->pool_ = std::make_unique<cpu::ThreadPool>(num_threads);
  return enc;
}

void VisionEncoder::validate(int64_t rows, int64_t patch_dim, int t, int h, int w, const std::string& where) const {
  auto bad = [&](const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, "vision encoder: " + where + msg); };
  if (t < 1 || h < 1 || w < 1) bad("grid (" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(w) + ") must be positive");
  if (h % cfg_.merge != 0 || w % cfg_.merge != 0)
    bad("grid " + std::to_string(h) + "x" + std::to_string(w) + " is not a multiple of spatial_merge_size " + std::to_string(cfg_.merge));
  if (patch_dim != cfg_.patch_dim())
    bad("patch rows hold " + std::to_string(patch_dim) + " values, the model takes " + std::to_string(cfg_.patch_dim()) +
        " (in_chans x temporal_patch_size x patch_size^2)");
  if (rows != int64_t(t) * h * w)
    bad(std::to_string(rows) + " patch rows for grid (" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(w) +
        "), which needs t*h*w = " + std::to_string(int64_t(t) * h * w));
}

void VisionEncoder::linear(const float* x, int64_t T, int64_t K, const Linear& l, int64_t N, float* y) const {
  cpu::matmul(*pool_, x, T, K, l.w->data, l.w->dtype, N, l.b ? l.b->data : nullptr, l.b ? l.b->dtype : DType::F32, y);
}

std::vector<float> VisionEncoder::encode(const float* pixel_values, int64_t rows, int64_t patch_dim, int t, int h, int w) const {
  validate(rows, patch_dim, t, h, w);
  std::vector<std::vector<float>> out = encode_batch({EncoderImage{pixel_values, rows * patch_dim, t, h, w}});
  return std::move(out[0]);
}

void VisionEncoder::check_batch(const std::vector<EncoderImage>& images) const {
  const int64_t patch_dim = cfg_.patch_dim();
  const size_t n_img = images.size();
  for (size_t i = 0; i < n_img; i++) {
    const EncoderImage& im = images[i];
    const std::string where = n_img > 1 ? "image " + std::to_string(i) + ": " : "";
    if (im.num_values < 0 || im.num_values % patch_dim != 0)
      throw Error(ErrorCode::kInvalidArgument, "vision encoder: " + where + std::to_string(im.num_values) +
                                                   " pixel values are not whole patch rows of " + std::to_string(patch_dim) +
                                                   " values (in_chans x temporal_patch_size x patch_size^2)");
    validate(im.num_values / patch_dim, patch_dim, im.t, im.h, im.w, where);
    if (!im.pixel_values) throw Error(ErrorCode::kInvalidArgument, "vision encoder: " + where + "no pixel values");
  }
}

std::vector<std::vector<float>> VisionEncoder::encode_batch(const std::vector<EncoderImage>& images) const {
  const int64_t patch_dim = cfg_.patch_dim();
  const size_t n_img = images.size();
  check_batch(images);  // every image before anything is computed
  if (n_img == 0) return {};

  std::lock_guard<std::mutex> lock(mu_);
  cpu::ThreadPool& pool = *pool_;
  const int64_t H = cfg_.hidden, I = cfg_.intermediate, nh = cfg_.num_heads, d = cfg_.head_dim(), half = d / 2;
  const int64_t unit = cfg_.unit(), merged = H * unit, out_h = cfg_.out_hidden;

  // The images' rows concatenated, each image's in its own window order (qwen2_vl_layout.h).
  const Qwen2VlBatchLayout layout = qwen2vl_batch_layout(images, patch_dim, cfg_.merge, cfg_.window_merged());
  const int64_t rows = layout.rows(), tokens = rows / unit;
  const std::vector<const float*>& src = layout.src;
  const std::vector<int32_t>& grow = layout.row;
  const std::vector<int32_t>& gcol = layout.col;
  const std::vector<int64_t>& cu_window = layout.cu_window;
  const std::vector<int64_t>& cu_frames = layout.cu_frames;

  // Rotary cos/sin per block row: [rows, head_dim / 2]; pair i turns by row * inv[i] for the first
  // quarter of the head, col * inv[i - head_dim / 4] for the second (angles in double).
  const int64_t q4 = int64_t(inv_freq_.size());
  std::vector<float> cosv(static_cast<size_t>(rows * half)), sinv(static_cast<size_t>(rows * half));
  pool.parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) {
      for (int64_t j = 0; j < half; j++) {
        const double a = j < q4 ? double(grow[size_t(i)]) * double(inv_freq_[size_t(j)])
                                : double(gcol[size_t(i)]) * double(inv_freq_[size_t(j - q4)]);
        cosv[size_t(i * half + j)] = float(std::cos(a));
        sinv[size_t(i * half + j)] = float(std::sin(a));
      }
    }
  });

  // Patch embedding: the Conv3d (stride = kernel) as a matmul over the flattened kernel.
  std::vector<float> x(static_cast<size_t>(rows * H));  // [rows, H] the residual stream, window order
  {
    std::vector<float> px(static_cast<size_t>(rows * patch_dim));  // [rows, patch_dim] gathered in window order
    pool.parallel_for(rows, 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) std::memcpy(&px[size_t(i * patch_dim)], src[size_t(i)], size_t(patch_dim) * sizeof(float));
    });
    cpu::matmul(pool, px.data(), rows, patch_dim, patch_embed_->data, patch_embed_->dtype, H, nullptr, DType::F32, x.data());
  }

  std::vector<float> hn(static_cast<size_t>(rows * H));        // [rows, H] normed input of a sub-layer
  std::vector<float> qkv(static_cast<size_t>(rows * 3 * H));   // [rows, 3H]: q heads, k heads, v heads
  std::vector<float> attn(static_cast<size_t>(rows * H));      // [rows, H] attention output, then proj's
  std::vector<float> gate(static_cast<size_t>(rows * I)), up(static_cast<size_t>(rows * I));  // [rows, I]
  const float scale = float(1.0 / std::sqrt(double(d)));

  // Attention tasks of (segment, head, chunk of kQueryChunk queries), windowed and full.
  struct Task {
    int64_t lo, hi, q0, q1, head;
  };
  auto make_tasks = [&](const std::vector<int64_t>& cu) {
    std::vector<Task> tasks;
    for (size_t s = 0; s + 1 < cu.size(); s++)
      for (int64_t hd = 0; hd < nh; hd++)
        for (int64_t q0 = cu[s]; q0 < cu[s + 1]; q0 += kQueryChunk)
          tasks.push_back({cu[s], cu[s + 1], q0, std::min(cu[s + 1], q0 + kQueryChunk), hd});
    return tasks;
  };
  const std::vector<Task> window_tasks = make_tasks(cu_window), frame_tasks = make_tasks(cu_frames);

  for (int64_t l = 0; l < int64_t(blocks_.size()); l++) {
    const Block& b = blocks_[size_t(l)];
    const bool full = std::find(cfg_.fullatt_blocks.begin(), cfg_.fullatt_blocks.end(), l) != cfg_.fullatt_blocks.end();
    const std::vector<Task>& tasks = full ? frame_tasks : window_tasks;

    cpu::rmsnorm(pool, x.data(), rows, H, b.norm1->data, b.norm1->dtype, kNormEps, hn.data());
    linear(hn.data(), rows, H, b.qkv, 3 * H, qkv.data());
    // Rotary on q and k, rotate-half per head.
    pool.parallel_for(rows, 16, [&](int64_t beg, int64_t end) {
      for (int64_t i = beg; i < end; i++) {
        const float* cs = &cosv[size_t(i * half)];
        const float* sn = &sinv[size_t(i * half)];
        for (int64_t part = 0; part < 2; part++) {
          float* base = &qkv[size_t(i * 3 * H + part * H)];
          for (int64_t hd = 0; hd < nh; hd++) {
            float* v = base + hd * d;
            for (int64_t j = 0; j < half; j++) {
              const float x1 = v[j], x2 = v[j + half];
              v[j] = x1 * cs[j] - x2 * sn[j];
              v[j + half] = x2 * cs[j] + x1 * sn[j];
            }
          }
        }
      }
    });
    // Bidirectional attention within each segment [lo, hi), each task writing its own slice of attn.
    pool.parallel_for(int64_t(tasks.size()), 1, [&](int64_t beg, int64_t end) {
      std::vector<float> p, acc(static_cast<size_t>(d));
      for (int64_t ti = beg; ti < end; ti++) {
        const Task& tk = tasks[size_t(ti)];
        p.resize(size_t(tk.hi - tk.lo));
        for (int64_t i = tk.q0; i < tk.q1; i++) {
          const float* q = &qkv[size_t(i * 3 * H + tk.head * d)];
          float mx = -INFINITY;
          for (int64_t j = tk.lo; j < tk.hi; j++) {
            const float* k = &qkv[size_t(j * 3 * H + H + tk.head * d)];
            const float dot = dot_lanes(q, k, d) * scale;
            p[size_t(j - tk.lo)] = dot;
            mx = std::max(mx, dot);
          }
          float sum = 0.f;
          for (float& v : p) sum += (v = std::exp(v - mx));
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j = tk.lo; j < tk.hi; j++) {
            const float pj = p[size_t(j - tk.lo)];
            const float* v = &qkv[size_t(j * 3 * H + 2 * H + tk.head * d)];
            for (int64_t e = 0; e < d; e++) acc[size_t(e)] += pj * v[e];
          }
          float* o = &attn[size_t(i * H + tk.head * d)];
          const float inv = 1.f / sum;
          for (int64_t e = 0; e < d; e++) o[e] = acc[size_t(e)] * inv;
        }
      }
    });
    linear(attn.data(), rows, H, b.proj, H, hn.data());
    cpu::add_inplace(pool, x.data(), hn.data(), rows * H);

    // SiLU-gated MLP, every Linear biased.
    cpu::rmsnorm(pool, x.data(), rows, H, b.norm2->data, b.norm2->dtype, kNormEps, hn.data());
    const cpu::LinearOut gu[2] = {
        {b.gate.w->data, b.gate.w->dtype, I, b.gate.b->data, b.gate.b->dtype, gate.data()},
        {b.up.w->data, b.up.w->dtype, I, b.up.b->data, b.up.b->dtype, up.data()},
    };
    cpu::matmul_multi(pool, hn.data(), rows, H, gu, 2);
    cpu::silu_mul_split(pool, gate.data(), up.data(), rows, I, gate.data());
    linear(gate.data(), rows, I, b.down, H, hn.data());
    cpu::add_inplace(pool, x.data(), hn.data(), rows * H);
  }

  // Merger: RMSNorm, unit consecutive rows joined ([tokens, H * unit] is the same memory; an
  // image's rows are whole merged tokens), Linear, exact GELU, Linear.
  cpu::rmsnorm(pool, x.data(), rows, H, ln_q_->data, ln_q_->dtype, kNormEps, hn.data());
  std::vector<float> z(static_cast<size_t>(tokens * merged));  // [tokens, H * unit]
  linear(hn.data(), tokens, merged, fc1_, merged, z.data());
  pool.parallel_for(tokens * merged, 4096, [&](int64_t beg, int64_t end) {
    for (int64_t i = beg; i < end; i++) {
      const float v = z[size_t(i)];
      z[size_t(i)] = 0.5f * v * (1.f + std::erf(v * float(M_SQRT1_2)));
    }
  });
  std::vector<float> y(static_cast<size_t>(tokens * out_h));  // [tokens, out_hidden] in window order
  linear(z.data(), tokens, merged, fc2_, out_h, y.data());
  return qwen2vl_unwindow(layout, y.data(), unit, out_h);
}

}  // namespace sluice::vision
