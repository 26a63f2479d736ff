"""The order in which the Hopper kernels take their tiles, and what it costs at the end of a call
(numpy only): a list-scheduling model of the persistent forward and the backward's CTA order on a
FlashMask, each tile or key block costing a fixed time a step (a live block, `tile_geometry`'s
classification) plus a fixed time a tile. It is what showed that global + sliding window lost
its time to the order, not to the work (NOTES.md, forty-first session): the global rows' tile
came last in every GQA group, so the last group's ran alone at the end.

    python3 benchmarks/tile_schedule.py [--lengths 32768 131072] [--masks global_sliding_window ...]
    python3 benchmarks/tile_schedule.py --mask-file PART.i32 S C CAUSAL   (dump_cp_part_mask.py's)

prints, per mask, each kernel's modelled ms in the orders before and after the change
(sm90/fwd_tile_order.cuh: heavy tiles first; sm90/bwd_cta_order.cuh: chains first) and the
ideal (the work spread evenly). The step and tile costs are rough H200 figures at head dim 128;
the model ranks orders, it does not predict times.
"""

import argparse
import heapq
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from tile_geometry import KERNEL_TILES, SKIP, classify_tiles  # noqa: E402

SMS = 132  # H200 / H100 SXM
FWD_US = (2.0, 2.4)  # (a tile, a live key block) of the persistent forward, us
BWD_US = (3.0, 3.6)  # (a CTA, a live query block) of the backward, us
# The FA2-class kernels (--family fa2): two forward CTAs an SM (each a step of 64 keys at half the
# SM's pace), one backward CTA (a step of 64 query rows against 128 keys); H200, head dim 128.
FA2_FWD_SLOTS, FA2_FWD_US = 2 * SMS, (3.0, 3.0)
FA2_BWD_SLOTS, FA2_BWD_US = SMS, (3.0, 2.2)

# The kernels' floors and shares (sm90/fwd_tile_order.cuh, sm90/bwd_cta_order.cuh; the FA2-class
# orders, cuda/fa2_cta_order.cuh, take the forward's share and a floor of 64K keys or rows a CTA).
HEAVY_MIN_BLOCKS, HEAVY_SHARE = 128, 16
CHAIN_MIN_STEPS, CHAIN_SHARE = 256, 16
FA2_HEAVY_MIN_ROWS = 65536
FA2_LIGHT_LAST = 16  # flashmask_launch.cuh, bwd_light_last at 128-key blocks


def heavy_threshold(total_blocks, sms=SMS, min_blocks=HEAVY_MIN_BLOCKS):
    return max(total_blocks // (sms * HEAVY_SHARE), min_blocks)


def chain_threshold(total_steps, sms=SMS, min_steps=CHAIN_MIN_STEPS):
    return max(total_steps // (sms * CHAIN_SHARE), min_steps)


def makespan(costs, sms=SMS):
    """Time until the last of `costs` ends, each taken in order by the first free SM."""
    free = [0.0] * min(sms, max(len(costs), 1))
    for c in costs:
        heapq.heapreplace(free, free[0] + c)
    return max(free)


def live_counts(indices, causal, seqlen_q, seqlen_k):
    """(forward: live key blocks of each 128-row query block, backward: live 64-row query blocks of
    each 128-key block) of one mask head, the Hopper kernels' tiles at head dim 128."""
    m, n = KERNEL_TILES["sm90 fwd"]
    fwd = (classify_tiles(indices, causal, seqlen_q, seqlen_k, m, n)[0, 0] != SKIP).sum(1)
    m, n = KERNEL_TILES["sm90 bwd"]
    bwd = (classify_tiles(indices, causal, seqlen_q, seqlen_k, m, n)[0, 0] != SKIP).sum(0)
    return fwd, bwd


def forward_orders(counts, heads=32, heads_k=8):
    """{order: [live key blocks of each tile in the order taken]}: fwd_tile_of's (a GQA group's
    heads side by side, query blocks in reverse, group by group) and heavy tiles first."""
    group = heads // heads_k
    tree = [int(counts[-1 - m]) for _ in range(heads_k) for m in range(counts.size) for _ in range(group)]
    threshold = heavy_threshold(sum(tree))
    heavy = [c for c in tree if c > threshold]
    return {"tree": tree, "heavy first": heavy + [c for c in tree if c <= threshold]}


def fitted_heads(live, group, max_steps=80):
    """fitted_head_count: the most heads of a GQA group one CTA takes for a key block."""
    return max([d for d in range(1, group + 1) if group % d == 0 and d * live <= max_steps] or [1])


def backward_orders(counts, heads=32, heads_k=8):
    """{order: [steps of each working CTA in the order taken]}: beyond 16K keys the grid's (a head's
    key blocks in turn; groups' heads interleaved, as fitted_head_of's rows) and chains first."""
    group = heads // heads_k
    bits = group.bit_length() - 1
    pow2 = group & (group - 1) == 0
    rows = []  # per grid row (head), its working CTAs' steps, key blocks in turn
    for rank in range(group):
        # fitted_head_of: the row's place j in its group (ranks bit-reversed for power-of-two groups)
        j = int(f"{rank:0{bits}b}"[::-1], 2) if pow2 and bits else rank
        for _ in range(heads_k):
            row = []
            for live in counts:
                d = fitted_heads(int(live), group)
                if j % d == 0:  # the leader of its sub-group; the others leave at once
                    row.append(d * int(live))
            rows.append(row)
    grid = [s for row in rows for s in row]
    threshold = chain_threshold(sum(grid))
    return {"grid": grid, "chains first": [s for s in grid if s > threshold] + [s for s in grid if s <= threshold]}


def fa2_live_counts(indices, causal, seqlen_q, seqlen_k):
    """live_counts on the FA2-class tiles at head dim 128 (forward 128 x 64, backward 64 x 128)."""
    m, n = KERNEL_TILES["fa2 fwd"]
    fwd = (classify_tiles(indices, causal, seqlen_q, seqlen_k, m, n)[0, 0] != SKIP).sum(1)
    m, n = KERNEL_TILES["fa2 bwd"]
    bwd = (classify_tiles(indices, causal, seqlen_q, seqlen_k, m, n)[0, 0] != SKIP).sum(0)
    return fwd, bwd


def heavy_first(grid, walked, min_blocks):
    """{order: costs in order}: the grid's own and, where a CTA walks more blocks than the floor,
    fa2_heavy_first_order_kernel's (the CTAs past heavy_threshold first, each part in rank order)."""
    if walked <= min_blocks:
        return {"grid": grid, "heavy first": grid}
    threshold = heavy_threshold(sum(grid), min_blocks=min_blocks)
    return {"grid": grid, "heavy first": [c for c in grid if c > threshold] + [c for c in grid if c <= threshold]}


def fa2_forward_orders(counts, heads=32, min_blocks=FA2_HEAVY_MIN_ROWS // 64, key_blocks=None):
    """The FA2-class forward's grid order (heads fastest, query blocks in reverse) and heavy first."""
    grid = [int(counts[-1 - m]) for m in range(counts.size) for _ in range(heads)]
    return heavy_first(grid, key_blocks if key_blocks is not None else int(counts.max(initial=0)), min_blocks)


def fa2_backward_orders(counts, heads=32, light_last=FA2_LIGHT_LAST, min_steps=FA2_HEAVY_MIN_ROWS // 64,
                        query_blocks=None):
    """The FA2-class backward's grid order (a head's key blocks in turn, the last light_last of
    every head after all of them, heads fastest) and heavy first."""
    kept = counts.size - min(light_last, counts.size)
    grid = [int(counts[n]) for _ in range(heads) for n in range(kept)]
    grid += [int(counts[n]) for n in range(kept, counts.size) for _ in range(heads)]
    return heavy_first(grid, query_blocks if query_blocks is not None else int(counts.max(initial=0)), min_steps)


def model_rows(name, indices, causal, seqlen_q, seqlen_k, family="sm90", fa2_floor_rows=FA2_HEAVY_MIN_ROWS):
    if family == "fa2":
        fwd, bwd = fa2_live_counts(indices, causal, seqlen_q, seqlen_k)
        kernels = (("fwd", fa2_forward_orders(fwd, min_blocks=fa2_floor_rows // 64, key_blocks=-(-seqlen_k // 64)),
                    FA2_FWD_US, FA2_FWD_SLOTS),
                   ("bwd", fa2_backward_orders(bwd, min_steps=fa2_floor_rows // 64, query_blocks=-(-seqlen_q // 64)),
                    FA2_BWD_US, FA2_BWD_SLOTS))
    else:
        fwd, bwd = live_counts(indices, causal, seqlen_q, seqlen_k)
        kernels = (("fwd", forward_orders(fwd), FWD_US, SMS), ("bwd", backward_orders(bwd), BWD_US, SMS))
    rows = []
    for kernel, orders, (tile_us, step_us), slots in kernels:
        costs = {k: [tile_us + step_us * s for s in v] for k, v in orders.items()}
        ideal = sum(next(iter(costs.values()))) / slots
        cells = [f"{k} {makespan(c, slots) / 1000:.2f}" for k, c in costs.items()]
        rows.append(f"| {name} | {seqlen_q} | {family} {kernel} | " + " | ".join(cells) + f" | {ideal / 1000:.2f} |")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--masks", nargs="+", default=["global_sliding_window", "sliding_window", "causal_document"])
    ap.add_argument("--mask-file", nargs=4, metavar=("FILE", "S", "C", "CAUSAL"),
                    help="a raw int32 [S, C] mask (dump_bench_masks.py, dump_cp_part_mask.py)")
    ap.add_argument("--family", choices=["sm90", "fa2"], default="sm90",
                    help="the Hopper kernels' orders, or the FA2-class kernels' (cuda/fa2_cta_order.cuh)")
    ap.add_argument("--fa2-floor-rows", type=int, default=FA2_HEAVY_MIN_ROWS,
                    help="the FA2-class orders' floor as keys (forward) or rows (backward) a CTA walks")
    args = ap.parse_args(argv)
    kw = {"family": args.family, "fa2_floor_rows": args.fa2_floor_rows}
    print("| mask | S | kernel | ms, old order | ms, new order | ideal ms |")
    print("|---|---|---|---|---|---|")
    if args.mask_file:
        path, s, c, causal = args.mask_file[0], int(args.mask_file[1]), int(args.mask_file[2]), args.mask_file[3] == "1"
        idx = np.fromfile(path, dtype=np.int32).reshape(1, 1, s, c)
        print("\n".join(model_rows(os.path.basename(path), idx, causal, s, s, **kw)))
        return 0
    sys.path.insert(0, os.path.dirname(HERE))
    from mask_area import bench_mask
    from paddle_flashmask import masks

    for seqlen in args.lengths:
        for name in args.masks:
            idx, causal = bench_mask(masks, name, seqlen, 8)
            print("\n".join(model_rows(name, idx, causal, seqlen, seqlen, **kw)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
