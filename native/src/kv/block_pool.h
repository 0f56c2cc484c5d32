// Fixed-size KV blocks with reference counts and a prefix cache. Which memory a block id refers
// to is the backend's business; the pool only tracks ownership and the cache index.
//
// Block states (each block is in exactly one):
//   free       ref 0, not cached: on the free list.
//   in use     ref >= 1: in the block tables of `ref` sequences. Cached or not.
//   evictable  ref 0, cached: its K/V are kept for a later prefix hit, on one of two LRU lists
//              by retention class: keyed (released by a sequence added with a prompt_cache_key)
//              or unkeyed.
// Invariants:
//   - Only full blocks are cached (register_block), and a cached block is read-only: every
//     sequence holding it has computed past its end, so the engine writes K/V only into a
//     sequence's own uncached last block. Hence sharing a cached block needs no copy.
//   - Evictable blocks count as free (num_free); allocate() takes the free list first and then
//     evicts, dropping the block from the index. Eviction order: the unkeyed LRU list (least
//     recently released first), and only once it is empty the keyed LRU list (same order).
//   - Retention class: a block is keyed when any holder released it as keyed during its current
//     in-use period (shared by a keyed and an unkeyed sequence: keyed wins). The class is reset
//     when the block is acquired again from the evictable state or reallocated.
//   - One block per hash: registering a hash that is already cached leaves the second block
//     uncached (it is freed normally). Blocks are never de-duplicated while in use, because a
//     sequence's block table must not change under it.
#pragma once
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"

namespace sluice {

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks);
  int64_t num_blocks() const { return num_blocks_; }
  // Blocks an allocation can get now: free plus evictable.
  int64_t num_free() const { return int64_t(free_.size() + lru_.size() + keyed_lru_.size()); }
  int64_t num_cached() const { return int64_t(cached_.size()); }
  int64_t num_evictable() const { return int64_t(lru_.size() + keyed_lru_.size()); }
  int64_t num_keyed_evictable() const { return int64_t(keyed_lru_.size()); }
  // Appends n block ids (ref 1 each) to out; returns false (and takes none) when fewer than n
  // are free or evictable.
  bool allocate(int64_t n, std::vector<int32_t>* out);
  // Drops one reference from each block, in order. A cached block whose count reaches 0 becomes
  // evictable (the earlier released, the sooner evicted; keyed after all unkeyed, see above); an
  // uncached one goes back to the free list. keyed: the releasing sequence had a prompt_cache_key.
  void release(const std::vector<int32_t>& blocks, bool keyed = false);

  // The cached block with this hash, or -1.
  int32_t lookup(BlockHash hash) const;
  // Adds a reference to a cached block (taking it off its LRU list if it was evictable).
  void acquire(int32_t block);
  // Caches an in-use, full block under `hash`. Returns false (and changes nothing) when the hash
  // is already cached or the block already is.
  bool register_block(int32_t block, BlockHash hash);
  // Empties the cache index: evictable blocks go back to the free list, in-use ones stay in use.
  void clear_cache();

  int32_t ref_count(int32_t block) const { return ref_[size_t(block)]; }
  bool is_cached(int32_t block) const { return has_hash_[size_t(block)] != 0; }

 private:
  void check_id(int32_t block, const char* what) const;

  int64_t num_blocks_;
  std::vector<int32_t> free_;                          // stack; low ids are handed out first
  std::vector<int32_t> ref_;                           // [num_blocks] sequences holding the block
  std::vector<BlockHash> hash_;                        // [num_blocks] valid where has_hash_
  std::vector<uint8_t> has_hash_;                      // [num_blocks] block is in cached_
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;  // hash -> block id
  std::list<int32_t> lru_;                             // unkeyed evictable blocks, front = evicted first
  std::list<int32_t> keyed_lru_;                       // keyed evictable blocks, evicted after lru_
  std::vector<std::list<int32_t>::iterator> lru_pos_;  // [num_blocks] valid while evictable
  std::vector<uint8_t> keyed_;                         // [num_blocks] retention class (see above)
};

}  // namespace sluice
