// The FlashMask preprocessing pass on the CPU: per (batch, mask head, key
// block) the min/max of every bound, so tiles can be classified in O(1).
#pragma once

#include <cstdint>
#include <vector>

#include "../flashmask_params.h"
#include "../mask_bounds.h"

namespace flashmask {
namespace cpu {

class BlockBoundsTable {
 public:
  BlockBoundsTable(const FwdParams& params, int block_n);

  // Summary of key block `block` for the summary row of mask_summary_row();
  // null without a mask.
  const BlockBounds* get(int64_t summary_row, int block) const {
    if (table_.empty()) return nullptr;
    return &table_[summary_row * num_blocks_ + block];
  }

 private:
  int num_blocks_ = 0;
  std::vector<BlockBounds> table_;
};

}  // namespace cpu
}  // namespace flashmask
