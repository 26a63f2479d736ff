// The order in which the sm90 backward takes its CTAs under fitted head
// grouping. A per-CTA timeline (NOTES.md, "The same timeline on both
// backwards") showed grouped CTAs of up to 80 steps starting in the last wave
// on causal documents and short documents at 8K, leaving 18% of the SMs' time
// idle at the end. Sorting every CTA by its work (v17a) fills that tail in a
// list-scheduling model but scatters the CTAs that run at once over heads and
// documents, and the backward lives on L2 (each step reads 32 KB of Q/dO and
// adds 32 KB of dQ): causal 8K -21%, causal document 32K -43%. So the sort
// stays inside a GQA group: the grid's slots go group by group, and within a
// group (its heads in the grid's order, key blocks side by side) by the class
// of their work (heads x live query blocks, from the count pass, capped at
// `cap` steps, in `classes` equal parts of the cap: coarse, so that the light
// key blocks of one short document stay side by side, v17b/c). Slots at or
// past the cap keep the group's grid order and go first, so plain causal's
// heavy key blocks stay a head's blocks side by side; the sort is stable, and
// the slots that do no work (non-leaders of a sub-group, which leave at once)
// go last. The main kernel reads order[its linear block index]
// in place of its grid coordinates: (batch x heads + head) x key blocks + key
// block.
#pragma once

#include <cstdint>

#include "../../flashmask_params.h"

namespace flashmask {
namespace sm90 {

// At most 256 work classes (the capped work's share of the cap, in
// `classes` equal parts; bwd_cta_order_classes), then one bucket for the
// slots that do no work.
constexpr int kOrderBuckets = 256;
constexpr int kOrderSlotsIdle = kOrderBuckets;

// Fitted grouping's grid row -> query head. Row y = rank x groups + g is head
// g x head_group + j(rank), where j runs 0, head_group / 2, ... (ranks
// bit-reversed for power-of-two groups): the heads that lead the largest
// sub-groups come first, so the long grouped CTAs start in the first waves and
// the one-head CTAs of heavy key blocks and the CTAs that leave at once fill
// in behind them.
__device__ __forceinline__ int fitted_head_of(int y, int num_heads, int head_group) {
  const int groups = num_heads / head_group;
  const int g = y % groups, rank = y / groups;
  const bool pow2 = (head_group & (head_group - 1)) == 0;
  const int bits = __ffs(head_group) - 1;  // head_group > 1 here
  const int j = pow2 ? int(__brev(unsigned(rank)) >> (32 - bits)) : rank;
  return g * head_group + j;
}

// A group's local slot i (its heads in the grid's row order, key blocks
// fastest) -> the main kernel's slot, and its bucket: 0 for the heaviest (at
// or past the cap), rising as the work falls; kOrderSlotsIdle for a slot that
// leaves at once.
struct OrderSlot {
  int slot, bucket;
};
__device__ __forceinline__ OrderSlot order_slot(const BwdParams& p, const int32_t* counts, const int32_t* live,
                                                int key_blocks, int cap, int classes, int batch, int group,
                                                int i) {
  const int groups = p.num_heads / p.bwd_head_group;
  const int n_block = i % key_blocks, rank = i / key_blocks;
  const int head = fitted_head_of(rank * groups + group, p.num_heads, p.bwd_head_group);
  const int64_t at = (int64_t(batch) * groups + group) * key_blocks + n_block;
  const int heads = counts[at];
  const int slot = (batch * p.num_heads + head) * key_blocks + n_block;
  if (head % heads != 0) return {slot, kOrderSlotsIdle};
  const int steps = min(heads * live[at], cap);
  return {slot, classes - 1 - int(int64_t(steps) * classes / (cap + 1))};
}

// One CTA per (GQA group, batch), a stable counting sort of the group's
// bwd_head_group x key_blocks slots by bucket into its own stretch of
// `order`: totals, their prefix, then chunk by chunk each slot's place among
// its chunk's equals (warp by warp with __match_any_sync, then across warps).
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    bwd_cta_order_kernel(BwdParams p, const int32_t* counts, const int32_t* live, int key_blocks, int cap,
                         int classes, int32_t* order) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kBuckets = kOrderBuckets + 1;
  __shared__ int next[kBuckets];                // where the bucket's next slot goes
  __shared__ int warp_place[kWarps][kBuckets];  // a chunk's per-warp counts, then places
  const int group = blockIdx.x, batch = blockIdx.y;
  const int num_slots = p.bwd_head_group * key_blocks;
  int32_t* const out = order + (int64_t(batch) * gridDim.x + group) * num_slots;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto slot_of = [&](int i) { return order_slot(p, counts, live, key_blocks, cap, classes, batch, group, i); };

  for (int b = threadIdx.x; b < kBuckets; b += kThreads) next[b] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < num_slots; i += kThreads) atomicAdd(&next[slot_of(i).bucket], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int b = 0; b < kBuckets; ++b) {
      const int total = next[b];
      next[b] = sum;
      sum += total;
    }
  }
  __syncthreads();

  for (int chunk = 0; chunk < num_slots; chunk += kThreads) {
    for (int i = threadIdx.x; i < kWarps * kBuckets; i += kThreads) (&warp_place[0][0])[i] = 0;
    __syncthreads();
    const int i = chunk + int(threadIdx.x);
    const bool in = i < num_slots;
    const OrderSlot s = in ? slot_of(i) : OrderSlot{0, -1};
    const unsigned peers = __match_any_sync(0xffffffffu, s.bucket);
    const int rank = __popc(peers & ((1u << lane) - 1));
    if (in && rank == 0) warp_place[warp][s.bucket] = __popc(peers);
    __syncthreads();
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) {
      int place = next[b];
      for (int w = 0; w < kWarps; ++w) {
        const int count = warp_place[w][b];
        warp_place[w][b] = place;
        place += count;
      }
      next[b] = place;
    }
    __syncthreads();
    if (in) out[warp_place[warp][s.bucket] + rank] = s.slot;
    __syncthreads();
  }
}

}  // namespace sm90
}  // namespace flashmask
