"""paddle_flashmask/distributed/spacing.py: allgather's received parts with their keys spaced out so
that no key block's min/max summary spans rows none of its keys see. The kernels' tile
classification (benchmarks/tile_geometry.py, its numpy mirror) must compute no more tiles with the
slots than without, and close to only the live ones; the slots must be a valid layout."""

import numpy as np
import paddle
import pytest
from script_loader import load_script

from paddle_flashmask import masks
from paddle_flashmask.distributed import ContextParallelPlan, allgather, spacing

geometry = load_script("benchmarks/tile_geometry.py")

KERNEL_TILES = [(64, 128), (128, 64), (128, 128)]


def _visible_intervals(columns, num_rows):
    """Per non-causal column ([keys, C]) the rows it shows as up to three intervals [a, b)."""
    c = np.asarray(columns, dtype=np.int64)
    if c.shape[1] == 2:  # [LTS, UTE]: rows in [UTE, LTS) are shown
        zero = np.zeros(len(c), np.int64)
        return np.stack([c[:, 1], zero, zero], 1), np.stack([c[:, 0], zero, zero], 1)
    lo_first = c[:, 0] <= c[:, 2]
    s1, e1 = np.where(lo_first, c[:, 0], c[:, 2]), np.where(lo_first, c[:, 1], c[:, 3])
    s2, e2 = np.where(lo_first, c[:, 2], c[:, 0]), np.where(lo_first, c[:, 3], c[:, 1])
    e1, e2 = np.maximum(e1, s1), np.maximum(e2, s2)
    gap_end = np.maximum(s2, e1)
    return (np.stack([np.zeros_like(s1), e1, np.maximum(e1, e2)], 1),
            np.stack([s1, gap_end, np.full_like(s1, num_rows)], 1))


def live_tiles(columns, num_rows, block_m, block_n):
    """Tiles (block_m rows x block_n keys) where some key shows some row: what no summary can skip."""
    a, b = _visible_intervals(columns, num_rows)
    keys = len(columns)
    n_rows = -(-num_rows // block_m)
    diff = np.zeros((-(-keys // block_n), n_rows + 1), np.int64)
    key_block = np.repeat(np.arange(keys) // block_n, 3)
    a, b = a.ravel(), b.ravel()
    shown = b > a
    np.add.at(diff, (key_block[shown], a[shown] // block_m), 1)
    np.add.at(diff, (key_block[shown], (b[shown] - 1) // block_m + 1), -1)
    return int((np.cumsum(diff, 1)[:, :n_rows] > 0).sum())


def computed_tiles(columns, num_rows, block_m, block_n):
    kinds = geometry.classify_tiles(columns[None, None], False, num_rows, len(columns), block_m, block_n)
    return int((kinds != geometry.SKIP).sum())


@pytest.mark.parametrize("cols", [2, 4])
def test_live_tiles_helper_matches_the_dense_part(cols):
    rng = np.random.default_rng(cols)
    rows, keys = 150, 77
    c = np.sort(rng.integers(0, rows + 1, size=(keys, cols)), axis=1).astype(np.int32)
    if cols == 2:
        c = c[:, ::-1].copy()  # LTS >= UTE too, not only below
    r = np.arange(rows)[:, None]
    masked = (r >= c[:, 0]) | (r < c[:, 1]) if cols == 2 else \
        ((r >= c[:, 0]) & (r < c[:, 1])) | ((r >= c[:, 2]) & (r < c[:, 3]))
    for bm, bn in [(16, 8), (32, 16)]:
        want = sum(bool((~masked[i:i + bm, j:j + bn]).any()) for i in range(0, rows, bm) for j in range(0, keys, bn))
        assert live_tiles(c, rows, bm, bn) == want


def _received_parts(name, S, W):
    idx, causal = masks.example_mask(name, S, batch_size=1, num_heads=1, seed=3)
    idx = idx.numpy()
    plan = ContextParallelPlan(idx, causal, W, seqlen=S)
    for r in range(W):
        spec = allgather.Spec(plan, r, None, paddle.to_tensor(idx), causal, 1.0, None, False, 1, paddle.CPUPlace(),
                              128)
        masks_r = spec.part_masks()
        for gi in range(len(spec.groups())):
            slots = spec.part_slots(gi)
            if slots is None:
                continue
            if gi == 0 and spec.fused():  # group 0's buffer follows the own keys in the first call
                yield spec.L, masks_r[0].numpy()[0, 0][spec.L + spec.lead(0):], slots
            else:
                yield spec.L, masks_r[1 + gi].numpy()[0, 0], slots


@pytest.mark.parametrize("name,S", [("causal_document", 16384), ("share_question", 16384),
                                    ("global_sliding_window", 16384), ("document", 16384),
                                    ("random_eviction", 65536)])  # its first cuts come at 64K
def test_spaced_parts_compute_no_more_tiles_and_about_the_live_ones(name, S):
    totals = np.zeros(3, np.int64)  # back to back, spaced, live
    parts = 0
    for W in (2, 3, 4):
        for rows, spaced, (slots, length) in _received_parts(name, S, W):
            parts += 1
            assert len(spaced) == length
            back_to_back = spaced[slots]
            # the padding slots hide every row with both bands (a no-op in a block's min/max)
            pad = np.ones(length, bool)
            pad[slots] = False
            np.testing.assert_array_equal(spaced[pad], np.tile([0, rows] * (spaced.shape[1] // 2), (pad.sum(), 1)))
            for bm, bn in KERNEL_TILES:
                before, after = computed_tiles(back_to_back, rows, bm, bn), computed_tiles(spaced, rows, bm, bn)
                assert after <= before, (W, bm, bn)
                totals += [before, after, live_tiles(spaced, rows, bm, bn)]
    assert parts > 0
    before, after, live = totals
    assert after <= live * 1.01, totals
    if name in ("causal_document", "global_sliding_window"):
        assert after < before * 0.95, totals  # where keys of a part see far-apart rows


def _columns_showing(row_ranges, num_rows):
    """Non-causal C = 4 columns, one per (start, end): rows [start, end) shown."""
    return np.array([[0, s, e, num_rows] for s, e in row_ranges], np.int32)[None, None]


def test_a_cut_where_the_next_keys_see_far_away_rows():
    L = 100_000
    near, far = [(0, 100)] * 70, [(50_000, 50_100)] * 70
    slots, length = spacing.key_slots(_columns_showing(near + far, L), L, 1 << 19)
    np.testing.assert_array_equal(slots, np.concatenate([np.arange(70), 128 + np.arange(70)]))
    assert length == 198


def test_no_cut_where_the_block_shows_those_rows_already():
    L = 100_000
    # the first keys see every row up to the far ones' (as evicted tokens do): the block's
    # summary spans them anyway, so a cut would only add a key block
    wide, far = [(0, 50_100)] * 70, [(50_000, 50_100)] * 70
    assert spacing.key_slots(_columns_showing(wide + far, L), L, 1 << 19) is None
    # neighbours see neighbouring rows (a sliding window): nothing to cut
    window = [(i, i + 1024) for i in range(0, 5000, 7)]
    assert spacing.key_slots(_columns_showing(window, L), L, 1 << 19) is None


def test_slots_are_a_layout_within_the_budget():
    rng = np.random.default_rng(0)
    L = 1 << 16
    for trial in range(20):
        n = int(rng.integers(2, 3000))
        starts = np.sort(rng.integers(0, L - 2000, size=int(rng.integers(1, 12))))
        pieces = np.split(np.arange(n), np.sort(rng.choice(np.arange(1, n), size=min(n - 1, len(starts) - 1),
                                                             replace=False)))
        ranges = [(int(s), int(s) + int(rng.integers(1, 2000))) for s, p in zip(starts, pieces) for _ in p]
        columns = _columns_showing(ranges, L)
        got = spacing.key_slots(columns, L, 1 << 19)
        if got is None:
            continue
        slots, length = got
        assert slots.dtype == np.int64 and len(slots) == n and length == slots[-1] + 1
        assert (np.diff(slots) >= 1).all()
        jumps = np.flatnonzero(np.diff(slots) > 1) + 1  # each run after a jump starts a key block
        assert (slots[jumps] % spacing.BLOCK_KEYS == 0).all()
        assert length - n <= max(n * spacing.MAX_PADDING_SHARE, 4 * spacing.BLOCK_KEYS)
        # with no room for padding the keys stay back to back
        assert spacing.key_slots(columns, L, n) is None


def test_one_key_or_no_candidates_give_none():
    assert spacing.key_slots(_columns_showing([(5, 9)], 100), 100, 1 << 19) is None
    assert spacing.key_slots(_columns_showing([(5, 9)] * 300, 100), 100, 1 << 19) is None
