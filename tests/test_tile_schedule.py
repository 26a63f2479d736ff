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
