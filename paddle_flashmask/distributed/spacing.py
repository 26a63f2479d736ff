"""Where a received part's keys sit in its kernel call: spaced out so that no key block mixes
far-apart rows.

The allgather method sends a rank only the keys its rows see, back to back in global order.
Neighbours there can see far-apart local rows (the keys of several documents or answers, a few
global tokens beside a window's keys), and the kernels summarise a key block by the min/max of
its columns' bounds: a block that mixes them leaves every row block between its columns' rows
partial, computed and masked to nothing (rank 1's received part of the 1M share-question plan
on 2 ranks: 8981 tiles of 64 x 128 computed for 1131 live). Starting a new key block where the
next key's rows would widen the block's summary by many row blocks (the gap filled with padding
slots: zero K/V, a column that hides every row and widens no summary, the remap op's -1) makes
the computed tiles the live ones (877 there) for a few percent more keys.

Numpy only; the columns are a part's remapped mask (non-causal form, C = 2 or 4).
"""

from __future__ import annotations

import contextlib

import numpy as np

# Key block the slots align to: every kernel's (64 or 128 keys) divides it.
BLOCK_KEYS = 128
# Row block the summaries are scored in: the finest any kernel steps by.
BLOCK_ROWS = 64
# A new key block starts where joining the next key would leave this many more rows computed.
MIN_WASTE_ROWS = 1024
# Padding slots at most, as a share of the part's keys (at least four cuts' worth; cuts are made
# in key order until it is spent).
MAX_PADDING_SHARE = 0.25


@contextlib.contextmanager
def geometry(block_keys, block_rows, min_waste_rows):
    """The blocks and threshold above set to these for a while: checks at toy lengths, where the
    kernels' own (128 keys, 64 rows, 1024) never cut."""
    global BLOCK_KEYS, BLOCK_ROWS, MIN_WASTE_ROWS
    saved = BLOCK_KEYS, BLOCK_ROWS, MIN_WASTE_ROWS
    BLOCK_KEYS, BLOCK_ROWS, MIN_WASTE_ROWS = block_keys, block_rows, min_waste_rows
    try:
        yield
    finally:
        BLOCK_KEYS, BLOCK_ROWS, MIN_WASTE_ROWS = saved


def _bands(columns, num_rows):
    """(LTS, LTE, UTS, UTE) int64 [..., keys] of non-causal columns: rows in [LTS, LTE) or
    [UTS, UTE) are masked (C = 2's [LTS, UTE] is [LTS, L) and [0, UTE))."""
    c = np.asarray(columns, dtype=np.int64)
    if c.shape[-1] == 2:
        return c[..., 0], np.full(c.shape[:-1], num_rows, np.int64), np.zeros(c.shape[:-1], np.int64), c[..., 1]
    return c[..., 0], c[..., 1], c[..., 2], c[..., 3]


def _rows_left_live(lts, lte, uts, ute, num_rows):
    """Row blocks a key block whose merged bounds are these does not skip: those not wholly
    inside one band (the kernels' classify_tile, mask_bounds.h)."""
    n = -(-num_rows // BLOCK_ROWS)

    def inside(lo, hi):
        first = -(-lo // BLOCK_ROWS)
        last = np.where(hi >= num_rows, n, hi // BLOCK_ROWS)
        return first, np.maximum(last, first)

    f1, l1 = inside(lts, lte)
    f2, l2 = inside(uts, ute)
    both = np.maximum(0, np.minimum(l1, l2) - np.maximum(f1, f2))
    return n - (l1 - f1) - (l2 - f2) + both


def key_slots(columns, num_rows, max_keys):
    """Slots of a part's keys in its kernel call: (int64 [keys] ascending, slots in all), or None
    when they stay back to back (no cut pays, or padding would pass ``max_keys``).

    ``columns``: the part's remapped mask, ``[B, Hm, keys, C]`` (C = 2 or 4, non-causal);
    ``num_rows``: the rank's rows (L). Keys where a neighbour pair's merged bounds leave many
    more row blocks live than either key alone are the candidates; going through them in order,
    a cut before key j pays when the keys after it that would share its key block leave
    ``MIN_WASTE_ROWS`` more rows live there than the block's keys before j do alone, in the
    worst (batch, mask head). A cut pads to the next key block.
    """
    keys = int(columns.shape[-2])
    if keys < 2:
        return None
    lts, lte, uts, ute = (b.reshape(-1, keys) for b in _bands(columns, num_rows))
    alone = _rows_left_live(lts, lte, uts, ute, num_rows)
    pair = _rows_left_live(np.maximum(lts[:, 1:], lts[:, :-1]), np.minimum(lte[:, 1:], lte[:, :-1]),
                           np.maximum(uts[:, 1:], uts[:, :-1]), np.minimum(ute[:, 1:], ute[:, :-1]), num_rows)
    waste_rows = MIN_WASTE_ROWS // BLOCK_ROWS
    candidates = np.flatnonzero((pair - np.maximum(alone[:, 1:], alone[:, :-1])).max(axis=0) >= waste_rows) + 1

    def live(a, b):  # row blocks the merged bounds of keys [a, b) leave live, per (batch, mask head)
        return _rows_left_live(lts[:, a:b].max(1), lte[:, a:b].min(1), uts[:, a:b].max(1), ute[:, a:b].min(1),
                               num_rows)

    budget = min(max(int(keys * MAX_PADDING_SHARE), 4 * BLOCK_KEYS), int(max_keys) - keys)
    cuts, padding = [], 0
    for j in candidates.tolist():
        offset = (j + padding) % BLOCK_KEYS  # key j's place in its key block without a cut
        if offset == 0:
            continue  # it starts a block already
        shared = min(keys, j + BLOCK_KEYS - offset)  # the keys after j that would share it
        if (live(j - offset, shared) - live(j - offset, j)).max() < waste_rows:
            continue
        if padding + BLOCK_KEYS - offset > budget:
            break
        padding += BLOCK_KEYS - offset
        cuts.append(j)
    if not cuts:
        return None
    starts = np.array([0] + cuts, dtype=np.int64)
    lengths = np.diff(np.append(starts, keys))
    first = np.empty_like(starts)
    at = 0
    for i, n in enumerate(lengths.tolist()):  # one step per run: few
        at = -(-at // BLOCK_KEYS) * BLOCK_KEYS
        first[i] = at
        at += n
    slots = np.repeat(first - starts, lengths) + np.arange(keys, dtype=np.int64)
    return slots, at
