// KvCursor: the K/V row offsets of one kv head along a sequence's paged block table, for the
// attention kernels of every ISA file.
// NOTE: in an anonymous namespace on purpose, so each file that includes it gets its own copy,
// compiled with that file's ISA flags; an inline function with external linkage would be merged
// by the linker into one copy, possibly built with instructions another caller's CPU lacks.
#pragma once
#include <cstdint>

#include "cpu/kernels.h"

namespace sluice::cpu::detail {
namespace {

// Element offsets of one kv head's K/V rows at positions 0, 1, 2, ... of a sequence, through
// its block table: slot = table[p / block_size] * block_size + p % block_size, row offset =
// (slot * n_kv_heads + kv_head) * head_dim, without a division per position (6% of the AVX2
// kernel's time at 4000 positions).
class KvCursor {
 public:
  // Starts at position c.first (0 unless a sliding window begins later).
  KvCursor(const int32_t* table, const PagedKV& c, int64_t kv_head)
      : table_(table),
        block_size_(c.block_size),
        stride_(c.n_kv_heads * c.head_dim),
        head_(kv_head * c.head_dim),
        block_(c.first / c.block_size),
        within_(c.first % c.block_size),
        fresh_(within_ != 0) {}
  // The current position's offset; then next() moves to the following position.
  int64_t offset() {
    // A block's entry is read on its first position only (never one past the last).
    if (within_ == 0 || fresh_) {
      base_ = int64_t(table_[block_]) * block_size_ * stride_ + head_;
      fresh_ = false;
    }
    return base_ + within_ * stride_;
  }
  void next() {
    if (++within_ == block_size_) {
      within_ = 0;
      block_++;
    }
  }

 private:
  const int32_t* table_;
  int64_t block_size_, stride_, head_;
  int64_t block_ = 0, within_ = 0, base_ = 0;
  bool fresh_ = false;  // started inside a block: its entry is still to be read
};

}  // namespace
}  // namespace sluice::cpu::detail
