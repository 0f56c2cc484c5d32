// e4m3 (fp8 KV cache) codes to 16-bit floats in registers, for the attention kernels that read an
// fp8 cache (attention.cu, flash_attention.cu, flash_decode.cu). Every conversion is exact: f16
// and bf16 hold every e4m3 value (3 mantissa bits, 2^-9 .. 448).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/mma_primitives.cuh"

namespace sluice::cuda {

// Two e4m3 codes (the first in the low byte) as two f16 in one register, the first in the low half.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<unsigned short>(codes & 0xffffu)));
  return h;
#else
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
#endif
}

// The same as two E (mma::pack2's layout); bf16 through f32.
template <typename E>
__device__ __forceinline__ uint32_t e4m3x2_to_e2(uint32_t codes);
template <>
__device__ __forceinline__ uint32_t e4m3x2_to_e2<__half>(uint32_t codes) {
  return e4m3x2_to_f16x2(codes);
}
template <>
__device__ __forceinline__ uint32_t e4m3x2_to_e2<__nv_bfloat16>(uint32_t codes) {
  const uint32_t h = e4m3x2_to_f16x2(codes);
  return mma::pack2<__nv_bfloat16>(__half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu))),
                                   __half2float(__ushort_as_half(static_cast<unsigned short>(h >> 16))));
}

// 8 codes (8 bytes) -> 8 E (16 bytes), in order.
template <typename E>
__device__ __forceinline__ uint4 e4m3x8_to_e8(uint2 codes) {
  return make_uint4(e4m3x2_to_e2<E>(codes.x), e4m3x2_to_e2<E>(codes.x >> 16), e4m3x2_to_e2<E>(codes.y),
                    e4m3x2_to_e2<E>(codes.y >> 16));
}

}  // namespace sluice::cuda
