"""Index maps (numpy, int64) of the exchanges, built once per plan and rank.

Every exchange is pack (a gather into the send buffer, one piece per destination) ->
all-to-all -> unpack (a gather into the layout the kernels read). Units are contiguous
vectors of ``heads x head_dim`` elements (or single LSE values); a map lists, for each
unit of its output, the unit of its input.
"""

from __future__ import annotations

import numpy as np


def _concat(parts):
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# ---- allgather method: K/V of the other ranks, and their gradients back -----------------------

def remote_ranks(world_size, rank):
    return [r for r in range(world_size) if r != rank]


def kv_send_pack(batch, local_len, world_size):
    """Local K rows, once per other rank: ``[(W-1) * B * L]`` units from ``[B, L]``."""
    one = np.arange(batch * local_len, dtype=np.int64)
    return np.tile(one, world_size - 1)


def kv_splits(plan, batch):
    """Units rank s sends rank d when every rank sends its rows to all others."""
    W = plan.world_size
    m = np.zeros((W, W), dtype=np.int64)
    for s in range(W):
        for d in range(W):
            if s != d:
                m[s, d] = batch * plan.num_local_rows(s)
    return m


def kv_recv_unpack(plan, rank, batch):
    """``[B, S_remote]`` (other ranks' rows, rank by rank) from the received pieces
    (piece s = rank s's ``[B, L_s]``)."""
    out, off = [], 0
    sizes = [plan.num_local_rows(s) for s in remote_ranks(plan.world_size, rank)]
    cols = []
    for n in sizes:
        cols.append((off, n))
        off += batch * n
    for b in range(batch):
        for (base, n) in cols:
            out.append(base + b * n + np.arange(n, dtype=np.int64))
    return _concat(out)


def remote_key_rows(plan, rank):
    return _concat([plan.local_rows(s) for s in remote_ranks(plan.world_size, rank)])


def dkv_send_pack(plan, rank, batch):
    """Gradients of the remote keys back to their owners: from ``[B, S_remote]`` to the
    pieces ``[s][B, L_s]``."""
    s_remote = sum(plan.num_local_rows(s) for s in remote_ranks(plan.world_size, rank))
    out, off = [], 0
    for s in remote_ranks(plan.world_size, rank):
        n = plan.num_local_rows(s)
        for b in range(batch):
            out.append(b * s_remote + off + np.arange(n, dtype=np.int64))
        off += n
    return _concat(out)


# ---- ulysses: sequence <-> heads ---------------------------------------------------------------

def seq_to_heads_pack(batch, local_len, world_size):
    """From ``[B, L, W, unit]`` (head group r = heads of rank r) to pieces ``[r][B, L]``."""
    bi = np.arange(batch * local_len, dtype=np.int64)
    return (bi[None, :] * world_size + np.arange(world_size, dtype=np.int64)[:, None]).ravel()


def seq_to_heads_splits(plan, batch):
    W = plan.world_size
    m = np.zeros((W, W), dtype=np.int64)
    for s in range(W):
        m[s, :] = batch * plan.num_local_rows(s)
    return m


def seq_to_heads_unpack(plan, batch):
    """``[B, S]`` in global order from the pieces ``[s][B, L_s]`` (any receiving rank)."""
    owner = plan.owner_of_rows()
    pos = plan.position_in_rank()
    lens = np.array([plan.num_local_rows(s) for s in range(plan.world_size)], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(batch * lens)[:-1]])
    b = np.arange(batch, dtype=np.int64)[:, None]
    return (base[owner][None, :] + b * lens[owner][None, :] + pos[None, :]).ravel()


def heads_to_seq_pack(plan, batch):
    """From ``[B, S]`` (global order) to the pieces ``[d][B, L_d]`` (rank d's rows)."""
    S = plan.seqlen
    out = []
    for d in range(plan.world_size):
        rows = plan.local_rows(d)
        out.append((np.arange(batch, dtype=np.int64)[:, None] * S + rows[None, :]).ravel())
    return _concat(out)


def heads_to_seq_unpack(batch, local_len, world_size):
    """``[B, L, W]`` (head group r: the heads rank r computed) from the pieces ``[r][B, L]``."""
    b = np.arange(batch, dtype=np.int64)[:, None, None]
    i = np.arange(local_len, dtype=np.int64)[None, :, None]
    r = np.arange(world_size, dtype=np.int64)[None, None, :]
    return ((r * batch + b) * local_len + i).ravel()


def lse_heads_to_seq_pack(plan, batch, heads_per_rank):
    """LSE ``[B, Hr, S]`` (single floats) to the pieces ``[d][B, Hr, L_d]``."""
    S = plan.seqlen
    out = []
    for d in range(plan.world_size):
        rows = plan.local_rows(d)
        bh = np.arange(batch * heads_per_rank, dtype=np.int64)[:, None]
        out.append((bh * S + rows[None, :]).ravel())
    return _concat(out)


def lse_heads_to_seq_unpack(batch, heads_per_rank, local_len, world_size):
    """``[B, W * Hr, L]`` from the pieces ``[r][B, Hr, L]``."""
    b = np.arange(batch, dtype=np.int64)[:, None, None, None]
    r = np.arange(world_size, dtype=np.int64)[None, :, None, None]
    h = np.arange(heads_per_rank, dtype=np.int64)[None, None, :, None]
    i = np.arange(local_len, dtype=np.int64)[None, None, None, :]
    return (((r * batch + b) * heads_per_rank + h) * local_len + i).ravel()


def mask_head_slice(batch_m, mask_heads, world_size, rank, seqlen, cols):
    """Units (``S * C`` each) of the rank's mask heads ``[Bm, Hm / W]`` of ``[Bm, Hm]``."""
    per = mask_heads // world_size
    b = np.arange(batch_m, dtype=np.int64)[:, None]
    h = rank * per + np.arange(per, dtype=np.int64)[None, :]
    return (b * mask_heads + h).ravel()
