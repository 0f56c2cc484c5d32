#include "kv/block_pool.h"

#include <algorithm>
#include <string>

#include "sluice/error.h"

namespace sluice {

BlockPool::BlockPool(int64_t num_blocks)
    : num_blocks_(num_blocks),
      ref_(size_t(num_blocks), 0),
      hash_(size_t(num_blocks)),
      has_hash_(size_t(num_blocks), 0),
      lru_pos_(size_t(num_blocks)),
      keyed_(size_t(num_blocks), 0) {
  free_.reserve(size_t(num_blocks));
  for (int64_t i = num_blocks - 1; i >= 0; i--) free_.push_back(int32_t(i));
}

void BlockPool::check_id(int32_t b, const char* what) const {
  if (b < 0 || b >= num_blocks_)
    throw Error(ErrorCode::kInternal, std::string(what) + ": KV block " + std::to_string(b) + " does not exist");
}

bool BlockPool::allocate(int64_t n, std::vector<int32_t>* out) {
  if (n > num_free()) return false;
  for (int64_t i = 0; i < n; i++) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      // Evict (unkeyed first): its K/V will be overwritten, so it leaves the index.
      std::list<int32_t>& from = lru_.empty() ? keyed_lru_ : lru_;
      b = from.front();
      from.pop_front();
      cached_.erase(hash_[size_t(b)]);
      has_hash_[size_t(b)] = 0;
    }
    ref_[size_t(b)] = 1;
    keyed_[size_t(b)] = 0;
    out->push_back(b);
  }
  return true;
}

void BlockPool::release(const std::vector<int32_t>& blocks, bool keyed) {
  for (int32_t b : blocks) {
    check_id(b, "release");
    if (ref_[size_t(b)] <= 0)
      throw Error(ErrorCode::kInternal, "KV block " + std::to_string(b) + " released twice or never allocated");
    if (keyed) keyed_[size_t(b)] = 1;
    if (--ref_[size_t(b)] > 0) continue;
    if (has_hash_[size_t(b)]) {
      std::list<int32_t>& to = keyed_[size_t(b)] ? keyed_lru_ : lru_;
      lru_pos_[size_t(b)] = to.insert(to.end(), b);
    } else {
      keyed_[size_t(b)] = 0;
      free_.push_back(b);
    }
  }
}

int32_t BlockPool::lookup(BlockHash hash) const {
  auto it = cached_.find(hash);
  return it == cached_.end() ? -1 : it->second;
}

void BlockPool::acquire(int32_t b) {
  check_id(b, "acquire");
  if (!has_hash_[size_t(b)]) throw Error(ErrorCode::kInternal, "acquire: KV block " + std::to_string(b) + " is not cached");
  if (ref_[size_t(b)]++ == 0) {
    (keyed_[size_t(b)] ? keyed_lru_ : lru_).erase(lru_pos_[size_t(b)]);
    keyed_[size_t(b)] = 0;
  }
}

bool BlockPool::register_block(int32_t b, BlockHash hash) {
  check_id(b, "register_block");
  if (ref_[size_t(b)] <= 0)
    throw Error(ErrorCode::kInternal, "register_block: KV block " + std::to_string(b) + " is not in use");
  if (has_hash_[size_t(b)] || cached_.count(hash)) return false;
  cached_.emplace(hash, b);
  hash_[size_t(b)] = hash;
  has_hash_[size_t(b)] = 1;
  return true;
}

void BlockPool::clear_cache() {
  for (int32_t b : lru_) free_.push_back(b);
  for (int32_t b : keyed_lru_) free_.push_back(b);
  lru_.clear();
  keyed_lru_.clear();
  cached_.clear();
  std::fill(has_hash_.begin(), has_hash_.end(), 0);
  // In-use blocks keep their class for this in-use period (harmless: uncached ones are freed).
  for (size_t i = 0; i < keyed_.size(); i++)
    if (ref_[i] == 0) keyed_[i] = 0;
}

}  // namespace sluice
