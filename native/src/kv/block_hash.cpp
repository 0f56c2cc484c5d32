#include "kv/block_hash.h"

namespace sluice {

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

inline uint64_t fnv_u64(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= kFnvPrime;
  }
  return h;
}

inline uint64_t fnv_u32(uint64_t h, uint32_t v) {
  for (int i = 0; i < 4; i++) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= kFnvPrime;
  }
  return h;
}

// NOTE: FNV alone mixes the last bytes weakly; the finalizer spreads them over all 64 bits so
// the value can index a hash map directly.
inline uint64_t finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

BlockHash root_block_hash(uint64_t seed, uint64_t extra_key) {
  return BlockHash{finalize(fnv_u64(fnv_u64(kFnvOffset, seed), extra_key))};
}

BlockHash hash_block(BlockHash parent, const int32_t* tokens, size_t n, uint64_t extra_key) {
  uint64_t h = fnv_u64(kFnvOffset, parent.value);
  h = fnv_u64(h, uint64_t(n));
  for (size_t i = 0; i < n; i++) h = fnv_u32(h, uint32_t(tokens[i]));
  h = fnv_u64(h, extra_key);
  return BlockHash{finalize(h)};
}

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = kFnvOffset;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= kFnvPrime;
  }
  return h;
}

}  // namespace sluice
