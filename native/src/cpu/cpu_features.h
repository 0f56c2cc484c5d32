// Runtime CPU-feature dispatch: which SIMD kernels this machine (and its OS) can run.
#pragma once

namespace sluice::cpu {

enum class SimdLevel { Generic = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3 };

// The best level the hardware supports, capped by SLUICE_SIMD=generic|avx2|avx512|avx512bf16
// (read once) and by force_simd_level().
SimdLevel simd_level();
SimdLevel detected_simd_level();  // hardware only, ignoring overrides
const char* simd_level_name(SimdLevel level);
// For tests: caps the level used from now on (nullptr or "" removes the cap). Not thread-safe
// with respect to running kernels.
void force_simd_level(const char* name);

}  // namespace sluice::cpu
