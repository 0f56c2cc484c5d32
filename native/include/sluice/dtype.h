// Element types of stored weights and activations.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sluice {

// Q8_0: blocks of 32 int8 weights with one f16 scale each, made at load (cpu/gemm_q8.h has the
// layout); only matmul weights on the CPU backend ever have it. U8: raw bytes of packed formats
// as checkpoints store them (gpt-oss's MXFP4 experts), which the binder unpacks at load; no
// kernel reads it. F8E4M3: FP8 checkpoints' weights as stored (safetensors F8_E4M3), which the
// binder dequantizes to bf16 at load (model/fp8.h); no backend ever sees it. Q4: AWQ / GPTQ 4-bit
// weights repacked at load (cpu/gemm_q4.h has the layout); the CPU matmuls read them as they are,
// the CUDA upload dequantizes them. I32: packed words as AWQ / GPTQ checkpoints store them
// (qweight, qzeros, g_idx), which the binder repacks at load; no kernel reads it. I64: index
// tables (an EAGLE-3 head's d2t), read at load.
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3, U8 = 4, F8E4M3 = 5, Q4 = 6, I32 = 7, I64 = 8 };

inline size_t dtype_size(DType t) {
  if (t == DType::I64) return 8;
  return t == DType::F32 || t == DType::I32 ? 4 : t == DType::Q8_0 || t == DType::U8 || t == DType::F8E4M3 || t == DType::Q4 ? 1 : 2;
}
inline bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8_0: return "q8_0";
    case DType::U8: return "u8";
    case DType::F8E4M3: return "f8_e4m3";
    case DType::Q4: return "q4";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  return "?";
}

// Scalar conversions (reference paths and odd sizes; SIMD kernels convert in registers).
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace sluice
