"""benchmarks/tile_schedule.py: the list-scheduling model of the Hopper kernels' tile orders, and
its thresholds against the kernels' own constants."""

import os
import re
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import tile_schedule as ts  # noqa: E402
from paddle_flashmask import masks  # noqa: E402

SM90 = os.path.join(REPO, "custom_ops", "flashmask", "cuda", "sm90")


def _constant(header, name):
    with open(os.path.join(SM90, header)) as f:
        return int(re.search(rf"constexpr int {name} = (\d+);", f.read()).group(1))


def test_thresholds_are_the_kernels():
    assert ts.HEAVY_MIN_BLOCKS == _constant("fwd_tile_order.cuh", "kHeavyMinBlocks")
    assert ts.HEAVY_SHARE == _constant("fwd_tile_order.cuh", "kHeavyShare")
    assert ts.CHAIN_MIN_STEPS == _constant("bwd_cta_order.cuh", "kChainMinSteps")
    assert ts.CHAIN_SHARE == _constant("bwd_cta_order.cuh", "kChainShare")


def test_makespan_list_schedules():
    assert ts.makespan([5.0, 1.0, 1.0, 1.0], sms=2) == 5.0
    assert ts.makespan([1.0, 1.0, 1.0, 5.0], sms=2) == 6.0  # the long one last runs alone
    assert ts.makespan([], sms=4) == 0.0


def test_fitted_heads_bounds_the_steps():
    assert ts.fitted_heads(20, 4) == 4 and ts.fitted_heads(30, 4) == 2 and ts.fitted_heads(81, 4) == 1


def test_orders_keep_every_tile():
    rng = np.random.default_rng(0)
    fwd, bwd = rng.integers(0, 600, 64), rng.integers(0, 900, 32)
    for orders, counts, per in ((ts.forward_orders(fwd), fwd, 32), (ts.backward_orders(bwd), None, None)):
        first, second = orders.values()
        assert sorted(first) == sorted(second)
        if counts is not None:
            assert sorted(first) == sorted(np.repeat(counts, per).tolist())


def test_global_rows_gain_from_the_new_orders():
    # global + sliding window at 32K: the global rows' tiles and the global keys' key blocks go first,
    # and the model's end of the call comes earlier; the ideal is the same work
    idx = masks.global_sliding_window_mask(32768, 16, 1024, place="numpy")
    fwd, bwd = ts.live_counts(idx, False, 32768, 32768)
    assert fwd[0] == fwd.max() == 256  # query block 0 holds the global rows: every key block
    tree, heavy = ts.forward_orders(fwd).values()
    assert heavy[:32] == [256] * 32 and tree[-1] == 256
    cost = [2.0 + 2.4 * s for s in heavy]
    assert ts.makespan(cost) < 0.9 * ts.makespan([2.0 + 2.4 * s for s in tree])
    grid, chains = ts.backward_orders(bwd).values()
    assert chains[:32] == [512] * 32  # key block 0: the global keys, every row
    assert ts.makespan([3.0 + 3.6 * s for s in chains]) < ts.makespan([3.0 + 3.6 * s for s in grid])


def test_packed_documents_keep_their_order():
    # nothing heavy in documents of at most 8K tokens: both orders are the old ones
    idx = masks.causal_document_mask([8192, 4096, 8192, 12288], place="numpy")
    fwd, bwd = ts.live_counts(idx, True, 32768, 32768)
    tree, heavy = ts.forward_orders(fwd).values()
    grid, chains = ts.backward_orders(bwd).values()
    assert tree == heavy and grid == chains


def test_fa2_constants_are_the_kernels():
    with open(os.path.join(os.path.dirname(SM90), "fa2_cta_order.cuh")) as f:
        assert ts.FA2_HEAVY_MIN_ROWS == int(re.search(r"constexpr int kFa2HeavyMinRows = (\d+);", f.read()).group(1))
    with open(os.path.join(os.path.dirname(SM90), "flashmask_launch.cuh")) as f:
        assert ts.FA2_LIGHT_LAST == int(re.search(r"kDefault = kBlockN >= 128 \? (\d+) : 0;", f.read()).group(1))


def test_fa2_orders_keep_every_cta_and_take_the_global_rows_first():
    # The FA2-class grids' own orders and heavy first (cuda/fa2_cta_order.cuh) on global + sliding
    # window at 32K: the same CTAs, the global rows' query block (the forward's last grid row) and
    # the global keys' key block (the last head's starts late) first, and an earlier end.
    # (At 32K under the environment's lower floor, 16K keys or rows: the default, 64K, leaves 32K as it is.)
    idx = masks.global_sliding_window_mask(32768, 16, 1024, place="numpy")
    fwd, bwd = ts.fa2_live_counts(idx, False, 32768, 32768)
    assert fwd[0] == fwd.max() == 512 and bwd[0] == bwd.max() == 512
    floor = 16384 // 64
    for orders, per_block, slots, us in ((ts.fa2_forward_orders(fwd, min_blocks=floor), fwd, ts.FA2_FWD_SLOTS,
                                          ts.FA2_FWD_US),
                                         (ts.fa2_backward_orders(bwd, min_steps=floor), bwd, ts.FA2_BWD_SLOTS,
                                          ts.FA2_BWD_US)):
        grid, heavy = orders.values()
        assert sorted(grid) == sorted(heavy) == sorted(np.repeat(per_block, 32).tolist())
        assert heavy[:32] == [512] * 32 and grid[:32] != [512] * 32
        cost = lambda order: ts.makespan([us[0] + us[1] * s for s in order], slots)  # noqa: E731
        assert cost(heavy) < 0.95 * cost(grid)
    # Under the default floor (64K keys or rows a CTA walks) the grid's order stays.
    for orders in (ts.fa2_forward_orders(fwd), ts.fa2_backward_orders(bwd)):
        grid, heavy = orders.values()
        assert grid == heavy
