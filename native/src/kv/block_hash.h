// Prefix-cache block identity. A full KV block is named by a keyed hash chained over its
// parent's hash (the block before it in the sequence), its token ids and an extra key (the model);
// a sequence's first block hangs off a root that also covers its cache scope (the organization).
// Pure functions: the same key and inputs give the same hash on every machine and run
// (golden-tested in native/tests/test_prefix_cache.cpp), so replicas sharing a key can compare
// prefixes.
//
// Why keyed: block hashes decide which sequences share K/V. With a public hash function a tenant
// could craft token blocks that collide with another's (a cache hit on someone else's prefix);
// SipHash-2-4 under a secret 128-bit key per deployment makes hashes unpredictable to callers.
// Why scoped: two organizations never share a chain, so neither can hit (or time) the other's
// prefix; `prompt_cache_key` only ever groups requests within one scope.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace sluice {

// A distinct type so a block hash is never confused with a block id, a token or a seed.
struct BlockHash {
  uint64_t value = 0;
  bool operator==(const BlockHash& o) const { return value == o.value; }
  bool operator!=(const BlockHash& o) const { return value != o.value; }
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return size_t(h.value); }
};

// The secret key of the hash: {k0, k1}, the key's 16 bytes read as two little-endian words.
using HashKey = std::array<uint64_t, 2>;

// SipHash-2-4 (Aumasson and Bernstein, 2012) over bytes fed in pieces. Words are fed in
// little-endian byte order, so a value hashes the same on every machine.
class SipHasher {
 public:
  explicit SipHasher(const HashKey& key);
  SipHasher& bytes(const void* data, size_t n);
  SipHasher& u32(uint32_t v);
  SipHasher& u64(uint64_t v);
  uint64_t finish() const;  // does not change the state: more bytes may follow

 private:
  void compress(uint64_t m);
  uint64_t v_[4];
  uint64_t tail_ = 0;    // bytes of the current, unfinished 8-byte word (little-endian)
  size_t total_ = 0;     // bytes fed so far
};

// The parent hash of the first block of a sequence in `scope` (an organization id; "" for an
// unscoped engine): SipHash(key, "sluice.root" || le64(extra_key) || le64(|scope|) || scope).
BlockHash root_block_hash(const HashKey& key, uint64_t extra_key, const std::string& scope);

// SipHash(key, le64(parent) || le64(n) || le32(tokens[0..n)) || le64(extra_key)).
BlockHash hash_block(const HashKey& key, BlockHash parent, const int32_t* tokens, size_t n, uint64_t extra_key);

// 64-bit FNV-1a of a byte string (the model key, from config.json; not a secret).
uint64_t fnv1a64(const std::string& bytes);

}  // namespace sluice
