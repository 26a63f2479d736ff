"""Collectives of context parallel: the group, an all-to-all exchange, agreement on errors.

Only collectives seen to give right values in the project's GPU runtime are used:
``all_reduce`` and ``alltoall_single`` (NCCL). Gloo (CPU) has no all-to-all, so there the
exchange is an ``all_reduce`` of every rank's send buffer (W times the traffic; CPU runs are
for correctness). Data packing around the collectives is our own ops (tensor_ops).
"""

from __future__ import annotations

import os

import numpy as np
import paddle
import paddle.distributed as dist

from . import tensor_ops


def get_context_parallel_group():
    """fleet's sep (context-parallel) group when fleet's hybrid parallel is initialised, else
    None (the global group)."""
    try:
        from paddle.distributed import fleet

        hcg = fleet.get_hybrid_communicate_group()
    except Exception:  # fleet not initialised
        return None
    if hcg is None:
        return None
    for getter in ("get_sep_parallel_group", "get_context_parallel_group"):
        fn = getattr(hcg, getter, None)
        if fn is None:
            continue
        try:
            group = fn()
        except Exception:
            continue
        if group is not None and getattr(group, "nranks", 1) > 1:
            return group
    return None


def group_size(group):
    return int(group.nranks) if group is not None else int(dist.get_world_size())


def group_rank(group):
    if group is not None:
        return int(group.rank)
    return int(dist.get_rank())


def _global_rank_of(group, r):
    return group.ranks[r] if group is not None else r


def agree(local_error, place, group):
    """Raise on every rank if any rank found bad input, before any data collective.

    ``local_error``: this rank's message or None. A rank-local error (its q rows disagree
    with the plan, say) must not leave the other ranks waiting in a collective.
    """
    if group_size(group) == 1:
        if local_error:
            raise ValueError(local_error)
        return
    flag = paddle.to_tensor(np.array([1 if local_error else 0], dtype=np.int32), place=place)
    dist.all_reduce(flag, group=group)
    bad = int(flag.numpy()[0])
    if local_error:
        raise ValueError(local_error)
    if bad:
        raise ValueError(f"context-parallel flashmask_attention: {bad} other rank(s) of the group got bad "
                         "input (their error names it); no rank went on")


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


class _Pending:
    def __init__(self, task, finish, keep):
        # keep: the send buffer, alive until the transfer is done (the allocator must not
        # hand its memory to another tensor while the communication stream reads it)
        self.task, self.finish, self.keep = task, finish, keep

    def wait(self):
        self.task.wait()
        self.keep = None
        return self.finish()


def _is_gpu(t):
    return "gpu" in str(t.place).lower() or "cuda" in str(t.place).lower()


def exchange(x, pack, unit, splits, unpack, out_shape, group, rank, sync=False):
    """All-to-all of ``x``'s units: pack (gather into pieces per destination, in rank
    order), send, unpack (gather into ``out_shape``).

    ``pack``/``unpack``: int64 index tensors (``layouts``), or None where the units are
    already in order (a reshape, no copy); ``splits[s][d]``: units rank s sends rank d
    (every rank passes the same matrix). Returns a handle; ``.wait()`` gives the result.
    On NCCL the transfer runs on the communication stream while the caller computes;
    gloo completes at once.
    """
    if _is_gpu(x) or _FORCE_PADDING:
        splits, pack, unpack = _without_empty_pieces(x, unit, splits, pack, unpack, rank)
    send_units = int(splits[rank].sum())
    recv_units = int(splits[:, rank].sum())
    send = x.reshape([send_units, unit]) if pack is None else \
        tensor_ops.gather_units(x, pack, unit, [send_units, unit])
    if _is_gpu(x):
        from paddle.distributed.communication import stream

        recv = paddle.empty([recv_units, unit], dtype=x.dtype)
        task = stream.alltoall_single(recv, send, in_split_sizes=[int(v) for v in splits[rank]],
                                      out_split_sizes=[int(v) for v in splits[:, rank]], group=group,
                                      sync_op=sync, use_calc_stream=False)

        def finish():
            return _unpack(recv, unpack, unit, out_shape)

        return _Pending(task, finish, send) if not sync else _Done(finish())
    recv = _alltoall_by_allreduce(send, splits, rank, group, unit)
    return _Done(_unpack(recv, unpack, unit, out_shape))


# Paddle 2.6's alltoall_single slices its tensors per piece and refuses an empty piece
# (seen on 2 H200s: "The start row index must be less than the end row index"), and
# every ring shift sends a rank nothing for itself. So on NCCL each empty piece carries one
# dummy unit, which the unpack map skips. Maps are built once per (pack, unpack, splits).
_FORCE_PADDING = os.environ.get("PADDLE_FLASHMASK_CP_PAD_EMPTY") == "1"  # tests: the same path on gloo
_padded_maps = {}


def _without_empty_pieces(x, unit, splits, pack, unpack, rank):
    if (splits > 0).all():
        return splits, pack, unpack
    x_units = int(np.prod([int(d) for d in x.shape])) // unit
    key = (id(pack), id(unpack), splits.tobytes(), splits.shape, rank, x_units, str(x.place))
    hit = _padded_maps.get(key)
    if hit is not None and hit[0] is pack and hit[1] is unpack:
        return hit[2], hit[3], hit[4]
    W = splits.shape[0]
    pack_np = None if pack is None else pack.numpy()
    pieces, off = [], 0
    for d in range(W):  # what this rank sends, destination by destination
        n = int(splits[rank, d])
        if n:
            pieces.append(np.arange(off, off + n) if pack_np is None else pack_np[off:off + n])
        else:
            pieces.append(np.full(1, -1, dtype=np.int64))  # a dummy unit (-1: a zero unit, read from nowhere)
        off += n
    true_to_padded, padded_off = [], 0
    for src in range(W):  # where each really sent unit lands in the padded receive buffer
        n = int(splits[src, rank])
        true_to_padded.append(padded_off + np.arange(n, dtype=np.int64))
        padded_off += max(n, 1)
    true_to_padded = np.concatenate(true_to_padded)
    if unpack is None:
        new_unpack = true_to_padded
    else:  # -1 (a zero unit) stays -1
        u = unpack.numpy()
        new_unpack = np.where(u >= 0, true_to_padded[np.maximum(u, 0)], -1) if true_to_padded.size else u
    padded = np.maximum(splits, 1)
    pack_t = paddle.to_tensor(np.concatenate(pieces).astype(np.int64), place=x.place)
    unpack_t = paddle.to_tensor(new_unpack.astype(np.int64), place=x.place)
    if len(_padded_maps) > 256:
        _padded_maps.clear()
    _padded_maps[key] = (pack, unpack, padded, pack_t, unpack_t)
    return padded, pack_t, unpack_t


def _unpack(recv, unpack, unit, out_shape):
    return recv.reshape(out_shape) if unpack is None else tensor_ops.gather_units(recv, unpack, unit, out_shape)


def shift_splits(units_per_rank, distance):
    """Splits of a ring shift: rank s sends its ``units_per_rank[s]`` units to rank
    ``(s + distance) % W`` and nothing else."""
    W = len(units_per_rank)
    m = np.zeros((W, W), dtype=np.int64)
    for s in range(W):
        m[s, (s + distance) % W] = units_per_rank[s]
    return m


def _alltoall_by_allreduce(send, splits, rank, group, unit):
    # gloo: every rank's send buffer lands on every rank through one all_reduce (zeros
    # elsewhere; x + 0 is exact), each rank keeps the pieces addressed to it. fp32 on the wire
    # (bf16/fp16 convert exactly); CPU only.
    W = splits.shape[0]
    width = int(max(splits.sum(axis=1).max(), 1))
    buf = np.zeros((W, width, unit), dtype=np.float32)
    mine = send.astype("float32").numpy() if send.dtype != paddle.float32 else send.numpy()
    buf[rank, :mine.shape[0]] = mine
    t = paddle.to_tensor(buf)
    dist.all_reduce(t, group=group)
    allb = t.numpy()
    pieces = []
    for s in range(W):
        start = int(splits[s, :rank].sum())
        pieces.append(allb[s, start:start + int(splits[s, rank])])
    recv = np.concatenate(pieces, axis=0) if pieces else np.zeros((0, unit), np.float32)
    out = paddle.to_tensor(recv)
    return out if send.dtype == paddle.float32 else out.astype(send.dtype)
