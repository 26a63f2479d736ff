"""Context parallel on W GPUs (a script, not a test): launch on every rank with

    python3 -m paddle.distributed.launch --devices 0,1 benchmarks/bench_cp_multi_gpu.py --check --bench
    python3 -m paddle.distributed.launch --nproc_per_node 2 benchmarks/bench_cp_multi_gpu.py --device cpu ...  # dry run

- ``--check``: every rank's out/dq/dk/dv rows of the distributed op against the single-GPU op
  on its own GPU, same inputs on every rank (bf16/fp16 within 1e-2; fp32 on CPU within 2e-4).
- ``--bench``: per rank, the step (fwd+bwd of the distributed op, exchanges included), the
  same rank's compute alone (bench_cp_gpu.rank_step_time) and its exchanges alone; T1 (the
  single-GPU op on the whole sequence, rank 0, S <= 2^19). Reports T1 / (W x slowest step),
  the busiest rank over the mean, and the share of communication hidden under compute,
  1 - (step - compute) / exchanges, per rank. Rank 0 prints the table and writes JSON lines.

Uses only what the trimmed Paddle GPU runtime runs: our ops, host<->device copies,
paddle.grad and all_reduce / alltoall_single.
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

import paddle_flashmask as pfm  # noqa: E402
from bench_cp_gpu import (Timer, add_common_args, device_tensor, long_context_mask, rank_step_time, rel,  # noqa: E402
                          single_device_step, small_masks, tiled, to_f32)
from mask_area import attention_flops  # noqa: E402
from paddle_flashmask.attention import GPU_KERNELS  # noqa: E402
from paddle_flashmask.distributed import ContextParallelPlan, allgather, flashmask_attention  # noqa: E402
from paddle_flashmask.distributed import attention as cp_attention  # noqa: E402


def gather_scalars(value, W, rank, place):
    """Every rank's float, through one all_reduce (sum of one-hot slots)."""
    slots = np.zeros(W, dtype=np.float32)
    slots[rank] = value
    t = paddle.to_tensor(slots, place=place)
    dist.all_reduce(t)
    return [float(x) for x in t.numpy()]


def check(args, place, W, rank):
    B, H, Hk, D = 2, 8, 2, 64
    worst_all, failures = 0.0, 0
    tol = 2e-4 if args.device == "cpu" else 1e-2
    for dtype in args.dtypes:
        S = 1037
        rng = np.random.default_rng(S)
        q, k, v, do = (rng.standard_normal((B, S, h, D)).astype(np.float32) for h in (H, Hk, Hk, H))
        for name, idx, causal in small_masks(S, Hk, seed=S):
            it = None if idx is None else paddle.to_tensor(idx, place=place)
            qd, kd, vd = (device_tensor(x, dtype, place) for x in (q, k, v))
            for t in (qd, kd, vd):
                t.stop_gradient = False
            out = pfm.flashmask_attention(qd, kd, vd, it, causal=causal)
            ref = [to_f32(out)] + [to_f32(g) for g in paddle.grad([out], [qd, kd, vd], [device_tensor(do, dtype, place)])]
            for method in args.methods:
                if method == "ulysses" and (H % W or Hk % W):
                    continue
                plan = ContextParallelPlan(idx, causal, W, method=method, seqlen=S)
                rows = plan.local_rows(rank)
                ql, kl, vl = (device_tensor(plan.shard(x, rank), dtype, place) for x in (q, k, v))
                for t in (ql, kl, vl):
                    t.stop_gradient = False
                o = flashmask_attention(ql, kl, vl, it, causal=causal, plan=plan)
                grads = paddle.grad([o], [ql, kl, vl], [device_tensor(plan.shard(do, rank), dtype, place)])
                errs = [rel(to_f32(g), w[:, rows]) for g, w in zip([o] + list(grads), ref)]
                worst = max(gather_scalars(max(errs), W, rank, place))
                worst_all = max(worst_all, worst)
                failures += worst > tol
                if rank == 0:
                    print(f"| {dtype} | {name} | {S} | {W} | {method} | {worst:.2e} | "
                          f"{'ok' if worst <= tol else 'FAIL'} |", flush=True)
    if rank == 0:
        print(f"check on {W} ranks: worst {worst_all:.2e}, {failures} failed", flush=True)
    return failures


def bench(args, place, W, rank):
    H, Hk, D = 32, 8, 128
    dtype = args.dtypes[0]
    timer = Timer(place)
    rng = np.random.default_rng(0)
    blocks = {h: rng.standard_normal((1, 4096, h, D)).astype(np.float32) for h in (H, Hk)}
    out = open(args.out, "a") if (args.out and rank == 0) else None
    if rank == 0:
        print("| mask | S | W | method | T1 ms | step ms (slowest) | busiest/mean | T1/(W*step) | compute ms | "
              "exchanges ms | hidden | step without agreement ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|",
              flush=True)
    kern = GPU_KERNELS[args.kernel]
    for S in args.lengths:
        for name in args.masks:
            if name == "causal" and S > args.max_causal:
                continue
            idx, causal = long_context_mask(name, S)
            it = None if idx is None else paddle.to_tensor(idx, place=place)
            fwd_flops, bwd_flops = attention_flops(idx, causal, S, S, H, D)
            t1 = None
            if rank == 0 and S <= args.t1_max:
                q, k, v, do = (tiled(blocks[h], S, place, dtype) for h in (H, Hk, Hk, H))

                single = single_device_step(q, k, v, do, it, causal, kern)
                single()
                t1 = min(timer(single)[0] for _ in range(args.repeats))
                q = k = v = do = None
            t1 = gather_scalars(t1 or 0.0, W, rank, place)[0] or None
            for method, layout in [(m, lay) for m in args.methods
                                   for lay in (args.layouts if m == "allgather" else ["auto"])]:
                plan = ContextParallelPlan(idx, causal, W, method=method, seqlen=S, layout=layout)
                L = plan.num_local_rows(rank)
                ql, kl, vl, dl = (tiled(blocks[h], L, place, dtype) for h in (H, Hk, Hk, H))
                for t in (ql, kl, vl):
                    t.stop_gradient = False

                def step():
                    o = flashmask_attention(ql, kl, vl, it, causal=causal, plan=plan)
                    return paddle.grad([o], [ql, kl, vl], [dl])

                try:
                    step()
                    t_step = min(timer(step)[0] for _ in range(args.repeats))
                    t_free = step_time_without_agreement(step, timer, args.repeats)
                    t_comp = rank_step_time(plan, rank, it, causal, method, blocks, place, dtype, args, timer)
                    t_comm = exchanges_time(plan, rank, method, kl, ql, it, causal, place, args, timer)
                except Exception as e:  # report, keep the other ranks in step
                    print(f"rank {rank}: {name} {S} {method}: {type(e).__name__}: {e}", flush=True)
                    t_step = t_free = t_comp = t_comm = float("nan")
                steps = gather_scalars(t_step, W, rank, place)
                frees = gather_scalars(t_free, W, rank, place)
                comps = gather_scalars(t_comp, W, rank, place)
                comms = gather_scalars(t_comm, W, rank, place)
                hidden = [1 - max(s - c, 0.0) / m if m > 0 else float("nan") for s, c, m in zip(steps, comps, comms)]
                slow = max(steps)
                rec = dict(mask=name, seqlen=S, world_size=W, method=method, t1_ms=None if t1 is None else t1 * 1e3,
                           step_ms=[x * 1e3 for x in steps], step_no_agreement_ms=[x * 1e3 for x in frees],
                           compute_ms=[x * 1e3 for x in comps],
                           exchanges_ms=[x * 1e3 for x in comms], hidden_share=hidden,
                           busiest_over_mean=slow / float(np.mean(steps)),
                           efficiency=None if t1 is None else t1 / (W * slow),
                           tflops_per_gpu=(fwd_flops + bwd_flops) / (W * slow) / 1e12,
                           work_imbalance=plan.work_imbalance, tile_imbalance=plan.tile_imbalance,
                           heads=H, heads_k=Hk, dim=D, dtype=dtype,
                           sparse_exchange=allgather.SPARSE_EXCHANGE if method == "allgather" else None,
                           layout=plan.layout,
                           device=paddle.device.cuda.get_device_name(0) if timer.gpu else "cpu")
                if rank == 0:
                    eff = "n/a" if t1 is None else f"{rec['efficiency']:.3f}"
                    tag = method + ("" if method != "allgather" else f", {plan.layout}")
                    print(f"| {name} | {S} | {W} | {tag} | {'n/a' if t1 is None else f'{t1 * 1e3:.1f}'} | "
                          f"{slow * 1e3:.1f} | {rec['busiest_over_mean']:.3f} | {eff} | "
                          f"{max(comps) * 1e3:.1f} | {max(comms) * 1e3:.1f} | {min(hidden):.2f} | "
                          f"{max(frees) * 1e3:.1f} |", flush=True)
                    if out:
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
                ql = kl = vl = dl = None


def step_time_without_agreement(step, timer, repeats):
    """Seconds of the same step with the per-call agreement (one all_reduce read back on the host,
    which waits for the GPU's queued work) turned off, as PADDLE_FLASHMASK_CP_AGREE=0 does; every
    rank runs this, so the ranks' collectives stay matched. Step minus this is the agreement's cost."""
    was = cp_attention._AGREE
    cp_attention._AGREE = False
    try:
        step()
        return min(timer(step)[0] for _ in range(repeats))
    finally:
        cp_attention._AGREE = was


def exchanges_time(plan, rank, method, k, q, it, causal, place, args, timer):
    """Seconds of this rank's exchanges of one step alone (forward and backward), no compute."""
    from paddle_flashmask.distributed import comm, ulysses

    group = comm.get_context_parallel_group()
    if method == "allgather":
        spec = allgather.Spec(plan, rank, group, it, causal, 1.0, 0, False, int(k.shape[0]), place,
                              int(q.shape[-1]))

        def run():
            jobs = []
            for gi, g in enumerate(spec.groups()):
                jobs += [allgather._send_kv(spec, k, gi, g), allgather._send_kv(spec, k, gi, g)]
            for j in jobs:
                j.wait()
            back = [j.wait() for j in jobs]  # the received K/V stand in for the dK/dV sent back
            jobs = []
            for (gi, g), x in zip(enumerate(spec.groups()), back[::2]):
                jobs += [allgather._send_back(spec, x, gi, g), allgather._send_back(spec, x, gi, g)]
            for j in jobs:
                j.wait()
    else:
        spec = ulysses.Spec(plan, rank, group, it, causal, 1.0, 0, False, int(k.shape[0]), place,
                            int(q.shape[-1]))

        def run():
            jobs = [ulysses.seq_to_heads(spec, x) for x in (q, k, k, q)]  # q, k, v, dout
            full = [j.wait() for j in jobs]
            for j in [ulysses.heads_to_seq(spec, full[0])] * 2 + [ulysses.heads_to_seq(spec, full[1])] * 2:
                j.wait()  # out, dq, dk, dv back
    run()
    return min(timer(run)[0] for _ in range(args.repeats))


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--dtypes", nargs="+", default=None)
    args = ap.parse_args()
    args.dtypes = args.dtypes or (["float32"] if args.device == "cpu" else ["bfloat16", "float16"])
    dist.init_parallel_env()
    W, rank = dist.get_world_size(), dist.get_rank()
    place = paddle.CPUPlace() if args.device == "cpu" else paddle.CUDAPlace(dist.ParallelEnv().dev_id)
    pfm.build()
    failures = check(args, place, W, rank) if args.check else 0
    if args.bench:
        bench(args, place, W, rank)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
