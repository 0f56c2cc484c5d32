#include "model/model_weights.h"

#include <cmath>
#include <cstring>
#include <set>

#include "cpu/thread_pool.h"
#include "model/architectures.h"
#include "model/fp8.h"
#include "model/int_weights.h"
#include "sluice/error.h"

namespace sluice {

namespace {

class Binder {
 public:
  Binder(const SafetensorsModel& st, const ModelConfig& c, const std::string& dir,
         std::vector<std::shared_ptr<HostBuffer>>& owned, bool keep_fp8)
      : st_(st), quant_(c.quantization), dir_(dir), owned_(owned), keep_fp8_(keep_fp8) {}

  // A float tensor (f32, f16 or bf16) of exactly this shape. An FP8 checkpoint's F8E4M3 weight
  // comes back dequantized to bf16 (model/fp8.h), in memory `owned` keeps.
  TensorView get(const std::string& name, std::vector<int64_t> shape) {
    TensorView t = find(name, std::move(shape));
    if (t.dtype == DType::F8E4M3) return dequantized(t);
    if (!is_float_dtype(t.dtype))
      throw Error(ErrorCode::kModelFileInvalid, t.file + ": tensor \"" + name + "\" has dtype " + dtype_name(t.dtype) +
                                                    ", expected f32, f16 or bf16");
    return t;
  }
  // The [out, in] weight of linear module `module`: "<module>.weight" as get() reads it, or, in an
  // AWQ / GPTQ checkpoint, its qweight / qzeros / scales (/ g_idx) repacked (model/int_weights.h).
  // Modules a quantized checkpoint keeps in float (modules_to_not_convert) have ".weight".
  TensorView linear(const std::string& module, int64_t out, int64_t in) {
    if (!has(module + ".qweight")) return get(module + ".weight", {out, in});
    const TensorView& qw = *st_.find(module + ".qweight");
    if (quant_.int_format == IntFormat::None)
      throw Error(ErrorCode::kModelFileInvalid, qw.file + ": tensor \"" + qw.name +
                                                    "\" is packed but config.json has no awq or gptq quantization_config" +
                                                    (quant_.method.empty() ? "" : " (quant_method \"" + quant_.method + "\")"));
    const int64_t per_word = 32 / quant_.bits;
    const bool awq = quant_.int_format == IntFormat::Awq;
    if ((awq && out % 8 != 0) || (!awq && (in % per_word != 0 || out % per_word != 0)))
      throw Error(ErrorCode::kModelFileInvalid,
                  qw.file + ": " + module + " is [" + std::to_string(out) + ", " + std::to_string(in) + "], which " +
                      quant_.method + " with " + std::to_string(quant_.bits) + " bits cannot pack (" +
                      (awq ? "outputs must be a multiple of 8)" : "inputs and outputs must be multiples of " +
                                                                      std::to_string(per_word) + ")"));
    const IntLinearShapes shapes = int_linear_shapes(quant_, out, in);
    IntLinear t;
    t.qweight = typed(module + ".qweight", shapes.qweight, DType::I32);
    t.qzeros = typed(module + ".qzeros", shapes.qzeros, DType::I32);
    t.scales = get(module + ".scales", shapes.scales);
    if (has(module + ".g_idx")) t.g_idx = typed(module + ".g_idx", {in}, DType::I32);
    TensorView w = repack_int_linear(t, quant_, out, in, module + ".weight", owned_, pool());
    // The stored words are read once: their file pages go back now rather than at unload.
    for (const TensorView* stored : {&t.qweight, &t.qzeros, &t.scales, &t.g_idx})
      if (stored->data) release_mapped_pages(stored->data, stored->nbytes);
    dequantized_extra_ += w.nbytes;
    dequantized_extra_ -= t.qweight.nbytes + t.qzeros.nbytes + t.scales.nbytes + (t.g_idx.data ? t.g_idx.nbytes : 0);
    return w;
  }
  // linear(), except that with keep_fp8 an F8E4M3 "<module>.weight" stays the stored codes, its
  // scale tensor in *scale.
  TensorView projection(const std::string& module, int64_t out, int64_t in, TensorView* scale) {
    if (keep_fp8_ && !has(module + ".qweight")) {
      const TensorView t = find(module + ".weight", {out, in});
      if (t.dtype == DType::F8E4M3) {
        *scale = fp8_scale(t);
        return t;
      }
    }
    return linear(module, out, in);
  }
  // A tensor of exactly this shape and dtype.
  TensorView typed(const std::string& name, std::vector<int64_t> shape, DType dtype) {
    TensorView t = find(name, std::move(shape));
    if (t.dtype != dtype)
      throw Error(ErrorCode::kModelFileInvalid, t.file + ": tensor \"" + name + "\" has dtype " + dtype_name(t.dtype) +
                                                    ", expected " + dtype_name(dtype));
    return t;
  }
  // Packed bytes (U8) of exactly this shape.
  TensorView get_packed(const std::string& name, std::vector<int64_t> shape) {
    TensorView t = find(name, std::move(shape));
    if (t.dtype != DType::U8)
      throw Error(ErrorCode::kModelFileInvalid, t.file + ": tensor \"" + name + "\" has dtype " + dtype_name(t.dtype) +
                                                    ", expected u8 (packed)");
    return t;
  }
  TensorView find(const std::string& name, std::vector<int64_t> shape) {
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
  // A layer's fp8 KV cache scale, under the first of `names` the checkpoint has: a one-element
  // float tensor, finite and > 0. Returns false (scale untouched) when it has none.
  bool kv_scale(const std::vector<std::string>& names, float* scale) {
    for (const std::string& name : names) {
      const TensorView* t = st_.find(name);
      if (!t) continue;
      if (t->numel() != 1 || (t->dtype != DType::F32 && t->dtype != DType::BF16 && t->dtype != DType::F16))
        throw Error(ErrorCode::kModelFileInvalid, t->file + ": KV cache scale \"" + name + "\" must be one f32/bf16/f16 " +
                                                      "value, got " + dtype_name(t->dtype) + " " + t->shape_string());
      const float v = t->float_at(0);
      if (!std::isfinite(v) || v <= 0.f)
        throw Error(ErrorCode::kModelFileInvalid, t->file + ": KV cache scale \"" + name + "\" is " +
                                                      std::to_string(v) + "; it must be finite and > 0");
      if (seen_.insert(name).second) bytes_ += t->nbytes;
      *scale = v;
      return true;
    }
    return false;
  }
  // Bytes of the bound tensors as stored, plus what the FP8 dequantized copies add.
  size_t bytes() const { return bytes_ + dequantized_extra_; }
  cpu::ThreadPool& pool() {
    if (!pool_) pool_ = std::make_unique<cpu::ThreadPool>(0);
    return *pool_;
  }

 private:
  // The scale tensor beside a linear weight stored F8_E4M3 ("<name>_scale_inv" for the block-wise
  // fp8 format, "<name>_scale" otherwise), its shape and dtype checked.
  const TensorView& fp8_scale(const TensorView& t) {
    const std::string& name = t.name;
    if (quant_.fp8 == Fp8Scales::None)
      throw Error(ErrorCode::kModelFileInvalid,
                  t.file + ": tensor \"" + name + "\" is F8_E4M3 but config.json has no FP8 quantization_config" +
                      (quant_.method.empty() ? "" : " (quant_method \"" + quant_.method + "\")"));
    if (t.shape.size() != 2)
      throw Error(ErrorCode::kModelFileInvalid, t.file + ": F8_E4M3 tensor \"" + name + "\" has shape " +
                                                    t.shape_string() + "; only linear weights [rows, cols] can be FP8");
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const bool block = quant_.fp8 == Fp8Scales::Block;
    const std::string scale_name = name + (block ? "_scale_inv" : "_scale");
    const TensorView* scale = st_.find(scale_name);
    if (!scale)
      throw Error(ErrorCode::kModelFileInvalid, t.file + ": F8_E4M3 tensor \"" + name + "\" has no scale tensor \"" +
                                                    scale_name + "\" (quant_method \"" + quant_.method + "\")");
    std::vector<std::vector<int64_t>> allowed;
    if (block)
      allowed = {{(rows + quant_.block_rows - 1) / quant_.block_rows, (cols + quant_.block_cols - 1) / quant_.block_cols}};
    else if (quant_.fp8 == Fp8Scales::Channel)
      allowed = {{rows, 1}};
    else
      allowed = {{}, {1}};
    bool fits = false;
    for (const auto& shape : allowed) fits |= scale->shape == shape;
    if (!fits) {
      TensorView want;
      want.shape = allowed.back();
      throw Error(ErrorCode::kModelFileInvalid,
                  scale->file + ": scale tensor \"" + scale_name + "\" has shape " + scale->shape_string() +
                      ", expected " + want.shape_string() + " for " + name + " " + t.shape_string() +
                      (block ? " with weight_block_size [" + std::to_string(quant_.block_rows) + ", " +
                                   std::to_string(quant_.block_cols) + "]"
                             : std::string()));
    }
    if (!is_float_dtype(scale->dtype))
      throw Error(ErrorCode::kModelFileInvalid, scale->file + ": scale tensor \"" + scale_name + "\" has dtype " +
                                                    dtype_name(scale->dtype) + ", expected f32, f16 or bf16");
    if (seen_.insert(scale_name).second) bytes_ += scale->nbytes;
    return *scale;
  }
  // A linear weight stored F8_E4M3 times its scale tensor, as bf16.
  TensorView dequantized(const TensorView& t) {
    const TensorView* scale = &fp8_scale(t);
    TensorView out = dequantize_fp8(t, *scale, quant_, owned_, pool());
    release_mapped_pages(t.data, t.nbytes);  // the codes are read once
    dequantized_extra_ += out.nbytes - t.nbytes - scale->nbytes;
    return out;
  }

  const SafetensorsModel& st_;
  const QuantizationConfig& quant_;
  std::string dir_;
  std::vector<std::shared_ptr<HostBuffer>>& owned_;
  bool keep_fp8_;
  std::unique_ptr<cpu::ThreadPool> pool_;  // made on first use (FP8, AWQ / GPTQ weights, gpt-oss's MXFP4 experts)
  std::set<std::string> seen_;
  size_t bytes_ = 0;
  size_t dequantized_extra_ = 0;
};

// A norm weight as Gemma uses it, (1 + w), made once at load as f32 (what transformers computes
// in), so every backend's RMSNorm stays the plain x / rms(x) * w.
TensorView plus_one(const TensorView& t, std::vector<std::shared_ptr<HostBuffer>>& owned) {
  auto buf = std::make_shared<HostBuffer>(size_t(t.numel()) * sizeof(float), false);
  float* out = reinterpret_cast<float*>(buf->data());
  for (int64_t i = 0; i < t.numel(); i++) {
    out[i] = 1.0f + t.float_at(i);
  }
  TensorView v = t;
  v.dtype = DType::F32;
  v.data = out;
  v.nbytes = size_t(t.numel()) * sizeof(float);
  owned.push_back(std::move(buf));
  return v;
}

// `n` elements of t from `offset`, every `stride`-th, as an f32 tensor made at load.
TensorView f32_copy(const TensorView& t, int64_t offset, int64_t n, int64_t stride,
                    std::vector<std::shared_ptr<HostBuffer>>& owned) {
  auto buf = std::make_shared<HostBuffer>(size_t(n) * sizeof(float), false);
  float* out = reinterpret_cast<float*>(buf->data());
  for (int64_t i = 0; i < n; i++) out[i] = t.float_at(offset + i * stride);
  TensorView v;
  v.name = t.name;
  v.file = t.file;
  v.dtype = DType::F32;
  v.shape = {n};
  v.data = out;
  v.nbytes = size_t(n) * sizeof(float);
  owned.push_back(std::move(buf));
  return v;
}

// MXFP4 (OCP microscaling, as gpt-oss publishes its experts): blocks of 32 FP4 (e2m1) values,
// two per byte (low nibble first), sharing one power-of-two scale byte (e8m0, bias 127).
constexpr float kFp4Values[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// Row `row` of an MXFP4 matrix of `cols` columns into bf16 (exact: 2 significant bits times a
// power of two, in bf16's exponent range except scales past it, which saturate as bf16 does).
void unpack_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, int64_t row, int64_t cols, uint16_t* out) {
  const int64_t nblocks = cols / 32;
  for (int64_t b = 0; b < nblocks; b++) {
    const float scale = std::ldexp(1.0f, int(scales[row * nblocks + b]) - 127);
    const uint8_t* bytes = blocks + (row * nblocks + b) * 16;
    for (int j = 0; j < 16; j++) {
      out[b * 32 + 2 * j] = f32_to_bf16(kFp4Values[bytes[j] & 0xf] * scale);
      out[b * 32 + 2 * j + 1] = f32_to_bf16(kFp4Values[bytes[j] >> 4] * scale);
    }
  }
}

// The experts of a gpt-oss layer: gate_up rows interleaved (gate 0, up 0, gate 1, ...) and down,
// unpacked to bf16 matrices per expert at load; biases split the same way, in f32.
// Returns the bytes the unpacked copies add beyond the packed tensors (what a step reads).
// gpt-oss experts as transformers saves them unquantized (checkpoints re-saved in bf16):
// gate_up_proj [E, H, 2I] and down_proj [E, I, H], input-major; transposed at load into the
// [out, in] matrices the kernels read, in the stored dtype, gate and up de-interleaved.
void bind_gpt_oss_dense_experts(Binder& b, const std::string& x, const ModelConfig& c, LayerWeights& l,
                                std::vector<std::shared_ptr<HostBuffer>>& owned, cpu::ThreadPool& pool) {
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  const TensorView gu = b.get(x + "gate_up_proj", {E, H, 2 * I});
  const TensorView gu_bias = b.get(x + "gate_up_proj_bias", {E, 2 * I});
  const TensorView d = b.get(x + "down_proj", {E, I, H});
  const TensorView d_bias = b.get(x + "down_proj_bias", {E, H});
  const size_t gsz = dtype_size(gu.dtype), dsz = dtype_size(d.dtype);
  auto gbuf = std::make_shared<HostBuffer>(size_t(E * 2 * I * H) * gsz);
  auto dbuf = std::make_shared<HostBuffer>(size_t(E * H * I) * dsz);
  const auto* gsrc = static_cast<const uint8_t*>(gu.data);
  const auto* dsrc = static_cast<const uint8_t*>(d.data);
  pool.parallel_for(E, 1, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; e++) {
      uint8_t* gate = gbuf->data() + size_t(e * 2 * I * H) * gsz;  // [I, H], then up [I, H]
      for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < 2 * I; j++) {
          const int64_t row = (j % 2) * I + j / 2;  // gate rows first, then up
          std::memcpy(gate + size_t(row * H + h) * gsz, gsrc + size_t((e * H + h) * 2 * I + j) * gsz, gsz);
        }
      uint8_t* down = dbuf->data() + size_t(e * H * I) * dsz;  // [H, I]
      for (int64_t i = 0; i < I; i++)
        for (int64_t h = 0; h < H; h++)
          std::memcpy(down + size_t(h * I + i) * dsz, dsrc + size_t((e * I + i) * H + h) * dsz, dsz);
    }
  });
  const auto view = [&](const TensorView& from, uint8_t* data, int64_t rows, int64_t cols, const std::string& name) {
    TensorView v;
    v.name = name;
    v.file = from.file;
    v.dtype = from.dtype;
    v.shape = {rows, cols};
    v.data = data;
    v.nbytes = size_t(rows * cols) * dtype_size(from.dtype);
    return v;
  };
  l.experts.resize(size_t(E));
  for (int64_t e = 0; e < E; e++) {
    ExpertWeights& ew = l.experts[size_t(e)];
    const std::string n = x + std::to_string(e);
    uint8_t* gate = gbuf->data() + size_t(e * 2 * I * H) * gsz;
    ew.gate = view(gu, gate, I, H, n + ".gate");
    ew.up = view(gu, gate + size_t(I * H) * gsz, I, H, n + ".up");
    ew.down = view(d, dbuf->data() + size_t(e * H * I) * dsz, H, I, n + ".down");
    ew.gate_bias = f32_copy(gu_bias, e * 2 * I, I, 2, owned);
    ew.up_bias = f32_copy(gu_bias, e * 2 * I + 1, I, 2, owned);
    ew.down_bias = f32_copy(d_bias, e * H, H, 1, owned);
  }
  owned.push_back(std::move(gbuf));
  owned.push_back(std::move(dbuf));
}

size_t bind_gpt_oss_experts(Binder& b, const std::string& m, const ModelConfig& c, LayerWeights& l,
                            std::vector<std::shared_ptr<HostBuffer>>& owned, cpu::ThreadPool& pool) {
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  const std::string x = m + "experts.";
  if (!b.has(x + "gate_up_proj_blocks") && b.has(x + "gate_up_proj")) {
    bind_gpt_oss_dense_experts(b, x, c, l, owned, pool);
    return 0;  // the copies replace the stored tensors byte for byte
  }
  const TensorView gu_blocks = b.get_packed(x + "gate_up_proj_blocks", {E, 2 * I, H / 32, 16});
  const TensorView gu_scales = b.get_packed(x + "gate_up_proj_scales", {E, 2 * I, H / 32});
  const TensorView gu_bias = b.get(x + "gate_up_proj_bias", {E, 2 * I});
  const TensorView d_blocks = b.get_packed(x + "down_proj_blocks", {E, H, I / 32, 16});
  const TensorView d_scales = b.get_packed(x + "down_proj_scales", {E, H, I / 32});
  const TensorView d_bias = b.get(x + "down_proj_bias", {E, H});
  const size_t per_expert = size_t(3 * I * H);
  auto buf = std::make_shared<HostBuffer>(size_t(E) * per_expert * sizeof(uint16_t));
  uint16_t* base = reinterpret_cast<uint16_t*>(buf->data());
  const auto* gub = static_cast<const uint8_t*>(gu_blocks.data);
  const auto* gus = static_cast<const uint8_t*>(gu_scales.data);
  const auto* db = static_cast<const uint8_t*>(d_blocks.data);
  const auto* ds = static_cast<const uint8_t*>(d_scales.data);
  const auto view = [&](uint16_t* data, int64_t rows, int64_t cols, const std::string& name) {
    TensorView v;
    v.name = name;
    v.file = gu_blocks.file;
    v.dtype = DType::BF16;
    v.shape = {rows, cols};
    v.data = data;
    v.nbytes = size_t(rows * cols) * sizeof(uint16_t);
    return v;
  };
  l.experts.resize(size_t(E));
  // Unpacking is the bulk of loading a gpt-oss checkpoint (20b: 19 billion values): every core.
  pool.parallel_for(E, 1, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; e++) {
      uint16_t* gate = base + size_t(e) * per_expert;
      uint16_t* up = gate + I * H;
      uint16_t* down = up + I * H;
      for (int64_t r = 0; r < I; r++) {
        unpack_mxfp4_row(gub, gus, e * 2 * I + 2 * r, H, gate + r * H);
        unpack_mxfp4_row(gub, gus, e * 2 * I + 2 * r + 1, H, up + r * H);
      }
      for (int64_t r = 0; r < H; r++) unpack_mxfp4_row(db, ds, e * H + r, I, down + r * I);
    }
  });
  for (int64_t e = 0; e < E; e++) {
    uint16_t* gate = base + size_t(e) * per_expert;
    uint16_t* up = gate + I * H;
    uint16_t* down = up + I * H;
    ExpertWeights& ew = l.experts[size_t(e)];
    const std::string n = x + std::to_string(e);
    ew.gate = view(gate, I, H, n + ".gate");
    ew.up = view(up, I, H, n + ".up");
    ew.down = view(down, H, I, n + ".down");
    ew.gate_bias = f32_copy(gu_bias, e * 2 * I, I, 2, owned);
    ew.up_bias = f32_copy(gu_bias, e * 2 * I + 1, I, 2, owned);
    ew.down_bias = f32_copy(d_bias, e * H, H, 1, owned);
  }
  owned.push_back(std::move(buf));
  const size_t packed = gu_blocks.nbytes + gu_scales.nbytes + d_blocks.nbytes + d_scales.nbytes;
  return size_t(E) * per_expert * sizeof(uint16_t) - packed;
}

}  // namespace

ModelWeights bind_weights(const SafetensorsModel& st, const ModelConfig& c, const std::string& dir, bool keep_fp8) {
  ModelWeights w;
  Binder b(st, c, dir, w.owned, keep_fp8);
  const ArchSpec* arch = find_architecture(c.architecture, c.model_type);
  if (!arch) throw Error(ErrorCode::kUnsupportedModel, dir + ": unsupported architecture " + c.architecture);
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t q_out = c.num_heads * hd, kv_out = c.num_kv_heads * hd;
  const std::string root = arch->prefix;  // "model." or "language_model.model."
  // lm_head sits beside the decoder: "lm_head.weight", or "language_model.lm_head.weight".
  const std::string head = root.substr(0, root.size() - std::string("model.").size()) + "lm_head.weight";
  const auto norm = [&](const std::string& name, int64_t n) {
    TensorView t = b.get(name, {n});
    return c.norm_plus_one ? plus_one(t, w.owned) : t;
  };
  w.embed = b.get(root + "embed_tokens.weight", {c.vocab_size, H});
  w.final_norm = norm(root + "norm.weight", H);
  // Tied checkpoints usually omit lm_head; when one ships it anyway, it is used as is.
  if (b.has(head) || !c.tie_word_embeddings) w.lm_head = b.get(head, {c.vocab_size, H});
  else w.lm_head = w.embed;

  w.layers.resize(size_t(c.num_layers));
  size_t unpacked_extra = 0;
  for (int64_t i = 0; i < c.num_layers; i++) {
    const std::string p = root + "layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[size_t(i)];
    l.input_norm = norm(p + "input_layernorm.weight", H);
    l.q = b.projection(p + "self_attn.q_proj", q_out, H, &l.fp8_scale.q);
    l.k = b.projection(p + "self_attn.k_proj", kv_out, H, &l.fp8_scale.k);
    l.v = b.projection(p + "self_attn.v_proj", kv_out, H, &l.fp8_scale.v);
    l.o = b.projection(p + "self_attn.o_proj", H, q_out, &l.fp8_scale.o);
    if (c.qkv_bias) {
      l.q_bias = b.get(p + "self_attn.q_proj.bias", {q_out});
      l.k_bias = b.get(p + "self_attn.k_proj.bias", {kv_out});
      l.v_bias = b.get(p + "self_attn.v_proj.bias", {kv_out});
    }
    if (c.o_bias) l.o_bias = b.get(p + "self_attn.o_proj.bias", {H});
    // fp8 KV cache scales as the published formats name them: llm-compressor's compressed-tensors
    // (self_attn.k_scale), NVIDIA ModelOpt (k_proj.k_scale), and older exports' one kv_scale.
    {
      const std::string a = p + "self_attn.";
      const bool k = b.kv_scale({a + "k_scale", a + "k_proj.k_scale", a + "kv_scale"}, &l.k_scale);
      const bool v = b.kv_scale({a + "v_scale", a + "v_proj.v_scale", a + "kv_scale"}, &l.v_scale);
      if (k != v)
        throw Error(ErrorCode::kModelFileInvalid, dir + ": layer " + std::to_string(i) + " has a " + (k ? "k" : "v") +
                                                      " KV cache scale but no " + (k ? "v" : "k") + " scale");
      l.kv_scales_from_checkpoint = k;
    }
    if (c.attention_sinks) {
      const TensorView sinks = b.get(p + "self_attn.sinks", {c.num_heads});
      l.sinks = f32_copy(sinks, 0, c.num_heads, 1, w.owned);
    }
    if (c.qk_norm) {
      l.q_norm = norm(p + "self_attn.q_norm.weight", hd);
      l.k_norm = norm(p + "self_attn.k_norm.weight", hd);
    }
    if (c.sandwich_norms) {
      l.attn_out_norm = norm(p + "post_attention_layernorm.weight", H);
      l.post_norm = norm(p + "pre_feedforward_layernorm.weight", H);
      l.mlp_out_norm = norm(p + "post_feedforward_layernorm.weight", H);
    } else {
      l.post_norm = norm(p + "post_attention_layernorm.weight", H);
    }
    if (c.is_sparse(i) && arch->mlp == MlpLayout::kGptOss) {
      l.router = b.get(p + "mlp.router.weight", {c.num_experts, H});
      l.router_bias = f32_copy(b.get(p + "mlp.router.bias", {c.num_experts}), 0, c.num_experts, 1, w.owned);
      unpacked_extra += bind_gpt_oss_experts(b, p + "mlp.", c, l, w.owned, b.pool());
      continue;
    }
    if (c.is_sparse(i)) {
      const int64_t E = c.num_experts, MI = c.moe_intermediate_size;
      const bool mixtral = arch->mlp == MlpLayout::kMixtral;
      const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
      l.router = b.get(m + "gate.weight", {E, H});
      l.experts.resize(size_t(E));
      for (int64_t e = 0; e < E; e++) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        ExpertWeights& ew = l.experts[size_t(e)];
        ew.gate = b.linear(x + (mixtral ? "w1" : "gate_proj"), MI, H);
        ew.up = b.linear(x + (mixtral ? "w3" : "up_proj"), MI, H);
        ew.down = b.linear(x + (mixtral ? "w2" : "down_proj"), H, MI);
      }
      continue;
    }
    l.gate = b.projection(p + "mlp.gate_proj", I, H, &l.fp8_scale.gate);
    l.up = b.projection(p + "mlp.up_proj", I, H, &l.fp8_scale.up);
    l.down = b.projection(p + "mlp.down_proj", H, I, &l.fp8_scale.down);
    if (c.mlp_bias) {
      l.gate_bias = b.get(p + "mlp.gate_proj.bias", {I});
      l.up_bias = b.get(p + "mlp.up_proj.bias", {I});
      l.down_bias = b.get(p + "mlp.down_proj.bias", {H});
    }
  }
  w.total_bytes = b.bytes() + unpacked_extra;
  w.main_dtype = w.layers.empty() ? w.embed.dtype : w.layers[0].q.dtype;
  return w;
}

std::vector<TensorView*> streamed_matrices(ModelWeights& w) {
  std::vector<TensorView*> out;
  for (LayerWeights& l : w.layers) {
    for (TensorView* t : {&l.q, &l.k, &l.v, &l.o}) out.push_back(t);
    if (l.experts.empty()) {
      for (TensorView* t : {&l.gate, &l.up, &l.down}) out.push_back(t);
    } else {
      out.push_back(&l.router);
      for (ExpertWeights& e : l.experts)
        for (TensorView* t : {&e.gate, &e.up, &e.down}) out.push_back(t);
    }
  }
  out.push_back(&w.lm_head);
  return out;
}

}  // namespace sluice
