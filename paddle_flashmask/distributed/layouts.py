"""Index maps (numpy, int64) of the exchanges, built once per plan and rank.

Every ulysses exchange is pack (a gather into the send buffer, one piece per destination)
-> all-to-all -> unpack (a gather into the layout the kernels read); the allgather
method's ring shifts need no maps. Units are contiguous
vectors of ``heads x head_dim`` elements (or single LSE values); a map lists, for each
unit of its output, the unit of its input.
"""

from __future__ import annotations

import numpy as np


def _concat(parts):
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


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


def mask_head_slice(batch_m, mask_heads, world_size, rank):
    """Units (``S * C`` each) of the rank's mask heads ``[Bm, Hm / W]`` of ``[Bm, Hm]``."""
    per = mask_heads // world_size
    b = np.arange(batch_m, dtype=np.int64)[:, None]
    h = rank * per + np.arange(per, dtype=np.int64)[None, :]
    return (b * mask_heads + h).ravel()
