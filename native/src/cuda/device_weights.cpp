#include "cuda/device_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "cpu/gemm_q4.h"
#include "cuda/check.h"
#include "cuda/fp8_gemm.h"
#include "model/fp8.h"
#include "model/quantize.h"

namespace sluice::cuda {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::allocate(size_t bytes, cudaStream_t stream) {
  release();
  if (bytes == 0) return;
  SLUICE_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  bytes_ = bytes;
  SLUICE_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes, stream));
}

void DeviceBuffer::release() {
  if (ptr_) cudaFree(ptr_);  // NOTE: unchecked: runs in destructors, possibly during unwinding
  ptr_ = nullptr;
  bytes_ = 0;
}

namespace {

// Element i of a tensor as E's 16-bit pattern: the stored bits when the dtype matches, else
// converted through f32 (f32 -> bf16 or f16 rounds to nearest even).
uint16_t element_bits(const TensorView& t, int64_t i, DType e) {
  if (t.dtype == e) return static_cast<const uint16_t*>(t.data)[i];
  float f;
  switch (t.dtype) {
    case DType::F32: f = static_cast<const float*>(t.data)[i]; break;
    case DType::BF16: f = bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]); break;
    default: f = f16_to_f32(static_cast<const uint16_t*>(t.data)[i]); break;
  }
  return e == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f);
}

float element_f32(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return static_cast<const float*>(t.data)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
  }
}

// Builds matrices row by row in host memory, then uploads each in one copy.
class Packer {
 public:
  Packer(DType e, size_t* total) : e_(e), total_(total) {}

  // Starts a [rows, ld] matrix (zero padded).
  void begin(int64_t rows, int64_t ld) {
    rows_ = rows;
    ld_ = ld;
    host_.assign(size_t(rows * ld), 0);
  }
  // Copies source row `src_row` of `t` ([*, cols]) to destination row `dst_row`.
  void row(const TensorView& t, int64_t src_row, int64_t dst_row) {
    const int64_t cols = t.shape[1];
    uint16_t* dst = host_.data() + dst_row * ld_;
    if (t.dtype == e_) {
      std::memcpy(dst, static_cast<const uint16_t*>(t.data) + src_row * cols, size_t(cols) * 2);
    } else {
      for (int64_t c = 0; c < cols; c++) dst[c] = element_bits(t, src_row * cols + c, e_);
    }
  }
  void rows(const TensorView& t, int64_t dst_row0) {
    for (int64_t r = 0; r < t.shape[0]; r++) row(t, r, dst_row0 + r);
  }
  // gate and up ([I, cols] each) as the gated epilogue reads them, from destination row dst_row0:
  // fused row r of group j = r / 16 is gate row 8j + r % 16 for r % 16 < 8, else up row 8j + r % 16 - 8.
  void gate_up_rows(const TensorView& gate, const TensorView& up, int64_t dst_row0) {
    for (int64_t i = 0; i < gate.shape[0]; i++) {
      row(gate, i, dst_row0 + (i / 8) * 16 + i % 8);
      row(up, i, dst_row0 + (i / 8) * 16 + 8 + i % 8);
    }
  }
  DeviceBuffer finish() {
    DeviceBuffer b(host_.size() * 2);
    SLUICE_CUDA_CHECK(cudaMemcpy(b.get(), host_.data(), host_.size() * 2, cudaMemcpyHostToDevice));
    *total_ += b.bytes();
    return b;
  }

 private:
  DType e_;
  size_t* total_;
  int64_t rows_ = 0, ld_ = 0;
  std::vector<uint16_t> host_;
};


std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); i++) out[size_t(i)] = element_f32(t, i);
  return out;
}

// Gate and up biases ([I] each) in the gated epilogue's interleaved order, into out[at ..].
void interleave_gate_up_bias(const TensorView& gate_b, const TensorView& up_b, int64_t I, std::vector<float>& out,
                             size_t at) {
  const std::vector<float> gb = to_f32(gate_b), ub = to_f32(up_b);
  for (int64_t i = 0; i < I; i++) {
    out[at + size_t((i / 8) * 16 + i % 8)] = gb[size_t(i)];
    out[at + size_t((i / 8) * 16 + 8 + i % 8)] = ub[size_t(i)];
  }
}

// A Q4 matrix [rows, cols] (the host buffer of gemm_q4.h) copied to the device.
DeviceQ4 upload_q4(const TensorView& t, int64_t rows, int64_t cols, size_t* total) {
  const auto* h = static_cast<const cpu::Q4Header*>(t.data);
  if (h->N != rows || h->K != cols)
    throw Error(ErrorCode::kInternal, "Q4 weight \"" + t.name + "\" is [" + std::to_string(h->N) + ", " +
                                          std::to_string(h->K) + "], expected [" + std::to_string(rows) + ", " +
                                          std::to_string(cols) + "]");
  DeviceQ4 d;
  d.buf.allocate(q4_device_bytes(t.data));
  d.w = q4_upload(t.data, d.buf.get());
  *total += d.buf.bytes();
  return d;
}

// One F8E4M3 matrix of an FP8 matrix on the device: its row r lands at destination row dst(r).
struct Fp8Part {
  const TensorView* w;      // [rows, K] e4m3 codes
  const TensorView* scale;  // as QuantizationConfig::fp8 shapes it
  std::function<int64_t(int64_t)> dst;
};

// F8E4M3 parts packed as DeviceFp8 [rows, ld]: codes copied (zero past K and in rows no part
// fills), scales expanded per destination row (per tensor and per channel: Channel; block-wise,
// 128 columns wide: Block with one row per block row).
DeviceFp8 upload_fp8(int64_t rows, int64_t K, const QuantizationConfig& q, const std::vector<Fp8Part>& parts,
                     size_t* total) {
  DeviceFp8 d;
  const bool block = q.fp8 == Fp8Scales::Block;
  const int64_t ld = (K + 31) / 32 * 32, scale_cols = block ? (K + kFp8BlockCols - 1) / kFp8BlockCols : 1;
  d.ld = int(ld);
  d.scales = block ? Fp8Scales::Block : Fp8Scales::Channel;
  std::vector<uint8_t> codes(size_t(rows * ld), 0);
  std::vector<float> scale(size_t(rows * scale_cols), 0.f);
  for (const Fp8Part& p : parts) {
    const TensorView& w = *p.w;
    if (w.dtype != DType::F8E4M3 || w.shape.size() != 2 || w.shape[1] != K)
      throw Error(ErrorCode::kInternal, "FP8 weight \"" + w.name + "\" is " + dtype_name(w.dtype) + " " +
                                            w.shape_string() + ", expected f8_e4m3 with " + std::to_string(K) +
                                            " columns");
    const auto* src = static_cast<const uint8_t*>(w.data);
    for (int64_t r = 0; r < w.shape[0]; r++) {
      const int64_t to = p.dst(r);
      const uint8_t* row = src + r * K;
      for (int64_t k = 0; k < K; k++)
        if (e4m3_is_nan(row[k]))
          throw Error(ErrorCode::kModelFileInvalid, w.file + ": tensor \"" + w.name +
                                                        "\" holds a NaN e4m3 code at row " + std::to_string(r) +
                                                        ", column " + std::to_string(k));
      std::memcpy(codes.data() + to * ld, row, size_t(K));
      for (int64_t j = 0; j < scale_cols; j++) {
        // Per tensor: [] or [1]; per channel: [rows, 1]; block-wise: [ceil(rows / block_rows), scale_cols].
        const int64_t at = block ? (r / q.block_rows) * scale_cols + j : q.fp8 == Fp8Scales::Channel ? r : 0;
        scale[size_t(to * scale_cols + j)] = element_f32(*p.scale, at);
      }
    }
  }
  d.codes.allocate(codes.size());
  SLUICE_CUDA_CHECK(cudaMemcpy(d.codes.get(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
  d.scale.allocate(scale.size() * sizeof(float));
  SLUICE_CUDA_CHECK(cudaMemcpy(d.scale.get(), scale.data(), scale.size() * sizeof(float), cudaMemcpyHostToDevice));
  *total += d.codes.bytes() + d.scale.bytes();
  return d;
}

// Whether this model's kept FP8 projections run as FP8 here: the device has the e4m3 MMA, block
// scales (if any) are 128 columns wide as fp8_gemm applies them, and SLUICE_CUDA_FP8 is not "0".
bool fp8_on_device(const QuantizationConfig& q) {
  if (const char* env = std::getenv("SLUICE_CUDA_FP8"); env && std::string(env) == "0") return false;
  if (q.fp8 == Fp8Scales::Block && q.block_cols != kFp8BlockCols) return false;
  return q.fp8 != Fp8Scales::None && fp8_gemm_supported();
}

// A sparse layer's router and experts, every expert at the same stride.
void upload_experts(const ModelConfig& c, const LayerWeights& lw, const DeviceWeights& d, Packer& pk, DeviceLayer& dl,
                    size_t* total) {
  const int64_t E = c.num_experts, H = c.hidden_size, MI = c.moe_intermediate_size, mip = d.moe_inter_pad;
  pk.begin(E, d.ld_h);
  pk.rows(lw.router, 0);
  dl.router_w = pk.finish();
  if (c.router_bias) dl.router_b = upload_f32(to_f32(lw.router_bias), total);
  pk.begin(E * 2 * mip, d.ld_h);
  for (int64_t e = 0; e < E; e++) pk.gate_up_rows(lw.experts[size_t(e)].gate, lw.experts[size_t(e)].up, e * 2 * mip);
  dl.experts_gate_up_w = pk.finish();
  pk.begin(E * H, mip);
  for (int64_t e = 0; e < E; e++) pk.rows(lw.experts[size_t(e)].down, e * H);
  dl.experts_down_w = pk.finish();
  if (c.expert_bias) {
    std::vector<float> gu(size_t(E * 2 * mip), 0.f), down;
    down.reserve(size_t(E * H));
    for (int64_t e = 0; e < E; e++) {
      const ExpertWeights& ew = lw.experts[size_t(e)];
      interleave_gate_up_bias(ew.gate_bias, ew.up_bias, MI, gu, size_t(e * 2 * mip));
      const std::vector<float> db = to_f32(ew.down_bias);
      down.insert(down.end(), db.begin(), db.end());
    }
    dl.experts_gate_up_b = upload_f32(gu, total);
    dl.experts_down_b = upload_f32(down, total);
  }
}

}  // namespace

DeviceBuffer upload_f32(const std::vector<float>& host, size_t* total) {
  DeviceBuffer b(host.size() * sizeof(float));
  SLUICE_CUDA_CHECK(cudaMemcpy(b.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  *total += b.bytes();
  return b;
}

DeviceWeights upload_weights(const ModelConfig& c, const ModelWeights& stored) {
  // FP8 projections the device cannot run as stored (or that are not kept whole per layer) become
  // bf16 first, in a copy of the views.
  const ModelWeights* src = &stored;
  ModelWeights converted;
  const auto has_fp8 = [](const LayerWeights& l) {
    for (const TensorView* t : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
      if (t->dtype == DType::F8E4M3) return true;
    return false;
  };
  if (std::any_of(stored.layers.begin(), stored.layers.end(), has_fp8)) {
    converted = stored;
    dequantize_fp8_weights(converted, c.quantization, 0, fp8_on_device(c.quantization));
    src = &converted;
  }
  const ModelWeights& w = *src;
  DeviceWeights d;
  d.dtype = w.main_dtype == DType::F16 ? DType::F16 : DType::BF16;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t q_rows = c.num_heads * hd, kv_rows = c.num_kv_heads * hd;
  d.ld_h = round_up8(H);
  d.ld_attn = round_up8(q_rows);
  d.inter_pad = round_up8(I);
  d.qkv_rows = q_rows + 2 * kv_rows;
  d.moe_inter_pad = c.num_experts > 0 ? round_up8(c.moe_intermediate_size) : 0;
  Packer pk(d.dtype, &d.bytes);

  pk.begin(c.vocab_size, d.ld_h);
  pk.rows(w.embed, 0);
  d.embed = pk.finish();
  if (w.lm_head.data != w.embed.data) {
    pk.begin(c.vocab_size, d.ld_h);
    pk.rows(w.lm_head, 0);
    d.lm_head = pk.finish();
  }
  d.final_norm = upload_f32(to_f32(w.final_norm), &d.bytes);
  d.inv_freq = upload_f32(c.rope_inv_freq(), &d.bytes);
  if (c.any_local_rope()) d.local_inv_freq = upload_f32(c.rope_local_inv_freq(), &d.bytes);

  d.layers.resize(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; l++) {
    const LayerWeights& lw = w.layers[size_t(l)];
    DeviceLayer& dl = d.layers[size_t(l)];
    dl.q4_attn = lw.q.dtype == DType::Q4;  // the engine keeps all four Q4 or none
    dl.fp8_attn = lw.q.dtype == DType::F8E4M3;  // dequantize_fp8_weights keeps all four or none
    if (dl.fp8_attn) {
      const LayerWeights::Fp8ScaleViews& s = lw.fp8_scale;
      dl.fp8_qkv = upload_fp8(d.qkv_rows, H, c.quantization,
                              {{&lw.q, &s.q, [](int64_t r) { return r; }},
                               {&lw.k, &s.k, [&](int64_t r) { return q_rows + r; }},
                               {&lw.v, &s.v, [&](int64_t r) { return q_rows + kv_rows + r; }}},
                              &d.bytes);
      dl.fp8_o = upload_fp8(H, q_rows, c.quantization, {{&lw.o, &s.o, [](int64_t r) { return r; }}}, &d.bytes);
      d.any_fp8_attn = true;
      d.fp8_scales = dl.fp8_qkv.scales;
    } else if (dl.q4_attn) {
      dl.q4_q = upload_q4(lw.q, q_rows, H, &d.bytes);
      dl.q4_k = upload_q4(lw.k, kv_rows, H, &d.bytes);
      dl.q4_v = upload_q4(lw.v, kv_rows, H, &d.bytes);
      dl.q4_o = upload_q4(lw.o, H, q_rows, &d.bytes);
      d.any_q4_attn = true;
    } else {
      pk.begin(d.qkv_rows, d.ld_h);
      pk.rows(lw.q, 0);
      pk.rows(lw.k, q_rows);
      pk.rows(lw.v, q_rows + kv_rows);
      dl.qkv_w = pk.finish();
    }
    if (c.qkv_bias) {
      std::vector<float> b = to_f32(lw.q_bias), kb = to_f32(lw.k_bias), vb = to_f32(lw.v_bias);
      b.insert(b.end(), kb.begin(), kb.end());
      b.insert(b.end(), vb.begin(), vb.end());
      dl.qkv_b = upload_f32(b, &d.bytes);
    }
    if (!dl.q4_attn && !dl.fp8_attn) {
      pk.begin(H, d.ld_attn);
      pk.rows(lw.o, 0);
      dl.o_w = pk.finish();
    }
    if (c.o_bias) dl.o_b = upload_f32(to_f32(lw.o_bias), &d.bytes);

    if (c.is_sparse(l)) {
      upload_experts(c, lw, d, pk, dl, &d.bytes);
    } else {
      dl.q4_mlp = lw.gate.dtype == DType::Q4;  // the engine keeps all three Q4 or none
      dl.fp8_mlp = lw.gate.dtype == DType::F8E4M3;  // dequantize_fp8_weights keeps all three or none
      if (dl.fp8_mlp) {
        // gate and up interleaved in 16-row groups [gate 8 | up 8], as Packer::gate_up_rows.
        const LayerWeights::Fp8ScaleViews& s = lw.fp8_scale;
        dl.fp8_gate_up = upload_fp8(2 * d.inter_pad, H, c.quantization,
                                    {{&lw.gate, &s.gate, [](int64_t i) { return (i / 8) * 16 + i % 8; }},
                                     {&lw.up, &s.up, [](int64_t i) { return (i / 8) * 16 + 8 + i % 8; }}},
                                    &d.bytes);
        dl.fp8_down = upload_fp8(H, I, c.quantization, {{&lw.down, &s.down, [](int64_t r) { return r; }}}, &d.bytes);
        d.any_fp8_mlp = true;
        d.fp8_scales = dl.fp8_gate_up.scales;
      } else if (dl.q4_mlp) {
        dl.q4_gate = upload_q4(lw.gate, I, H, &d.bytes);
        dl.q4_up = upload_q4(lw.up, I, H, &d.bytes);
        dl.q4_down = upload_q4(lw.down, H, I, &d.bytes);
        d.any_q4_mlp = true;
      } else {
        pk.begin(2 * d.inter_pad, d.ld_h);
        pk.gate_up_rows(lw.gate, lw.up, 0);
        dl.gate_up_w = pk.finish();
      }
      if (c.mlp_bias) {
        std::vector<float> b(size_t(2 * d.inter_pad), 0.f);
        interleave_gate_up_bias(lw.gate_bias, lw.up_bias, I, b, 0);
        dl.gate_up_b = upload_f32(b, &d.bytes);
        dl.down_b = upload_f32(to_f32(lw.down_bias), &d.bytes);
        if (dl.q4_mlp) {
          dl.gate_b = upload_f32(to_f32(lw.gate_bias), &d.bytes);
          dl.up_b = upload_f32(to_f32(lw.up_bias), &d.bytes);
        }
      }
      if (!dl.q4_mlp && !dl.fp8_mlp) {
        pk.begin(H, d.inter_pad);
        pk.rows(lw.down, 0);
        dl.down_w = pk.finish();
      }
    }

    dl.input_norm = upload_f32(to_f32(lw.input_norm), &d.bytes);
    dl.post_norm = upload_f32(to_f32(lw.post_norm), &d.bytes);
    if (c.sandwich_norms) {
      dl.attn_out_norm = upload_f32(to_f32(lw.attn_out_norm), &d.bytes);
      dl.mlp_out_norm = upload_f32(to_f32(lw.mlp_out_norm), &d.bytes);
    }
    if (c.attention_sinks) dl.sinks = upload_f32(to_f32(lw.sinks), &d.bytes);
    if (c.qk_norm) {
      dl.q_norm = upload_f32(to_f32(lw.q_norm), &d.bytes);
      dl.k_norm = upload_f32(to_f32(lw.k_norm), &d.bytes);
    }
  }
  return d;
}

}  // namespace sluice::cuda
