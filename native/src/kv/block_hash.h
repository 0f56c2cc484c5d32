// Prefix-cache block identity. A full KV block is named by a hash chained over its parent's
// hash (the block before it in the sequence), its token ids and an extra key (model / adapter).
// Pure functions: the same inputs give the same hash on every machine and run (golden-tested in
// native/tests/test_prefix_cache.cpp), so replicas can compare prefixes.
#pragma once
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

// The parent of a sequence's first block: depends only on the configured seed and the extra key.
BlockHash root_block_hash(uint64_t seed, uint64_t extra_key);

// hash(parent, tokens[0..n), extra_key): 64-bit FNV-1a over the little-endian bytes of the
// parent hash, the token count, the tokens and the extra key, then a splitmix64 finalizer.
BlockHash hash_block(BlockHash parent, const int32_t* tokens, size_t n, uint64_t extra_key);

// 64-bit FNV-1a of a byte string (used to derive the model key from config.json).
uint64_t fnv1a64(const std::string& bytes);

}  // namespace sluice
