#include "kv/block_hash.h"

#include <cstring>

namespace sluice {

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

// One SipRound on the four state words.
inline void sip_round(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);
  v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;
  v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;
  v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);
}

constexpr char kRootTag[] = "sluice.root";

}  // namespace

SipHasher::SipHasher(const HashKey& key) {
  // The initialization constants of the SipHash paper ("somepseudorandomlygeneratedbytes").
  v_[0] = key[0] ^ 0x736f6d6570736575ull;
  v_[1] = key[1] ^ 0x646f72616e646f6dull;
  v_[2] = key[0] ^ 0x6c7967656e657261ull;
  v_[3] = key[1] ^ 0x7465646279746573ull;
}

void SipHasher::compress(uint64_t m) {
  v_[3] ^= m;
  sip_round(v_[0], v_[1], v_[2], v_[3]);  // c = 2 compression rounds
  sip_round(v_[0], v_[1], v_[2], v_[3]);
  v_[0] ^= m;
}

SipHasher& SipHasher::bytes(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; i++) {
    tail_ |= uint64_t(p[i]) << (8 * (total_ % 8));
    total_++;
    if (total_ % 8 == 0) {
      compress(tail_);
      tail_ = 0;
    }
  }
  return *this;
}

SipHasher& SipHasher::u32(uint32_t v) {
  const uint8_t b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
  return bytes(b, 4);
}

SipHasher& SipHasher::u64(uint64_t v) {
  if (total_ % 8 == 0) {  // aligned: one whole word, no byte loop (the common case)
    compress(v);
    total_ += 8;
    return *this;
  }
  u32(uint32_t(v));
  return u32(uint32_t(v >> 32));
}

uint64_t SipHasher::finish() const {
  uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
  // The last word: the remaining bytes, with the message length (mod 256) in its top byte.
  const uint64_t b = tail_ | (uint64_t(total_ & 0xff) << 56);
  v3 ^= b;
  sip_round(v0, v1, v2, v3);
  sip_round(v0, v1, v2, v3);
  v0 ^= b;
  v2 ^= 0xff;
  for (int i = 0; i < 4; i++) sip_round(v0, v1, v2, v3);  // d = 4 finalization rounds
  return v0 ^ v1 ^ v2 ^ v3;
}

BlockHash root_block_hash(const HashKey& key, uint64_t extra_key, const std::string& scope) {
  SipHasher h(key);
  h.bytes(kRootTag, sizeof(kRootTag) - 1).u64(extra_key).u64(uint64_t(scope.size())).bytes(scope.data(), scope.size());
  return BlockHash{h.finish()};
}

BlockHash hash_block(const HashKey& key, BlockHash parent, const int32_t* tokens, size_t n, uint64_t extra_key) {
  SipHasher h(key);
  h.u64(parent.value).u64(uint64_t(n));
  for (size_t i = 0; i < n; i++) h.u32(uint32_t(tokens[i]));
  h.u64(extra_key);
  return BlockHash{h.finish()};
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
