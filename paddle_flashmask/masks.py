"""FlashMask mask builders (attention-gym style).

FlashMask stores a sparse attention mask column-wise: ``startend_row_indices`` is an
int32 tensor of shape ``[B, Hm, Sk, C]`` whose third axis indexes KEY COLUMNS ``j`` and
whose values are QUERY-ROW indices in ``[0, Sq]``.  Column ``j`` masks query rows ``i``:

==========  ===  ========================  ===========================================
causal      C    vectors                   masked rows of column j
==========  ===  ========================  ===========================================
True        1    LTS                       ``i >= LTS_j``            (+ causal part)
True        2    LTS, LTE                  ``LTS_j <= i < LTE_j``    (+ causal part)
False       2    LTS, UTE                  ``i >= LTS_j  or  i < UTE_j``
False       4    LTS, LTE, UTS, UTE        ``LTS_j <= i < LTE_j  or  UTS_j <= i < UTE_j``
==========  ===  ========================  ===========================================

The causal part masks ``j > i + Sk - Sq`` (bottom-right alignment; ``i < j`` when
``Sq == Sk``).

Every builder here uses numpy (O(S) work), returns a ``paddle.Tensor`` of dtype int32 and
shape ``[B, Hm, S, C]`` (``Hm = 1`` except :func:`random_eviction_mask`), and takes
``place=None`` which is forwarded to :func:`paddle.to_tensor` (``place="numpy"`` returns
the numpy array instead, without importing paddle: the PyTorch peer benchmark builds
the very same indices that way).  Each docstring states the
``causal`` flag to pass to ``flashmask_attention`` and shows the ten-token example
(``1`` = attend, ``0`` = masked; rows are queries, columns keys).

Document-style builders accept the document lengths either as one list (broadcast to
``batch_size`` rows) or as a list of lists (one per batch row).

This module is self-contained: it depends only on numpy, and on paddle and matplotlib
lazily.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Callable, Dict, List, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:  # annotations only; see _paddle()
    import paddle

# Paddle is imported lazily so that tools outside Paddle (e.g. the PyTorch peer
# benchmark) can build the very same indices with place="numpy".
NUMPY = "numpy"


def _paddle():
    import paddle

    return paddle

__all__ = [
    "causal_mask",
    "sliding_window_mask",
    "causal_document_mask",
    "document_mask",
    "share_question_mask",
    "global_sliding_window_mask",
    "causal_blockwise_mask",
    "prefix_lm_document_mask",
    "prefix_lm_causal_mask",
    "qk_sparse_mask",
    "random_eviction_mask",
    "to_dense",
    "plot_mask",
    "MASK_BUILDERS",
    "example_mask",
]


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _check_int(value, name: str, minimum: int | None = None) -> int:
    if not _is_int(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return bool(value)


# The indices are int32: no position, length or sequence length past this.
_INT32_MAX = int(np.iinfo(np.int32).max)


def _check_seqlen(value, name: str = "seqlen") -> int:
    """A sequence length: an integer in [1, 2^31 - 1] (past it the int32 indices would wrap)."""
    value = _check_int(value, name, 1)
    if value > _INT32_MAX:
        raise ValueError(f"{name} must be at most {_INT32_MAX} (int32 indices), got {value}")
    return value


def _to_tensor(arr: np.ndarray, place) -> paddle.Tensor:
    arr = np.ascontiguousarray(arr, dtype=np.int32)
    if isinstance(place, str) and place == NUMPY:
        return arr
    try:
        return _paddle().to_tensor(arr, dtype="int32", place=place)
    except (AttributeError, TypeError, ValueError, RuntimeError) as e:  # e.g. "gpu" on a CPU-only Paddle
        raise ValueError(f"place={place!r}: this Paddle cannot put the indices there ({type(e).__name__}: {e})") \
            from None


def _is_paddle_tensor(x) -> bool:
    # No import needed: a paddle.Tensor can only exist if paddle is imported.
    import sys

    paddle = sys.modules.get("paddle")
    return paddle is not None and isinstance(x, paddle.Tensor)


def _stack_rows(rows: List[np.ndarray], heads: int = 1) -> np.ndarray:
    """rows: list of [S, C] arrays -> [B, heads, S, C] int32."""
    out = np.stack(rows, axis=0).astype(np.int32, copy=False)[:, None]
    if heads != 1:
        out = np.repeat(out, heads, axis=1)
    return out


def _broadcast(row: np.ndarray, batch_size: int) -> np.ndarray:
    """row: [S, C] -> [B, 1, S, C]."""
    return np.broadcast_to(row[None, None], (batch_size, 1) + row.shape).astype(np.int32)


def _is_scalar(x) -> bool:
    return isinstance(x, (numbers.Number, np.generic))


def _is_row_of_scalars(x) -> bool:
    """True when x looks like one row of lengths (or is empty)."""
    if isinstance(x, np.ndarray):
        return x.ndim <= 1
    if not isinstance(x, (list, tuple)):
        return False
    if len(x) == 0:
        return True
    return _is_scalar(x[0])


def _per_row(values, batch_size, name: str) -> Tuple[List, int]:
    """Split a 'one row or one row per batch element' argument into a list of rows."""
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise ValueError(f"{name} must be a list, tuple or numpy array (or a paddle.Tensor of lengths), "
                         f"got {type(values).__name__}: {values!r}")
    if batch_size is not None:
        batch_size = _check_int(batch_size, "batch_size", 1)
    return values, batch_size


def _lengths_rows(doc_lens, batch_size, name: str) -> List[np.ndarray]:
    if _is_paddle_tensor(doc_lens):
        doc_lens = doc_lens.numpy()
    doc_lens, batch_size = _per_row(doc_lens, batch_size, name)
    if _is_row_of_scalars(doc_lens):
        rows = [doc_lens] * (batch_size or 1)
    else:
        rows = list(doc_lens)
        if len(rows) == 0:
            raise ValueError(f"{name} must not be an empty list of batch rows")
        if batch_size is not None and batch_size != len(rows):
            raise ValueError(
                f"batch_size={batch_size} does not match the {len(rows)} rows of {name}"
            )
    out = []
    for r in rows:
        if not _is_row_of_scalars(r) or (isinstance(r, (list, tuple)) and not all(_is_int(x) for x in r)):
            raise ValueError(f"{name}: each batch row must be a flat list of integer lengths, got {r!r}")
        a = np.asarray(r)
        if a.size == 0:
            a = np.zeros(0, dtype=np.int64)
        if a.dtype.kind not in "iu":
            raise ValueError(f"{name} must contain integers, got dtype {a.dtype}")
        if a.dtype.kind == "u" and np.any(a > _INT32_MAX):  # before the cast, which would wrap them
            raise ValueError(f"{name}: a batch row sums past {_INT32_MAX}, the int32 indices' limit")
        a = a.astype(np.int64).reshape(-1)
        if np.any(a < 0):
            raise ValueError(f"{name} must not contain negative lengths, got {a.tolist()}")
        if np.any(a > _INT32_MAX) or a.sum() > _INT32_MAX:  # lengths first: below 2^31 their sum cannot wrap
            raise ValueError(f"{name}: a batch row sums past {_INT32_MAX}, the int32 indices' limit")
        out.append(a)
    return out


def _resolve_seqlen(totals: Sequence[int], seqlen, name: str) -> int:
    need = int(max(totals)) if len(totals) else 0
    if seqlen is None:
        if need < 1:
            raise ValueError(f"{name} must contain at least one token when seqlen is not given")
        seqlen = need
    seqlen = _check_seqlen(seqlen)
    if need > seqlen:
        raise ValueError(f"{name} sums to {need}, more than seqlen={seqlen}")
    return seqlen


def _doc_bounds(lens: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per-token (start, end) of the document each token belongs to."""
    ends = np.cumsum(lens)
    starts = ends - lens
    return np.repeat(starts, lens), np.repeat(ends, lens)


# --------------------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------------------


def causal_mask(seqlen: int, batch_size: int = 1, *, place=None) -> paddle.Tensor:
    """Plain causal mask. Use with ``causal=True``. Shape ``[B, 1, S, 1]``.

    LTS_j = S for every column (nothing masked beyond the causal part)::

        LTS  10 10 10 10 10 10 10 10 10 10

        1 0 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 1 0 0 0 0 0 0 0
        ...
        1 1 1 1 1 1 1 1 1 1
    """
    S = _check_seqlen(seqlen)
    B = _check_int(batch_size, "batch_size", 1)
    return _to_tensor(np.full((B, 1, S, 1), S, dtype=np.int32), place)


def sliding_window_mask(seqlen: int, window: int, batch_size: int = 1, *, place=None) -> paddle.Tensor:
    """Causal sliding window: row i sees keys ``i - window .. i``. Use with ``causal=True``.

    ``LTS_j = min(j + window + 1, S)``; shape ``[B, 1, S, 1]``. Ten tokens, ``window=2``::

        LTS  3 4 5 6 7 8 9 10 10 10

        1 0 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 1 0 0 0 0 0 0 0
        0 1 1 1 0 0 0 0 0 0
        0 0 1 1 1 0 0 0 0 0
        0 0 0 1 1 1 0 0 0 0
        0 0 0 0 1 1 1 0 0 0
        0 0 0 0 0 1 1 1 0 0
        0 0 0 0 0 0 1 1 1 0
        0 0 0 0 0 0 0 1 1 1
    """
    S = _check_seqlen(seqlen)
    w = min(_check_int(window, "window", 0), S)  # wider than the sequence: the whole prefix
    B = _check_int(batch_size, "batch_size", 1)
    lts = np.minimum(np.arange(S, dtype=np.int64) + w + 1, S)
    return _to_tensor(_broadcast(lts[:, None], B), place)


def causal_document_mask(doc_lens, seqlen: int | None = None, batch_size: int | None = None,
                         *, place=None) -> paddle.Tensor:
    """Causal attention inside each packed document. Use with ``causal=True``.

    ``doc_lens``: one list of document lengths (broadcast to ``batch_size`` rows) or one
    list per batch row. ``LTS_j`` = end of j's document; shape ``[B, 1, S, 1]``.
    ``seqlen`` defaults to the largest row total; tokens past a row's total (padding)
    form one extra causal document of their own (``LTS = S``). Documents ``[4, 3, 3]``::

        LTS  4 4 4 4 7 7 7 10 10 10

        1 0 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 1 0 0 0 0 0 0 0
        1 1 1 1 0 0 0 0 0 0
        0 0 0 0 1 0 0 0 0 0
        0 0 0 0 1 1 0 0 0 0
        0 0 0 0 1 1 1 0 0 0
        0 0 0 0 0 0 0 1 0 0
        0 0 0 0 0 0 0 1 1 0
        0 0 0 0 0 0 0 1 1 1
    """
    rows = _lengths_rows(doc_lens, batch_size, "doc_lens")
    S = _resolve_seqlen([r.sum() for r in rows], seqlen, "doc_lens")
    out = []
    for lens in rows:
        lts = np.full(S, S, dtype=np.int64)
        _, ends = _doc_bounds(lens)
        lts[: ends.size] = ends
        out.append(lts[:, None])
    return _to_tensor(_stack_rows(out), place)


def document_mask(doc_lens, seqlen: int | None = None, batch_size: int | None = None,
                  *, place=None) -> paddle.Tensor:
    """Bidirectional attention inside each packed document. Use with ``causal=False``.

    ``[..., 0] = LTS_j`` (end of j's document), ``[..., 1] = UTE_j`` (its start); shape
    ``[B, 1, S, 2]``. Padding past a row's total forms its own bidirectional document.
    Documents ``[4, 3, 3]``::

        LTS  4 4 4 4 7 7 7 10 10 10
        UTE  0 0 0 0 4 4 4  7  7  7

        1 1 1 1 0 0 0 0 0 0
        1 1 1 1 0 0 0 0 0 0
        1 1 1 1 0 0 0 0 0 0
        1 1 1 1 0 0 0 0 0 0
        0 0 0 0 1 1 1 0 0 0
        0 0 0 0 1 1 1 0 0 0
        0 0 0 0 1 1 1 0 0 0
        0 0 0 0 0 0 0 1 1 1
        0 0 0 0 0 0 0 1 1 1
        0 0 0 0 0 0 0 1 1 1
    """
    rows = _lengths_rows(doc_lens, batch_size, "doc_lens")
    S = _resolve_seqlen([r.sum() for r in rows], seqlen, "doc_lens")
    out = []
    for lens in rows:
        total = int(lens.sum())
        starts, ends = _doc_bounds(lens)
        row = np.empty((S, 2), dtype=np.int64)
        row[:total, 0] = ends
        row[:total, 1] = starts
        row[total:, 0] = S
        row[total:, 1] = total
        out.append(row)
    return _to_tensor(_stack_rows(out), place)


def _is_group(x) -> bool:
    return (
        isinstance(x, (tuple, list))
        and len(x) == 2
        and _is_scalar(x[0])
        and isinstance(x[1], (tuple, list, np.ndarray))
        and all(_is_scalar(a) for a in x[1])
    )


def share_question_mask(segments, seqlen: int | None = None, batch_size: int | None = None,
                        *, place=None) -> paddle.Tensor:
    """Shared-question (DPO / reward-model) mask. Use with ``causal=True``.

    ``segments``: groups ``(prompt_len, [answer_len, ...])`` packed one after another,
    either one list of groups (broadcast to ``batch_size`` rows) or one list of groups per
    batch row. Inside a group, every answer attends (causally) to the prompt and to
    itself, never to the other answers; nothing attends across groups. Encoding
    (``[B, 1, S, 1]``): prompt columns get LTS = group end, answer columns get
    LTS = answer end. Padding past a row's total forms its own causal document.
    Prompt 4, answers 3 and 3 (``[(4, [3, 3])]``)::

        LTS  10 10 10 10 7 7 7 10 10 10

        1 0 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 1 0 0 0 0 0 0 0
        1 1 1 1 0 0 0 0 0 0
        1 1 1 1 1 0 0 0 0 0
        1 1 1 1 1 1 0 0 0 0
        1 1 1 1 1 1 1 0 0 0
        1 1 1 1 0 0 0 1 0 0
        1 1 1 1 0 0 0 1 1 0
        1 1 1 1 0 0 0 1 1 1
    """
    _, batch_size = _per_row(segments, batch_size, "segments")
    if len(segments) == 0 or _is_group(segments[0]):
        rows = [segments] * (batch_size or 1)
    else:
        rows = list(segments)
        if batch_size is not None and batch_size != len(rows):
            raise ValueError(
                f"batch_size={batch_size} does not match the {len(rows)} rows of segments"
            )
    parsed = []
    for r in rows:
        seg_lens: List[int] = []
        seg_vals: List[int] = []
        pos = 0
        if not isinstance(r, (list, tuple)):
            raise ValueError(f"segments: each batch row must be a list of (prompt_len, [answer_len, ...]) "
                             f"groups, got {r!r}")
        for g in r:
            if not _is_group(g):
                raise ValueError(
                    f"segments: each group must be (prompt_len, [answer_len, ...]), got {g!r}"
                )
            prompt = _check_int(g[0], "segments prompt_len", 0)
            answers = [_check_int(a, "segments answer_len", 0) for a in g[1]]
            group_end = pos + prompt + sum(answers)
            seg_lens.append(prompt)
            seg_vals.append(group_end)
            pos += prompt
            for a in answers:
                pos += a
                seg_lens.append(a)
                seg_vals.append(pos)
        parsed.append((np.asarray(seg_lens, dtype=np.int64), np.asarray(seg_vals, dtype=np.int64), pos))
    S = _resolve_seqlen([p[2] for p in parsed], seqlen, "segments")
    out = []
    for lens, vals, total in parsed:
        lts = np.full(S, S, dtype=np.int64)
        lts[:total] = np.repeat(vals, lens)
        out.append(lts[:, None])
    return _to_tensor(_stack_rows(out), place)


def global_sliding_window_mask(seqlen: int, global_tokens: int, window, batch_size: int = 1,
                               *, place=None) -> paddle.Tensor:
    """Global tokens + bidirectional sliding window (Longformer style). Use with ``causal=False``.

    The first ``global_tokens`` tokens attend to and are attended by every token; any other
    pair attends iff ``i - left <= j <= i + right`` (``left`` keys back, ``right`` keys
    ahead, as Paddle's ``window_size``) where ``window`` is an int (``left = right``) or a
    ``(left, right)`` tuple. Shape ``[B, 1, S, 4]`` = ``(LTS, LTE, UTS, UTE)``:
    for ``j >= G``: ``LTS = min(j + left + 1, S)``, ``LTE = S``, ``(UTS, UTE) = (G, j - right)``
    when ``j - right > G`` else ``(0, 0)``; global columns are ``(S, S, 0, 0)``.
    Ten tokens, ``global_tokens=2``, ``window=1``::

        LTS  10 10 4 5 6 7 8 9 10 10
        LTE  10 10 10 10 10 10 10 10 10 10
        UTS   0  0 0 0 2 2 2 2  2  2
        UTE   0  0 0 0 3 4 5 6  7  8

        1 1 1 1 1 1 1 1 1 1
        1 1 1 1 1 1 1 1 1 1
        1 1 1 1 0 0 0 0 0 0
        1 1 1 1 1 0 0 0 0 0
        1 1 0 1 1 1 0 0 0 0
        1 1 0 0 1 1 1 0 0 0
        1 1 0 0 0 1 1 1 0 0
        1 1 0 0 0 0 1 1 1 0
        1 1 0 0 0 0 0 1 1 1
        1 1 0 0 0 0 0 0 1 1
    """
    S = _check_seqlen(seqlen)
    G = _check_int(global_tokens, "global_tokens", 0)
    B = _check_int(batch_size, "batch_size", 1)
    if _is_int(window):
        left = right = _check_int(window, "window", 0)
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"window must be an int or a (left, right) pair, got {window!r}")
        left = _check_int(window[0], "window", 0)
        right = _check_int(window[1], "window", 0)
    left, right = min(left, S), min(right, S)  # wider than the sequence: all of it
    j = np.arange(S, dtype=np.int64)
    g = min(G, S)
    row = np.zeros((S, 4), dtype=np.int64)
    row[:, 0] = np.where(j < g, S, np.minimum(j + left + 1, S))
    row[:, 1] = S
    ute = j - right
    has_up = (j >= g) & (ute > g)
    row[:, 2] = np.where(has_up, g, 0)
    row[:, 3] = np.where(has_up, np.minimum(ute, S), 0)
    return _to_tensor(_broadcast(row, B), place)


def causal_blockwise_mask(doc_lens, seqlen: int | None = None, batch_size: int | None = None,
                          *, place=None) -> paddle.Tensor:
    """Causal blockwise mask (e.g. in-context-learning demos + query). Use with ``causal=True``.

    Tokens are split into blocks ``doc_lens``. Every block except the last attends causally
    within itself only; the LAST block attends causally to everything before it (all
    blocks). Encoding ``[B, 1, S, 2]`` = ``(LTS, LTE)``: a column of block k (not last)
    masks rows ``[end_k, start_last)``; empty intervals (last block, the block just
    before it) are written ``(S, S)``. Padding past a row's total extends the last block
    (padding rows see everything before them). Blocks ``[4, 3, 3]``::

        LTS  4 4 4 4 10 10 10 10 10 10
        LTE  7 7 7 7 10 10 10 10 10 10

        1 0 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 1 0 0 0 0 0 0 0
        1 1 1 1 0 0 0 0 0 0
        0 0 0 0 1 0 0 0 0 0
        0 0 0 0 1 1 0 0 0 0
        0 0 0 0 1 1 1 0 0 0
        1 1 1 1 1 1 1 1 0 0
        1 1 1 1 1 1 1 1 1 0
        1 1 1 1 1 1 1 1 1 1
    """
    rows = _lengths_rows(doc_lens, batch_size, "doc_lens")
    S = _resolve_seqlen([r.sum() for r in rows], seqlen, "doc_lens")
    out = []
    for lens in rows:
        row = np.full((S, 2), S, dtype=np.int64)
        nz = lens[lens > 0]
        if nz.size >= 2:
            start_last = int(nz[:-1].sum())
            _, ends = _doc_bounds(nz[:-1])
            nonempty = ends < start_last
            row[:start_last, 0] = np.where(nonempty, ends, S)
            row[:start_last, 1] = np.where(nonempty, start_last, S)
        out.append(row)
    return _to_tensor(_stack_rows(out), place)


def _pair_rows(values, batch_size, name: str) -> List[List[Tuple[int, int]]]:
    _, batch_size = _per_row(values, batch_size, name)

    def is_pair(x):
        return isinstance(x, (tuple, list, np.ndarray)) and len(x) == 2 and all(_is_scalar(v) for v in x)

    if len(values) == 0 or is_pair(values[0]):
        rows = [values] * (batch_size or 1)
    else:
        rows = list(values)
        if batch_size is not None and batch_size != len(rows):
            raise ValueError(f"batch_size={batch_size} does not match the {len(rows)} rows of {name}")
    out = []
    for r in rows:
        if not isinstance(r, (list, tuple, np.ndarray)):
            raise ValueError(f"{name}: each batch row must be a list of (int, int) pairs, got {r!r}")
        prs = []
        for p in r:
            if not is_pair(p):
                raise ValueError(f"{name}: expected pairs of integers, got {p!r}")
            prs.append((_check_int(p[0], name, 0), _check_int(p[1], name, 0)))
        out.append(prs)
    return out


def prefix_lm_document_mask(docs, seqlen: int | None = None, batch_size: int | None = None,
                            *, place=None) -> paddle.Tensor:
    """Packed prefix-LM documents. Use with ``causal=False``.

    ``docs``: ``(prefix_len, doc_len)`` pairs (one list, or one list per batch row). Inside
    each document the first ``prefix_len`` tokens attend bidirectionally among themselves,
    the remaining tokens causally (to the prefix and earlier tokens); no attention across
    documents. Encoding ``[B, 1, S, 2]`` = ``(LTS, UTE)``: LTS = document end; UTE = document
    start for prefix columns and ``j`` for the others. Padding past a row's total forms its
    own causal document. ``docs=[(2, 3), (2, 2), (2, 5)]``::

        LTS  3 3 3 5 5 10 10 10 10 10
        UTE  0 0 2 3 3  5  5  7  8  9

        1 1 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 1 0 0 0 0 0 0 0
        0 0 0 1 1 0 0 0 0 0
        0 0 0 1 1 0 0 0 0 0
        0 0 0 0 0 1 1 0 0 0
        0 0 0 0 0 1 1 0 0 0
        0 0 0 0 0 1 1 1 0 0
        0 0 0 0 0 1 1 1 1 0
        0 0 0 0 0 1 1 1 1 1
    """
    rows = _pair_rows(docs, batch_size, "docs")
    parsed = []
    for r in rows:
        pre = np.asarray([p for p, _ in r], dtype=np.int64)
        lens = np.asarray([n for _, n in r], dtype=np.int64)
        if np.any(pre > lens):
            raise ValueError(f"docs: prefix_len must be <= doc_len, got {r}")
        parsed.append((pre, lens))
    S = _resolve_seqlen([int(l.sum()) for _, l in parsed], seqlen, "docs")
    j = np.arange(S, dtype=np.int64)
    out = []
    for pre, lens in parsed:
        total = int(lens.sum())
        starts, ends = _doc_bounds(lens)
        prefix_end = np.repeat(np.cumsum(lens) - lens + pre, lens)
        row = np.empty((S, 2), dtype=np.int64)
        row[:total, 0] = ends
        row[:total, 1] = np.where(j[:total] < prefix_end, starts, j[:total])
        row[total:, 0] = S
        row[total:, 1] = j[total:]
        out.append(row)
    return _to_tensor(_stack_rows(out), place)


def prefix_lm_causal_mask(seqlen: int, prefix_len: int, batch_size: int = 1, *, place=None) -> paddle.Tensor:
    """Prefix LM: bidirectional over the first ``prefix_len`` tokens, causal after. Use with ``causal=False``.

    Encoding ``[B, 1, S, 2]`` = ``(LTS, UTE)``: LTS = S; UTE = 0 for prefix columns, ``j``
    otherwise. Ten tokens, ``prefix_len=5``::

        LTS  10 10 10 10 10 10 10 10 10 10
        UTE   0  0  0  0  0  5  6  7  8  9

        1 1 1 1 1 0 0 0 0 0
        1 1 1 1 1 0 0 0 0 0
        1 1 1 1 1 0 0 0 0 0
        1 1 1 1 1 0 0 0 0 0
        1 1 1 1 1 0 0 0 0 0
        1 1 1 1 1 1 0 0 0 0
        1 1 1 1 1 1 1 0 0 0
        1 1 1 1 1 1 1 1 0 0
        1 1 1 1 1 1 1 1 1 0
        1 1 1 1 1 1 1 1 1 1
    """
    S = _check_seqlen(seqlen)
    P = _check_int(prefix_len, "prefix_len", 0)
    B = _check_int(batch_size, "batch_size", 1)
    if P > S:
        raise ValueError(f"prefix_len={P} exceeds seqlen={S}")
    j = np.arange(S, dtype=np.int64)
    row = np.stack([np.full(S, S, dtype=np.int64), np.where(j < P, 0, j)], axis=1)
    return _to_tensor(_broadcast(row, B), place)


def qk_sparse_mask(seqlen: int, maskout_pairs, batch_size: int | None = None, *, place=None) -> paddle.Tensor:
    """QK-sparse mask: dropped token spans. Use with ``causal=True``.

    ``maskout_pairs``: ``(offset, maskout_len)`` spans (sorted, non-overlapping; one list or
    one list per batch row). The tokens of a span ``[o, o + n)`` attend (causally) to the
    keys before ``o`` only: neither to each other nor to themselves, while later rows see
    them normally. Encoding ``[B, 1, S, 2]`` = ``(LTS, LTE)``: span columns get
    ``(j, o + n)``, all others ``(S, S)``. A span starting at 0 leaves its first row
    fully masked (FlashMask outputs zeros there). ``seqlen=10``,
    ``maskout_pairs=[(2, 3), (6, 2)]``::

        LTS  10 10 2 3 4 10 6 7 10 10
        LTE  10 10 5 5 5 10 8 8 10 10

        1 0 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 1 1 1 1 0 0 0 0
        1 1 1 1 1 1 0 0 0 0
        1 1 1 1 1 1 0 0 0 0
        1 1 1 1 1 1 1 1 1 0
        1 1 1 1 1 1 1 1 1 1

    (Paddle's docstring writes column 5 as ``(5, 5)``; any empty interval is equivalent.)
    """
    S = _check_seqlen(seqlen)
    rows = _pair_rows(maskout_pairs, batch_size, "maskout_pairs")
    j = np.arange(S, dtype=np.int64)
    out = []
    for prs in rows:
        row = np.full((S, 2), S, dtype=np.int64)
        last = 0
        for off, n in prs:
            if off < last:
                raise ValueError(
                    f"maskout_pairs must be sorted and non-overlapping, got {prs}"
                )
            if off + n > S:
                raise ValueError(f"maskout_pairs span ({off}, {n}) exceeds seqlen={S}")
            row[off:off + n, 0] = j[off:off + n]
            row[off:off + n, 1] = off + n
            last = off + n
        out.append(row)
    return _to_tensor(_stack_rows(out), place)


def random_eviction_mask(seqlen: int, num_heads: int, batch_size: int = 1, start_row: int | None = None,
                         seed: int = 0, *, place=None) -> paddle.Tensor:
    """Random KV-cache eviction, independent per (batch, head). Use with ``causal=True``.

    From query row ``start_row`` on (default ``seqlen // 2``, at least 1), one key is
    evicted at each row: ``S - start_row`` distinct keys drawn from ``[0, S - 1)`` get
    random eviction rows in ``[start_row, S)``; an evicted key j is invisible to rows
    ``>= LTS_j``. ``LTS_j = max(eviction_row, j + 1)`` so every row keeps at least its
    diagonal key; never-evicted keys have ``LTS_j = S``. Shape ``[B, H, S, 1]``.
    Ten tokens, ``num_heads=1, start_row=5, seed=0`` (values depend on ``seed``)::

        LTS  10 10 7 5 9 10 7 10 9 10

        1 0 0 0 0 0 0 0 0 0
        1 1 0 0 0 0 0 0 0 0
        1 1 1 0 0 0 0 0 0 0
        1 1 1 1 0 0 0 0 0 0
        1 1 1 1 1 0 0 0 0 0
        1 1 1 0 1 1 0 0 0 0
        1 1 1 0 1 1 1 0 0 0
        1 1 0 0 1 1 0 1 0 0
        1 1 0 0 1 1 0 1 1 0
        1 1 0 0 0 1 0 1 0 1
    """
    S = _check_seqlen(seqlen)
    H = _check_int(num_heads, "num_heads", 1)
    B = _check_int(batch_size, "batch_size", 1)
    if start_row is None:
        start_row = max(1, S // 2)
    start_row = _check_int(start_row, "start_row", 1)
    if start_row > S:
        raise ValueError(f"start_row={start_row} exceeds seqlen={S}")
    rng = np.random.default_rng(_check_int(seed, "seed", 0))
    m = S - start_row  # number of evictions (<= S - 1 because start_row >= 1)
    evict_rows = np.arange(start_row, S, dtype=np.int64)
    floor = np.arange(1, S + 1, dtype=np.int64)
    out = np.empty((B, H, S, 1), dtype=np.int32)
    for b in range(B):
        for h in range(H):
            lts = np.full(S, S, dtype=np.int64)
            if m > 0:
                keys = rng.choice(S - 1, size=m, replace=False)
                lts[keys] = evict_rows
            out[b, h, :, 0] = np.maximum(lts, floor)
    return _to_tensor(out, place)


# --------------------------------------------------------------------------------------
# dense conversion / plotting
# --------------------------------------------------------------------------------------


def _check_form(shape, causal: bool) -> int:
    if len(shape) != 4:
        raise ValueError(f"startend_row_indices must be 4-D [B, Hm, Sk, C], got shape {tuple(shape)}")
    C = int(shape[-1])
    allowed = (1, 2) if causal else (2, 4)
    if C not in allowed:
        raise ValueError(
            f"startend_row_indices last dim must be in {allowed} for causal={causal}, got {C}"
        )
    return C


def _dense_keep(idx: np.ndarray, causal: bool, sq: int, rows: np.ndarray | None = None,
                cols: np.ndarray | None = None) -> np.ndarray:
    """Keep mask for numpy indices [B, Hm, Sk, C] at query rows ``rows`` and key cols ``cols``."""
    C = _check_form(idx.shape, causal)
    sk = idx.shape[2]
    if rows is None:
        rows = np.arange(sq, dtype=np.int64)
    if cols is None:
        cols = np.arange(sk, dtype=np.int64)
    v = idx[:, :, cols, :].astype(np.int64)  # [B, Hm, nc, C]
    i = rows[:, None]  # [nr, 1]

    def vec(c):
        return v[:, :, None, :, c]  # [B, Hm, 1, nc]

    if causal:
        if C == 1:
            masked = i >= vec(0)
        else:
            masked = (i >= vec(0)) & (i < vec(1))
        masked = masked | (cols[None, :] > i + (sk - sq))
    else:
        if C == 2:
            masked = (i >= vec(0)) | (i < vec(1))
        else:
            masked = ((i >= vec(0)) & (i < vec(1))) | ((i >= vec(2)) & (i < vec(3)))
    shape = (idx.shape[0], idx.shape[1], rows.size, cols.size)
    return np.broadcast_to(~masked, shape).copy()


def to_dense(startend_row_indices, causal: bool, seqlen_q: int | None = None):
    """Dense boolean KEEP mask ``[B, Hm, Sq, Sk]`` (True = attend) for FlashMask indices.

    Accepts a numpy array (returns numpy) or a ``paddle.Tensor`` (returns a paddle bool
    tensor on the same place). ``seqlen_q`` defaults to ``Sk``; the causal part is aligned
    bottom-right (row i sees keys ``j <= i + Sk - Sq``). Memory is ``B*Hm*Sq*Sk`` bytes.
    """
    is_paddle = _is_paddle_tensor(startend_row_indices)
    idx = startend_row_indices.numpy() if is_paddle else np.asarray(startend_row_indices)
    causal = _check_bool(causal, "causal")
    _check_form(idx.shape, causal)
    sq = idx.shape[2] if seqlen_q is None else _check_int(seqlen_q, "seqlen_q", 0)
    keep = _dense_keep(idx, causal, sq)
    if is_paddle:
        return _paddle().to_tensor(keep, dtype="bool", place=startend_row_indices.place)
    return keep


def plot_mask(startend_row_indices, causal: bool, path, batch: int = 0, head: int = 0,
              seqlen_q: int | None = None, title: str | None = None, max_pixels: int = 1024):
    """Write a PNG of the dense keep mask of one (batch, head): key columns on x, query rows on y.

    Masks larger than ``max_pixels`` per side are subsampled (evenly spaced rows/columns).
    Returns ``path``.
    """
    # Object-oriented API with the Agg canvas: no pyplot, no global backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if _is_paddle_tensor(startend_row_indices):
        idx = startend_row_indices.numpy()
    else:
        idx = np.asarray(startend_row_indices)
    causal = _check_bool(causal, "causal")
    _check_form(idx.shape, causal)
    batch, head = _check_int(batch, "batch"), _check_int(head, "head")
    if not (0 <= batch < idx.shape[0]):
        raise ValueError(f"batch={batch} out of range for {idx.shape[0]} batch rows")
    if not (0 <= head < idx.shape[1]):
        raise ValueError(f"head={head} out of range for {idx.shape[1]} mask heads")
    idx = idx[batch:batch + 1, head:head + 1]
    sk = idx.shape[2]
    sq = sk if seqlen_q is None else _check_int(seqlen_q, "seqlen_q", 1)
    max_pixels = _check_int(max_pixels, "max_pixels", 2)
    rows = np.unique(np.linspace(0, sq - 1, min(sq, max_pixels)).round().astype(np.int64))
    cols = np.unique(np.linspace(0, sk - 1, min(sk, max_pixels)).round().astype(np.int64))
    keep = _dense_keep(idx, bool(causal), sq, rows, cols)[0, 0]

    fig = Figure(figsize=(5, 5 * max(0.25, min(4.0, sq / max(sk, 1)))))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(keep, cmap="Blues", vmin=0, vmax=1, interpolation="nearest", aspect="auto",
              extent=(-0.5, sk - 0.5, sq - 0.5, -0.5))
    ax.set_xlabel("key column j")
    ax.set_ylabel("query row i")
    density = float(keep.mean()) if keep.size else 0.0
    ax.set_title(title if title is not None else f"FlashMask keep mask (causal={bool(causal)}, "
                 f"density~{density:.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    return path


# --------------------------------------------------------------------------------------
# registry and realistic examples
# --------------------------------------------------------------------------------------

MASK_BUILDERS: Dict[str, Tuple[Callable[..., paddle.Tensor], bool]] = {
    "causal": (causal_mask, True),
    "sliding_window": (sliding_window_mask, True),
    "causal_document": (causal_document_mask, True),
    "document": (document_mask, False),
    "share_question": (share_question_mask, True),
    "global_sliding_window": (global_sliding_window_mask, False),
    "causal_blockwise": (causal_blockwise_mask, True),
    "prefix_lm_document": (prefix_lm_document_mask, False),
    "prefix_lm_causal": (prefix_lm_causal_mask, False),
    "qk_sparse": (qk_sparse_mask, True),
    "random_eviction": (random_eviction_mask, True),
}


def _random_partition(rng: np.random.Generator, total: int, k: int) -> np.ndarray:
    """k positive integers summing to total (k is clipped to [1, total])."""
    k = max(1, min(k, total))
    if k == 1:
        return np.asarray([total], dtype=np.int64)
    cuts = np.sort(rng.choice(np.arange(1, total), size=k - 1, replace=False))
    edges = np.concatenate([[0], cuts, [total]])
    return np.diff(edges).astype(np.int64)


def _random_docs(rng: np.random.Generator, S: int, lo: int = 2, hi: int = 12) -> np.ndarray:
    """lo..hi documents of random lengths summing to S (at most S // 4 documents)."""
    k = min(int(rng.integers(lo, hi + 1)), max(1, S // 4))
    return _random_partition(rng, S, k)


def example_mask(name: str, seqlen: int, batch_size: int = 1, num_heads: int = 1, seed: int = 0,
                 *, place=None) -> Tuple[paddle.Tensor, bool]:
    """A realistic instance of mask ``name`` (a key of :data:`MASK_BUILDERS`) at any ``seqlen``.

    Returns ``(startend_row_indices, causal)``. Random choices come from ``seed``; each batch
    row gets its own documents. Mask heads ``Hm = 1`` except ``random_eviction`` (``Hm =
    num_heads``). Instances:

    - causal: plain causal.
    - sliding_window: window ``min(1024, max(1, S // 8))`` (1024 from S = 8192 on).
    - causal_document / document / causal_blockwise: 2-12 documents of random lengths
      summing to S (at most ``S // 4`` documents, so a single one for S < 8).
    - share_question: 1-4 groups (at most ``S // 3``) of ``(prompt, [answer, answer])``
      with random lengths.
    - global_sliding_window: ``min(16, max(1, S // 64))`` global tokens and window
      ``min(512, max(1, S // 16))`` on both sides (16 / 512 from S = 8192 on).
    - prefix_lm_document: random documents, each with a random prefix length.
    - prefix_lm_causal: random prefix in ``[S // 8, S // 2]``.
    - qk_sparse: up to two random dropped spans (never starting at token 0).
    - random_eviction: eviction from row ``S // 2``, independent per head.
    """
    if not isinstance(name, str) or name not in MASK_BUILDERS:
        raise ValueError(f"name must be one of {sorted(MASK_BUILDERS)}, got {name!r}")
    S = _check_seqlen(seqlen)
    B = _check_int(batch_size, "batch_size", 1)
    H = _check_int(num_heads, "num_heads", 1)
    rng = np.random.default_rng(_check_int(seed, "seed", 0))
    causal = MASK_BUILDERS[name][1]

    if name == "causal":
        t = causal_mask(S, B, place=place)
    elif name == "sliding_window":
        t = sliding_window_mask(S, min(1024, max(1, S // 8)), B, place=place)
    elif name in ("causal_document", "document", "causal_blockwise"):
        docs = [_random_docs(rng, S) for _ in range(B)]
        t = MASK_BUILDERS[name][0](docs, seqlen=S, place=place)
    elif name == "share_question":
        rows = []
        for _ in range(B):
            groups = []
            for g in _random_partition(rng, S, min(int(rng.integers(1, 5)), max(1, S // 3))):
                parts = _random_partition(rng, int(g), 3)
                groups.append((int(parts[0]), [int(p) for p in parts[1:]]))
            rows.append(groups)
        t = share_question_mask(rows, seqlen=S, place=place)
    elif name == "global_sliding_window":
        t = global_sliding_window_mask(S, min(16, max(1, S // 64)), min(512, max(1, S // 16)), B,
                                       place=place)
    elif name == "prefix_lm_document":
        rows = []
        for _ in range(B):
            lens = _random_docs(rng, S)
            pre = np.floor(rng.random(lens.size) * (lens + 1)).astype(np.int64)
            rows.append([(int(p), int(n)) for p, n in zip(pre, lens)])
        t = prefix_lm_document_mask(rows, seqlen=S, place=place)
    elif name == "prefix_lm_causal":
        t = prefix_lm_causal_mask(S, int(rng.integers(S // 8, S // 2 + 1)), B, place=place)
    elif name == "qk_sparse":
        rows = []
        for _ in range(B):
            n_pairs = min(2, (S - 1) // 2)
            if n_pairs <= 0:
                rows.append([])
                continue
            pts = np.sort(rng.choice(S - 1, size=2 * n_pairs, replace=False) + 1)
            rows.append([(int(pts[2 * k]), int(pts[2 * k + 1] - pts[2 * k])) for k in range(n_pairs)])
        t = qk_sparse_mask(S, rows, place=place)
    else:  # random_eviction
        t = random_eviction_mask(S, H, B, start_row=max(1, S // 2), seed=int(seed), place=place)
    return t, causal
