#include "kv/block_pool.h"

#include "sluice/error.h"

namespace sluice {

BlockPool::BlockPool(int64_t num_blocks) : num_blocks_(num_blocks), in_use_(size_t(num_blocks), 0) {
  free_.reserve(size_t(num_blocks));
  for (int64_t i = num_blocks - 1; i >= 0; i--) free_.push_back(int32_t(i));
}

bool BlockPool::allocate(int64_t n, std::vector<int32_t>* out) {
  if (n > int64_t(free_.size())) return false;
  for (int64_t i = 0; i < n; i++) {
    int32_t b = free_.back();
    free_.pop_back();
    in_use_[size_t(b)] = 1;
    out->push_back(b);
  }
  return true;
}

void BlockPool::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    if (b < 0 || b >= num_blocks_ || !in_use_[size_t(b)])
      throw Error(ErrorCode::kInternal, "KV block " + std::to_string(b) + " released twice or never allocated");
    in_use_[size_t(b)] = 0;
    free_.push_back(b);
  }
}

}  // namespace sluice
