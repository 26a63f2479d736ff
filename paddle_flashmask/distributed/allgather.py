"""Context parallel by K/V exchange ("allgather"): query rows stay, keys travel.

Forward on rank r: its K/V go to every other rank, one ring shift per distance d (rank r
sends to r + d and receives from r - d), all started at once. While they travel r attends
its queries to its own keys, then to each arriving peer's keys in turn, and merges the
partial softmaxes exactly by their LSE. Backward: each peer part's backward (with the
merged out/LSE), its dK/dV shifted back to the owner at once, then the local part while
they travel; every rank sums what it receives for its keys in a fixed order. Each part
reads the global mask through the remap op (local query rows, that part's key columns),
so tiles are skipped exactly as on one device, and no part has more keys than one rank
holds (the Hopper kernels take up to 2^19). Any mask form, head count, GQA.
"""

from __future__ import annotations

import weakref

from paddle.autograd import PyLayer

from . import comm, tensor_ops


class Spec:
    """Everything but q/k/v a call needs; index tensors cached on the plan per place."""

    def __init__(self, plan, rank, group, indices, causal, scale, gpu_kernel, deterministic, batch, place):
        self.plan, self.rank, self.group = plan, rank, group
        self.indices, self.causal, self.scale = indices, causal, scale
        self.gpu_kernel, self.deterministic = gpu_kernel, deterministic
        self.batch, self.place = batch, place
        self.W = plan.world_size
        self.L = plan.num_local_rows(rank)

    def peers(self):
        """Other ranks in the order their K/V arrive: r - 1, r - 2, ... (mod W)."""
        return [(self.rank - d) % self.W for d in range(1, self.W)]

    def part_masks(self):
        """{rank s: mask of s's keys for this rank's rows} (s = this rank: its own keys);
        cached per indices tensor (every layer of a model passes the same one)."""
        if self.indices is None and not self.causal:
            return {s: None for s in range(self.W)}  # full attention: nothing to mask
        key = ("masks", self.rank, id(self.indices) if self.indices is not None else None, str(self.place))
        hit = self.plan._device_cache.get(key)
        if hit is not None and (self.indices is None or hit[0]() is self.indices):
            return hit[1]
        table = self.plan._cached_index(("row_table", self.rank), self.plan.row_table(self.rank), self.place)
        masks = {}
        for s in range(self.W):
            rows = self.plan._cached_index(("rows", s), self.plan.local_rows(s), self.place)
            masks[s] = tensor_ops.remap_indices(self.indices, rows, table, self.causal, self.plan.chunk_size,
                                                self.plan.seqlen)
        ref = weakref.ref(self.indices) if self.indices is not None else None
        self.plan._device_cache[key] = (ref, masks)
        return masks


def _shift(spec, x, distance, rows_of_sender, out_rows):
    """Ring shift by ``distance`` of a ``[B, rows, Hk, D]`` tensor: every rank sends x to
    rank + distance and gets the tensor of rank - distance, shaped ``[B, out_rows, Hk, D]``."""
    B, _, Hk, D = [int(d) for d in x.shape]
    units = [B * n for n in rows_of_sender]
    splits = comm.shift_splits(units, distance)
    return comm.exchange(x, None, Hk * D, splits, None, [B, out_rows, Hk, D], spec.group, spec.rank)


def _send_kv(spec, x, distance):
    rows = [spec.plan.num_local_rows(s) for s in range(spec.W)]
    return _shift(spec, x, distance, rows, rows[(spec.rank - distance) % spec.W])


def _send_back(spec, dx, distance):
    # dK of the keys of peer (rank - distance) goes back to it: a shift by -distance, and
    # what arrives is the piece for this rank's own keys from rank + distance.
    rows_sent = [spec.plan.num_local_rows((s - distance) % spec.W) for s in range(spec.W)]
    return _shift(spec, dx, -distance, rows_sent, spec.L)


def part_forward(spec, q, k, v, mask):
    """(out, lse) of this rank's queries over one part's keys (the part's own mask)."""
    return tensor_ops.attention_fwd(q, k, v, mask, spec.scale, False, spec.gpu_kernel, spec.deterministic)


def part_backward(spec, q, k, v, mask, out, lse, dout):
    """(dq, dk, dv) of one part, from the merged out/lse: P = exp(S - LSE) and
    delta = rowsum(dO * O) are those of all keys, so the parts' dq add up exactly."""
    return tensor_ops.attention_bwd(q, k, v, mask, out, lse, dout, spec.scale, False, spec.gpu_kernel,
                                    spec.deterministic)


class AllGatherAttention(PyLayer):
    @staticmethod
    def forward(ctx, q, k, v, spec):
        masks = spec.part_masks()
        jobs = [(_send_kv(spec, k, d), _send_kv(spec, v, d)) for d in range(1, spec.W)]
        out, lse = part_forward(spec, q, k, v, masks[spec.rank])  # overlaps the transfers on NCCL
        remote = []
        for (kj, vj), s in zip(jobs, spec.peers()):
            k_s, v_s = kj.wait(), vj.wait()
            out_s, lse_s = part_forward(spec, q, k_s, v_s, masks[s])
            out, lse = tensor_ops.merge_partial(out, lse, out_s, lse_s)
            remote += [k_s, v_s]
        ctx.spec = spec
        ctx.save_for_backward(q, k, v, out, lse, *remote)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        spec = ctx.spec
        q, k, v, out, lse, *remote = ctx.saved_tensor()
        masks = spec.part_masks()
        dq, back = None, []
        for d, s in enumerate(spec.peers(), start=1):
            k_s, v_s = remote[2 * (d - 1)], remote[2 * (d - 1) + 1]
            dq_s, dk_s, dv_s = part_backward(spec, q, k_s, v_s, masks[s], out, lse, dout)
            back.append((_send_back(spec, dk_s, d), _send_back(spec, dv_s, d)))
            dq = dq_s if dq is None else tensor_ops.accumulate(dq, dq_s)
        dq_l, dk, dv = part_backward(spec, q, k, v, masks[spec.rank], out, lse, dout)  # overlaps the transfers
        dq = dq_l if dq is None else tensor_ops.accumulate(dq_l, dq)
        for kj, vj in back:  # fixed order: deterministic sums
            dk = tensor_ops.accumulate(dk, kj.wait())
            dv = tensor_ops.accumulate(dv, vj.wait())
        return dq, dk, dv
