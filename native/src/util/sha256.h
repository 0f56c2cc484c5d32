// SHA-256 (FIPS 180-4), for keying cached content by what it holds (the pixels a vision tower
// reads): x86's SHA extensions where the CPU has them (a few GB/s), else portable C++.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace sluice {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  // The digest of everything updated so far; the object must not be updated after.
  std::array<uint8_t, 32> finish();

  // Whether update() uses the CPU's SHA instructions (for tests and benches).
  static bool hardware();
  // For tests: compress with the portable code even where the instructions exist.
  static void force_portable(bool portable);

 private:
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;  // bytes
};

}  // namespace sluice
