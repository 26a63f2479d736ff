"""Context parallel on ONE GPU: every rank of a W-rank group simulated in turn (a script,
not a test).

What one GPU can tell about context parallel, with the collectives left out:
- ``--check``: each simulated rank runs the same pieces the distributed op runs (the remap
  of the global mask, the part forwards/backwards, the LSE merge, the dK/dV sums, the
  pack/unpack gathers around every exchange), all on the GPU; the all-to-all itself is
  emulated on the host. Every rank's out/dq/dk/dv rows are compared with the single-GPU
  op on the same inputs (bf16/fp16: ||got - ref|| / ||ref|| <= 1e-2).
- ``--bench``: per-rank compute time of a step (fwd+bwd, every GPU-side piece of the
  method, no communication) against the single-GPU time T1: the busiest rank over the
  mean (imbalance) and T1 / (W * busiest) (the scaling efficiency compute alone allows).
  Communication needs several GPUs and is not measured here.

Runs in the trimmed Paddle GPU runtime (only our ops, host<->device copies, paddle.grad)
and on CPU (``--device cpu``, small sizes) for a dry run.
"""

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # reference.random_indices

import paddle  # noqa: E402

import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask import long_sequence  # noqa: E402
from mask_area import attention_flops  # noqa: E402
from paddle_flashmask import masks  # noqa: E402
from paddle_flashmask.distributed import ContextParallelPlan, allgather, layouts, spacing, tensor_ops, ulysses  # noqa: E402
from paddle_flashmask.attention import GPU_KERNELS  # noqa: E402


def device_tensor(array, dtype, place):
    host = paddle.to_tensor(array, place=paddle.CPUPlace())
    if str(host.dtype).split(".")[-1] != dtype:
        host = host.astype(dtype)
    return host._copy_to(place, True) if not isinstance(place, paddle.CPUPlace) else host


def to_f32(t):
    a = t.numpy()
    if a.dtype == np.uint16:  # bfloat16 bits
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def idx_t(a, place):
    return np.asarray(a, dtype=np.int64) if place is None else paddle.to_tensor(np.asarray(a, dtype=np.int64), place=place)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---- masks ----------------------------------------------------------------------------------

def _loguniform(rng, lo, hi):
    return int(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def long_context_mask(name, S, seed=0):
    """(numpy indices or None, causal): long-context instances of the issue's mask set."""
    rng = np.random.default_rng(seed)
    if name == "causal":
        return None, True
    if name == "causal_document":  # documents of 1K-32K tokens (log-uniform)
        lens, left = [], S
        while left > 0:
            n = min(left, _loguniform(rng, 1024, 32768))
            lens.append(n)
            left -= n
        return masks.causal_document_mask(lens, place="numpy"), True
    if name == "share_question":  # prompt 1K-8K, two answers of 512-4K each
        groups, left = [], S
        while left > 0:
            p = min(left, _loguniform(rng, 1024, 8192))
            left -= p
            ans = []
            for _ in range(2):
                if left <= 0:
                    break
                a = min(left, _loguniform(rng, 512, 4096))
                ans.append(a)
                left -= a
            groups.append((p, ans or [0]))
        groups = [(p, [a for a in ans if a > 0]) if any(ans) else (p, []) for p, ans in groups]
        return masks.share_question_mask(groups, seqlen=S, place="numpy"), True
    if name == "global_sliding_window":  # 16 global tokens, window 1024 each side
        return masks.global_sliding_window_mask(S, 16, 1024, place="numpy"), False
    raise ValueError(name)


def small_masks(S, Hk, seed):
    from reference import random_indices

    rng = np.random.default_rng(seed)
    out = []
    for name in ("causal_document", "share_question", "document", "global_sliding_window", "random_eviction"):
        idx, causal = masks.example_mask(name, S, batch_size=2, num_heads=Hk, seed=seed, place="numpy")
        out.append((name, idx, causal))
    for causal, C in ((True, 1), (True, 2), (False, 2), (False, 4)):
        out.append((f"random_c{C}_{'causal' if causal else 'full'}_hm{Hk}", random_indices(rng, 2, Hk, S, S, causal, C),
                    causal))
    out.append(("plain_causal", None, True))
    return out


# ---- the all-to-all, emulated on the host ------------------------------------------------------

def emulate_exchange(xs, packs, unit, splits, unpacks, out_shapes, dtype, place):
    """Per rank: pack on the device (our op), all-to-all on the host, unpack on the device."""
    W = len(xs)
    sends = [to_f32(tensor_ops.gather_units(x, p, unit, [int(splits[r].sum()), unit])) for r, (x, p) in
             enumerate(zip(xs, packs))]
    outs = []
    for d in range(W):
        pieces = [sends[s][int(splits[s, :d].sum()): int(splits[s, :d].sum()) + int(splits[s, d])] for s in range(W)]
        recv = device_tensor(np.concatenate(pieces), dtype, place)
        outs.append(tensor_ops.gather_units(recv, unpacks[d], unit, out_shapes[d]))
    return outs


# ---- one step of every simulated rank ----------------------------------------------------------

def spaced(spec, gi, x):
    """A group's arrived ``[B, keys, ...]`` host array as its buffer: after the lead, among zero
    padding slots where the part has them (allgather.Spec.spaced_units)."""
    B, n = x.shape[:2]
    out = np.zeros((B * spec.part_length(gi, spec.groups()[gi]),) + x.shape[2:], x.dtype)
    out[spec.spaced_units(gi, np.arange(B * n))] = x.reshape((B * n,) + x.shape[2:])
    return out.reshape((B, -1) + x.shape[2:])


def unspaced(spec, gi, x, offset=None):
    """The group's keys' rows, in arrival order, of its buffer's ``[B, slots, ...]`` result (or,
    with ``offset``, of the fused call's, where the buffer starts at that key)."""
    B, width = x.shape[:2]
    n = spec.num_arriving(spec.groups()[gi])
    at = spec.spaced_units(gi, np.arange(B * n), width, offset or 0)
    return x.reshape((B * width,) + x.shape[2:])[at].reshape((B, n) + x.shape[2:])


class Sim:
    def __init__(self, plan, indices, causal, dtype, place, B, H, Hk, D, kernel):
        self.plan, self.indices, self.causal = plan, indices, causal
        self.dtype, self.place, self.B, self.H, self.Hk, self.D = dtype, place, B, H, Hk, D
        self.W = plan.world_size
        self.scale = D ** -0.5
        self.kernel = GPU_KERNELS[kernel]

    def spec(self, cls, r):
        return cls(self.plan, r, None, self.indices, self.causal, self.scale, self.kernel, False, self.B, self.place,
                   self.D)

    # allgather: own keys, then each group of peers' (the keys this rank's rows see, as the
    # sparse exchange sends them; emulated by host copies), merged by LSE; backward: group
    # parts first, their dK/dV spread back over the owners' keys and summed there
    def allgather(self, q, k, v, do):
        W = self.W
        specs = [self.spec(allgather.Spec, r) for r in range(W)]
        host = lambda a: device_tensor(a, self.dtype, self.place)  # a transfer
        saved, sent = [], {}
        for r in range(W):
            sp = specs[r]
            masks, groups, first = sp.part_masks(), sp.groups(), 1 if sp.fused() else 0
            arrived = []  # per group: (sources, their keys, K buffer, V buffer) on the host
            for gi, g in enumerate(groups):
                srcs = sp.sources(g)
                keys = [sp.sent(x, r) for x in srcs]
                k_g, v_g = (spaced(sp, gi, np.concatenate([to_f32(t[x])[:, s] for x, s in zip(srcs, keys)], axis=1))
                            for t in (k, v))
                arrived.append((srcs, keys, k_g, v_g))
            if first:  # group 0's keys in the own keys' call
                k_main, v_main = (host(np.concatenate([to_f32(t[r]), a], axis=1))
                                  for t, a in ((k, arrived[0][2]), (v, arrived[0][3])))
            else:
                k_main, v_main = k[r], v[r]
            out, lse = allgather.part_forward(sp, q[r], k_main, v_main, masks[0])
            parts = []
            for gi in range(first, len(groups)):
                srcs, keys, k_g, v_g = arrived[gi]
                if k_g.shape[1] == 0:  # no key of this group is seen here
                    parts.append((gi, None, None))
                    continue
                k_g, v_g = host(k_g), host(v_g)
                out_g, lse_g = allgather.part_forward(sp, q[r], k_g, v_g, masks[1 + gi])
                out, lse = tensor_ops.merge_partial(out, lse, out_g, lse_g)
                parts.append((gi, k_g, v_g))
            dq, back = None, {}
            for gi, k_g, v_g in parts:
                if k_g is not None:
                    dq_g, dk_g, dv_g = allgather.part_backward(sp, q[r], k_g, v_g, masks[1 + gi], out, lse, do[r])
                    back[gi] = tuple(unspaced(sp, gi, to_f32(t)) for t in (dk_g, dv_g))
                    dq = dq_g if dq is None else tensor_ops.accumulate(dq, dq_g)
            dq_l, dk, dv = allgather.part_backward(sp, q[r], k_main, v_main, masks[0], out, lse, do[r])
            dq = dq_l if dq is None else tensor_ops.accumulate(dq_l, dq)
            if first:  # the fused call's keys: the own ones, then group 0's buffer
                back[0] = tuple(unspaced(sp, 0, to_f32(t), offset=sp.L) for t in (dk, dv))
                dk, dv = (host(to_f32(t)[:, :sp.L]) for t in (dk, dv))
            for gi, (srcs, keys, _, _) in enumerate(arrived):
                off = 0
                for x, s in zip(srcs, keys):  # each source's keys go home, zeros where not sent
                    shape = (self.B, self.plan.num_local_rows(x), self.Hk, self.D)
                    dk_x, dv_x = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
                    if s.size:
                        dk_x[:, s], dv_x[:, s] = back[gi][0][:, off:off + s.size], back[gi][1][:, off:off + s.size]
                    sent[(r, x)] = (dk_x, dv_x)
                    off += s.size
            saved.append((out, dq, dk, dv))
        res = []
        for r in range(W):
            out, dq, dk, dv = saved[r]
            for g in specs[r].groups():  # as allgather.backward receives them
                senders = sorted((r + d) % W for d in g)
                dk = tensor_ops.accumulate(dk, host(np.stack([sent[(t, r)][0] for t in senders])))
                dv = tensor_ops.accumulate(dv, host(np.stack([sent[(t, r)][1] for t in senders])))
            res.append((out, dq, dk, dv))
        return res

    # ulysses: sequence -> heads, the op on all rows of H/W heads, heads -> sequence
    def _s2h(self, xs, heads):
        W, B, plan = self.W, self.B, self.plan
        Ls = [plan.num_local_rows(r) for r in range(W)]
        unit = heads // W * self.D
        packs = [idx_t(layouts.seq_to_heads_pack(B, Ls[r], W), self.place) for r in range(W)]
        unpacks = [idx_t(layouts.seq_to_heads_unpack(plan, B), self.place)] * W
        return emulate_exchange(xs, packs, unit, layouts.seq_to_heads_splits(plan, B), unpacks,
                                [[B, plan.seqlen, heads // W, self.D]] * W, self.dtype, self.place)

    def _h2s(self, ys, heads):
        W, B, plan = self.W, self.B, self.plan
        Ls = [plan.num_local_rows(r) for r in range(W)]
        unit = heads // W * self.D
        packs = [idx_t(layouts.heads_to_seq_pack(plan, B), self.place)] * W
        unpacks = [idx_t(layouts.heads_to_seq_unpack(B, Ls[r], W), self.place) for r in range(W)]
        return emulate_exchange(ys, packs, unit, layouts.seq_to_heads_splits(plan, B).T.copy(), unpacks,
                                [[B, Ls[r], heads, self.D] for r in range(W)], self.dtype, self.place)

    def ulysses(self, q, k, v, do):
        W = self.W
        specs = [self.spec(ulysses.Spec, r) for r in range(W)]
        qh, kh, vh, doh = self._s2h(q, self.H), self._s2h(k, self.Hk), self._s2h(v, self.Hk), self._s2h(do, self.H)
        outs, grads = [], ([], [], [])
        for r in range(W):
            mask = specs[r].mask()
            out_h, lse_h = tensor_ops.attention_fwd(qh[r], kh[r], vh[r], mask, self.scale, self.causal, self.kernel, False)
            g = tensor_ops.attention_bwd(qh[r], kh[r], vh[r], mask, out_h, lse_h, doh[r], self.scale, self.causal,
                                         self.kernel, False)
            outs.append(out_h)
            for lst, x in zip(grads, g):
                lst.append(x)
        out = self._h2s(outs, self.H)
        dq, dk, dv = self._h2s(grads[0], self.H), self._h2s(grads[1], self.Hk), self._h2s(grads[2], self.Hk)
        return list(zip(out, dq, dk, dv))


def check(args, place):
    B, H, Hk, D = 2, 8, 2, 64
    failures, lines = 0, []
    for dtype in args.dtypes:
        for S in (1037,):
            rng = np.random.default_rng(S)
            q, k, v, do = (rng.standard_normal((B, S, h, D)).astype(np.float32) for h in (H, Hk, Hk, H))
            qd, kd, vd, dod = (device_tensor(x, dtype, place) for x in (q, k, v, do))
            for name, idx, causal in small_masks(S, Hk, seed=S):
                it = None if idx is None else paddle.to_tensor(idx, place=place)
                for t in (qd, kd, vd):
                    t.stop_gradient = False
                out = pfm.flashmask_attention(qd, kd, vd, it, causal=causal)
                ref = [to_f32(out)] + [to_f32(g) for g in paddle.grad([out], [qd, kd, vd], [dod])]
                for W in args.world_sizes:
                    extra = ["allgather_per_peer"] if W > 2 else []
                    # spaced: the key spacing at toy sizes; apart: the own keys' call without group 0's
                    extra += ["allgather_spaced", "allgather_apart"] if "allgather" in args.methods else []
                    for method in args.methods + extra:
                        if method == "ulysses" and (H % W or Hk % W):
                            continue
                        # per_peer: one exchange and kernel call per peer, as when parts hit 2^19 keys
                        allgather.KEYS_PER_PART = 1 if method == "allgather_per_peer" else 1 << 19
                        allgather.FUSE_OWN = method != "allgather_apart"
                        base = method.split("_")[0]
                        plan = ContextParallelPlan(idx, causal, W, method=base, seqlen=S)
                        sim = Sim(plan, it, causal, dtype, place, B, H, Hk, D, args.kernel)
                        shard = lambda x: [device_tensor(plan.shard(x, r), dtype, place) for r in range(W)]
                        # spaced: 8-key blocks, a cut where 2 more 4-row blocks would be live, so that
                        # the check's short parts get padding slots too
                        toy = spacing.geometry(8, 4, 8) if method == "allgather_spaced" else contextlib.nullcontext()
                        with toy:
                            got = getattr(sim, base)(shard(q), shard(k), shard(v), shard(do))
                        spaced = sum(1 for key, slots in plan._host_cache.items() if key[0] == "slots" and slots)
                        worst = 0.0
                        for r in range(W):
                            rows = plan.local_rows(r)
                            errs = [rel(to_f32(g), w[:, rows]) for g, w in zip(got[r], ref)]
                            worst = max(worst, *errs)
                        allgather.KEYS_PER_PART = 1 << 19
                        allgather.FUSE_OWN = True
                        ok = worst <= 1e-2
                        failures += not ok
                        line = (f"| {dtype} | {name} | {S} | {W} | {method} | {worst:.2e} | {'ok' if ok else 'FAIL'} |"
                                + (f" {spaced} parts spaced out |" if method == "allgather_spaced" else ""))
                        lines.append(line)
                        print(line, flush=True)
    print(f"check: {len(lines)} cases, {failures} failed")
    return failures


# ---- timing ------------------------------------------------------------------------------------

def tiled(rng_block, S, place, dtype):
    """[1, S, h, D] on the device: a random block repeated (our gather op), no host-size copy."""
    blk = device_tensor(rng_block, dtype, place)
    n = rng_block.shape[1]
    src = idx_t(np.arange(S, dtype=np.int64) % n, place)
    h, D = rng_block.shape[2], rng_block.shape[3]
    return tensor_ops.gather_units(blk, src, h * D, [1, S, h, D])


class Timer:
    def __init__(self, place):
        self.gpu = not isinstance(place, paddle.CPUPlace)

    def sync(self):
        if self.gpu:
            paddle.device.cuda.synchronize()

    def __call__(self, fn):
        self.sync()
        t0 = time.perf_counter()
        r = fn()
        self.sync()
        return time.perf_counter() - t0, r


def bench(args, place):
    H, Hk, D = 32, 8, 128
    dtype = args.dtypes[0]
    timer = Timer(place)
    rng = np.random.default_rng(0)
    blocks = {h: rng.standard_normal((1, 4096, h, D)).astype(np.float32) for h in (H, Hk)}
    start = time.time()
    out = open(args.out, "a") if args.out else None
    print("| mask | S | W | method | chunk | work imb. | T1 fwd+bwd ms | rank ms (fwd+bwd) | busiest/mean | "
          "T1/(W*busiest) | TFLOP/s T1 | TFLOP/s per GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for S in args.lengths:
        for name in args.masks:
            if time.time() - start > args.budget_s:
                print(f"(budget reached: skipping {name} at {S})")
                continue
            if name == "causal" and S > args.max_causal:
                print(f"(causal at {S} skipped: --max-causal {args.max_causal})")
                continue
            idx, causal = long_context_mask(name, S)
            it = None if idx is None else paddle.to_tensor(idx, place=place)
            fwd_flops, bwd_flops = attention_flops(idx, causal, S, S, H, D)
            q, k, v, do = (tiled(blocks[h], S, place, dtype) for h in (H, Hk, Hk, H))

            single = single_device_step(q, k, v, do, it, causal, GPU_KERNELS[args.kernel])
            if S <= args.t1_max:
                single()
                t1 = min(timer(single)[0] for _ in range(args.repeats))
            else:
                t1 = None
            q = k = v = do = None
            for W in args.world_sizes:
                for method, layout in [(m, lay) for m in args.methods
                                       for lay in (args.layouts if m == "allgather" else ["auto"])]:
                    plan = ContextParallelPlan(idx, causal, W, method=method, seqlen=S, layout=layout)
                    times = [rank_step_time(plan, r, it, causal, method, blocks, place, dtype, args, timer)
                             for r in range(W)]
                    busiest, mean = max(times), float(np.mean(times))
                    flops = fwd_flops + bwd_flops
                    rec = dict(mask=name, seqlen=S, world_size=W, method=method, chunk_size=plan.chunk_size,
                               layout=plan.layout, sparse_exchange=allgather.SPARSE_EXCHANGE,
                               work_imbalance=plan.work_imbalance, token_imbalance=plan.token_imbalance,
                               t1_ms=None if t1 is None else t1 * 1e3, rank_ms=[t * 1e3 for t in times],
                               busiest_over_mean=busiest / mean,
                               efficiency_compute=None if t1 is None else t1 / (W * busiest),
                               t1_tflops=None if t1 is None else flops / t1 / 1e12,
                               tflops_per_gpu=flops / (W * busiest) / 1e12,
                               part_keys_max=max(plan.num_local_rows(x) for x in range(W)) if method == "allgather"
                               else S,
                               heads=H, heads_k=Hk, dim=D, dtype=dtype, kernel=args.kernel,
                               device=paddle.device.cuda.get_device_name(0) if timer.gpu else "cpu")
                    if out:
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
                    fmt = lambda x, f: "n/a" if x is None else format(x, f)
                    tag = method + ("" if method != "allgather" else f", {plan.layout}")
                    print(f"| {name} | {S} | {W} | {tag} | {plan.chunk_size} | {plan.work_imbalance:.3f} | "
                          f"{fmt(rec['t1_ms'], '.1f')} | {' / '.join(f'{t * 1e3:.1f}' for t in times)} | "
                          f"{busiest / mean:.3f} | {fmt(rec['efficiency_compute'], '.3f')} | "
                          f"{fmt(rec['t1_tflops'], '.0f')} | {rec['tflops_per_gpu']:.0f} |", flush=True)


def single_device_step(q, k, v, do, it, causal, kernel):
    """One GPU's fwd+bwd of the whole sequence: the op's kernels in one call up to 2^19 tokens
    (2^18 at head dim 256), beyond that the op's long-sequence path (Hopper kernels on pieces, merged exactly) rather
    than the FA2-class kernels one call would fall back to."""
    scale = int(q.shape[3]) ** -0.5
    if int(q.shape[1]) <= long_sequence.sm90_max_seqlen(int(q.shape[3])):
        def step():
            o, lse = tensor_ops.attention_fwd(q, k, v, it, scale, causal, kernel, False)
            return tensor_ops.attention_bwd(q, k, v, it, o, lse, do, scale, causal, kernel, False)
        return step
    for t in (q, k, v):
        t.stop_gradient = False

    def step():
        o, _ = long_sequence.attention(q, k, v, it, causal, scale, kernel, False)
        return paddle.grad([o], [q, k, v], [do])
    return step


def rank_step_time(plan, r, it, causal, method, blocks, place, dtype, args, timer):
    """Seconds of rank r's GPU work in one fwd+bwd (min over repeats), inputs of the right shapes."""
    H, Hk, D = blocks[32].shape[2], blocks[8].shape[2], blocks[32].shape[3]
    S, W, B = plan.seqlen, plan.world_size, 1
    L = plan.num_local_rows(r)
    kern = GPU_KERNELS[args.kernel]
    scale = D ** -0.5
    if method == "allgather":
        spec = allgather.Spec(plan, r, None, it, causal, scale, kern, False, B, place, D)
        q, k, v, do = (tiled(blocks[h], L, place, dtype) for h in (H, Hk, Hk, H))
        # what the exchanges bring (each group's K/V: the keys r's rows see) and send back
        # (dK/dV pieces for r's keys, spread over all of them); a group that brings nothing
        # is not computed
        groups, first = spec.groups(), 1 if spec.fused() else 0
        parts = []
        for gi in range(first, len(groups)):
            if spec.num_arriving(groups[gi]):  # the kernel call's keys: padding slots too (allgather.Spec.part_length)
                parts.append((gi, tiled(blocks[Hk], spec.part_length(gi, groups[gi]), place, dtype)))
        # fused: group 0's buffer joins the own keys in the first call (allgather.Spec.fused)
        buffer0 = tiled(blocks[Hk], spec.part_length(0, groups[0]), place, dtype) if first else None
        main = "own + group 0" if first else "own"
        backs = [tiled(blocks[Hk], len(g) * L, place, dtype) for g in groups]
        # --parts: after the step is timed whole, one more step with each piece synchronized and
        # timed on its own (ms by label)
        part_ms, timing_pieces = {}, False

        def piece(label, fn):
            if not timing_pieces:
                return fn()
            seconds, result = timer(fn)
            part_ms[label] = part_ms.get(label, 0.0) + seconds * 1e3
            return result

        def step():
            masks = spec.part_masks()
            if first:
                k_main = piece("concat", lambda: tensor_ops.concat([k, buffer0], 1))
                v_main = piece("concat", lambda: tensor_ops.concat([v, buffer0], 1))
            else:
                k_main, v_main = k, v
            o, s_ = piece(f"{main} fwd ({int(k_main.shape[1])} keys)",
                          lambda: allgather.part_forward(spec, q, k_main, v_main, masks[0]))
            for gi, k_g in parts:
                o_g, l_g = piece(f"group {gi} fwd ({int(k_g.shape[1])} keys)",
                                 lambda: allgather.part_forward(spec, q, k_g, k_g, masks[1 + gi]))
                o, s_ = piece("merges", lambda: tensor_ops.merge_partial(o, s_, o_g, l_g))
            dq = None
            for gi, k_g in parts:
                dq_g, _, _ = piece(f"group {gi} bwd", lambda: allgather.part_backward(spec, q, k_g, k_g, masks[1 + gi],
                                                                                      o, s_, do))
                dq = dq_g if dq is None else piece("sums", lambda: tensor_ops.accumulate(dq, dq_g))
            dq_l, dk, dv = piece(f"{main} bwd", lambda: allgather.part_backward(spec, q, k_main, v_main, masks[0],
                                                                                 o, s_, do))
            if dq is not None:
                piece("sums", lambda: tensor_ops.accumulate(dq_l, dq))
            if first:  # the own keys' dK/dV out of the fused call's
                dk, dv = piece("sums", lambda: (allgather._own_keys(spec, dk), allgather._own_keys(spec, dv)))
            for back in backs:
                dk, dv = piece("sums", lambda: (tensor_ops.accumulate(dk, back), tensor_ops.accumulate(dv, back)))
    else:
        spec = ulysses.Spec(plan, r, None, it, causal, scale, kern, False, B, place, D)
        qh, dh = (tiled(blocks[H][:, :, : H // W], S, place, dtype) for _ in range(2))
        kh, vh = (tiled(blocks[Hk][:, :, : Hk // W], S, place, dtype) for _ in range(2))
        ql = tiled(blocks[H], L, place, dtype)
        kl = tiled(blocks[Hk], L, place, dtype)
        s2h = idx_t(layouts.seq_to_heads_pack(B, L, W), place)
        s2h_un = idx_t(layouts.seq_to_heads_unpack(plan, B), place)
        h2s = idx_t(layouts.heads_to_seq_pack(plan, B), place)
        h2s_un = idx_t(layouts.heads_to_seq_unpack(B, L, W), place)
        uq, uk = H // W * D, Hk // W * D
        back_q = tiled(blocks[H][:, :, : H // W], W * L, place, dtype)  # as received from the others
        back_k = tiled(blocks[Hk][:, :, : Hk // W], W * L, place, dtype)

        def step():
            for x, u in ((ql, uq), (kl, uk), (kl, uk), (ql, uq)):  # pack q, k, v, dout
                tensor_ops.gather_units(x, s2h, u, [W * L, u])
            for x, u, h in ((qh, uq, H), (kh, uk, Hk), (vh, uk, Hk)):  # unpack: global order
                tensor_ops.gather_units(x, s2h_un, u, [1, S, h // W, D])
            mask = spec.mask()
            o, s = tensor_ops.attention_fwd(qh, kh, vh, mask, scale, causal, kern, False)
            tensor_ops.gather_units(o, h2s, uq, [S, uq])  # out back to the sequence
            tensor_ops.gather_units(back_q, h2s_un, uq, [1, L, H, D])
            tensor_ops.gather_units(dh, s2h_un, uq, [1, S, H // W, D])  # dout to heads
            dq, dk, dv = tensor_ops.attention_bwd(qh, kh, vh, mask, o, s, dh, scale, causal, kern, False)
            for x, u, back, h in ((dq, uq, back_q, H), (dk, uk, back_k, Hk), (dv, uk, back_k, Hk)):
                tensor_ops.gather_units(x, h2s, u, [S, u])
                tensor_ops.gather_units(back, h2s_un, u, [1, L, h, D])

    step()
    best = min(timer(step)[0] for _ in range(args.repeats))
    if method == "allgather" and args.parts:
        timing_pieces = True
        step()
        print(f"#   rank {r} ({L} rows), pieces synchronized one by one, ms: " +
              ", ".join(f"{label} {ms:.1f}" for label, ms in part_ms.items()), flush=True)
    return best


def add_common_args(ap):
    """The options this script and bench_cp_multi_gpu.py share (rank_step_time and the bench
    loops read them)."""
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--methods", nargs="+", default=["allgather", "ulysses"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[65536, 131072, 262144, 1048576])
    ap.add_argument("--masks", nargs="+", default=["causal_document", "share_question", "global_sliding_window", "causal"])
    ap.add_argument("--max-causal", type=int, default=262144)
    ap.add_argument("--t1-max", type=int, default=1 << 20,
                    help="longest S timed on one GPU (beyond 2^19 tokens through the op's long-sequence path)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kernel", default="auto")
    ap.add_argument("--layouts", nargs="+", default=["auto"], help="plan layouts timed for allgather "
                    "(auto, chunks, local)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--parts", action="store_true", help="allgather: also time each rank's pieces one by one")


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--dense-exchange", action="store_true", help="every key to every rank (no sparse exchange)")
    ap.add_argument("--budget-s", type=float, default=1e9)
    args = ap.parse_args()
    allgather.SPARSE_EXCHANGE = not args.dense_exchange
    place = paddle.CPUPlace() if args.device == "cpu" else paddle.CUDAPlace(0)
    pfm.build()
    failures = check(args, place) if args.check else 0
    if args.bench:
        bench(args, place)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
