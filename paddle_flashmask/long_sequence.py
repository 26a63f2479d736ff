"""Attention over sequences longer than one Hopper kernel call takes.

The Hopper kernels take at most 2^19 query rows and keys per call, 2^18 at head dims above
128 (192 and 256: their live-block lists must fit in shared memory next to the tiles:
``sm90_max_seqlen``); a longer self-attention call would otherwise run on the FA2-class
kernels at a fraction of the speed, or not at all (head dim 192 has no FA2-class kernel;
those kernels take up to 65535 query blocks, validation.fa2_max_query_rows). Here the call is cut into query pieces and key parts of at most
``split_seqlen(head_dim)`` tokens (v, out and dV keep value's own head dim, e.g. 128 with
q/k 192). Every (piece, part) pair runs the single-device kernels on the GLOBAL mask through
the remap op (its masked rows in the piece's row numbers, for the part's keys), so tiles
are skipped exactly as in one call; a piece's partial results over the key parts merge by
their LSE, and the pieces are put back together with our concat op. Backward: every pair's
backward with the merged out and LSE (P and rowsum(dO * O) are those of all keys), dQ summed
over the key parts and dK/dV over the query pieces. Every data movement is one of our ops (the runtimes
this project is tested in run no Paddle GPU kernel).

Taken for self-attention (Sq == Sk) without ``window_size`` or ``block_mask``, on a GPU of
compute capability 9.0 whose Hopper kernels take the dtype and head dim, beyond
``sm90_max_seqlen(head_dim)`` tokens; ``PADDLE_FLASHMASK_SPLIT_SEQLEN=N`` splits every such
call longer than N tokens, on any device (CPU included, for tests).
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle.autograd import PyLayer

from . import validation
from ._env import getenv

# The Hopper kernels' longest sequence (flashmask_sm90_api.cu, kMaxSeqlen) at head dims 64
# and 128; head dims above 128 (192 and 256) take half (their larger tiles leave less shared
# memory for the lists).
SM90_MAX_SEQLEN = 1 << 19
SM90_MAX_SEQLEN_WIDE_HEADS = 1 << 18
_ENV = "PADDLE_FLASHMASK_SPLIT_SEQLEN"
_ROW_ALIGN = 128  # pieces start on whole kernel tiles


class _TensorOps:
    """paddle_flashmask.distributed.tensor_ops (our gather, remap, merge, sum and concat ops),
    imported at first use: that package imports this one's parent module."""

    def __getattr__(self, name):
        from .distributed import tensor_ops as module

        return getattr(module, name)


tensor_ops = _TensorOps()


def sm90_max_seqlen(head_dim):
    """The longest sequence (query rows and keys) one Hopper kernel call takes at query/key
    ``head_dim`` (value's head dim does not change it)."""
    return SM90_MAX_SEQLEN_WIDE_HEADS if head_dim > 128 else SM90_MAX_SEQLEN


def split_env_value():
    """PADDLE_FLASHMASK_SPLIT_SEQLEN as set (None unset), unchecked: split_seqlen checks it."""
    return getenv(_ENV)


def split_seqlen(head_dim):
    """(longest piece, forced): from PADDLE_FLASHMASK_SPLIT_SEQLEN if set (pieces are whole
    128-row tiles, so at least 128 tokens), else the Hopper limit at ``head_dim``."""
    env = getenv(_ENV, "")
    if not env:
        return sm90_max_seqlen(head_dim), False
    try:
        value = int(env)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{_ENV} must be a positive integer, got {env!r}")
    return value, True


def should_split(query, key, window, block_mask, gpu_kernel_name, head_dim, sm90_head_dims):
    """Whether this call runs in pieces (see the module docstring)."""
    if not paddle.in_dynamic_mode():
        return False
    S = int(query.shape[1])
    if int(key.shape[1]) != S or window is not None or block_mask is not None:
        return False
    return splits(query, gpu_kernel_name == "fa2", head_dim, sm90_head_dims)


def splits(query, fa2_forced, head_dim, sm90_head_dims):
    """Whether a self-attention of ``query``'s length runs in pieces here."""
    S = int(query.shape[1])
    limit, forced = split_seqlen(head_dim)
    if S <= limit:
        return False
    if forced:
        return True
    if not query.place.is_gpu_place() or fa2_forced or head_dim not in sm90_head_dims:
        return False
    if query.dtype not in (paddle.float16, paddle.bfloat16):
        return False
    return validation.compute_capability(query.place.gpu_device_id()) == (9, 0)


class _Pieces:
    """The cut of one call: piece i holds tokens [bounds[i], bounds[i + 1]); index tensors
    (row gathers, remap tables, key lists) built once per (S, B, place)."""

    _cache = {}

    def __init__(self, S, B, place, limit):
        step = max(_ROW_ALIGN, limit // _ROW_ALIGN * _ROW_ALIGN)
        n = -(-S // step)
        size = -(-S // n)
        size = -(-size // _ROW_ALIGN) * _ROW_ALIGN
        self.S, self.B, self.size = S, B, size
        self.bounds = [min(i * size, S) for i in range(n)] + [S]
        self.n = n
        key = (S, B, str(place), size)
        hit = _Pieces._cache.get(key)
        if hit is None:
            hit = self._build(place)
            if len(_Pieces._cache) > 32:
                _Pieces._cache.clear()
            _Pieces._cache[key] = hit
        self.rows, self.tables, self.keys = hit

    def _build(self, place):
        def t(a):
            return paddle.to_tensor(np.ascontiguousarray(a), dtype=str(a.dtype), place=place)

        rows, tables, keys = [], [], []
        chunks = self.n  # the remap's chunks are the pieces themselves (chunk_size = size)
        for i in range(self.n):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            r = np.arange(lo, hi, dtype=np.int64)
            rows.append(t((np.arange(self.B, dtype=np.int64)[:, None] * self.S + r[None, :]).ravel()))
            table = np.zeros(chunks + 1, dtype=np.int32)
            table[i + 1:] = hi - lo  # this piece's rows lie in chunk i only
            tables.append(t(table))
            keys.append(t(r))
        return rows, tables, keys

    def length(self, i):
        return self.bounds[i + 1] - self.bounds[i]

    def take(self, x, i):
        """Piece i's tokens of ``x`` ``[B, S, h, d]`` (our gather op)."""
        if self.n == 1:
            return x
        shape = [int(d) for d in x.shape]
        unit = int(np.prod(shape[2:]))
        return tensor_ops.gather_units(x, self.rows[i], unit, [shape[0], self.length(i)] + shape[2:])


def _masks(pieces, indices, causal):
    """The remapped mask of every (query piece i, key part j), None where nothing is masked;
    a pair that plain causal masks whole is left out (False)."""
    if indices is None and not causal:
        return [[None] * pieces.n for _ in range(pieces.n)]
    out = []
    for i in range(pieces.n):
        row = []
        for j in range(pieces.n):
            if indices is None and j > i:  # causal: keys after every row of the piece
                row.append(False)
                continue
            row.append(tensor_ops.remap_indices(indices, pieces.keys[j], pieces.tables[i], causal, pieces.size,
                                                pieces.S))
        out.append(row)
    return out


def _concat(parts, axis):
    return parts[0] if len(parts) == 1 else tensor_ops.concat(parts, axis)


def pieces_forward(q, k, v, indices, causal, scale, gpu_kernel, deterministic):
    """(out, lse, state) of the single-device op computed in pieces, outside autograd; ``state``
    is what :func:`pieces_backward` needs besides q/k/v/out (the pieces' LSEs: the outputs
    are taken back from ``out``, not kept twice)."""
    # the limit splits() decided with: both take the head dim of q (the op's head_dim)
    limit, _ = split_seqlen(int(q.shape[3]))
    pieces = _Pieces(int(q.shape[1]), int(q.shape[0]), q.place, limit)
    masks = _masks(pieces, indices, causal)
    ks = [pieces.take(k, j) for j in range(pieces.n)]
    vs = [pieces.take(v, j) for j in range(pieces.n)]
    outs, lses = [], []
    for i in range(pieces.n):
        q_i = pieces.take(q, i)
        out = lse = None
        for j in range(pieces.n):
            if masks[i][j] is False:
                continue
            o, s = tensor_ops.attention_fwd(q_i, ks[j], vs[j], masks[i][j], scale, False, gpu_kernel, deterministic)
            out, lse = (o, s) if out is None else tensor_ops.merge_partial(out, lse, o, s)
        outs.append(out)
        lses.append(lse)
    return _concat(outs, 1), _concat(lses, 2), (pieces, masks, lses)


def pieces_backward(state, q, k, v, out, dout, scale, gpu_kernel, deterministic):
    """(dq, dk, dv) for :func:`pieces_forward`'s call: every pair's backward with its piece's
    merged out/LSE, dQ summed over key parts and dK/dV over query pieces."""
    pieces, masks, lses = state
    ks = [pieces.take(k, j) for j in range(pieces.n)]
    vs = [pieces.take(v, j) for j in range(pieces.n)]
    dqs, dks, dvs = [], [None] * pieces.n, [None] * pieces.n
    for i in range(pieces.n):
        q_i, do_i, out_i = pieces.take(q, i), pieces.take(dout, i), pieces.take(out, i)
        dq = None
        for j in range(pieces.n):
            if masks[i][j] is False:
                continue
            dq_ij, dk_ij, dv_ij = tensor_ops.attention_bwd(q_i, ks[j], vs[j], masks[i][j], out_i, lses[i], do_i,
                                                           scale, False, gpu_kernel, deterministic)
            dq = dq_ij if dq is None else tensor_ops.accumulate(dq, dq_ij)
            dks[j] = dk_ij if dks[j] is None else tensor_ops.accumulate(dks[j], dk_ij)
            dvs[j] = dv_ij if dvs[j] is None else tensor_ops.accumulate(dvs[j], dv_ij)
        dqs.append(dq)
    return _concat(dqs, 1), _concat(dks, 1), _concat(dvs, 1)


class _Call:
    """The call's non-differentiable arguments (the indices travel here, not as a PyLayer
    input, so autograd expects gradients for q, k and v only)."""

    def __init__(self, indices, causal, scale, gpu_kernel, deterministic):
        self.indices, self.causal, self.scale = indices, causal, scale
        self.gpu_kernel, self.deterministic = gpu_kernel, deterministic


class LongSequenceAttention(PyLayer):
    @staticmethod
    def forward(ctx, q, k, v, call):
        # no zero gradient made for the LSE output (Paddle's own fill kernel may not run)
        ctx.set_materialize_grads(False)
        out, lse, state = pieces_forward(q, k, v, call.indices, call.causal, call.scale, call.gpu_kernel,
                                         call.deterministic)
        ctx.call, ctx.state = call, state
        ctx.save_for_backward(q, k, v, out)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        q, k, v, out = ctx.saved_tensor()
        call = ctx.call
        return pieces_backward(ctx.state, q, k, v, out, dout, call.scale, call.gpu_kernel, call.deterministic)


def attention(q, k, v, indices, causal, scale, gpu_kernel, deterministic):
    """(out, lse) of the single-device op, computed in pieces; gradients reach q/k/v."""
    return LongSequenceAttention.apply(q, k, v, _Call(indices, causal, scale, gpu_kernel, deterministic))
