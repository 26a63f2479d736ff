"""The FlashMask index layouts both integrations accept (PaddleNLP and PaddleFormers pass
``[B, S]``, ``[B, Hm, S]`` or ``[B, Hm, S, C]``, int32 or int64), brought to the op's
``[B, Hm, S, C]`` int32. Imports neither framework: PaddleFormers and PaddleNLP 3.0.0b4 do
not share an environment."""

from __future__ import annotations

import weakref

import paddle


INT32_MAX = 2**31 - 1


# The last batch's indices and what they became. Every layer of a model gets the same indices
# tensor; giving each the same normalized tensor lets the op check its values once (a host sync)
# instead of once per layer (a sync per layer, each stalling the host until the GPU drains).
_LAST = {"source": None, "version": None, "result": None}


def _inplace_version(t):
    return t._inplace_version() if hasattr(t, "_inplace_version") else None


def as_bhsc_int32(ind):
    """``ind`` as int32 with four dims (a missing mask-head axis and column axis become 1); the
    same tensor object for the same (unchanged) input, call after call."""
    cacheable = paddle.in_dynamic_mode()
    if cacheable and _LAST["source"] is not None and _LAST["source"]() is ind \
            and _LAST["version"] == _inplace_version(ind):
        return _LAST["result"]
    out = _normalized(ind)
    if cacheable:
        try:
            _LAST.update(source=weakref.ref(ind), version=_inplace_version(ind), result=out)
        except TypeError:  # a tensor type without weak references: normalized every call
            pass
    return out


def _normalized(ind):
    if not isinstance(ind, paddle.Tensor):
        raise TypeError(f"attn_mask_startend_row_indices must be a paddle.Tensor, got {type(ind).__name__}")
    if ind.dtype not in (paddle.int32, paddle.int64):
        raise TypeError(f"attn_mask_startend_row_indices must be int32 (or int64), got {ind.dtype}")
    if ind.dtype == paddle.int64:
        # saturated, not wrapped: 2**32 had become 0 (every key masked, zeros out) with no error;
        # clipped, it stays out of [0, S] and the op's range check names it. No host sync here.
        ind = paddle.clip(ind, -1, INT32_MAX).astype("int32")
    if ind.ndim == 2:
        ind = ind.unsqueeze(1)
    if ind.ndim == 3:
        ind = ind.unsqueeze(-1)
    return ind
