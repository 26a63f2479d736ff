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
// Chains: a slot whose own steps are a large share of what each SM does in
// the whole call (chain_threshold) goes before every group's slots, the
// chains of all groups in group order. In the group's stretch it would start
// as late as the group does, and a key block that every query row sees (the
// global keys of global + sliding window) then ran alone on one SM for the
// last ~20% of the kernel (1M tokens on 2 ranks: rank 0's own backward 121 ms
// against the other rank's 95). Longer calls, which take no order by default
// (bwd_cta_ordered), take one where a chain exists: chains first, then the
// groups' slots in their grid order; without one the order is the grid's own.
#pragma once

#include <cstdint>

#include "../../flashmask_params.h"

namespace flashmask {
namespace sm90 {

// Bucket 0 for the chains, then at most 256 work classes (the capped work's
// share of the cap, in `classes` equal parts; bwd_cta_order_classes), then one
// bucket for the slots that do no work.
constexpr int kOrderBuckets = 256;
constexpr int kOrderSlotsChain = 0;
constexpr int kOrderSlotsIdle = kOrderBuckets + 1;

// A working slot is a chain where its steps exceed this share of the steps
// an SM takes over the whole call (total_steps / sms): a slot started at the
// beginning of the last sixteenth would end after the others. Never below
// kChainMinSteps, so that the heaviest key blocks of causal and packed masks at
// up to 32K (<= 512 steps against thousands an SM) keep their groups' order
// and the L2 locality that goes with it.
// (PADDLE_FLASHMASK_SM90_BWD_CHAIN_MIN_STEPS sets that floor: tests lower it to
// order short calls this way.)
constexpr int kChainMinSteps = 256;
constexpr int kChainShare = 16;
FLASHMASK_HOST_DEVICE int64_t chain_threshold(int64_t total_steps, int sms, int min_steps) {
  const int64_t share = total_steps / (int64_t(sms) * kChainShare);
  return share > min_steps ? share : int64_t(min_steps);
}

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
// fastest) -> the main kernel's slot, and its bucket: kOrderSlotsChain for a
// chain (steps past `chain_steps`), then 1 for the heaviest (at or past the
// cap), rising as the work falls; kOrderSlotsIdle for a slot that leaves at
// once.
struct OrderSlot {
  int slot, bucket;
};
__device__ __forceinline__ OrderSlot order_slot(const BwdParams& p, const int32_t* counts, const int32_t* live,
                                                int key_blocks, int cap, int classes, int64_t chain_steps,
                                                int batch, int group, int i) {
  const int groups = p.num_heads / p.bwd_head_group;
  const int n_block = i % key_blocks, rank = i / key_blocks;
  const int head = fitted_head_of(rank * groups + group, p.num_heads, p.bwd_head_group);
  const int64_t at = (int64_t(batch) * groups + group) * key_blocks + n_block;
  const int heads = counts[at];
  const int slot = (batch * p.num_heads + head) * key_blocks + n_block;
  if (head % heads != 0) return {slot, kOrderSlotsIdle};
  if (int64_t(heads) * live[at] > chain_steps) return {slot, kOrderSlotsChain};
  const int steps = min(heads * live[at], cap);
  return {slot, 1 + classes - 1 - int(int64_t(steps) * classes / (cap + 1))};
}

// The sum of `v` over the CTA's threads, in every thread (`scratch`: kThreads
// / 32 int64 of shared memory, free again when it returns).
template <int kThreads>
__device__ __forceinline__ int64_t cta_sum(int64_t v, int64_t* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  int64_t total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// The chains of the whole call, as each order CTA needs them: the threshold,
// the chain slots of the (batch, group) stretches before `pair` and of all.
struct ChainCounts {
  int64_t threshold;
  int before, all;
};
template <int kThreads>
__device__ ChainCounts count_chains(const BwdParams& p, const int32_t* counts, const int32_t* live, int key_blocks,
                                    int sms, int min_steps, int pair, int64_t* scratch) {
  const int hg = p.bwd_head_group;
  const int64_t items = int64_t(p.batch) * (p.num_heads / hg) * key_blocks;  // (batch, group, key block)
  int64_t steps = 0;  // an item's CTAs take hg x live steps together
  for (int64_t at = threadIdx.x; at < items; at += kThreads) steps += int64_t(hg) * live[at];
  const int64_t threshold = chain_threshold(cta_sum<kThreads>(steps, scratch), sms, min_steps);
  int64_t before = 0, all = 0;
  for (int64_t at = threadIdx.x; at < items; at += kThreads) {
    const int heads = counts[at];
    const int chains = int64_t(heads) * live[at] > threshold ? hg / heads : 0;  // the item's working slots
    all += chains;
    before += at / key_blocks < pair ? chains : 0;
  }
  return {threshold, int(cta_sum<kThreads>(before, scratch)), int(cta_sum<kThreads>(all, scratch))};
}

// The main kernel's slot at grid position i (its linear block index), as the
// grid itself takes them: key blocks fastest, then fitted_head_of's rows,
// then batch.
__device__ __forceinline__ int32_t grid_slot(const BwdParams& p, int key_blocks, int64_t i) {
  const int n_block = int(i % key_blocks), row = int(i / key_blocks % p.num_heads);
  const int batch = int(i / key_blocks / p.num_heads);
  return int32_t((int64_t(batch) * p.num_heads + fitted_head_of(row, p.num_heads, p.bwd_head_group)) * key_blocks +
                 n_block);
}

// One CTA per (GQA group, batch), a stable counting sort of the group's
// bwd_head_group x key_blocks slots by bucket into its own stretch of
// `order`: totals, their prefix, then chunk by chunk each slot's place among
// its chunk's equals (warp by warp with __match_any_sync, then across warps).
// With `chains` (sms: the SMs the grid runs on; chain_threshold's floor), the chain bucket goes to the
// front of the whole order (count_chains: every CTA counts all groups' chains,
// O(items) each, to know where its own go) and the stretches follow, each
// short of its chains. `sorted` false: no classes (cap 0: the group's working
// slots in grid order), and where the call has no chain, the grid's own order.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    bwd_cta_order_kernel(BwdParams p, const int32_t* counts, const int32_t* live, int key_blocks, int cap,
                         int classes, bool chains, bool sorted, int sms, int chain_min_steps, int32_t* order) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kBuckets = kOrderBuckets + 2;
  __shared__ int next[kBuckets];                // where the bucket's next slot goes
  __shared__ int warp_place[kWarps][kBuckets];  // a chunk's per-warp counts, then places
  __shared__ int64_t scratch[kWarps];
  const int group = blockIdx.x, batch = blockIdx.y;
  const int num_slots = p.bwd_head_group * key_blocks;
  const int pair = batch * gridDim.x + group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const ChainCounts chain = chains ? count_chains<kThreads>(p, counts, live, key_blocks, sms, chain_min_steps, pair,
                                                            scratch)
                                   : ChainCounts{INT64_MAX, 0, 0};
  if (!sorted && chain.all == 0) {  // the grid's order: this CTA writes its share of it
    for (int i = threadIdx.x; i < num_slots; i += kThreads) {
      const int64_t at = int64_t(pair) * num_slots + i;
      order[at] = grid_slot(p, key_blocks, at);
    }
    return;
  }
  // Local place -> place in the whole order: the chains (the first `mine` of
  // the stretch) among all chains, the rest after all chains.
  const int mine_start = chain.before;
  auto place_of = [&](int local, int mine) -> int64_t {
    if (local < mine) return mine_start + local;
    return int64_t(chain.all) + int64_t(pair) * num_slots - chain.before + (local - mine);
  };
  auto slot_of = [&](int i) {
    return order_slot(p, counts, live, key_blocks, sorted ? cap : 0, classes, chain.threshold, batch, group, i);
  };

  for (int b = threadIdx.x; b < kBuckets; b += kThreads) next[b] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < num_slots; i += kThreads) atomicAdd(&next[slot_of(i).bucket], 1);
  __syncthreads();
  __shared__ int mine;  // this stretch's chains
  if (threadIdx.x == 0) {
    mine = next[kOrderSlotsChain];
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
    if (in) order[place_of(warp_place[warp][s.bucket] + rank, mine)] = s.slot;
    __syncthreads();
  }
}

}  // namespace sm90
}  // namespace flashmask
