"""Route PaddleFormers attention through ``paddle_flashmask.flashmask_attention`` (CPU and GPU).

PaddleFormers (tested with 1.2.0) looks attention up at call time in the registry
``paddleformers.nn.attention.interface.AttentionInterface`` under the config's
``_attn_implementation``. Its own "flashmask" entry calls Paddle's GPU-only kernel, and it
ignores ``scaling``, dense masks and dropout. :func:`enable_flashmask` registers
:func:`flashmask_attention_forward` as the "flashmask" entry instead (the original is kept and
restored by :func:`disable_flashmask`), so every model family that takes
``attn_mask_startend_row_indices`` (Llama, Gemma3, ERNIE 4.5 / MoE, DeepSeek-V3, GLM-4 MoE,
GPT-OSS, Phi-3, ...) runs FlashMask on CPU and GPU.

Contract (from PaddleFormers' sources): q ``[B, H, Sq, Dq]``, k ``[B, Hk, Sk, Dq]``, v
``[B, Hk, Sk, Dv]`` (GQA k/v not repeated), returns ``(out [B, Sq, H * Dv], None)``.

- Indices ``[B, S]``, ``[B, Hm, S]`` or ``[B, Hm, S, C]`` (int32/int64) -> our op; causal as
  PaddleFormers decides it: C = 1 causal, C = 4 not, C = 2 ``is_causal`` (default causal).
  Sliding-window layers get indices with the window already folded in by PaddleFormers.
- No indices, no mask -> our op, causal unless ``is_causal=False`` / ``module.is_causal``.
- A dense mask that is exactly causal (or causal + the layer's ``sliding_window``) -> our op;
  any other dense mask (padding, custom) -> the exact dense path.
- Dense path (exact, fp32 softmax, O(S^2) memory; warned once) for what the op cannot express:
  attention sinks (GPT-OSS ``sink``), ``softcap``, ``dropout > 0``, and on GPU a dtype/head dim
  the CUDA kernels do not take (they take fp16/bf16 with head dim 32/64/96/128/256, and 192
  with value 128 where the Hopper kernels run: ``paddle_flashmask.attention.gpu_supports``).
- ``Dv != Dq`` (MLA): the CPU kernel takes v's own head dim, the Hopper kernels 192 with 128;
  elsewhere on GPU, whose kernels take one head dim, the narrower of v and q/k is zero-padded
  to the wider one (exact: zero columns add nothing to q.k or to the output) and the output
  sliced back to ``Dv``. DeepSeek-V3 pads v to Dq itself before calling (under "flashmask");
  for a model passed to :func:`enable_flashmask` the entry knows its value head dim from the
  config and takes the padding off again, so its 192/128 reaches the op as 192/128 (the Hopper
  kernels on GPU; less work on CPU). A DeepSeek-V3 model not passed in arrives as 192/192,
  which no GPU kernel takes: the dense path there, whose warning says to pass the model.
- ``scaling`` is honoured (PaddleFormers' own entry ignores it: wrong for Gemma3 when
  ``query_pre_attn_scalar != head_dim``). Exception: DeepSeek-V3 under "flashmask" pre-scales q
  by ``scaling`` and pads v itself, expecting ``1/sqrt(Dq)``; it is recognised by the bare
  ``nn.Layer()`` placeholder it passes as ``module`` (no other caller does) and gets that scale.
- ``sliding_window`` keyword (Phi-3): ignored, as by every PaddleFormers entry; the window is
  already in the mask or indices PaddleFormers builds.
"""

from __future__ import annotations

import contextlib
import warnings

import paddle
import paddle.nn.functional as F
from paddleformers.nn.attention.interface import AttentionInterface

import paddle_flashmask
from paddle_flashmask.attention import gpu_supports

from .indices import as_bhsc_int32

KEY = "flashmask"
_STATE = {"orig": None}
_MODEL_ATTR = "_pfm_orig_attn_impl"


def normalize_indices(ind, is_causal=None):
    """``(indices [B, Hm, S, C] int32, causal)`` from PaddleFormers' layouts, PaddleFormers'
    causal rule (C = 1 causal, C = 4 not, C = 2 ``is_causal``, default causal)."""
    ind = as_bhsc_int32(ind)  # also: a paddle.Tensor, int32 or int64
    if ind.ndim != 4 or ind.shape[-1] not in (1, 2, 4):
        raise ValueError("attn_mask_startend_row_indices must be [B, S], [B, Hm, S] or [B, Hm, S, C] with C "
                         f"in 1, 2, 4, got shape {list(ind.shape)}")
    C = ind.shape[-1]
    causal = C == 1 or (C == 2 and is_causal is not False)
    return ind, causal


def indices_to_keep(ind, causal, q_len):
    """Dense bool keep mask ``[B, Hm, Sq, Sk]`` of indices ``[B, Hm, Sk, C]``, on their device
    (the semantics of ``paddle_flashmask.masks.to_dense``)."""
    sk, C = ind.shape[2], ind.shape[3]
    i = paddle.arange(q_len, dtype="int32").reshape([1, 1, q_len, 1])
    col = [ind[:, :, :, c].unsqueeze(2) for c in range(C)]  # [B, Hm, 1, Sk]
    if causal:
        masked = i >= col[0] if C == 1 else paddle.logical_and(i >= col[0], i < col[1])
        masked = paddle.logical_or(masked, ~_causal_keep(q_len, sk))
    elif C == 2:
        masked = paddle.logical_or(i >= col[0], i < col[1])
    else:
        masked = paddle.logical_or(paddle.logical_and(i >= col[0], i < col[1]),
                                   paddle.logical_and(i >= col[2], i < col[3]))
    return ~masked


def _causal_keep(q_len, k_len, window=None):
    # bottom-right aligned (as our op and a KV cache): row i is key position i + Sk - Sq
    keep = paddle.tril(paddle.ones([q_len, k_len], dtype="bool"), diagonal=k_len - q_len)
    if window is not None:  # PaddleFormers' window w: keys i-w+1 .. i
        keep = paddle.logical_and(keep, paddle.triu(paddle.ones([q_len, k_len], dtype="bool"),
                                                    diagonal=k_len - q_len - window + 1))
    return keep


def _keep_of(mask):
    """Bool keep mask of a dense mask: bool as is, additive float 0 = keep (None if it is a bias)."""
    if mask.dtype == paddle.bool:
        return mask
    m = mask.astype("float32")
    keep = m == 0
    if not bool(paddle.logical_or(keep, m <= -1e4).all()):
        return None
    return keep


def _dense_as_op_args(mask, module, q_len, k_len):
    """``{}`` (plain causal) or ``{"window_size": (w - 1, 0)}`` when the dense mask is exactly one of
    the patterns the op takes without indices; None otherwise."""
    keep = _keep_of(mask[:, :, :, :k_len])
    if keep is None:
        return None
    if bool((keep == _causal_keep(q_len, k_len)).all()):
        return {}
    w = getattr(module, "sliding_window", None)
    if isinstance(w, int) and w > 0 and bool((keep == _causal_keep(q_len, k_len, w)).all()):
        return {"window_size": (w - 1, 0)}
    return None


def _dense_attention(q, k, v, keep=None, additive=None, scale=1.0, sink=None, softcap=None, dropout=0.0):
    """Exact dense attention in PaddleFormers' layout: q [B,H,Sq,D], k/v [B,Hk,Sk,D*] -> [B,H,Sq,Dv].
    ``keep``: bool [.., Sq, Sk] (rows without keys give 0, as the op); ``additive``: float mask."""
    H, Hk = q.shape[1], k.shape[1]
    if Hk != H:
        k = paddle.repeat_interleave(k, H // Hk, axis=1)
        v = paddle.repeat_interleave(v, H // Hk, axis=1)
    s = paddle.matmul(q.astype("float32"), k.astype("float32"), transpose_y=True) * scale
    if softcap:
        s = softcap * paddle.tanh(s / softcap)
    if additive is not None:
        additive = additive[:, :, :, : k.shape[2]].astype("float32")
        if additive.shape[1] not in (1, H):  # one mask head per k/v head, as a bool mask may have
            additive = paddle.repeat_interleave(additive, H // additive.shape[1], axis=1)
        s = s + additive
    if keep is not None:
        keep = keep.reshape([1, 1] + keep.shape) if keep.ndim == 2 else keep
        if keep.shape[1] not in (1, H):  # one mask head per k/v head
            keep = paddle.repeat_interleave(keep.astype("int32"), H // keep.shape[1], axis=1).astype("bool")
        s = paddle.where(keep, s, paddle.full_like(s, -1e30))
    if sink is not None:  # GPT-OSS: one learned logit per head joins every row's softmax
        sink = sink.astype("float32").reshape([1, H, 1, 1]).expand([s.shape[0], H, s.shape[2], 1])
        p = F.softmax(paddle.concat([s, sink], axis=-1), axis=-1)[:, :, :, :-1]
    else:
        p = F.softmax(s, axis=-1)
    if keep is not None:
        p = p * keep.any(axis=-1, keepdim=True).astype(p.dtype)
    if dropout > 0:
        p = F.dropout(p, dropout, training=True)
    return paddle.matmul(p.astype(v.dtype), v)


def _op_supports(q, head_dim, value_head_dim):
    place = q.place
    if not (hasattr(place, "is_gpu_place") and place.is_gpu_place()):
        return True  # the CPU kernel takes every dtype and head dim
    # fp16/bf16 and the kernels' head dims (256, Gemma3's, everywhere); 192 with value 128 (MLA)
    # only where the Hopper kernels run it and the backward is not deterministic
    return gpu_supports(q, head_dim, value_head_dim=value_head_dim)


def _op_head_dims(q, Dq, Dv):
    """The (q/k, v) head dims our op runs a call of head dims ``Dq``/``Dv`` with, or None when it
    cannot (the dense path): the call's own where the kernels take them (the CPU kernel any,
    the GPU ones e.g. 192/128 on Hopper), else one head dim for q, k and v, the narrower side
    zero-padded (exact)."""
    if _op_supports(q, Dq, Dv):
        return Dq, Dv
    D = max(Dq, Dv)
    return (D, D) if _op_supports(q, D, D) else None


def _value_piece_width(q, Dq, Dv):
    """Where the op takes neither ``Dq``/``Dv`` nor one padded head dim (_op_head_dims is None): the
    widest value head dim below ``Dv`` (a multiple of 8) that the kernels take with ``Dq``, so that v
    can run in column pieces of that width, or None. DeepSeek-V3 reaches the entry at 192/192 (v
    zero-padded) where Hopper's kernels take 192/128: two calls, exact, since each output column
    depends only on its own value column (P is the same in every call)."""
    for width in range(Dv - 8, 7, -8):
        if _op_supports(q, Dq, width):
            return width
    return None


_warned = set()


def _warn_once(msg):
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, stacklevel=3)


# {q/k head dim: value head dim} of MLA models passed to enable_flashmask whose attention zero-pads
# v to the q/k head dim before calling the "flashmask" entry with a bare nn.Layer() as module
# (DeepSeek-V3's scaled_dot_product_attention): the entry slices the padding off (exact: it is
# zeros). None for a q/k head dim seen with two value head dims (left padded).
_PADDED_VALUE_HEAD_DIMS = {}


def _mla_head_dims(config):
    """(q/k head dim, value head dim) of an MLA config whose value head dim is the narrower, or None."""
    dims = [getattr(config, name, None) for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")]
    if not all(isinstance(d, int) and d > 0 for d in dims):
        return None
    qk, v = dims[0] + dims[1], dims[2]
    return (qk, v) if v < qk else None


def _record_padded_value_head_dims(model):
    for layer in model.sublayers(include_self=True):
        dims = _mla_head_dims(getattr(layer, "config", None))
        if dims is not None:
            qk, v = dims
            _PADDED_VALUE_HEAD_DIMS[qk] = v if _PADDED_VALUE_HEAD_DIMS.get(qk, v) == v else None


def _pad_last(x, d):
    if x.shape[-1] == d:
        return x
    return paddle.concat([x, paddle.zeros(x.shape[:-1] + [d - x.shape[-1]], dtype=x.dtype)], axis=-1)


def flashmask_attention_forward(module, query, key, value, attention_mask=None,
                                attn_mask_startend_row_indices=None, dropout=0.0, sink=None,
                                scaling=None, is_causal=None, softcap=None, **kwargs):
    """PaddleFormers attention-interface entry backed by ``paddle_flashmask.flashmask_attention``."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, paddle.Tensor) or t.ndim != 4:
            raise ValueError(f"flashmask attention: {name} must be a 4-D tensor [batch, heads, seqlen, "
                             f"head_dim], got {getattr(t, 'shape', type(t).__name__)}")
    B, H, Sq, Dq = query.shape
    Sk, Dv = key.shape[2], value.shape[-1]
    if key.shape[-1] != Dq or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"flashmask attention: key {list(key.shape)} / value {list(value.shape)} do not match "
                         f"query {list(query.shape)} ([B, H, S, D] layout)")
    Hk = key.shape[1]
    if attention_mask is not None and (attention_mask.ndim != 4 or attention_mask.shape[-2] != Sq
                                       or attention_mask.shape[-1] < Sk
                                       or attention_mask.shape[0] not in (1, B)
                                       or attention_mask.shape[1] not in (1, Hk, H)):
        # (other batch or head counts had failed in Paddle's broadcast, naming no argument)
        raise ValueError(f"flashmask attention: attention_mask must be [1 or {B}, 1 or {Hk} or {H}, {Sq}, >= {Sk}], "
                         f"got {list(attention_mask.shape)}")
    if attention_mask is not None and attn_mask_startend_row_indices is not None:
        raise ValueError("flashmask attention: pass attn_mask_startend_row_indices or a dense attention_mask, "
                         "not both")
    padded_to = None  # the head dim the caller padded v to (DeepSeek-V3), given back in the output
    placeholder = type(module) is paddle.nn.Layer
    if placeholder:  # DeepSeek-V3's placeholder: q already scaled for 1/sqrt(Dq)
        scale = Dq**-0.5
        unpadded = _PADDED_VALUE_HEAD_DIMS.get(Dq)
        if unpadded is not None and Dv == Dq:
            value, Dv, padded_to = value[:, :, :, :unpadded], unpadded, Dq
    else:
        scale = float(scaling) if scaling is not None else Dq**-0.5

    ind = causal = None
    op_kw = None  # keyword arguments for our op, or None for the dense path
    if attn_mask_startend_row_indices is not None:
        ind, causal = normalize_indices(attn_mask_startend_row_indices, is_causal)
        op_kw = {}
    elif attention_mask is None:
        causal = is_causal if is_causal is not None else (Sq > 1 and getattr(module, "is_causal", True))
        op_kw = {}
    else:
        causal = True
        op_kw = _dense_as_op_args(attention_mask, module, Sq, Sk) if is_causal is not False else None

    dense_why = ("an attention sink" if sink is not None else "softcap" if softcap
                 else "dropout" if dropout and dropout > 0 else None)
    dims = None  # (q/k, v) head dims of our op's call; None: the dense path
    piece = None  # the value width of each call where v runs in column pieces
    if dense_why is None and op_kw is not None:
        dims = _op_head_dims(query, Dq, Dv)
        if dims is None:
            no_kernel = f"no GPU kernel for {query.dtype} head_dim {Dq}" + (f" / value {Dv}" if Dv != Dq else "")
            # DeepSeek-V3 zero-pads v to Dq before calling: its own value head dim (e.g. 192/128)
            # has a kernel, which the entry can use in one call only once it knows it
            pass_model = ("; an MLA model (DeepSeek-V3) pads value to the q/k head dim: pass the model to "
                          "paddlenlp_patches.paddleformers.enable_flashmask(model) so its own value head "
                          "dim reaches the op" if placeholder and padded_to is None and Dv == Dq else "")
            piece = _value_piece_width(query, Dq, Dv)
            if piece is None:
                dense_why = no_kernel + pass_model
            else:
                dims = (Dq, piece)
                _warn_once(f"flashmask attention: {no_kernel}: value runs in {-(-Dv // piece)} calls of "
                           f"{Dq}/{piece} (each recomputes the scores){pass_model}")
    if dims is not None:
        # our op wants [B, S, H, D]; zero-padding a head dim (where _op_head_dims asks) is exact
        q, k, v = (x.transpose([0, 2, 1, 3]) for x in (query, key, value))
        q, k = _pad_last(q, dims[0]), _pad_last(k, dims[0])
        pieces = [v] if piece is None else [v[:, :, :, c:c + piece] for c in range(0, Dv, piece)]
        outs = []
        for vp in pieces:
            o = paddle_flashmask.flashmask_attention(q, k, _pad_last(vp, dims[1]), ind, causal=bool(causal),
                                                     softmax_scale=scale, **op_kw)
            outs.append(o[:, :, :, :vp.shape[-1]] if o.shape[-1] != vp.shape[-1] else o)
        out = outs[0] if len(outs) == 1 else paddle.concat(outs, axis=-1)
    else:
        if dense_why is not None:
            _warn_once(f"flashmask attention: exact dense path for {dense_why} (O(S^2) memory)")
        keep = additive = None
        if ind is not None:
            keep = indices_to_keep(ind, causal, Sq)
        elif attention_mask is not None:
            keep = attention_mask[:, :, :, :Sk] if attention_mask.dtype == paddle.bool else None
            additive = None if keep is not None else attention_mask
            if is_causal:
                keep = paddle.logical_and(keep, _causal_keep(Sq, Sk)) if keep is not None else _causal_keep(Sq, Sk)
        elif causal:
            keep = _causal_keep(Sq, Sk)
        out = _dense_attention(query, key, value, keep, additive, scale, sink, softcap, dropout or 0.0)
        out = out.transpose([0, 2, 1, 3])
    if padded_to is not None:  # the caller slices the width it padded v to
        out, Dv = _pad_last(out, padded_to), padded_to
    return out.reshape([B, Sq, H * Dv]), None


def _is_ours(fn):
    return fn is flashmask_attention_forward


def is_enabled():
    return _is_ours(AttentionInterface._global_mapping.get(KEY))


def _route_model(model, impl):
    """Point a built model's attention at ``impl`` (configs and layers that cached the choice,
    e.g. Gemma3 / ERNIE 4.5 ``attn_implementation``); returns what was there before."""
    old = []
    for layer in model.sublayers(include_self=True):
        cfg = getattr(layer, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            old.append((cfg, "_attn_implementation", cfg._attn_implementation))
            cfg._attn_implementation = impl
        if isinstance(getattr(layer, "attn_implementation", None), str):
            old.append((layer, "attn_implementation", layer.attn_implementation))
            layer.attn_implementation = impl
    return old


def enable_flashmask(model=None):
    """Register our op as PaddleFormers' "flashmask" attention. Idempotent; returns ``model``.

    Models built with ``_attn_implementation="flashmask"`` use it at once. A model passed in is
    also switched to "flashmask" (its previous choice comes back with ``disable_flashmask(model)``),
    and where it is an MLA model that pads its values (DeepSeek-V3) its calls reach the op with
    their own value head dim.
    """
    current = AttentionInterface._global_mapping.get(KEY)
    if not _is_ours(current):
        _STATE["orig"] = current
        AttentionInterface.register(KEY, flashmask_attention_forward)
    if model is not None and not hasattr(model, _MODEL_ATTR):
        setattr(model, _MODEL_ATTR, _route_model(model, KEY))
    if model is not None:
        _record_padded_value_head_dims(model)
    return model


def disable_flashmask(model=None):
    """Restore PaddleFormers' own "flashmask" entry (and a passed model's previous choice)."""
    if is_enabled():
        AttentionInterface._global_mapping[KEY] = _STATE["orig"]
    _PADDED_VALUE_HEAD_DIMS.clear()
    if model is not None:
        _unroute(model)
    return model


def _unroute(model):
    for obj, attr, value in reversed(getattr(model, _MODEL_ATTR, ())):
        setattr(obj, attr, value)
    if hasattr(model, _MODEL_ATTR):
        delattr(model, _MODEL_ATTR)


@contextlib.contextmanager
def flashmask_enabled(model=None):
    """``with flashmask_enabled(model): ...`` enables, then restores the previous state."""
    was = is_enabled()
    routed = model is not None and not hasattr(model, _MODEL_ATTR)
    enable_flashmask(model)
    try:
        yield model
    finally:
        if routed:
            _unroute(model)
        if not was:
            disable_flashmask()
