"""The few data movements context parallel needs, as our own ops.

On the GPU runtimes this project is tested in, Paddle's own GPU kernels may not run, so
every copy, permutation, sum and merge on the data path is one of the op library's
``pfm_cp_*`` ops (CPU and CUDA), never a Paddle kernel.
"""

from __future__ import annotations

import numpy as np

from .._loader import load_ops


def _ops():
    return load_ops()


def gather_units(x, src, unit, out_shape):
    """``out.flat[n*unit:(n+1)*unit] = x.flat[src[n]*unit:...]``, shaped ``out_shape``."""
    return _ops().pfm_cp_gather_units(x, src, int(unit), [int(d) for d in out_shape])


def accumulate(a, b):
    """``a + sum of b's pieces``: b holds P >= 1 tensors shaped like a, back to back (fp32 sums)."""
    return _ops().pfm_cp_accumulate(a, b)


def merge_partial(out_a, lse_a, out_b, lse_b):
    """Exact softmax merge of two attention results over disjoint key sets -> (out, lse)."""
    out, lse = _ops().pfm_cp_merge(out_a, lse_a, out_b, lse_b)
    return out, lse


def remap_indices(indices, key_rows, row_table, causal, chunk_size, seqlen):
    """The global mask restricted to a rank's query rows and the keys ``key_rows``, in the
    rank's local row numbers, as a causal=False form (see the op); a key of -1 is a padding
    slot, a column that hides every row (allgather's spaced parts)."""
    return _ops().pfm_cp_remap_indices(indices, key_rows, row_table, bool(causal), int(chunk_size), int(seqlen))


def attention_fwd(q, k, v, indices, scale, causal, gpu_kernel, deterministic):
    """(out, lse) of the single-device op, outside autograd."""
    out, lse = _ops().pfm_flashmask_attention(q, k, v, indices, None, float(scale), bool(causal), -1, -1,
                                              int(gpu_kernel), bool(deterministic))
    return out, lse


def attention_bwd(q, k, v, indices, out, lse, dout, scale, causal, gpu_kernel, deterministic):
    """(dq, dk, dv) of the single-device backward for a given (possibly merged) out and lse."""
    dq, dk, dv = _ops().pfm_flashmask_attention_bwd(q, k, v, indices, None, out, lse, dout, float(scale),
                                                    bool(causal), -1, -1, int(gpu_kernel), bool(deterministic))
    return dq, dk, dv


def concat(parts, axis):
    """The tensors side by side along ``axis`` (every other dim equal)."""
    return _ops().pfm_cp_concat(list(parts), int(axis))


def rows_index(batch, seqlen, rows: np.ndarray):
    """Units of ``x[:, rows]`` in a ``[batch, seqlen, ...]`` tensor, for ``gather_units``."""
    return (np.arange(batch, dtype=np.int64)[:, None] * seqlen + np.asarray(rows, np.int64)[None, :]).ravel()


def take_rows(x, rows: np.ndarray):
    """``x[:, rows]`` for a ``[B, S, ...]`` paddle tensor on any place."""
    import paddle

    shape = [int(d) for d in x.shape]
    B, S = shape[0], shape[1]
    unit = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    src_t = paddle.to_tensor(rows_index(B, S, rows), dtype="int64", place=x.place)
    return gather_units(x, src_t, unit, [B, rows.size] + shape[2:])


def merge_rows(parts, rows_per_rank, seqlen):
    """``[B, S, ...]`` from per-rank ``[B, L_r, ...]`` parts (a host round trip: a helper for
    inputs and results, not for the attention's data path)."""
    import paddle

    arrays = [p.numpy() for p in parts]
    out = np.empty((arrays[0].shape[0], seqlen) + arrays[0].shape[2:], dtype=arrays[0].dtype)
    for rows, a in zip(rows_per_rank, arrays):
        out[:, rows] = a
    return paddle.to_tensor(out, place=parts[0].place)
