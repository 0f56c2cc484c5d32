#include "vision/siglip_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "cpu/kernels.h"
#include "sluice/error.h"
#include "util/json.h"

namespace sluice::vision {

namespace {

constexpr const char* kArchitecture = "Gemma3ForConditionalGeneration";
constexpr const char* kTower = "vision_tower.vision_model.";
constexpr const char* kProjector = "multi_modal_projector.";

[[noreturn]] void invalid_model(const std::string& msg) { throw Error(ErrorCode::kModelFileInvalid, "vision encoder: " + msg); }

json::Value read_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kModelFileInvalid, path + ": " + e.what());
  }
}

std::string architecture_of(const json::Value& raw) {
  if (const json::Value* a = raw.find("architectures"); a && a->is_array() && !a->as_array().empty() && a->as_array()[0].is_string())
    return a->as_array()[0].as_string();
  return "";
}

double get_number(const json::Value& obj, const std::string& where, const char* key, double def) {
  const json::Value* v = obj.find(key);
  if (!v || v->is_null()) return def;
  if (!v->is_number()) invalid_model(where + key + " must be a number");
  return v->as_number();
}

int64_t get_int(const json::Value& obj, const std::string& where, const char* key, int64_t def) {
  const double v = get_number(obj, where, key, double(def));
  if (v != std::floor(v) || v < 1) invalid_model(where + key + " must be a positive integer");
  return int64_t(v);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); i++) out[size_t(i)] = t.float_at(i);
  return out;
}

// exp(x) for the softmax's x = score - max <= 0 (Cephes' expf polynomial, relative error under
// 1e-7; below -87 it gives exp(-87)). Free of branches and calls so that the loops over a row
// vectorize: libm's exp, one call per score, cost more than both attention matmuls together.
inline float exp_nonpositive(float x) {
  uint32_t xb;  // clamped to -87 through the bits: a float compare would keep the loop scalar
  std::memcpy(&xb, &x, 4);
  xb = xb > 0xC2AE0000u ? 0xC2AE0000u : xb;  // above -87.f's bits: below -87 (negative floats)
  std::memcpy(&x, &xb, 4);
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;  // round(x / ln 2): 1.5 * 2^23
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;   // x - n ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// Softmax of row[n] in place; max and sum in 8 independent lanes (vectorizable, fixed order).
void softmax_row(float* row, int64_t n) {
  float lane[8];
  for (float& l : lane) l = -INFINITY;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++) lane[l] = lane[l] > row[j + l] ? lane[l] : row[j + l];
  float mx = -INFINITY;
  for (float l : lane) mx = std::max(mx, l);
  for (; j < n; j++) mx = std::max(mx, row[j]);
  for (j = 0; j < n; j++) row[j] = exp_nonpositive(row[j] - mx);
  for (float& l : lane) l = 0.f;
  for (j = 0; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++) lane[l] += row[j + l];
  float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; j < n; j++) sum += row[j];
  const float inv = 1.f / sum;
  for (j = 0; j < n; j++) row[j] *= inv;
}

int64_t isqrt(int64_t n) {
  int64_t r = int64_t(std::llround(std::sqrt(double(n))));
  while (r * r > n) r--;
  while ((r + 1) * (r + 1) <= n) r++;
  return r;
}

}  // namespace

std::string model_architecture(const std::string& model_dir) { return architecture_of(read_config(model_dir)); }

int64_t SiglipConfig::pool() const { return side() / isqrt(mm_tokens); }

std::unique_ptr<SiglipEncoder> SiglipEncoder::load(const std::string& model_dir, int num_threads) {
  const json::Value raw = read_config(model_dir);
  const std::string arch = architecture_of(raw);
  const json::Value* vc = raw.find("vision_config");
  if (arch != kArchitecture || !vc || !vc->is_object())
    throw Error(ErrorCode::kUnsupportedModel, "vision encoder: " + model_dir + " is not a Gemma 3 vision model (architecture " +
                                                  (arch.empty() ? "unknown" : arch) + (vc ? "" : ", no vision_config") +
                                                  "; the SigLIP encoder supports " + kArchitecture + ")");

  std::unique_ptr<SiglipEncoder> enc(new SiglipEncoder());
  SiglipConfig& c = enc->cfg_;
  const std::string w = "vision_config.";
  c.hidden = get_int(*vc, w, "hidden_size", c.hidden);
  c.intermediate = get_int(*vc, w, "intermediate_size", c.intermediate);
  c.num_layers = get_int(*vc, w, "num_hidden_layers", c.num_layers);
  c.num_heads = get_int(*vc, w, "num_attention_heads", c.num_heads);
  c.num_channels = get_int(*vc, w, "num_channels", c.num_channels);
  c.image_size = get_int(*vc, w, "image_size", c.image_size);
  c.patch = get_int(*vc, w, "patch_size", c.patch);
  c.eps = float(get_number(*vc, w, "layer_norm_eps", c.eps));
  c.mm_tokens = get_int(raw, "", "mm_tokens_per_image", c.mm_tokens);
  if (const json::Value* tc = raw.find("text_config"); tc && tc->is_object())
    c.text_hidden = get_int(*tc, "text_config.", "hidden_size", c.text_hidden);
  std::string act = "gelu_pytorch_tanh";
  if (const json::Value* a = vc->find("hidden_act"); a && a->is_string()) act = a->as_string();
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh")
    throw Error(ErrorCode::kUnsupportedModel, "vision encoder: vision_config.hidden_act " + act + " is not supported (gelu_pytorch_tanh only)");
  if (c.hidden % c.num_heads != 0)
    invalid_model("vision_config.hidden_size " + std::to_string(c.hidden) + " is not a multiple of num_attention_heads " +
                  std::to_string(c.num_heads));
  if (c.image_size % c.patch != 0)
    invalid_model("vision_config.image_size " + std::to_string(c.image_size) + " is not a multiple of patch_size " +
                  std::to_string(c.patch));
  const int64_t per_side = isqrt(c.mm_tokens);
  if (per_side * per_side != c.mm_tokens || c.side() % per_side != 0)
    invalid_model("mm_tokens_per_image " + std::to_string(c.mm_tokens) + " is not a square whose side divides the " +
                  std::to_string(c.side()) + " patches per side");

  enc->model_ = SafetensorsModel::open_dir(model_dir);
  const SafetensorsModel& m = *enc->model_;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) -> const TensorView* {
    const TensorView* t = m.find(name);
    if (!t) invalid_model("missing tensor " + name + " in " + model_dir);
    if (t->shape != shape) invalid_model(name + " has shape " + shape_str(t->shape) + ", expected " + shape_str(shape));
    if (!is_float_dtype(t->dtype)) invalid_model(name + " has dtype " + dtype_name(t->dtype) + " (f32, bf16 or f16 expected)");
    return t;
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    return Linear{get(name + ".weight", {out, in}), get(name + ".bias", {out})};
  };
  const int64_t D = c.hidden, I = c.intermediate;
  auto norm = [&](const std::string& name) { return Norm{to_f32(*get(name + ".weight", {D})), to_f32(*get(name + ".bias", {D}))}; };
  const std::string t = kTower;
  enc->patch_w_ = get(t + "embeddings.patch_embedding.weight", {D, c.num_channels, c.patch, c.patch});
  enc->patch_b_ = get(t + "embeddings.patch_embedding.bias", {D});
  enc->pos_ = to_f32(*get(t + "embeddings.position_embedding.weight", {c.num_patches(), D}));
  for (int64_t i = 0; i < c.num_layers; i++) {
    const std::string p = t + "encoder.layers." + std::to_string(i) + ".";
    Block b;
    b.norm1 = norm(p + "layer_norm1");
    b.norm2 = norm(p + "layer_norm2");
    b.q = linear(p + "self_attn.q_proj", D, D);
    b.k = linear(p + "self_attn.k_proj", D, D);
    b.v = linear(p + "self_attn.v_proj", D, D);
    b.out = linear(p + "self_attn.out_proj", D, D);
    b.fc1 = linear(p + "mlp.fc1", I, D);
    b.fc2 = linear(p + "mlp.fc2", D, I);
    enc->blocks_.push_back(std::move(b));
  }
  enc->post_norm_ = norm(t + "post_layernorm");
  const std::string pj = kProjector;
  enc->soft_norm_ = to_f32(*get(pj + "mm_soft_emb_norm.weight", {D}));
  for (float& v : enc->soft_norm_) v += 1.f;
  // x @ W with W [hidden, text_hidden]: transposed once into the Linear layout the matmuls take.
  const TensorView* proj = get(pj + "mm_input_projection_weight", {D, c.text_hidden});
  enc->proj_t_.resize(size_t(c.text_hidden * D));
  for (int64_t k = 0; k < D; k++)
    for (int64_t n = 0; n < c.text_hidden; n++) enc->proj_t_[size_t(n * D + k)] = proj->float_at(k * c.text_hidden + n);
  enc->pool_ = std::make_unique<cpu::ThreadPool>(num_threads);
  return enc;
}

void SiglipEncoder::linear(const float* x, int64_t T, int64_t K, const Linear& l, int64_t N, float* y) const {
  cpu::matmul(*pool_, x, T, K, l.w->data, l.w->dtype, N, l.b->data, l.b->dtype, y);
}

void SiglipEncoder::layer_norm(const float* x, int64_t T, const Norm& n, float* out) const {
  const int64_t D = cfg_.hidden;
  const double eps = cfg_.eps;
  pool_->parallel_for(T, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) {
      const float* r = x + i * D;
      double mean = 0, var = 0;
      for (int64_t j = 0; j < D; j++) mean += r[j];
      mean /= double(D);
      for (int64_t j = 0; j < D; j++) var += (r[j] - mean) * (r[j] - mean);
      const float inv = float(1.0 / std::sqrt(var / double(D) + eps)), mu = float(mean);
      float* o = out + i * D;
      for (int64_t j = 0; j < D; j++) o[j] = (r[j] - mu) * inv * n.w[size_t(j)] + n.b[size_t(j)];
    }
  });
}

void SiglipEncoder::attention(const float* q, const float* k, const float* v, int64_t N, float* attn) const {
  cpu::ThreadPool& pool = *pool_;
  const int64_t D = cfg_.hidden, d = cfg_.head_dim();
  const float scale = float(1.0 / std::sqrt(double(d)));
  std::vector<float> qh(size_t(N * d)), kh(size_t(N * d));  // [N, d] one head's queries (scaled), keys
  std::vector<float> vt(size_t(d * N));                       // [d, N] its values transposed
  std::vector<float> s(size_t(N * N));                        // [N, N] scores, then probabilities
  std::vector<float> oh(size_t(N * d));                       // [N, d] its output
  // P V over groups of query rows: the matmuls share out output rows, and V^T has only head_dim.
  const int64_t rows_per_group = std::max<int64_t>(16, (N + pool.size() - 1) / pool.size());
  std::vector<cpu::LinearOut> outs;
  std::vector<cpu::MatmulGroup> groups;
  for (int64_t r = 0; r < N; r += rows_per_group)
    outs.push_back({vt.data(), DType::F32, d, nullptr, DType::F32, oh.data() + r * d});
  for (size_t g = 0; g < outs.size(); g++) {
    const int64_t r = int64_t(g) * rows_per_group;
    groups.push_back({s.data() + r * N, std::min(rows_per_group, N - r), N, &outs[g], 1});
  }
  for (int64_t hd = 0; hd < cfg_.num_heads; hd++) {
    pool.parallel_for(N, 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++)
        for (int64_t j = 0; j < d; j++) {
          qh[size_t(i * d + j)] = q[i * D + hd * d + j] * scale;
          kh[size_t(i * d + j)] = k[i * D + hd * d + j];
          vt[size_t(j * N + i)] = v[i * D + hd * d + j];
        }
    });
    // Scores: queries against every key as a Linear over the keys ([N, d] is the [out, in] layout).
    cpu::matmul(pool, qh.data(), N, d, kh.data(), DType::F32, N, nullptr, DType::F32, s.data());
    pool.parallel_for(N, 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) softmax_row(s.data() + i * N, N);
    });
    cpu::matmul_groups(pool, groups.data(), int(groups.size()));
    pool.parallel_for(N, 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) std::memcpy(attn + i * D + hd * d, &oh[size_t(i * d)], size_t(d) * sizeof(float));
    });
  }
}

void SiglipEncoder::validate(const EncoderImage& image, const std::string& where) const {
  const SiglipConfig& c = cfg_;
  const int64_t side = c.side(), S = c.image_size;
  auto bad = [&](const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, "vision encoder: " + where + msg); };
  const int t = image.t, h = image.h, w = image.w;
  if (t != 1 || h != side || w != side)
    bad("grid (" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(w) + ") is not one image of (1, " +
        std::to_string(side) + ", " + std::to_string(side) + ") patches");
  if (image.num_values != c.pixel_values())
    bad(std::to_string(image.num_values) + " pixel values, the model takes " + std::to_string(c.pixel_values()) + " (" +
        std::to_string(c.num_channels) + " x " + std::to_string(S) + " x " + std::to_string(S) + ")");
  if (!image.pixel_values) bad("no pixel values");
}

std::vector<float> SiglipEncoder::encode(const float* pixel_values, int64_t num_values, int t, int h, int w) const {
  std::vector<std::vector<float>> out = encode_batch({EncoderImage{pixel_values, num_values, t, h, w}});
  return std::move(out[0]);
}

void SiglipEncoder::check_batch(const std::vector<EncoderImage>& images) const {
  const size_t n_img = images.size();
  for (size_t i = 0; i < n_img; i++) validate(images[i], n_img > 1 ? "image " + std::to_string(i) + ": " : "");
}

std::vector<std::vector<float>> SiglipEncoder::encode_batch(const std::vector<EncoderImage>& images) const {
  const size_t n_img = images.size();
  check_batch(images);
  std::vector<std::vector<float>> outs(n_img);
  if (n_img == 0) return outs;

  const SiglipConfig& c = cfg_;
  const int64_t side = c.side(), N = c.num_patches(), D = c.hidden, I = c.intermediate, P = c.patch, S = c.image_size;
  const int64_t B = int64_t(n_img), R = B * N;  // image i owns patch rows [i * N, (i + 1) * N)
  std::lock_guard<std::mutex> lock(mu_);
  cpu::ThreadPool& pool = *pool_;
  const int64_t pd = c.patch_dim();

  // Patch embedding: the Conv2d (stride = kernel) as a matmul over each patch's [channel, y, x].
  std::vector<float> x(size_t(R * D));  // [R, D] the residual stream, each image's patches row-major
  {
    std::vector<float> px(size_t(R * pd));  // [R, patch_dim]
    pool.parallel_for(R, 16, [&](int64_t b, int64_t e) {
      for (int64_t gi = b; gi < e; gi++) {
        const float* pixel_values = images[size_t(gi / N)].pixel_values;
        const int64_t i = gi % N, r = i / side, col = i % side;
        float* dst = &px[size_t(gi * pd)];
        for (int64_t ch = 0; ch < c.num_channels; ch++)
          for (int64_t y = 0; y < P; y++)
            std::memcpy(dst + (ch * P + y) * P, pixel_values + (ch * S + r * P + y) * S + col * P, size_t(P) * sizeof(float));
      }
    });
    cpu::matmul(pool, px.data(), R, pd, patch_w_->data, patch_w_->dtype, D, patch_b_->data, patch_b_->dtype, x.data());
    for (int64_t i = 0; i < B; i++) cpu::add_inplace(pool, x.data() + i * N * D, pos_.data(), N * D);
  }

  std::vector<float> hn(size_t(R * D));  // [R, D] normed input of a sub-layer, then its output
  std::vector<float> q(size_t(R * D)), k(size_t(R * D)), v(size_t(R * D));  // [R, D] heads side by side
  std::vector<float> attn(size_t(R * D));  // [R, D]
  std::vector<float> mid(size_t(R * I));   // [R, I] fc1's output
  for (const Block& b : blocks_) {
    layer_norm(x.data(), R, b.norm1, hn.data());
    const cpu::LinearOut qkv[3] = {
        {b.q.w->data, b.q.w->dtype, D, b.q.b->data, b.q.b->dtype, q.data()},
        {b.k.w->data, b.k.w->dtype, D, b.k.b->data, b.k.b->dtype, k.data()},
        {b.v.w->data, b.v.w->dtype, D, b.v.b->data, b.v.b->dtype, v.data()},
    };
    cpu::matmul_multi(pool, hn.data(), R, D, qkv, 3);
    for (int64_t i = 0; i < B; i++) {
      const int64_t o = i * N * D;
      attention(q.data() + o, k.data() + o, v.data() + o, N, attn.data() + o);
    }
    linear(attn.data(), R, D, b.out, D, hn.data());
    cpu::add_inplace(pool, x.data(), hn.data(), R * D);

    layer_norm(x.data(), R, b.norm2, hn.data());
    linear(hn.data(), R, D, b.fc1, I, mid.data());
    pool.parallel_for(R * I, 16384, [&](int64_t beg, int64_t end) {
      const float s2pi = 0.7978845608028654f;  // sqrt(2 / pi)
      for (int64_t i = beg; i < end; i++) {
        const float g = mid[size_t(i)];
        mid[size_t(i)] = 0.5f * g * (1.f + std::tanh(s2pi * (g + 0.044715f * g * g * g)));
      }
    });
    linear(mid.data(), R, I, b.fc2, D, hn.data());
    cpu::add_inplace(pool, x.data(), hn.data(), R * D);
  }
  layer_norm(x.data(), R, post_norm_, hn.data());

  // Projector: per image, average pools of k x k patches (tokens row-major over the pooled grid),
  // Gemma's RMSNorm (x / rms(x) * (1 + w)); then every image's tokens @ mm_input_projection_weight.
  const int64_t kp = c.pool(), out_side = side / kp, T = c.mm_tokens;
  std::vector<float> pooled(size_t(B * T * D));  // [B * mm_tokens, D]
  pool.parallel_for(B * T, 1, [&](int64_t beg, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(D));
    for (int64_t gt = beg; gt < end; gt++) {
      const int64_t img = gt / T, tok = gt % T;
      const float* xs = &hn[size_t(img * N * D)];
      const int64_t r0 = (tok / out_side) * kp, c0 = (tok % out_side) * kp;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t r = r0; r < r0 + kp; r++)
        for (int64_t cc = c0; cc < c0 + kp; cc++) {
          const float* src = xs + (r * side + cc) * D;
          for (int64_t j = 0; j < D; j++) acc[size_t(j)] += src[j];
        }
      double ss = 0;
      for (int64_t j = 0; j < D; j++) {
        acc[size_t(j)] /= double(kp * kp);
        ss += acc[size_t(j)] * acc[size_t(j)];
      }
      const double inv = 1.0 / std::sqrt(ss / double(D) + double(c.eps));
      float* o = &pooled[size_t(gt * D)];
      for (int64_t j = 0; j < D; j++) o[j] = float(acc[size_t(j)] * inv) * soft_norm_[size_t(j)];
    }
  });
  std::vector<float> proj(size_t(B * T * c.text_hidden));  // [B * mm_tokens, text_hidden]
  cpu::matmul(pool, pooled.data(), B * T, D, proj_t_.data(), DType::F32, c.text_hidden, nullptr, DType::F32, proj.data());
  for (int64_t i = 0; i < B; i++)
    outs[size_t(i)].assign(proj.begin() + i * T * c.text_hidden, proj.begin() + (i + 1) * T * c.text_hidden);
  return outs;
}

}  // namespace sluice::vision
