// Fixed-size KV blocks handed out from a free list. Which memory a block id refers to is
// the backend's business; the pool only tracks ownership.
#pragma once
#include <cstdint>
#include <vector>

namespace sluice {

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks);
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const { return int64_t(free_.size()); }
  // Appends n block ids to out; returns false (and takes none) when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>* out);
  void release(const std::vector<int32_t>& blocks);

 private:
  int64_t num_blocks_;
  std::vector<int32_t> free_;  // stack; low ids are handed out first
  std::vector<uint8_t> in_use_;  // [num_blocks] guards against double release
};

}  // namespace sluice
