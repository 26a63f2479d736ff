"""Random context-parallel configurations on W gloo ranks against the single-device op (fp32).

    python -m paddle.distributed.launch --nproc_per_node W tests/cp_random_worker.py OUT_DIR SEED CASES

Each case draws a length, batch, heads (GQA), head dims (value's own), a mask (random
intervals of every form with Hm = 1, Hk or H, a builder's mask, or none), the method, the
plan layout and chunk size, the sparse or dense exchange and the part grouping; every rank
writes its worst relative error and its failures to OUT_DIR/rank<r>.json.
Used by tests/test_distributed.py (ROOT on PYTHONPATH).
"""

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # reference.random_indices
import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask import masks  # noqa: E402
from paddle_flashmask.distributed import ContextParallelPlan, allgather, flashmask_attention  # noqa: E402
from reference import random_indices  # noqa: E402

def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

dist.init_parallel_env()
W, rank = dist.get_world_size(), dist.get_rank()
master = np.random.default_rng(int(sys.argv[2]))
worst, fails = 0.0, []
for case in range(int(sys.argv[3])):
    seed = int(master.integers(1 << 30))
    rng = np.random.default_rng(seed)
    S = int(rng.integers(W * 8, 400)); B = int(rng.choice([1, 2])); Hk = int(rng.choice([1, 2])); H = Hk * int(rng.choice([1, 2, 3]))
    D = int(rng.choice([8, 16])); Dv = int(rng.choice([D, 8, 12]))
    kind = rng.integers(0, 4)
    if kind == 0:
        causal, C = [(True, 1), (True, 2), (False, 2), (False, 4)][rng.integers(0, 4)]
        hm = int(rng.choice([1, Hk, H]))
        idx = random_indices(rng, B, hm, S, S, causal, C)
    elif kind == 1:
        name = str(rng.choice(["causal_document", "share_question", "document", "global_sliding_window", "prefix_lm_causal", "random_eviction", "qk_sparse"]))
        idx, causal = masks.example_mask(name, S, batch_size=B, num_heads=Hk, seed=seed % 1000)
        idx = idx.numpy()
    else:
        idx, causal = None, bool(rng.integers(0, 2))
    method = "ulysses" if (rng.random() < 0.3 and H % W == 0 and Hk % W == 0 and (idx is None or idx.shape[1] == 1 or idx.shape[1] % W == 0)) else "allgather"
    layout = str(rng.choice(["auto", "chunks", "local"]))
    chunk = None if rng.random() < 0.5 else int(rng.choice([4, 8, 16, 32]))
    if chunk is not None and -(-S // chunk) < W:
        chunk = None
    if chunk is not None and layout == "local":
        layout = "chunks"
    allgather.SPARSE_EXCHANGE = bool(rng.random() < 0.8)
    allgather.KEYS_PER_PART = 1 if rng.random() < 0.2 else 1 << 19
    q, k, v, do = (rng.standard_normal(s).astype(np.float32) for s in ((B, S, H, D), (B, S, Hk, D), (B, S, Hk, Dv), (B, S, H, Dv)))
    tag = dict(seed=seed, S=S, B=B, H=H, Hk=Hk, D=D, Dv=Dv, kind=int(kind), method=method, layout=layout, chunk=chunk, sparse=allgather.SPARSE_EXCHANGE)
    try:
        qt, kt, vt = (paddle.to_tensor(x, stop_gradient=False) for x in (q, k, v))
        it = None if idx is None else paddle.to_tensor(idx)
        out, lse = pfm.flashmask_attention(qt, kt, vt, it, causal=causal, return_softmax_lse=True)
        ref = [out.numpy(), lse.numpy()] + [g.numpy() for g in paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(do)])]
        plan = ContextParallelPlan(idx, causal, W, method=method, chunk_size=chunk, seqlen=S, layout=layout)
        rows = plan.local_rows(rank)
        ql, kl, vl = (paddle.to_tensor(plan.shard(x, rank), stop_gradient=False) for x in (q, k, v))
        o, l = flashmask_attention(ql, kl, vl, it, causal=causal, plan=plan, return_softmax_lse=True)
        g = paddle.grad([o], [ql, kl, vl], [paddle.to_tensor(plan.shard(do, rank))])
        want_lse = ref[1][:, :, rows]
        if not np.array_equal(np.isinf(l.numpy()), np.isinf(want_lse)):
            fails.append(dict(tag, why="lse inf")); continue
        errs = [rel(o.numpy(), ref[0][:, rows]), rel(g[0].numpy(), ref[2][:, rows]), rel(g[1].numpy(), ref[3][:, rows]), rel(g[2].numpy(), ref[4][:, rows])]
        worst = max(worst, max(errs))
        if max(errs) > 2e-4:
            fails.append(dict(tag, errs=errs))
    except Exception:
        fails.append(dict(tag, error=traceback.format_exc()[-1500:]))
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(dict(worst=worst, fails=fails, cases=int(sys.argv[3])), f)
dist.barrier()  # leave together (gloo)
if hasattr(dist, "destroy_process_group"):
    dist.destroy_process_group()
