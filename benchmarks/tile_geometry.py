"""The tiles a kernel computes for a FlashMask, and the share of their area that is unmasked
(numpy only): the ceiling a mask's TFLOP/s on the unmasked area can reach against plain causal's
with the same tiles, before any cost a kernel adds per tile or per CTA.

A tile is skipped, computed whole, or computed with elementwise masking, by the rule of
`classify_tile` over per-column-block bounds (custom_ops/flashmask/mask_bounds.h): the kernels
summarise each block of `summary_cols` key columns by the min/max of its columns' bounds, and a
tile of several such blocks combines its parts' kinds (`classify_tile_parts`).

    python3 benchmarks/tile_geometry.py [--lengths 8192 32768] [--masks causal_document ...]

prints, for the benchmark's mask instances (mask_area.bench_mask, the ones bench_gpu.py times),
each kernel tile's unmasked share of the computed area over plain causal's (the ratio issue 15's
and 16's mask targets are read against) and the share of computed tiles that need masking; then
the same shares with tiles aligned to the mask's diagonal blocks (`segments`), what tiling each
packed document on its own would leave.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mask_area import BENCH_MASKS, column_bounds, unmasked_area  # noqa: E402

SUMMARY_COLS = 64  # kMaskBlockN (custom_ops/flashmask/cuda/kernel_traits.h): one BlockBounds a block

# (query rows, key columns) of the kernels' tiles at head dim 128 (kernel_traits.h,
# sm90/sm90_kernel_traits.h): the FA2-class forward 4 warps x 32 rows over 64 keys, its backward
# 64-row steps over 128 keys; the Hopper forward two warpgroups of 64 rows over 128 keys, its
# backward 64-row steps over 128 keys.
KERNEL_TILES = {
    "fa2 fwd": (128, 64),
    "fa2 bwd": (64, 128),
    "sm90 fwd": (128, 128),
    "sm90 bwd": (64, 128),
}

SKIP, FULL, PARTIAL = 0, 1, 2


def _part_kinds(indices, causal, seqlen_q, seqlen_k, block_m, part_cols):
    """Kinds [B, Hm, row blocks, parts] of the block_m x part_cols tiles (classify_tile)."""
    if indices is None:
        shape = (1, 1)
        lts = lte = uts = ute = None
    else:
        lts, lte, uts, ute = column_bounds(indices, causal, seqlen_q)
        shape = lts.shape[:2]
    n_rows = -(-seqlen_q // block_m)
    n_parts = -(-seqlen_k // part_cols)
    r0 = (np.arange(n_rows) * block_m)[:, None]
    r1 = np.minimum(r0 + block_m, seqlen_q)  # the kernels pass the tile's last row + 1
    c0 = (np.arange(n_parts) * part_cols)[None, :]
    c1 = c0 + part_cols  # unclamped: a ragged last block masks its overhang
    partial = np.broadcast_to(c1 > seqlen_k, (n_rows, n_parts))
    skip = np.zeros((n_rows, n_parts), dtype=bool)
    if causal:  # bottom-right aligned: row i sees keys j <= i + (seqlen_k - seqlen_q)
        offset = seqlen_k - seqlen_q
        skip = skip | (c0 > r1 - 1 + offset)
        partial = partial | (c1 - 1 > r0 + offset)
    if lts is not None:
        starts = np.arange(n_parts) * part_cols

        def lo(x):
            return np.minimum.reduceat(x, starts, axis=-1)[..., None, :]

        def hi(x):
            return np.maximum.reduceat(x, starts, axis=-1)[..., None, :]

        skip = skip | ((r0 >= hi(lts)) & (r1 <= lo(lte))) | ((r0 >= hi(uts)) & (r1 <= lo(ute)))
        lower_clear = (r1 <= lo(lts)) | (r0 >= hi(lte)) | (lo(lts) >= hi(lte))
        upper_clear = (r1 <= lo(uts)) | (r0 >= hi(ute)) | (lo(uts) >= hi(ute))
        partial = partial | ~(lower_clear & upper_clear)
    skip, partial = np.broadcast_arrays(skip, partial)
    kinds = np.where(skip, SKIP, np.where(partial, PARTIAL, FULL))
    return np.broadcast_to(kinds, shape + kinds.shape[-2:])


def _tile_parts(indices, causal, seqlen_q, seqlen_k, block_m, block_n, part_cols):
    """Kinds [B, Hm, row blocks, key tiles, parts] of each block_m x block_n tile's part_cols-wide
    parts (_part_kinds); parts wholly past the keys' end count as skipped."""
    parts = _part_kinds(indices, causal, seqlen_q, seqlen_k, block_m, part_cols)
    per_tile = block_n // part_cols
    n_tiles = -(-seqlen_k // block_n)
    pad = n_tiles * per_tile - parts.shape[-1]
    if pad:
        parts = np.concatenate([parts, np.full(parts.shape[:-1] + (pad,), SKIP)], axis=-1)
    return parts.reshape(parts.shape[:-1] + (n_tiles, per_tile))


def classify_tiles(indices, causal, seqlen_q, seqlen_k, block_m, block_n, summary_cols=SUMMARY_COLS):
    """Kinds [B, Hm, row blocks, key blocks] (SKIP, FULL, PARTIAL) of the block_m x block_n tiles.

    `indices` is startend_row_indices [B, Hm, Sk, C] (None: no column mask). Key tiles wider
    than a summary block combine their parts' kinds: skipped or whole where every part is,
    masked elementwise otherwise."""
    if block_n % summary_cols and summary_cols % block_n:
        raise ValueError(f"block_n {block_n} and summary_cols {summary_cols}: one must divide the other")
    grouped = _tile_parts(indices, causal, seqlen_q, seqlen_k, block_m, block_n, min(block_n, summary_cols))
    # combine_tile_kinds: the parts' common kind, else elementwise (a missing part beside a live
    # one counts as skipped, so the tile masks the overhang).
    same = (grouped == grouped[..., :1]).all(-1)
    return np.where(same, grouped[..., 0], PARTIAL)


def computed_area(kinds, seqlen_q, seqlen_k, block_m, block_n):
    """Elements of the tiles computed (skipped ones excluded), [B, Hm]: a tile's rows and
    columns are clipped to the sequences, as the kernels' loads are."""
    rows = np.minimum(block_m, seqlen_q - np.arange(kinds.shape[-2]) * block_m)
    cols = np.minimum(block_n, seqlen_k - np.arange(kinds.shape[-1]) * block_n)
    return ((kinds != SKIP) * rows[:, None] * cols[None, :]).sum((-2, -1))


def tile_geometry(indices, causal, seqlen_q, seqlen_k, block_m, block_n):
    """(unmasked share of the computed area, share of computed tiles masked elementwise), each
    over every (batch, mask head)."""
    kinds = classify_tiles(indices, causal, seqlen_q, seqlen_k, block_m, block_n)
    batch, heads = kinds.shape[:2]
    area = unmasked_area(indices, causal, seqlen_q, seqlen_k, batch, heads)
    computed = computed_area(kinds, seqlen_q, seqlen_k, block_m, block_n)
    n_live = (kinds != SKIP).sum()
    return float(area.sum() / max(computed.sum(), 1)), float((kinds == PARTIAL).sum() / max(n_live, 1))


def key_halves(indices, causal, seqlen_q, seqlen_k, block_m=64, block_n=128):
    """The FA2-class backward's steps (block_m query rows over a CTA's block_n keys, two summary
    blocks wide) and how many of them have exactly one live summary block ("key half"): (live
    steps, steps with one live half). A half past the keys' end is not live. Where a step's other
    half is wholly masked, a kernel can run that step's GEMMs on the live half's keys alone."""
    if block_n != 2 * SUMMARY_COLS:
        raise ValueError(f"block_n {block_n}: key halves are two summary blocks of {SUMMARY_COLS}")
    live = _tile_parts(indices, causal, seqlen_q, seqlen_k, block_m, block_n, SUMMARY_COLS) != SKIP
    return int(live.any(-1).sum()), int((live.sum(-1) == 1).sum())


def _live_row_range(indices, causal, seqlen):
    """(first, last) visible row of each key column, [B, Hm, S] each (self-attention, Sq = Sk =
    seqlen); an empty column has first = seqlen and last = -1."""
    lts, lte, uts, ute = column_bounds(indices, causal, seqlen)
    lo = np.broadcast_to(np.arange(seqlen) if causal else np.zeros(seqlen, dtype=np.int64), lts.shape)
    first, last = lo.copy(), np.full(lts.shape, seqlen - 1)
    for _ in range(2):  # two masked intervals: a row leaves each one at most once, either way
        first = np.where((first >= lts) & (first < lte), lte, first)
        first = np.where((first >= uts) & (first < ute), ute, first)
        last = np.where((last >= lts) & (last < lte), lts - 1, last)
        last = np.where((last >= uts) & (last < ute), uts - 1, last)
    empty = (first >= seqlen) | (last < lo) | (first > last)
    return np.where(empty, seqlen, first), np.where(empty, -1, last)


def segments(indices, causal, seqlen):
    """The mask's diagonal blocks, [B][Hm] lists of (start, end): split at every row s where no
    row >= s sees a key < s and no row < s a key >= s (documents packed into one sequence;
    FlashAttention's varlen call takes them as separate sequences). Self-attention only."""
    first, last = _live_row_range(indices, causal, seqlen)
    seen_before = np.maximum.accumulate(last, -1)[..., :-1]  # last row seeing a key < s
    seen_after = np.minimum.accumulate(first[..., ::-1], -1)[..., ::-1][..., 1:]  # first row seeing a key >= s
    rows = np.arange(1, seqlen)
    split = (seen_before < rows) & (seen_after >= rows)
    out = []
    for per_batch in split:
        out.append([])
        for per_head in per_batch:
            cuts = [0] + [int(r) for r in rows[per_head]] + [seqlen]
            out[-1].append(list(zip(cuts[:-1], cuts[1:])))
    return out


def segment_aligned_geometry(indices, causal, seqlen, block_m, block_n):
    """tile_geometry's unmasked share when every diagonal block (`segments`) is tiled from its own
    first row and key, as a varlen kernel tiles its sequences: each block is classified as a mask
    of its own (its columns' bounds shifted to its first row and clipped to it), and no tile
    straddles two blocks. A block's last row and key tiles count whole, as the kernels compute
    them: their rows and keys past the block are the next block's, loaded and masked (only the
    sequence's end clips a tile, as in computed_area)."""
    if indices is None:  # no column mask: one block, the whole sequence
        return tile_geometry(None, causal, seqlen, seqlen, block_m, block_n)[0]
    idx = np.asarray(indices, dtype=np.int64)
    batch, heads = idx.shape[:2]
    computed = 0
    for b, per_batch in enumerate(segments(idx, causal, seqlen)):
        for h, blocks in enumerate(per_batch):
            for start, end in blocks:
                length = end - start
                sub = np.clip(idx[b:b + 1, h:h + 1, start:end] - start, 0, length)
                live = classify_tiles(sub, causal, length, length, block_m, block_n)[0, 0] != SKIP
                rows = np.minimum(block_m, seqlen - (start + np.arange(live.shape[0]) * block_m))
                cols = np.minimum(block_n, seqlen - (start + np.arange(live.shape[1]) * block_n))
                computed += int((live * rows[:, None] * cols[None, :]).sum())
    area = unmasked_area(idx, causal, seqlen, seqlen, batch, heads)
    return float(area.sum() / max(computed, 1))


def _length(seqlen):
    return f"{seqlen // 1024}K" if seqlen % 1024 == 0 else str(seqlen)


def geometry_table(masks_module, names, lengths, tiles=KERNEL_TILES, heads_k=8, segment_aligned=False):
    """Markdown rows: each mask's unmasked share per kernel tile over plain causal's, and the
    share of the first kernel tile's computed tiles that are masked elementwise; with
    `segment_aligned`, the shares with each diagonal block tiled on its own and the number of
    blocks instead."""
    from mask_area import bench_mask

    first = next(iter(tiles))
    last = "blocks" if segment_aligned else f"masked tiles ({first})"
    head = ["mask", "S"] + [f"{k} {m}x{n}" for k, (m, n) in tiles.items()] + [last]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seqlen in lengths:
        causal_share = {k: tile_geometry(None, True, seqlen, seqlen, m, n)[0] for k, (m, n) in tiles.items()}
        for name in names:
            idx, causal = bench_mask(masks_module, name, seqlen, heads_k)
            if segment_aligned:
                shares = {k: segment_aligned_geometry(idx, causal, seqlen, m, n) for k, (m, n) in tiles.items()}
                blocks = [1] if idx is None else [len(per_head) for per_batch in segments(idx, causal, seqlen)
                                                  for per_head in per_batch]
                tail = f"{min(blocks)}" if min(blocks) == max(blocks) else f"{min(blocks)}-{max(blocks)}"
            else:
                geo = {k: tile_geometry(idx, causal, seqlen, seqlen, m, n) for k, (m, n) in tiles.items()}
                shares, tail = {k: g[0] for k, g in geo.items()}, f"{geo[first][1]:.2f}"
            cells = [f"{shares[k] / causal_share[k]:.2f}" for k in tiles]
            lines.append(f"| {name} | {_length(seqlen)} | " + " | ".join(cells) + f" | {tail} |")
    return lines


def key_halves_table(masks_module, names, lengths, heads_k=8):
    """Markdown rows: the FA2-class backward's live steps (64 rows x 128 keys) per (batch, mask
    head) and the share with one live 64-key half (`key_halves`)."""
    from mask_area import bench_mask

    lines = ["| mask | S | live steps | one live half |", "|---|---|---|---|"]
    for seqlen in lengths:
        for name in names:
            idx, causal = bench_mask(masks_module, name, seqlen, heads_k)
            steps, single = key_halves(idx, causal, seqlen, seqlen)
            rows = 1 if idx is None else int(np.prod(np.shape(idx)[:2]))
            lines.append(f"| {name} | {_length(seqlen)} | {steps / rows:.0f} | {single / max(steps, 1):.3f} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--masks", nargs="+", default=[m for m in BENCH_MASKS if m not in ("full", "causal")],
                    choices=BENCH_MASKS)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(HERE))
    from paddle_flashmask import masks

    print("Unmasked share of the computed tiles' area, over plain causal's with the same tiles "
          "(the ceiling of a mask's TFLOP/s against causal's, before per-tile and per-CTA costs); "
          "last column: computed tiles masked elementwise.\n")
    print("\n".join(geometry_table(masks, args.masks, args.lengths)))
    print("\nThe same with each diagonal block of the mask (the documents of a packed sequence, "
          "`segments`) tiled from its own first row and key, as a varlen kernel tiles its sequences "
          "(tiles never straddle two blocks); last column: the blocks found.\n")
    print("\n".join(geometry_table(masks, args.masks, args.lengths, segment_aligned=True)))
    print("\nThe FA2-class backward's steps (64 query rows over a CTA's 128 keys) with one live 64-key "
          "half, whose other half a kernel need not compute.\n")
    print("\n".join(key_halves_table(masks, ["causal"] + [m for m in args.masks if m != "causal"], args.lengths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
