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

  // Summary of key block `block` for (batch, mask head); null without a mask.
  const BlockBounds* get(int batch, int mask_head, int block) const {
    if (table_.empty()) return nullptr;
    return &table_[(int64_t(batch) * mask_heads_ + mask_head) * num_blocks_ + block];
  }
  // This (batch, mask head)'s [seqlen_k, C] indices, or null without a mask.
  const int32_t* columns(const MaskParams& mask, int batch, int mask_head) const {
    if (mask.startend_row_indices == nullptr) return nullptr;
    return mask.startend_row_indices + batch * mask.batch_stride + mask_head * mask.head_stride;
  }

 private:
  int mask_heads_ = 1;
  int num_blocks_ = 0;
  std::vector<BlockBounds> table_;
};

// Mask head used by query head `head` (Hm is 1 or Hk).
inline int mask_head_of(const FwdParams& p, int head) {
  if (p.mask.num_heads == 1) return 0;
  return head / (p.num_heads / p.mask.num_heads);
}

}  // namespace cpu
}  // namespace flashmask
