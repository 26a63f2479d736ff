"""Attention work per query row of a FlashMask mask, in O(S) per mask head.

Context parallel splits the query rows over ranks, so what has to be balanced is,
per row, the number of keys it attends to (summed over batch and mask heads). Each
key column masks at most two row intervals (the causal part counts as one), so the
per-row counts come from difference arrays over those intervals: no dense mask.
"""

from __future__ import annotations

import numpy as np


def masked_intervals(indices: np.ndarray | None, causal: bool, seqlen: int):
    """The (at most) two masked row intervals of every key column, Sq == Sk == seqlen.

    Returns ``(a0, a1, b0, b1)``, each ``[B, Hm, S]`` int64: column j masks rows
    ``[a0, a1)`` and ``[b0, b1)`` (empty intervals have start >= end). ``None`` indices
    give shape ``[1, 1, S]``.
    """
    S = int(seqlen)
    cols = np.arange(S, dtype=np.int64)
    if indices is None:
        shape = (1, 1, S)
        zero = np.zeros(shape, dtype=np.int64)
        causal_end = np.broadcast_to(cols, shape) if causal else zero
        return zero, zero, zero, causal_end.astype(np.int64)
    v = np.clip(np.asarray(indices, dtype=np.int64), 0, S)
    C = v.shape[-1]
    full = np.full(v.shape[:3], S, dtype=np.int64)
    zero = np.zeros(v.shape[:3], dtype=np.int64)
    if causal:
        # The causal part masks rows i < j (key j after query i).
        a0, a1 = v[..., 0], (full if C == 1 else v[..., 1])
        b0, b1 = zero, np.broadcast_to(cols, v.shape[:3]).astype(np.int64)
    elif C == 2:
        a0, a1, b0, b1 = v[..., 0], full, zero, v[..., 1]
    else:
        a0, a1, b0, b1 = v[..., 0], v[..., 1], v[..., 2], v[..., 3]
    return a0, a1, b0, b1


def _coverage(starts: np.ndarray, ends: np.ndarray, seqlen: int) -> np.ndarray:
    # Per row, how many of the intervals [starts, ends) cover it (empty ones count 0).
    starts, ends = starts.ravel(), ends.ravel()
    keep = starts < ends
    diff = np.bincount(starts[keep], minlength=seqlen + 1) - np.bincount(ends[keep], minlength=seqlen + 1)
    return np.cumsum(diff[:seqlen])


def unmasked_per_row(indices: np.ndarray | None, causal: bool, seqlen: int) -> np.ndarray:
    """Keys each query row attends to, summed over batch and mask heads: int64 ``[S]``.

    Exact (the two intervals' overlap is subtracted once); O(B * Hm * S).
    """
    S = int(seqlen)
    a0, a1, b0, b1 = masked_intervals(indices, causal, S)
    heads = a0.shape[0] * a0.shape[1]
    masked = _coverage(a0, a1, S) + _coverage(b0, b1, S)
    masked -= _coverage(np.maximum(a0, b0), np.minimum(a1, b1), S)
    return heads * S - masked


def _blocks_inside(lo, hi, seqlen, block):
    # Row blocks [first, last) lying wholly inside the rows [lo, hi) (the last block may be short).
    nb = -(-seqlen // block)
    first = -(-lo // block)
    last = np.where(hi >= seqlen, nb, hi // block)
    return first, np.maximum(last, first)


def live_tiles_per_row(indices: np.ndarray | None, causal: bool, seqlen: int, block: int = 128) -> np.ndarray:
    """Kernel work per query row: the live (not fully masked) ``block x block`` tiles of its
    row block, summed over batch and mask heads, float64 ``[S]``.

    The kernels pay per tile, not per element: a few rows that see every key (global
    tokens) make their whole row block visit every key block. A tile is taken as dead when
    one of the column block's two masked intervals covers its rows in every column (the
    per-block min/max summaries the kernels skip by); O(B * Hm * S).
    """
    S = int(seqlen)
    nb = -(-S // block)
    a0, a1, b0, b1 = masked_intervals(indices, causal, S)
    starts = np.arange(0, S, block)
    # rows masked in EVERY column of a column block, per interval
    A_lo, A_hi = np.maximum.reduceat(a0, starts, axis=-1), np.minimum.reduceat(a1, starts, axis=-1)
    B_lo, B_hi = np.maximum.reduceat(b0, starts, axis=-1), np.minimum.reduceat(b1, starts, axis=-1)
    dead = np.zeros(nb + 1, dtype=np.int64)
    for lo, hi, sign in ((A_lo, A_hi, 1), (B_lo, B_hi, 1),
                         (np.maximum(A_lo, B_lo), np.minimum(A_hi, B_hi), -1)):
        f, l = _blocks_inside(lo.ravel(), hi.ravel(), S, block)
        keep = f < l
        dead += sign * (np.bincount(f[keep], minlength=nb + 1) - np.bincount(l[keep], minlength=nb + 1))
    heads = a0.shape[0] * a0.shape[1]
    live_per_block = heads * starts.size - np.cumsum(dead)[:nb]
    return np.repeat(live_per_block.astype(np.float64), block)[:S]


def columns_seen_by(indices: np.ndarray | None, causal: bool, seqlen: int, rows: np.ndarray,
                    intervals=None) -> np.ndarray:
    """bool ``[S]``: the key columns that at least one of the query ``rows`` attends to, in
    some batch row and mask head. O(B * Hm * S): each column's kept rows are the complement
    of its two masked intervals, counted in ``rows`` through a prefix sum. ``intervals``:
    :func:`masked_intervals` of the same mask, when the caller has them."""
    S = int(seqlen)
    rows = np.asarray(rows, dtype=np.int64)
    in_rows = np.zeros(S + 1, dtype=np.int32)
    in_rows[rows + 1] = 1
    before = np.cumsum(in_rows, dtype=np.int32)  # before[g]: rows < g (non-decreasing)

    def count(lo, hi):
        # bounds lie in [0, S] (masked_intervals clips them); an empty interval (hi <= lo)
        # gives before[hi] - before[lo] <= 0, hence the floor at 0
        return np.maximum(before[hi] - before[lo], 0)

    a0, a1, b0, b1 = intervals if intervals is not None else masked_intervals(indices, causal, S)
    kept = rows.size - count(a0, a1) - count(b0, b1) + count(np.maximum(a0, b0), np.minimum(a1, b1))
    return (kept > 0).reshape(-1, S).any(axis=0)
