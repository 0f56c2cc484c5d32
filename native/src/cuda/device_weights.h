// The model's weights on the GPU, uploaded once from the memory map and laid out for the CUDA
// kernels: q/k/v fused into one matrix, gate/up fused and interleaved in 16-row groups (for the
// GEMM's SiLU-and-mul epilogue), rows padded to multiples of 8 elements (16-byte loads), biases
// and norm weights in f32. Matrices keep the checkpoint's dtype (bf16 or f16); f32 checkpoints
// are rounded to bf16 (round to nearest even). Mixture-of-experts layers keep every expert's
// matrices in one allocation (expert e at e * stride), laid out as the dense ones; gpt-oss's
// MXFP4 experts arrive here already unpacked to bf16 by the weight binder. AWQ / GPTQ projections
// that arrive as Q4 (engine: dequantize_packed_weights keeps a layer's attention or dense MLP
// projections Q4 when all of them are) stay 4-bit: copied as stored, read by q4_gemm.h's kernels.
// FP8 checkpoints' projections that arrive as F8E4M3 (bind_weights' keep_fp8) stay e4m3 for
// fp8_gemm.h where the device has the e4m3 MMA and block scales are 128 columns wide (a layer's
// q/k/v/o when all four are, a dense layer's gate/up/down when all three are); otherwise they are
// dequantized to bf16 here, as the CPU backend gets them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/q4_gemm.h"
#include "model/model_weights.h"
#include "sluice/dtype.h"
#include "sluice/model_config.h"

namespace sluice::cuda {

inline int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }

// Owns one cudaMalloc'd allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { allocate(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Frees what it held; zero-filled by a memset queued on `stream`, so that work the owner
  // queues on that stream afterwards (a non-blocking stream does not wait for the legacy one)
  // never sees the fill land after its own writes.
  void allocate(size_t bytes, cudaStream_t stream = nullptr);
  void release();
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// One Q4 matrix (AWQ / GPTQ 4-bit) on the device: the host Q4 buffer copied byte for byte, and
// the kernels' view of it (q4_gemm.h).
struct DeviceQ4 {
  DeviceBuffer buf;
  Q4DeviceWeights w;
};

// One FP8 matrix on the device, laid out for fp8_gemm: e4m3 codes [rows, ld] (ld = K rounded up
// to 32; zero codes past K and in padding rows) and f32 scales per row: Channel [rows], or Block
// [rows, ceil(K / 128)] (w_block_rows 1). Padding rows have scale 0.
struct DeviceFp8 {
  DeviceBuffer codes;
  DeviceBuffer scale;
  Fp8Scales scales = Fp8Scales::Channel;
  int ld = 0;
};

struct DeviceLayer {
  // q4_attn: q/k/v/o are Q4 (q4_q .. q4_o) and qkv_w / o_w are empty; q4_mlp (dense layers):
  // gate/up/down are Q4 and gate_up_w / down_w are empty. Biases stay as below either way.
  bool q4_attn = false, q4_mlp = false;
  DeviceQ4 q4_q, q4_k, q4_v, q4_o, q4_gate, q4_up, q4_down;
  DeviceBuffer gate_b, up_b;  // [I] f32 each, q4_mlp with biases: the decode GEMVs' (gate_up_b too)
  // fp8_attn: q/k/v/o are FP8 (fp8_qkv: [qkv_rows, *] as qkv_w; fp8_o) and qkv_w / o_w are empty;
  // fp8_mlp (dense layers): fp8_gate_up ([2 * inter_pad, *] as gate_up_w) and fp8_down instead of
  // gate_up_w / down_w. Biases stay as below.
  bool fp8_attn = false, fp8_mlp = false;
  DeviceFp8 fp8_qkv, fp8_o, fp8_gate_up, fp8_down;
  DeviceBuffer qkv_w;      // [nq*hd + 2*nkv*hd, ld_h] E
  DeviceBuffer qkv_b;      // [same rows] f32, when the model has q/k/v biases
  DeviceBuffer o_w;        // [H, ld_attn] E
  DeviceBuffer o_b;        // [H] f32, optional
  DeviceBuffer gate_up_w;  // [2 * inter_pad, ld_h] E, 16-row groups [gate 8 | up 8]
  DeviceBuffer gate_up_b;  // [2 * inter_pad] f32, optional, same order
  DeviceBuffer down_w;     // [H, inter_pad] E (inter_pad = ld of the SiLU output)
  DeviceBuffer down_b;     // [H] f32, optional
  DeviceBuffer input_norm, post_norm;  // [H] f32
  DeviceBuffer attn_out_norm, mlp_out_norm;  // [H] f32, sandwich norms (Gemma)
  DeviceBuffer q_norm, k_norm;         // [hd] f32, Qwen3
  DeviceBuffer sinks;                  // [nq] f32, attention sinks (gpt-oss)
  // Mixture of experts (sparse layers): the router and every expert's MLP.
  DeviceBuffer router_w;               // [experts, ld_h] E
  DeviceBuffer router_b;               // [experts] f32, optional
  DeviceBuffer experts_gate_up_w;      // [experts * 2 * moe_inter_pad, ld_h] E, each as gate_up_w
  DeviceBuffer experts_gate_up_b;      // [experts * 2 * moe_inter_pad] f32, optional
  DeviceBuffer experts_down_w;         // [experts * H, moe_inter_pad] E
  DeviceBuffer experts_down_b;         // [experts * H] f32, optional
};

struct DeviceWeights {
  DType dtype = DType::BF16;  // E: bf16 or f16
  int64_t ld_h = 0;           // round_up8(hidden)
  int64_t ld_attn = 0;        // round_up8(nq * hd)
  int64_t inter_pad = 0;      // round_up8(intermediate)
  int64_t qkv_rows = 0;       // nq*hd + 2*nkv*hd
  int64_t moe_inter_pad = 0;  // round_up8(moe_intermediate_size), 0 without experts
  DeviceBuffer embed;         // [vocab, ld_h] E
  DeviceBuffer lm_head;       // [vocab, ld_h] E; empty when tied (use embed)
  DeviceBuffer final_norm;    // [H] f32
  DeviceBuffer inv_freq;      // [rotary_dim / 2] f32
  DeviceBuffer local_inv_freq;  // [rotary_dim / 2] f32, the local layers' rope (Gemma 3), optional
  std::vector<DeviceLayer> layers;
  bool any_q4_attn = false, any_q4_mlp = false;  // some layer is q4_attn / q4_mlp
  bool any_fp8_attn = false, any_fp8_mlp = false;  // some layer is fp8_attn / fp8_mlp
  Fp8Scales fp8_scales = Fp8Scales::Channel;  // of every DeviceFp8 (Block when the checkpoint's are)
  size_t bytes = 0;           // device bytes held

  const void* lm_head_ptr() const { return lm_head.bytes() ? lm_head.get() : embed.get(); }
};

// A host f32 vector (biases, norm weights, RoPE frequencies) as a device buffer, uploaded
// synchronously; its bytes are added to *total.
DeviceBuffer upload_f32(const std::vector<float>& host, size_t* total);

// Uploads (synchronously) everything the forward pass reads. Throws sluice::Error on failure
// (kModelFileInvalid at a NaN e4m3 code of a projection kept FP8).
DeviceWeights upload_weights(const ModelConfig& c, const ModelWeights& w);

}  // namespace sluice::cuda
