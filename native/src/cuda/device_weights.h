// The model's weights on the GPU, uploaded once from the memory map and laid out for the CUDA
// kernels: q/k/v fused into one matrix, gate/up fused and interleaved in 16-row groups (for the
// GEMM's SiLU-and-mul epilogue), rows padded to multiples of 8 elements (16-byte loads), biases
// and norm weights in f32. Matrices keep the checkpoint's dtype (bf16 or f16); f32 checkpoints
// are rounded to bf16 (round to nearest even).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

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

struct DeviceLayer {
  DeviceBuffer qkv_w;      // [nq*hd + 2*nkv*hd, ld_h] E
  DeviceBuffer qkv_b;      // [same rows] f32, when the model has q/k/v biases
  DeviceBuffer o_w;        // [H, ld_attn] E
  DeviceBuffer o_b;        // [H] f32, optional
  DeviceBuffer gate_up_w;  // [2 * inter_pad, ld_h] E, 16-row groups [gate 8 | up 8]
  DeviceBuffer gate_up_b;  // [2 * inter_pad] f32, optional, same order
  DeviceBuffer down_w;     // [H, inter_pad] E (inter_pad = ld of the SiLU output)
  DeviceBuffer down_b;     // [H] f32, optional
  DeviceBuffer input_norm, post_norm;  // [H] f32
  DeviceBuffer q_norm, k_norm;         // [hd] f32, Qwen3
};

struct DeviceWeights {
  DType dtype = DType::BF16;  // E: bf16 or f16
  int64_t ld_h = 0;           // round_up8(hidden)
  int64_t ld_attn = 0;        // round_up8(nq * hd)
  int64_t inter_pad = 0;      // round_up8(intermediate)
  int64_t qkv_rows = 0;       // nq*hd + 2*nkv*hd
  DeviceBuffer embed;         // [vocab, ld_h] E
  DeviceBuffer lm_head;       // [vocab, ld_h] E; empty when tied (use embed)
  DeviceBuffer final_norm;    // [H] f32
  DeviceBuffer inv_freq;      // [rotary_dim / 2] f32
  std::vector<DeviceLayer> layers;
  size_t bytes = 0;           // device bytes held

  const void* lm_head_ptr() const { return lm_head.bytes() ? lm_head.get() : embed.get(); }
};

// Uploads (synchronously) everything the forward pass reads. Throws sluice::Error on failure.
DeviceWeights upload_weights(const ModelConfig& c, const ModelWeights& w);

}  // namespace sluice::cuda
