"""Worker of tests/test_distributed.py, run on every rank by
``python -m paddle.distributed.launch --nproc_per_node W tests/cp_worker.py OUT_DIR``
(gloo on CPU). Every case compares this rank's result with its rows of the single-device
op on the same random inputs; bad-input cases must raise on every rank, and the group must
still work after them. Writes OUT_DIR/rank{r}.json."""

import contextlib
import json
import os
import sys
import traceback

import numpy as np
import paddle
import paddle.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask import masks  # noqa: E402
from paddle_flashmask.distributed import ContextParallelPlan, flashmask_attention, spacing  # noqa: E402
from paddle_flashmask.distributed import allgather  # noqa: E402
from paddle_flashmask.distributed import attention as dist_attention  # noqa: E402
from reference import random_indices  # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def case_inputs(seed, B, S, H, Hk, D, Dv=None):
    rng = np.random.default_rng(seed)
    Dv = D if Dv is None else Dv
    q = rng.standard_normal((B, S, H, D)).astype(np.float32)
    k = rng.standard_normal((B, S, Hk, D)).astype(np.float32)
    v = rng.standard_normal((B, S, Hk, Dv)).astype(np.float32)
    do = rng.standard_normal((B, S, H, Dv)).astype(np.float32)
    return q, k, v, do


def single_device(q, k, v, do, idx, causal):
    qt, kt, vt = (paddle.to_tensor(x, stop_gradient=False) for x in (q, k, v))
    it = None if idx is None else paddle.to_tensor(idx)
    out, lse = pfm.flashmask_attention(qt, kt, vt, it, causal=causal, return_softmax_lse=True)
    dq, dk, dv = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(do)])
    return [t.numpy() for t in (out, lse, dq, dk, dv)]


def single_device_scaled(q, k, v, idx, causal, scale):
    out = pfm.flashmask_attention(*(paddle.to_tensor(x) for x in (q, k, v)), paddle.to_tensor(idx), causal=causal,
                                  softmax_scale=scale)
    return out.numpy()


def context_parallel(q, k, v, do, idx, causal, W, rank, method, chunk_size=None, layout="auto", plan_box=None):
    plan = ContextParallelPlan(idx, causal, W, method=method, chunk_size=chunk_size, seqlen=q.shape[1], layout=layout)
    if plan_box is not None:  # the caller reads what the call left in the plan
        plan_box.append(plan)
    rows = plan.local_rows(rank)
    ql, kl, vl = (paddle.to_tensor(plan.shard(x, rank), stop_gradient=False) for x in (q, k, v))
    it = None if idx is None else paddle.to_tensor(idx)
    out, lse = flashmask_attention(ql, kl, vl, it, causal=causal, plan=plan, return_softmax_lse=True)
    dq, dk, dv = paddle.grad([out], [ql, kl, vl], [paddle.to_tensor(plan.shard(do, rank))])
    return rows, [t.numpy() for t in (out, lse, dq, dk, dv)]


def mask_cases(S, H, Hk, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name in ("causal_document", "share_question", "document", "global_sliding_window", "prefix_lm_causal",
                 "causal_blockwise", "qk_sparse", "random_eviction"):
        idx, causal = masks.example_mask(name, S, batch_size=2, num_heads=Hk, seed=seed)
        out.append((name, idx.numpy(), causal))
    for causal, C in ((True, 1), (True, 2), (False, 2), (False, 4)):
        for hm in ((1, Hk, H) if C in (1, 4) else (1, Hk)):
            out.append((f"random_c{C}_{'causal' if causal else 'full'}_hm{hm}",
                        random_indices(rng, 2, hm, S, S, causal, C), causal))
    out.append(("plain_causal", None, True))
    out.append(("no_mask", None, False))
    return out


def spaced_parts(plan, rank):
    """Group parts of this rank's last allgather call that had padding slots."""
    return sum(1 for key, slots in plan._host_cache.items() if key[0] == "slots" and key[1] == rank and slots)


def fused_calls(plan):
    """Whether the plan's allgather calls took group 0's keys beside the own ones."""
    return any(key[0] == "groups" and grouping[1] for key, grouping in plan._host_cache.items())


def run_cases(W, rank, results):
    B, H, Hk, D = 2, 4, 2, 16
    # (S, name, indices, causal, value head dim, chunk size, sparse K/V exchange[, layout])
    cases = [(S, name, idx, causal, None, None, True) for S in (77, 130)
             for name, idx, causal in mask_cases(S, H, Hk, seed=S)]
    # the local layout (stretches, a few chunks moved or swapped)
    cases += [(130, name + "_local", idx, causal, None, None, True, "local")
              for name, idx, causal in mask_cases(130, H, Hk, seed=130)
              if name in ("causal_document", "share_question", "global_sliding_window", "plain_causal")]
    # value with a head dim of its own (MLA-style)
    cases += [(130, name + "_dv8", idx, causal, 8, None, True) for name, idx, causal in mask_cases(130, H, Hk, seed=130)
              if name in ("causal_document", f"random_c4_full_hm{H}")]
    # every key sent to every rank (PADDLE_FLASHMASK_CP_SPARSE=0)
    cases += [(130, name + "_dense_exchange", idx, causal, None, None, False)
              for name, idx, causal in mask_cases(130, H, Hk, seed=130) if name in ("share_question", "random_eviction")]
    # one document per rank, chunks aligned to them: every rank needs no remote key (empty parts)
    for causal in (True, False):
        docs = [40] * W  # batch 2 (the q/k/v batch)
        idx = (masks.causal_document_mask(docs, batch_size=B) if causal else masks.document_mask(docs, batch_size=B)).numpy()
        cases.append((40 * W, f"own_document_{'causal' if causal else 'full'}", idx, causal, None, 40, True))
    # the whole-sequence call (ulysses) and the parts (allgather) cut into pieces of <= 64 tokens
    # (paddle_flashmask.long_sequence, as beyond 2^19 tokens on Hopper)
    cases += [(130, name + "_pieces", idx, causal, None, None, True) for name, idx, causal in
              mask_cases(130, H, Hk, seed=130) if name in ("causal_document", f"random_c4_full_hm{H}", "plain_causal")]
    from paddle_flashmask import long_sequence

    real_pieces = long_sequence.pieces_forward
    pieces_calls = []
    long_sequence.pieces_forward = lambda *a: (pieces_calls.append(1), real_pieces(*a))[1]
    results["pieces_calls"] = pieces_calls
    for S, name, idx, causal, Dv, chunk_size, sparse, *layout in cases:
        q, k, v, do = case_inputs(S * 7 + len(name), B, S, H, Hk, D, Dv)
        ref = single_device(q, k, v, do, idx, causal)
        for method in ("allgather", "ulysses", "allgather_per_peer", "allgather_spaced", "allgather_apart"):
            if method == "allgather_per_peer" and (W == 2 or S != 130):
                continue
            if method in ("allgather_spaced", "allgather_apart") and (S != 130 or not sparse):
                continue
            if method == "ulysses" and (H % W or Hk % W or (idx is not None and idx.shape[1] % W and idx.shape[1] > 1)):
                continue
            tag = f"{method}/{name}/S{S}"
            # per_peer: one all-to-all and kernel call per peer, as when parts hit 2^19 keys
            allgather.KEYS_PER_PART = 1 if method == "allgather_per_peer" else 1 << 19
            allgather.SPARSE_EXCHANGE = sparse
            # apart: the own keys' call apart from group 0's, as where they do not fit one call
            allgather.FUSE_OWN = method != "allgather_apart"
            if name.endswith("_pieces"):
                os.environ["PADDLE_FLASHMASK_SPLIT_SEQLEN"] = "64"
            try:
                plan_box = []
                # spaced: 8-key blocks, a cut where 2 more 4-row blocks would be live, so that
                # these tiny masks get padding slots too
                toy = spacing.geometry(8, 4, 8) if method == "allgather_spaced" else contextlib.nullcontext()
                with toy:
                    rows, got = context_parallel(q, k, v, do, idx, causal, W, rank, method.split("_")[0], chunk_size,
                                                 *layout, plan_box=plan_box)
                if method == "allgather_spaced":
                    results["spaced_parts"] += spaced_parts(plan_box[0], rank)
                if method.startswith("allgather"):
                    fused = results["fused_calls"].setdefault(method, 0)
                    results["fused_calls"][method] = fused + fused_calls(plan_box[0])
                want = [ref[0][:, rows], ref[1][:, :, rows], ref[2][:, rows]]
                errs = [rel(got[0], want[0]), float(np.nanmax(np.abs(np.where(np.isinf(want[1]), 0, got[1] - want[1])))),
                        rel(got[2], want[2])]
                lse_inf_ok = bool(np.array_equal(np.isinf(got[1]), np.isinf(want[1])))
                # dk/dv: this rank's rows of the full gradient
                errs += [rel(got[3], ref[3][:, rows]), rel(got[4], ref[4][:, rows])]
                results["cases"].append({"case": tag, "errs": errs, "lse_inf_ok": lse_inf_ok,
                                         "rows": int(len(rows))})
            except Exception:
                results["cases"].append({"case": tag, "error": traceback.format_exc()[-2000:]})
            finally:
                allgather.SPARSE_EXCHANGE = True
                allgather.FUSE_OWN = True
                os.environ.pop("PADDLE_FLASHMASK_SPLIT_SEQLEN", None)


def expect_raise(results, tag, fn):
    try:
        fn()
        results["bad"].append({"case": tag, "raised": None})
    except (ValueError, TypeError, NotImplementedError) as e:
        results["bad"].append({"case": tag, "raised": type(e).__name__, "msg": str(e)[:300]})
    except Exception as e:  # any other error type is a failure of the contract
        results["bad"].append({"case": tag, "raised": "other:" + type(e).__name__, "msg": str(e)[:300]})


def run_bad_input(W, rank, results):
    B, S, H, Hk, D = 1, 64, 4, 2, 8
    q, k, v, do = case_inputs(5, B, S, H, Hk, D)
    idx = masks.causal_document_mask([20, 30, 14]).numpy()
    plan = ContextParallelPlan(idx, True, W)
    it = paddle.to_tensor(idx)
    local = [paddle.to_tensor(plan.shard(x, rank)) for x in (q, k, v)]

    def wrong_rows_on_rank1():
        ql = paddle.to_tensor(q[:, : plan.num_local_rows(rank) + (1 if rank == 1 else 0)])
        flashmask_attention(ql, local[1], local[2], it, causal=True, plan=plan)

    expect_raise(results, "rows_disagree_on_one_rank", wrong_rows_on_rank1)
    expect_raise(results, "plan_other_world_size",
                 lambda: flashmask_attention(*local, it, causal=True, plan=ContextParallelPlan(idx, True, W + 1)))
    other = masks.causal_document_mask([10, 54]).numpy()
    expect_raise(results, "plan_other_mask",
                 lambda: flashmask_attention(*local, paddle.to_tensor(other), causal=True, plan=plan))
    expect_raise(results, "indices_not_global",
                 lambda: flashmask_attention(*local, paddle.to_tensor(idx[:, :, : plan.num_local_rows(rank)]),
                                             causal=True, plan=plan))
    expect_raise(results, "causal_disagrees", lambda: flashmask_attention(*local, it, causal=False, plan=plan))
    plan_u = ContextParallelPlan(idx, True, W, method="ulysses")
    odd = W + 1  # heads the group size does not divide
    q3 = paddle.to_tensor(plan_u.shard(np.repeat(q[:, :, :1], odd, axis=2), rank))
    k3 = paddle.to_tensor(plan_u.shard(np.repeat(k[:, :, :1], odd, axis=2), rank))
    expect_raise(results, "ulysses_heads_not_divisible",
                 lambda: flashmask_attention(q3, k3, k3, it, causal=True, plan=plan_u))
    # ranks that built different plans (another chunk size) must all stop
    plan_mixed = ContextParallelPlan(idx, True, W, chunk_size=4 if rank == 0 else 8)
    mixed = [paddle.to_tensor(plan_mixed.shard(x, rank)) for x in (q, k, v)]
    expect_raise(results, "ranks_with_different_plans",
                 lambda: flashmask_attention(*mixed, it, causal=True, plan=plan_mixed))
    # same chunk size, another layout on rank 0: other rows, the same row counts
    plan_layout = ContextParallelPlan(idx, True, W, chunk_size=8, layout="local" if rank == 0 else "chunks")
    moved = [paddle.to_tensor(plan_layout.shard(x, rank)) for x in (q, k, v)]
    expect_raise(results, "ranks_with_different_layouts",
                 lambda: flashmask_attention(*moved, it, causal=True, plan=plan_layout))
    # one rank's mistakes that its own checks catch before the agreement: every rank raises
    expect_raise(results, "causal_on_rank1_only",
                 lambda: flashmask_attention(*local, it, causal=rank != 1, plan=plan))
    expect_raise(results, "dropout_on_rank1_only",
                 lambda: flashmask_attention(*local, it, causal=True, plan=plan, dropout=0.1 if rank == 1 else 0.0))
    expect_raise(results, "plan_none_on_rank1_only",
                 lambda: flashmask_attention(*local, it, causal=True, plan=None if rank == 1 else plan))
    # mistakes no single rank can see: other head counts or another softmax_scale on one rank
    k_wide = [paddle.to_tensor(plan.shard(np.concatenate([x, x], 2) if rank == 1 else x, rank)) for x in (k, v)]
    expect_raise(results, "kv_heads_on_rank1_only",
                 lambda: flashmask_attention(local[0], *k_wide, it, causal=True, plan=plan))
    expect_raise(results, "scale_on_rank1_only",
                 lambda: flashmask_attention(*local, it, causal=True, plan=plan,
                                             softmax_scale=0.5 if rank == 1 else None))
    # an exchange switch set on one rank only: its messages would differ in size (gloo aborts)
    def sparse_off_on_rank1():
        allgather.SPARSE_EXCHANGE = rank != 1
        try:
            flashmask_attention(*local, it, causal=True, plan=plan)
        finally:
            allgather.SPARSE_EXCHANGE = True

    expect_raise(results, "exchange_switch_on_rank1_only", sparse_off_on_rank1)
    # signatures whose group sum is W x rank 1's (10, 20, 30 on 3 ranks): a sum-based agreement let
    # rank 1 go on alone into the exchange while the others raised
    def mean_signature_on_rank1():
        own = dist_attention._call_signature
        dist_attention._call_signature = lambda *args: 10 * (rank + 1)
        try:
            flashmask_attention(*local, it, causal=True, plan=plan)
        finally:
            dist_attention._call_signature = own

    expect_raise(results, "signatures_whose_mean_is_rank1s", mean_signature_on_rank1)
    # arguments that differ in form, not in what the call takes, agree: deterministic None / False,
    # softmax_scale 1 / 1.0
    ref_one = single_device_scaled(q, k, v, idx, True, 1.0)
    out = flashmask_attention(*local, it, causal=True, plan=plan, deterministic=None if rank == 0 else False,
                              softmax_scale=1 if rank == 0 else 1.0)
    results["equivalent_arguments"] = rel(out.numpy(), ref_one[:, plan.local_rows(rank)])
    # the group still works afterwards
    rows, got = context_parallel(q, k, v, do, idx, True, W, rank, "allgather")
    ref = single_device(q, k, v, do, idx, True)
    results["after_bad"] = rel(got[0], ref[0][:, rows])
    results["pieces_calls"] = len(results["pieces_calls"])


def main():
    out_dir = sys.argv[1]
    dist.init_parallel_env()
    W, rank = dist.get_world_size(), dist.get_rank()
    results = {"rank": rank, "world_size": W, "cases": [], "bad": [], "spaced_parts": 0, "fused_calls": {}}
    paddle.seed(0)
    run_cases(W, rank, results)
    run_bad_input(W, rank, results)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    # leave together: a rank that exits first closes gloo sockets a peer may still read
    dist.barrier()
    if hasattr(dist, "destroy_process_group"):
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
