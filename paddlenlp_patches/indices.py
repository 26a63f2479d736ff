"""The FlashMask index layouts both integrations accept (PaddleNLP and PaddleFormers pass
``[B, S]``, ``[B, Hm, S]`` or ``[B, Hm, S, C]``, int32 or int64), brought to the op's
``[B, Hm, S, C]`` int32. Imports neither framework: PaddleFormers and PaddleNLP 3.0.0b4 do
not share an environment."""

from __future__ import annotations

import paddle


INT32_MAX = 2**31 - 1


def as_bhsc_int32(ind):
    """``ind`` as int32 with four dims (a missing mask-head axis and column axis become 1)."""
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
