#include "cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

#include "cpu/kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace sluice::cpu {

namespace {

SimdLevel detect() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return SimdLevel::Generic;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave) return SimdLevel::Generic;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool os_ymm = (xcr0_lo & 0x6) == 0x6;      // SSE + AVX state
  const bool os_zmm = (xcr0_lo & 0xe6) == 0xe6;    // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return SimdLevel::Generic;
  const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  unsigned a1 = 0, b1, c1, d1;
  __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
  const bool avx512bf16 = a1 & (1u << 5);
  if (!(os_ymm && avx2 && fma && f16c)) return SimdLevel::Generic;
  if (!(os_zmm && avx512f && avx512bw && avx512vl && avx512dq)) return SimdLevel::Avx2;
  return avx512bf16 ? SimdLevel::Avx512Bf16 : SimdLevel::Avx512;
#else
  return SimdLevel::Generic;
#endif
}

SimdLevel parse(const char* name, SimdLevel fallback) {
  if (!name || !*name) return fallback;
  if (!std::strcmp(name, "generic")) return SimdLevel::Generic;
  if (!std::strcmp(name, "avx2")) return SimdLevel::Avx2;
  if (!std::strcmp(name, "avx512")) return SimdLevel::Avx512;
  if (!std::strcmp(name, "avx512bf16")) return SimdLevel::Avx512Bf16;
  return fallback;
}

SimdLevel g_detected = detect();
SimdLevel g_cap = parse(std::getenv("SLUICE_SIMD"), SimdLevel::Avx512Bf16);

}  // namespace

SimdLevel detected_simd_level() { return g_detected; }
SimdLevel simd_level() { return g_detected < g_cap ? g_detected : g_cap; }

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Generic: return "generic";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
    case SimdLevel::Avx512Bf16: return "avx512bf16";
  }
  return "generic";
}

const char* simd_level_name() { return simd_level_name(simd_level()); }

void force_simd_level(const char* name) {
  g_cap = parse(name, SimdLevel::Avx512Bf16);
}

}  // namespace sluice::cpu
