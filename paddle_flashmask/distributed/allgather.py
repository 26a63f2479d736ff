"""Context parallel by K/V exchange ("allgather"): query rows stay, keys travel.

Forward on rank r: send the local K/V to every other rank (all-to-all) and, while they
travel, attend the local queries to the local keys; then to the other ranks' keys; merge
the two partial softmaxes exactly by their LSE. Backward: the remote part's backward
first, its dK/dV sent back to their owners while the local part's backward runs; every
rank sums what it receives for its rows. Both parts read the global mask through the
remap op (local query rows, the part's key columns), so tiles are skipped exactly as on
one device. Any mask form, head count, GQA.
"""

from __future__ import annotations

import weakref

import numpy as np
from paddle.autograd import PyLayer

from . import comm, layouts, tensor_ops


class Spec:
    """Everything but q/k/v a call needs; index tensors cached on the plan per place."""

    def __init__(self, plan, rank, group, indices, causal, scale, gpu_kernel, deterministic, batch, place):
        self.plan, self.rank, self.group = plan, rank, group
        self.indices, self.causal, self.scale = indices, causal, scale
        self.gpu_kernel, self.deterministic = gpu_kernel, deterministic
        self.batch, self.place = batch, place
        self.W = plan.world_size
        self.L = plan.num_local_rows(rank)

    def part_masks(self):
        """(mask of the local keys, mask of the remote keys) for this rank's rows; cached per
        indices tensor (every layer of a model passes the same one)."""
        if self.indices is None and not self.causal:
            return None, None  # full attention: nothing to mask
        key = ("masks", self.rank, id(self.indices) if self.indices is not None else None, str(self.place))
        hit = self.plan._device_cache.get(key)
        if hit is not None and (self.indices is None or hit[0]() is self.indices):
            return hit[1], hit[2]
        table = self.plan._cached_index(("row_table", self.rank), self.plan.row_table(self.rank), self.place)
        local_rows = self.plan._cached_index(("rows", self.rank), self.plan.local_rows(self.rank), self.place)
        remote_rows = self.plan._cached_index(("remote_rows", self.rank),
                                              layouts.remote_key_rows(self.plan, self.rank), self.place)
        args = (table, self.causal, self.plan.chunk_size, self.plan.seqlen)
        m_local = tensor_ops.remap_indices(self.indices, local_rows, *args)
        m_remote = tensor_ops.remap_indices(self.indices, remote_rows, *args)
        ref = weakref.ref(self.indices) if self.indices is not None else None
        self.plan._device_cache[key] = (ref, m_local, m_remote)
        return m_local, m_remote


def _idx(spec, name, build):
    return spec.plan._cached_index(("allgather", name, spec.rank, spec.batch), build(), spec.place)


def _send_kv(spec, x):
    B, L, Hk, D = [int(d) for d in x.shape]
    plan, W = spec.plan, spec.W
    s_remote = plan.seqlen - L
    pack = _idx(spec, "kv_pack", lambda: layouts.kv_send_pack(B, L, W))
    unpack = _idx(spec, "kv_unpack", lambda: layouts.kv_recv_unpack(plan, spec.rank, B))
    splits = layouts.kv_splits(plan, B)
    return comm.exchange(x, pack, Hk * D, splits, unpack, [B, s_remote, Hk, D], spec.group, spec.rank)


def _send_dkv(spec, dx):
    B, s_remote, Hk, D = [int(d) for d in dx.shape]
    plan = spec.plan
    pack = _idx(spec, "dkv_pack", lambda: layouts.dkv_send_pack(plan, spec.rank, B))
    n = (spec.W - 1) * B * spec.L
    unpack = _idx(spec, "dkv_unpack", lambda: np.arange(n, dtype=np.int64))
    splits = layouts.kv_splits(plan, B).T.copy()
    return comm.exchange(dx, pack, Hk * D, splits, unpack, [spec.W - 1, B, spec.L, Hk, D], spec.group, spec.rank)


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
        m_local, m_remote = spec.part_masks()
        k_job, v_job = _send_kv(spec, k), _send_kv(spec, v)
        out_l, lse_l = part_forward(spec, q, k, v, m_local)  # overlaps the transfer on NCCL
        k_rem, v_rem = k_job.wait(), v_job.wait()
        out_r, lse_r = part_forward(spec, q, k_rem, v_rem, m_remote)
        out, lse = tensor_ops.merge_partial(out_l, lse_l, out_r, lse_r)
        ctx.spec = spec
        ctx.save_for_backward(q, k, v, k_rem, v_rem, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        spec = ctx.spec
        q, k, v, k_rem, v_rem, out, lse = ctx.saved_tensor()
        m_local, m_remote = spec.part_masks()
        dq_r, dk_r, dv_r = part_backward(spec, q, k_rem, v_rem, m_remote, out, lse, dout)
        dk_job, dv_job = _send_dkv(spec, dk_r), _send_dkv(spec, dv_r)
        dq_l, dk_l, dv_l = part_backward(spec, q, k, v, m_local, out, lse, dout)  # overlaps the transfer
        dq = tensor_ops.accumulate(dq_l, dq_r)
        dk = tensor_ops.accumulate(dk_l, dk_job.wait())
        dv = tensor_ops.accumulate(dv_l, dv_job.wait())
        return dq, dk, dv
