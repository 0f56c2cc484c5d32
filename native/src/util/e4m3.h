// OCP FP8 e4m3 ("e4m3fn": sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities;
// S.1111.111 is NaN; largest finite 448; subnormals m/8 * 2^-6): the exact value of a code, and the
// encoder the engine's own FP8 data uses (the fp8 KV cache, weights quantized at load).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace sluice {

inline bool e4m3_is_nan(uint8_t code) { return (code & 0x7f) == 0x7f; }

// The exact value of an e4m3 code.
inline float e4m3_to_float(uint8_t code) {
  if (e4m3_is_nan(code)) return std::nanf("");
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  const float magnitude = exponent == 0 ? std::ldexp(float(mantissa), -9)  // (m / 8) * 2^-6
                                        : std::ldexp(float(8 + mantissa), exponent - 10);  // (1 + m/8) * 2^(e-7)
  return code & 0x80 ? -magnitude : magnitude;
}

// The nearest code to x, ties to even, saturated to +-448 (the largest finite code); NaN stays NaN.
inline uint8_t f32_to_e4m3(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7f;  // NaN
  if (mag >= 0x43e00000u) return sign | 0x7e;  // >= 448, infinities included: saturate
  if (mag < 0x3c800000u) {
    // Below 2^-6, the smallest normal: subnormal codes count units of 2^-9 (exact scaling by a
    // power of two; nearbyint rounds ties to even in the default rounding mode). 8 units is the
    // code of 2^-6 itself, so the carry lands on the right code.
    float a;
    std::memcpy(&a, &mag, 4);
    return sign | uint8_t(std::nearbyint(a * 512.f));
  }
  // Normal: round the 23-bit mantissa to 3 bits, ties to even; a carry into the exponent is the
  // next binade's code. Rebias 127 -> 7.
  const uint32_t rounded = (mag + 0x7ffffu + ((mag >> 20) & 1u)) >> 20;
  const uint32_t code = rounded - ((127u - 7u) << 3);
  return sign | uint8_t(code > 0x7eu ? 0x7eu : code);
}

}  // namespace sluice
