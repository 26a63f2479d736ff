"""ContextParallelPlan (balance, partition, row maps) and the exchange layouts, in one
process: the layouts are checked by simulating the all-to-all with numpy."""

import time

import numpy as np
import paddle
import pytest

from paddle_flashmask import masks
from paddle_flashmask.distributed import ContextParallelPlan, assignment, layouts, workload
from paddle_flashmask.distributed.plan import mask_fingerprint


def dense_work(idx, causal, S):
    keep = masks.to_dense(idx, causal) if idx is not None else (np.tril(np.ones((S, S), bool)) if causal else np.ones((S, S), bool))
    keep = np.broadcast_to(keep, (1, 1, S, S)) if keep.ndim == 2 else keep
    return keep.sum(axis=(0, 1, 3))


@pytest.mark.parametrize("name", ["causal", "causal_document", "share_question", "document",
                                  "global_sliding_window", "prefix_lm_document", "random_eviction", "qk_sparse"])
def test_row_work_equals_the_dense_mask(name):
    S = 203
    idx, causal = masks.example_mask(name, S, batch_size=2, num_heads=2, seed=3)
    got = workload.unmasked_per_row(idx.numpy(), causal, S)
    np.testing.assert_array_equal(got, dense_work(idx.numpy(), causal, S))


def test_row_work_with_random_overlapping_intervals():
    from reference import random_indices

    rng = np.random.default_rng(0)
    S = 150
    for causal, C in ((True, 1), (True, 2), (False, 2), (False, 4)):
        idx = random_indices(rng, 2, 2, S, S, causal, C)
        np.testing.assert_array_equal(workload.unmasked_per_row(idx, causal, S), dense_work(idx, causal, S))
    for causal in (True, False):
        np.testing.assert_array_equal(workload.unmasked_per_row(None, causal, S), dense_work(None, causal, S))


@pytest.mark.parametrize("S", [8192, 32768, 131072])
@pytest.mark.parametrize("name", ["causal", "causal_document"])
@pytest.mark.parametrize("W", [2, 3, 4, 8])
def test_balanced_within_ten_percent(S, name, W):
    idx, causal = masks.example_mask(name, S, seed=W)
    t0 = time.perf_counter()
    plan = ContextParallelPlan(idx, causal, W)
    assert time.perf_counter() - t0 < 5.0  # O(S): milliseconds in practice
    assert plan.work_imbalance <= 1.10 and plan.token_imbalance <= 1.10, plan
    rows = [plan.local_rows(r) for r in range(W)]
    assert all(np.all(np.diff(r) > 0) for r in rows)
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(S))
    # the per-rank area the plan reports is the area of its rows
    work = workload.unmasked_per_row(idx.numpy(), causal, S)
    np.testing.assert_allclose([work[r].sum() for r in rows], plan.rank_work)


def test_other_masks_and_batches_balance():
    for name in ("share_question", "global_sliding_window", "sliding_window", "document", "random_eviction"):
        idx, causal = masks.example_mask(name, 16384, batch_size=2, num_heads=2, seed=1)
        for W in (2, 4, 8):
            plan = ContextParallelPlan(idx, causal, W)
            assert plan.work_imbalance <= 1.10 and plan.token_imbalance <= 1.10, (name, plan)


@pytest.mark.parametrize("S,W", [(5, 4), (37, 3), (100, 2), (130, 8), (1, 1)])
def test_small_and_odd_sequences_partition(S, W):
    idx, causal = masks.example_mask("causal_document", S, seed=2)
    plan = ContextParallelPlan(idx, causal, W)
    rows = [plan.local_rows(r) for r in range(W)]
    assert all(r.size > 0 for r in rows)
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(S))
    for r in range(W):
        table = plan.row_table(r)
        assert table[-1] == rows[r].size
        # table + chunk offsets count the rank's rows below any bound g
        for g in range(S + 1):
            c = min(g // plan.chunk_size, plan.num_chunks)
            local = table[-1] if c >= plan.num_chunks else table[c] + min(g - c * plan.chunk_size, table[c + 1] - table[c])
            assert local == np.count_nonzero(rows[r] < g)


@pytest.mark.parametrize("S", [37, 64, 100])
def test_a_mask_that_hides_everything_balances_tokens(S):
    """No live tile anywhere (non-causal LTS = UTE = 0): the imbalances are 1, not 0 / 0 = NaN, and
    the rows split as they would with no mask (NaN scores had kept the first chunk size tried:
    32 / 5 rows at S = 37)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's 0 / 0 warning fails the test
        plan = ContextParallelPlan(np.zeros((1, 1, S, 2), np.int32), False, 2, layout="chunks")
    unmasked = ContextParallelPlan(None, False, 2, layout="chunks", seqlen=S)
    assert plan.tile_imbalance == 1.0 and plan.work_imbalance == 1.0
    assert [plan.num_local_rows(r) for r in range(2)] == [unmasked.num_local_rows(r) for r in range(2)]


def test_shard_and_unshard_round_trip():
    import paddle

    idx, causal = masks.example_mask("share_question", 90, batch_size=2, seed=0)
    plan = ContextParallelPlan(idx, causal, 3)
    x = np.random.default_rng(0).standard_normal((2, 90, 3)).astype(np.float32)
    parts = [plan.shard(x, r) for r in range(3)]
    np.testing.assert_array_equal(plan.unshard(parts), x)
    tparts = [plan.shard(paddle.to_tensor(x), r) for r in range(3)]
    for a, b in zip(parts, tparts):
        np.testing.assert_array_equal(a, b.numpy())
    np.testing.assert_array_equal(plan.unshard(tparts).numpy(), x)
    ids = np.arange(180, dtype=np.int64).reshape(2, 90)
    np.testing.assert_array_equal(plan.shard(paddle.to_tensor(ids), 1).numpy(), ids[:, plan.local_rows(1)])


def test_plan_errors_name_the_argument():
    idx, causal = masks.example_mask("causal_document", 64, seed=0)
    with pytest.raises(ValueError, match="world_size"):
        ContextParallelPlan(idx, causal, 0)
    with pytest.raises(ValueError, match="method"):
        ContextParallelPlan(idx, causal, 2, method="ring")
    with pytest.raises(ValueError, match="last dim"):
        ContextParallelPlan(idx, False, 2)
    with pytest.raises(ValueError, match="seqlen"):
        ContextParallelPlan(None, True, 2)
    with pytest.raises(ValueError, match="cannot split"):
        ContextParallelPlan(None, True, 8, seqlen=5)
    for bad in (8.9, "8", True, [8], float("nan")):  # none is silently truncated or coerced
        with pytest.raises(ValueError, match="seqlen must be a positive int"):
            ContextParallelPlan(None, True, 2, seqlen=bad)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        ContextParallelPlan(None, True, 2, seqlen=8, chunk_size=True)
    with pytest.raises(ValueError, match="chunk_size"):
        ContextParallelPlan(idx, causal, 2, chunk_size=64)
    with pytest.raises(ValueError, match=r"values must lie in \[0, 64\]"):
        ContextParallelPlan(idx.numpy() + 100, causal, 2)
    swapped = np.stack([np.full(64, 40), np.full(64, 30)], -1).astype(np.int32)[None, None]  # LTS > LTE
    with pytest.raises(ValueError, match="LTS"):
        ContextParallelPlan(swapped, True, 2)
    bands = np.zeros((1, 1, 64, 4), np.int32)
    bands[..., :2], bands[..., 2], bands[..., 3] = 64, 20, 10  # UTS > UTE
    with pytest.raises(ValueError, match="UTS"):
        ContextParallelPlan(bands, False, 2)
    with pytest.raises(ValueError, match="must not be empty"):
        ContextParallelPlan(np.zeros((0, 1, 64, 1), np.int32), True, 2)
    plan = ContextParallelPlan(idx, causal, 2)
    with pytest.raises(ValueError, match="rank"):
        plan.local_rows(2)
    with pytest.raises(ValueError, match="S=64"):
        plan.shard(np.zeros((1, 63)), 0)
    parts = [plan.shard(np.arange(64, dtype=np.int32)[None], r) for r in range(2)]
    with pytest.raises(ValueError, match="dtype"):
        plan.unshard([parts[0], parts[1].astype(np.float32) + 0.7])
    with pytest.raises(ValueError, match="part 0's B"):
        plan.unshard([parts[0], np.concatenate([parts[1]] * 2)])
    np.testing.assert_array_equal(plan.unshard(parts), np.arange(64)[None])
    assert mask_fingerprint(idx.numpy(), True, 64) != mask_fingerprint(idx.numpy(), False, 64)


def _simulate(xs, pack, unit, splits, unpack, out_shape):
    """numpy all-to-all over the ranks' inputs xs: what comm.exchange returns on each rank."""
    W = len(xs)
    sends = [x.reshape(-1, unit)[pack[r]] for r, x in enumerate(xs)]
    outs = []
    for d in range(W):
        pieces = []
        for s in range(W):
            start = int(splits[s, :d].sum())
            pieces.append(sends[s][start:start + int(splits[s, d])])
        recv = np.concatenate(pieces)
        outs.append(recv[unpack[d]].reshape(out_shape[d]))
    return outs


def test_layouts_sequence_heads_round_trip():
    B, S, H, D, W = 2, 50, 6, 4, 3
    idx, causal = masks.example_mask("causal_document", S, batch_size=B, seed=4)
    plan = ContextParallelPlan(idx, causal, W, chunk_size=4)
    x = np.random.default_rng(1).standard_normal((B, S, H, D))
    local = [plan.shard(x, r) for r in range(W)]
    Ls = [plan.num_local_rows(r) for r in range(W)]
    unit = H // W * D
    packs = [layouts.seq_to_heads_pack(B, Ls[r], W) for r in range(W)]
    unpack = [layouts.seq_to_heads_unpack(plan, B)] * W
    full = _simulate(local, packs, unit, layouts.seq_to_heads_splits(plan, B), unpack, [(B, S, H // W, D)] * W)
    for r in range(W):
        np.testing.assert_array_equal(full[r], x[:, :, r * H // W:(r + 1) * H // W])
    back = _simulate(full, [layouts.heads_to_seq_pack(plan, B)] * W, unit,
                     layouts.seq_to_heads_splits(plan, B).T.copy(),
                     [layouts.heads_to_seq_unpack(B, Ls[r], W) for r in range(W)], [(B, Ls[r], H, D) for r in range(W)])
    for r in range(W):
        np.testing.assert_array_equal(back[r], local[r])
    lse = [np.random.default_rng(r).standard_normal((B, H // W, S)) for r in range(W)]
    lse_back = _simulate(lse, [layouts.lse_heads_to_seq_pack(plan, B, H // W)] * W, 1,
                         layouts.seq_to_heads_splits(plan, B).T * (H // W),
                         [layouts.lse_heads_to_seq_unpack(B, H // W, Ls[r], W) for r in range(W)],
                         [(B, H, Ls[r]) for r in range(W)])
    for r in range(W):
        want = np.concatenate([lse[g][:, :, plan.local_rows(r)] for g in range(W)], axis=1)
        np.testing.assert_array_equal(lse_back[r], want)


def test_ring_shifts_bring_every_peer_and_send_gradients_home():
    from paddle_flashmask.distributed.comm import shift_splits

    B, S, Hk, D, W = 2, 41, 2, 3, 3
    plan = ContextParallelPlan(None, True, W, seqlen=S, chunk_size=4)
    k = np.random.default_rng(2).standard_normal((B, S, Hk, D))
    local = [plan.shard(k, r) for r in range(W)]
    Ls = [plan.num_local_rows(r) for r in range(W)]
    ident = lambda n: np.arange(n)
    for d in range(1, W):  # as allgather._send_kv: rank r gets rank r - d's keys
        got = _simulate(local, [ident(B * Ls[r]) for r in range(W)], Hk * D, shift_splits([B * n for n in Ls], d),
                        [ident(B * Ls[(r - d) % W]) for r in range(W)], [(B, Ls[(r - d) % W], Hk, D) for r in range(W)])
        for r in range(W):
            np.testing.assert_array_equal(got[r], k[:, plan.local_rows((r - d) % W)])
        # as allgather._send_back: the gradient of rank r - d's keys goes home to it
        grads = [np.random.default_rng(10 * d + r).standard_normal((B, Ls[(r - d) % W], Hk, D)) for r in range(W)]
        back = _simulate(grads, [ident(B * Ls[(r - d) % W]) for r in range(W)], Hk * D,
                         shift_splits([B * Ls[(s - d) % W] for s in range(W)], -d),
                         [ident(B * Ls[r]) for r in range(W)], [(B, Ls[r], Hk, D) for r in range(W)])
        for r in range(W):
            np.testing.assert_array_equal(back[r], grads[(r + d) % W])


def test_live_tiles_match_their_definition():
    """A tile is dead when one of the column block's masked intervals covers its rows in
    every column; the O(S) count equals that definition tile by tile."""
    from reference import random_indices

    def brute(idx, causal, S, block):
        a0, a1, b0, b1 = workload.masked_intervals(idx, causal, S)
        nb = -(-S // block)
        live = np.zeros(nb)
        for rb in range(nb):
            r0, r1 = rb * block, min(S, (rb + 1) * block)
            for cb in range(nb):
                c = slice(cb * block, min(S, (cb + 1) * block))
                dead_a = ((a0[..., c] <= r0) & (a1[..., c] >= r1)).all(-1)
                dead_b = ((b0[..., c] <= r0) & (b1[..., c] >= r1)).all(-1)
                live[rb] += (~(dead_a | dead_b)).sum()
        return live

    rng = np.random.default_rng(0)
    for S, block in ((300, 32), (257, 64)):
        cases = [(masks.example_mask(n, S, batch_size=2, num_heads=2, seed=1)[0].numpy(), masks.MASK_BUILDERS[n][1])
                 for n in ("causal_document", "global_sliding_window", "share_question", "document")]
        cases += [(random_indices(rng, 2, 2, S, S, c, C), c) for c, C in ((True, 1), (True, 2), (False, 2), (False, 4))]
        cases += [(None, True), (None, False)]
        for idx, causal in cases:
            got = workload.live_tiles_per_row(idx, causal, S, block)
            np.testing.assert_array_equal(got[::block], brute(idx, causal, S, block))
            assert got.shape == (S,)


def test_global_tokens_balanced_by_tiles():
    """Rows that see every key make their row block visit every key block: the plan gives
    that rank fewer tokens (within the 8% token slack) so tiles stay balanced."""
    idx = masks.global_sliding_window_mask(262144, 16, 1024).numpy()
    for W in (2, 4):
        plan = ContextParallelPlan(idx, False, W)
        assert plan.tile_imbalance <= 1.02 and plan.token_imbalance <= 1.08 and plan.work_imbalance <= 1.10, plan


def dense_keys_needed(idx, causal, S, plan, src, dst):
    keep = masks.to_dense(idx, causal, seqlen_q=S) if idx is not None else \
        (np.tril(np.ones((S, S), bool)) if causal else np.ones((S, S), bool))[None, None]
    seen = keep[:, :, plan.local_rows(dst)][:, :, :, plan.local_rows(src)].any(axis=(0, 1, 2))
    return np.flatnonzero(seen)


@pytest.mark.parametrize("name", ["causal_document", "share_question", "document", "global_sliding_window",
                                  "prefix_lm_causal", "causal_blockwise", "qk_sparse", "random_eviction"])
@pytest.mark.parametrize("W", [2, 3])
def test_keys_needed_equals_the_dense_mask(name, W):
    # what the allgather exchange sends src -> dst: the keys some row of dst attends to
    S = 517
    idx, causal = masks.example_mask(name, S, batch_size=2, num_heads=2, seed=W)
    idx = idx.numpy()
    plan = ContextParallelPlan(idx, causal, W, chunk_size=32)
    for src in range(W):
        for dst in range(W):
            np.testing.assert_array_equal(plan.keys_needed(src, dst), dense_keys_needed(idx, causal, S, plan, src, dst))


def test_keys_needed_random_intervals_and_no_mask():
    from reference import random_indices

    rng = np.random.default_rng(4)
    S, W = 300, 3
    cases = [(random_indices(rng, 2, hm, S, S, causal, C), causal)
             for causal, C in ((True, 1), (True, 2), (False, 2), (False, 4)) for hm in (1, 2)]
    cases += [(None, True), (None, False)]
    for idx, causal in cases:
        plan = ContextParallelPlan(idx, causal, W, chunk_size=16, seqlen=S)
        for src in range(W):
            for dst in range(W):
                np.testing.assert_array_equal(plan.keys_needed(src, dst),
                                              dense_keys_needed(idx, causal, S, plan, src, dst))


def test_keys_needed_skips_other_documents():
    # one document per rank: nothing crosses; packed short answers: most keys stay home
    idx = masks.causal_document_mask([256, 256]).numpy()
    plan = ContextParallelPlan(idx, True, 2, chunk_size=256)
    assert plan.keys_needed(0, 1).size == 0 and plan.keys_needed(1, 0).size == 0
    assert plan.keys_needed(0, 0).size == 256


@pytest.mark.parametrize("W", [2, 3, 5])
def test_stretches_cut_the_sequence_in_rank_order(W):
    rng = np.random.default_rng(W)
    work, lens = rng.random(200) * 10, np.full(200, 16)
    owner = assignment.stretches(work, lens, W, token_cap=10**9)
    assert owner[0] == 0 and owner[-1] == W - 1 and np.all(np.diff(owner) >= 0)  # one stretch each, in order
    load = np.bincount(owner, weights=work, minlength=W)
    assert load.max() / load.mean() <= 1 + 2 * work.max() * W / work.sum()  # within a chunk or two of even


@pytest.mark.parametrize("W", [2, 4])
def test_local_layout_keeps_documents_home_and_stays_balanced(W):
    rng = np.random.default_rng(W)
    S, lens = 65536, []
    while sum(lens) < S:
        lens.append(int(min(S - sum(lens), np.exp(rng.uniform(np.log(512), np.log(8192))))))
    idx = masks.causal_document_mask(lens).numpy()

    def sent(plan):
        return sum(plan.keys_needed(s, d).size for s in range(W) for d in range(W) if s != d) / (S * (W - 1))

    local = ContextParallelPlan(idx, True, W, layout="local")
    chunks = ContextParallelPlan(idx, True, W, layout="chunks")
    assert local.layout == "local" and chunks.layout == "chunks"
    assert local.tile_imbalance <= 1.02 and local.token_imbalance <= 1.02 and local.work_imbalance <= 1.05, local
    assert sent(local) < (0.5 if W == 2 else 0.9) * sent(chunks)  # more swaps over more ranks
    np.testing.assert_array_equal(np.sort(np.concatenate([local.local_rows(r) for r in range(W)])), np.arange(S))


def test_auto_layout_keeps_windows_home():
    S, W = 32768, 4
    win = masks.sliding_window_mask(S, 512).numpy()
    plan = ContextParallelPlan(win, True, W)
    assert plan.layout == "local" and plan.tile_imbalance <= 1.02 and plan.token_imbalance <= 1.02
    sent = sum(plan.keys_needed(s, d).size for s in range(W) for d in range(W) if s != d)
    assert sent <= 4 * (W - 1) * 512  # about the window across each cut
    causal = ContextParallelPlan(None, True, W, seqlen=S)
    assert max(causal.tile_imbalance, causal.work_imbalance, causal.token_imbalance) <= 1.01
    assert ContextParallelPlan(win, True, W, method="ulysses").layout == "chunks"  # no exchange to save


def test_bad_layout():
    with pytest.raises(ValueError, match="layout must be one of"):
        ContextParallelPlan(None, True, 2, seqlen=100, layout="zigzag")


@pytest.mark.parametrize("S,W", [(2, 2), (3, 3), (7, 2), (17, 7), (129, 3), (300, 7)])
def test_local_layout_on_short_sequences_gives_every_rank_rows(S, W):
    for causal in (True, False):
        plan = ContextParallelPlan(None, causal, W, seqlen=S, layout="local")
        rows = [plan.local_rows(r) for r in range(W)]
        np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(S))
        assert all(r.size > 0 for r in rows)


def _assign_exhaustive(work, lens, world_size, token_cap):
    """assignment.spread with every move and every swap of the refinement listed (|a| x |b| candidates):
    the reference its sorted search must match, chunk for chunk."""
    n = work.size
    load = np.zeros(world_size)
    tokens = np.zeros(world_size, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    for c in np.argsort(-work, kind="stable"):
        room = tokens + lens[c] <= token_cap
        if not room.any():
            room = tokens == tokens.min()
        r = int(np.flatnonzero(room)[np.argmin(load[room])])
        owner[c], load[r], tokens[r] = r, load[r] + work[c], tokens[r] + lens[c]
    target = load.mean() * (1 + assignment.REFINE_TOLERANCE)
    for _ in range(4 * n):
        hi = int(np.argmax(load))
        if load[hi] <= target:
            break
        gap, a, best = load[hi] - load, np.flatnonzero(owner == hi), None
        for lo in np.argsort(load):
            lo = int(lo)
            if gap[lo] <= 0:
                break
            b = np.flatnonzero(owner == lo)
            delta = np.concatenate([work[a], (work[a][:, None] - work[b][None, :]).ravel()])
            dtok = np.concatenate([lens[a], (lens[a][:, None] - lens[b][None, :]).ravel()])
            ok = (delta > 0) & (delta < gap[lo]) & (tokens[lo] + dtok <= token_cap) & (tokens[hi] - dtok <= token_cap)
            if not ok.any():
                continue
            new_max = np.where(ok, np.maximum(load[hi] - delta, load[lo] + delta), np.inf)
            k = int(np.argmin(new_max))
            best = (lo, k, b)
            break
        if best is None:
            break
        lo, k, b = best
        if k < a.size:
            owner[a[k]], moved, mtok = lo, work[a[k]], lens[a[k]]
        else:
            ca, cb = a[(k - a.size) // b.size], b[(k - a.size) % b.size]
            owner[ca], owner[cb] = lo, hi
            moved, mtok = work[ca] - work[cb], lens[ca] - lens[cb]
        load[hi], load[lo] = load[hi] - moved, load[lo] + moved
        tokens[hi], tokens[lo] = tokens[hi] - mtok, tokens[lo] + mtok
    return owner


def test_assign_matches_the_exhaustive_search():
    """Ties, skewed and empty chunks, mixed lengths, token caps from tighter than possible to loose,
    and heavy-tailed chunks under an exact token cap (moves blocked: the refinement swaps)."""
    rng = np.random.default_rng(11)
    for i in range(180):
        n, W = int(rng.integers(1, 400)), int(rng.integers(2, 9))
        work = rng.random(n)
        kind = i % 6
        if kind == 0:
            work = np.round(work * 3)
        elif kind == 1:
            work = np.sort(work) ** 3
        elif kind == 2:
            work[rng.random(n) < 0.5] = 0.0
        elif kind >= 4:  # a few heavy chunks, equal lengths, no token slack
            n = W * int(rng.integers(2, 40))
            work = rng.pareto(1.5, n)
            work = np.round(work * 2) if kind == 5 else work
        lens = rng.choice([64, 128, 2048], n) if kind == 3 else np.full(n, 128)
        cap = int(np.ceil(lens.sum() / W * (1.0 if kind >= 4 else rng.choice([0.9, 1.0, 1.08, 2.0]))))
        np.testing.assert_array_equal(assignment.spread(work, lens, W, cap), _assign_exhaustive(work, lens, W, cap),
                                      err_msg=f"case {i}: n={n} W={W} cap={cap}")


def test_allgather_groups_follow_the_kernel_limit_of_the_head_dim(monkeypatch):
    # One kernel call takes the keys of a group of ring distances; the Hopper kernels take
    # 2^19 keys at head dims 64/128 and 2^18 at 192 and 256 (long_sequence.sm90_max_seqlen),
    # so the same plan groups its peers twice as finely at 192 and 256. Scaled down: 2^19 ->
    # 4 x the rows of a rank, 2^18 -> 2 x.
    from paddle_flashmask import long_sequence
    from paddle_flashmask.distributed import allgather

    S, W = 4096, 8
    plan = ContextParallelPlan(None, True, W, seqlen=S)
    most = max(plan.num_local_rows(r) for r in range(W))
    monkeypatch.setattr(long_sequence, "SM90_MAX_SEQLEN", 4 * most)
    monkeypatch.setattr(long_sequence, "SM90_MAX_SEQLEN_WIDE_HEADS", 2 * most)
    monkeypatch.setattr(allgather, "KEYS_PER_PART", 1 << 30)

    def groups(head_dim):
        spec = allgather.Spec(plan, 0, None, None, True, 1.0, 0, False, 1, None, head_dim)
        return spec.groups()

    # every key sent (the dense exchange): each distance brings `most` keys; group 0 shares its
    # call with the own keys (fused), so it holds one distance fewer
    monkeypatch.setattr(allgather, "SPARSE_EXCHANGE", False)
    assert [len(g) for g in groups(128)] == [3, 4]
    assert [len(g) for g in groups(256)] == [1, 2, 2, 2]
    assert [len(g) for g in groups(192)] == [1, 2, 2, 2]  # q/k 192 (value 128): the head dim of q counts
    monkeypatch.setattr(allgather, "FUSE_OWN", False)
    assert [len(g) for g in groups(128)] == [4, 3]
    assert [len(g) for g in groups(256)] == [2, 2, 2, 1]
    monkeypatch.setattr(allgather, "FUSE_OWN", True)
    monkeypatch.setattr(allgather, "SPARSE_EXCHANGE", True)
    # the sparse exchange: causal sends a rank only the keys before its rows, so distances pack
    # by what they bring; a group closes only where the next distance would not fit
    for head_dim in (128, 256):
        spec = allgather.Spec(plan, 0, None, None, True, 1.0, 0, False, 1, None, head_dim)
        need = {d: max(spec.num_sent((r - d) % W, r) for r in range(W)) for d in range(1, W)}
        room = [spec.keys_per_part() - (spec.own_width(most) if spec.fused() else 0)] + \
            [spec.keys_per_part()] * W
        gs = groups(head_dim)
        for i, g in enumerate(gs):
            assert sum(need[d] for d in g) <= room[i] or len(g) == 1
            if i + 1 < len(gs):
                assert sum(need[d] for d in g) + need[gs[i + 1][0]] > room[i]
    for head_dim in (128, 192, 256):  # every ring distance exactly once, in order
        assert [d for g in groups(head_dim) for d in g] == list(range(1, W))
    # cached index tensors are kept apart per part size (the grouping differs)
    a = allgather.Spec(plan, 0, None, None, True, 1.0, 0, False, 1, None, 128)
    b = allgather.Spec(plan, 0, None, None, True, 1.0, 0, False, 1, None, 256)
    assert a.keys_per_part() != b.keys_per_part()


def test_mask_check_is_not_skipped_for_a_new_tensor_on_a_reused_id():
    # The plan remembers the indices tensors whose mask it checked, by id. A new tensor with another
    # mask that gets a freed tensor's id must be checked again (as if the entry were under its id).
    from paddle_flashmask.distributed.attention import _check_same_mask

    idx, causal = masks.example_mask("causal_document", 64, seed=0)
    plan = ContextParallelPlan(idx, causal, 2)
    first = paddle.to_tensor(idx.numpy())
    _check_same_mask(plan, first)
    other = paddle.to_tensor(masks.causal_document_mask([64]).numpy())
    plan._device_cache[("mask_ok", id(other))] = plan._device_cache.pop(("mask_ok", id(first)))
    with pytest.raises(ValueError, match="differ from the indices the plan was built from"):
        _check_same_mask(plan, other)
    _check_same_mask(plan, first)  # the checked tensor itself still passes


def test_extreme_pairs_move_at_most_the_limit_heaviest_against_lightest():
    work = np.array([9.0, 1.0, 7.0, 5.0, 2.0, 0.5, 3.0, 0.0])
    a, b = np.array([0, 2, 3]), np.array([1, 4, 5, 7])
    got_a, got_b, moved = assignment._extreme_pairs_within(work, a, b, limit=12.0)
    # pairs (9, 0) -> 9, then (7, 0.5) -> 6.5 would reach 15.5 > 12: one pair
    assert list(got_a) == [0] and list(got_b) == [7] and moved == 9.0
    got_a, got_b, moved = assignment._extreme_pairs_within(work, a, b, limit=16.0)
    assert list(got_a) == [0, 2] and list(got_b) == [7, 5] and moved == 15.5
    assert assignment._extreme_pairs_within(work, a, b, limit=8.9) is None  # the first pair alone is over


def test_swap_steps_stay_few_where_every_chunk_is_light(monkeypatch):
    # plain causal over many 128-row chunks: the local stretches leave the ranks far apart and
    # each chunk holds a sliver of a rank's work; one swap a step took a step per chunk pair
    # (thousands here, quadratic in the chunks)
    steps = []
    for fn in ("_extreme_pairs_within", "_pair_nearest_half"):
        def counted(*args, _orig=getattr(assignment, fn)):
            steps.append(1)
            return _orig(*args)

        monkeypatch.setattr(assignment, fn, counted)
    plan = ContextParallelPlan(None, True, 8, seqlen=1 << 21, layout="local")
    assert plan.work_imbalance <= 1 + assignment.REFINE_TOLERANCE
    assert len(steps) < plan.num_chunks // 100, (len(steps), plan.num_chunks)
