"""Route PaddleNLP LLaMA attention through ``paddle_flashmask.flashmask_attention``.

PaddleNLP 3.0.0b4 ignores ``attn_mask_startend_row_indices`` on its eager path (plain causal,
packed documents leak into each other), calls Paddle's GPU-only flashmask on the
``use_flash_attention`` path, and on that path silently drops dense masks on CPU
(``F.scaled_dot_product_attention(..., is_causal=True)`` ignores ``attn_mask``). The patch
replaces the attention function with :func:`flashmask_attn_func`:

- indices given (``[B, S]``, ``[B, Hm, S]``, ``[B, Hm, S, 1]`` or ``[B, Hm, S, C]``, int32 or
  int64; int64 values beyond int32 are errors, never wrapped) -> our op, ``causal=True`` for
  C = 1, 2 and ``causal=False`` for C = 4 (a model config attribute ``flashmask_causal`` overrides); GQA k/v are used as they come (no repeat with
  ``use_flash_attention=True``);
- no indices and no dense mask, or a dense mask that is exactly causal -> our op, plain causal;
- any other dense mask (padding masks, block masks, ALiBi) -> an exact dense fp32-softmax path;
- on GPU, a dtype/head_dim the CUDA kernels do not take (they take fp16/bf16, head_dim 32/64/96/128)
  -> the same dense path with the indices expanded on device (warned once; O(S^2) memory);
- under an active context-parallel batch (``paddlenlp_patches.context_parallel``): q/k/v hold this
  rank's rows -> ``paddle_flashmask.distributed.flashmask_attention`` with the batch's plan and
  global indices.

Patch points: the module attribute ``llama.modeling.scaled_dot_product_attention`` (bound by
``LlamaAttention.__init__``, so it covers models built later), ``llama.fusion_ops
.fusion_flash_attention`` (looked up at call time by every already-built model with
``use_flash_attention=True``, and by Qwen2/DeepSeek-V2 that reuse it), and, for a model passed
in, every ``LlamaAttention.attn_func`` (covers already-built models with
``use_flash_attention=False``, also inside LoRA or DataParallel wrappers). When disabled, the
wrapper forwards to PaddleNLP's original function, so layers bound while enabled fall back too.
Also ``llama.modeling.is_casual_mask``, by which ``LlamaModel.forward`` drops a dense mask it takes
for causal when ``use_flash_attention`` is on: PaddleNLP's only asks that nothing below the
diagonal be masked, which a prefix-LM or bidirectional mask passes; ours asks for exactly causal.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import paddle
import paddle.nn.functional as F

import paddle_flashmask
import paddle_flashmask.attention
from paddlenlp.transformers.llama import fusion_ops
from paddlenlp.transformers.llama import modeling as llama_modeling

from . import context_parallel
from .indices import as_bhsc_int32

_STATE = {"enabled": False, "orig_sdpa": None, "orig_fusion": None, "orig_is_causal": None}
_ORIG_ATTR = "_pfm_orig_attn_func"


def _originals():
    if _STATE["orig_sdpa"] is None:
        sdpa = llama_modeling.scaled_dot_product_attention
        fusion = fusion_ops.fusion_flash_attention
        _STATE["orig_sdpa"] = getattr(sdpa, "__wrapped_orig__", sdpa)
        _STATE["orig_fusion"] = getattr(fusion, "__wrapped_orig__", fusion)
        is_causal = llama_modeling.is_casual_mask
        _STATE["orig_is_causal"] = getattr(is_causal, "__wrapped_orig__", is_causal)
    return _STATE["orig_sdpa"], _STATE["orig_fusion"], _STATE["orig_is_causal"]


def normalize_indices(ind, config=None):
    """``(indices [B, Hm, S, C] int32, causal)`` from the layouts PaddleNLP and our collators use."""
    ind = as_bhsc_int32(ind)
    if ind.ndim != 4:
        raise ValueError("attn_mask_startend_row_indices must be [B, S], [B, Hm, S] or [B, Hm, S, C], "
                         f"got shape {list(ind.shape)}")
    C = ind.shape[-1]
    causal = getattr(config, "flashmask_causal", None)
    if causal is None:
        causal = C != 4
    return ind, bool(causal)


def _dense_keep_is_causal(mask, q_len, kv_len) -> bool:
    """True when the dense mask (bool keep, or additive float) is exactly plain causal."""
    if q_len != kv_len or mask.ndim < 2 or mask.shape[-2:] != [q_len, kv_len]:
        return False
    if mask.dtype == paddle.bool:
        keep = mask
    else:
        m = mask.astype("float32")
        # additive: 0 = keep, very negative = masked; anything else is a bias -> not a mask
        neg = m <= -1e4
        if not bool(paddle.logical_or(m == 0, neg).all()):
            return False
        keep = m == 0
    tril = paddle.tril(paddle.ones([q_len, kv_len], dtype="bool"))
    return bool((keep == tril).all())


def exact_is_causal_mask(attention_mask) -> bool:
    """For ``LlamaModel.forward``, which drops a dense mask it takes for causal when
    use_flash_attention is on: PaddleNLP's ``is_casual_mask`` only asks that nothing below the
    diagonal be masked, so a prefix-LM or bidirectional mask passed as plain causal, silently."""
    return _dense_keep_is_causal(attention_mask, attention_mask.shape[-2], attention_mask.shape[-1])


def indices_to_keep(ind, causal: bool, q_len: int):
    """Dense bool keep mask ``[B, Hm, Sq, Sk]`` of FlashMask indices ``[B, Hm, Sk, C]`` (paddle ops,
    on the indices' device; the same semantics as ``paddle_flashmask.masks.to_dense``)."""
    sk, C = ind.shape[2], ind.shape[3]
    i = paddle.arange(q_len, dtype="int32").reshape([1, 1, q_len, 1])
    vec = [ind[:, :, :, c].unsqueeze(2) for c in range(C)]  # [B, Hm, 1, Sk]
    if causal:
        masked = i >= vec[0] if C == 1 else paddle.logical_and(i >= vec[0], i < vec[1])
        j = paddle.arange(sk, dtype="int32").reshape([1, 1, 1, sk])
        masked = paddle.logical_or(masked, j > i + (sk - q_len))
    elif C == 2:
        masked = paddle.logical_or(i >= vec[0], i < vec[1])
    else:
        masked = paddle.logical_or(paddle.logical_and(i >= vec[0], i < vec[1]),
                                   paddle.logical_and(i >= vec[2], i < vec[3]))
    return paddle.logical_not(masked)


def _dense_attention(q, k, v, mask, alibi=None):
    """Exact dense attention for what our op cannot take. q [B,Sq,H,D], k/v [B,Sk,Hk,D]; mask:
    None (causal), bool keep [.., Sq, Sk] (rows without keys give 0, as the op) or additive float."""
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if Hk != H:
        k = paddle.repeat_interleave(k, H // Hk, axis=2)
        v = paddle.repeat_interleave(v, H // Hk, axis=2)
    qt, kt, vt = (x.transpose([0, 2, 1, 3]) for x in (q, k, v))
    scores = paddle.matmul(qt.astype("float32"), kt.astype("float32"), transpose_y=True) * (D**-0.5)
    if alibi is not None:
        scores = scores + alibi.reshape([B, H, 1, -1]).astype("float32")
    if mask is None:
        mask = paddle.tril(paddle.ones([Sq, Sk], dtype="bool"), diagonal=Sk - Sq)
    while mask.ndim < 4:
        mask = mask.unsqueeze(0 if mask.ndim == 2 else 1)
    if mask.shape[1] not in (1, H):
        mask = paddle.repeat_interleave(mask, H // mask.shape[1], axis=1)
    if mask.dtype == paddle.bool:
        scores = paddle.where(mask, scores, paddle.full_like(scores, -1e30))
        p = F.softmax(scores, axis=-1)
        p = p * mask.any(axis=-1, keepdim=True).astype(p.dtype)
    else:
        p = F.softmax(scores + mask.astype("float32"), axis=-1)
    return paddle.matmul(p.astype(q.dtype), vt).transpose([0, 2, 1, 3])


def _op_supports(q, v) -> bool:
    """The CPU kernel takes any dtype/head_dim; the CUDA kernels fp16/bf16 with head_dim
    32/64/96/128/256, and 192 with value head_dim 128 where the Hopper kernels run it (not with
    a deterministic backward)."""
    place = q.place
    if not (hasattr(place, "is_gpu_place") and place.is_gpu_place()):
        return True
    return paddle_flashmask.attention.gpu_supports(q, int(q.shape[-1]), value_head_dim=int(v.shape[-1]))


_warned = set()


def _warn_once(msg):
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, stacklevel=3)


def flashmask_attn_func(query_states, config, key_states, value_states, attention_mask, output_attentions,
                        alibi=None, attn_mask_startend_row_indices=None, sequence_parallel=False,
                        reshard_layer=None, npu_is_casual=False, skip_recompute=False, **kwargs):
    """Drop-in for PaddleNLP's ``scaled_dot_product_attention`` / ``fusion_flash_attention``.

    q ``[B, Sq, H, D]``, k/v ``[B, Sk, Hk, D]`` -> ``[B, Sq, H*D]`` (``[B*Sq, H*D]`` with
    ``sequence_parallel``), or ``(out, None)`` with ``output_attentions``.
    """
    if not _STATE["enabled"]:
        orig = _originals()[0]
        return orig(query_states, config, key_states, value_states, attention_mask, output_attentions,
                    alibi=alibi, attn_mask_startend_row_indices=attn_mask_startend_row_indices,
                    sequence_parallel=sequence_parallel, reshard_layer=reshard_layer,
                    npu_is_casual=npu_is_casual, skip_recompute=skip_recompute)
    if (reshard_layer is not None or getattr(config, "context_parallel_degree", 1) > 1
            or getattr(config, "sep_parallel_degree", 1) > 1):
        # PaddleNLP's own sep/cp model paths (reshard layer, ring attention) split the sequence
        # differently; ours keeps the model config at 1 and shards per batch (context_parallel.py)
        raise NotImplementedError("paddlenlp_patches flashmask: PaddleNLP's model-config sep/context parallel "
                                  "is not supported; use paddlenlp_patches.context_parallel (the runner's "
                                  "context_parallel_degree / sep_parallel_degree), which keeps the model config at 1")
    bsz, q_len, num_heads, _ = query_states.shape
    head_dim = value_states.shape[-1]
    cp_batch = context_parallel.active()
    if cp_batch is not None:
        if alibi is not None:
            raise ValueError("context parallel attention does not support alibi")
        if q_len != cp_batch.local_len:
            raise ValueError(f"context parallel: attention got {q_len} query rows, this rank holds "
                             f"{cp_batch.local_len} of {cp_batch.seq_len} (prepare the model with "
                             "paddlenlp_patches.enable_context_parallel)")
        # the distributed op with the plan's (normalized, global) indices
        out = cp_batch.attention(query_states, key_states, value_states)
    elif attn_mask_startend_row_indices is not None:
        if alibi is not None:
            raise ValueError("flashmask attention does not support alibi")
        ind, causal = normalize_indices(attn_mask_startend_row_indices, config)
        if _op_supports(query_states, value_states):
            out = paddle_flashmask.flashmask_attention(query_states, key_states, value_states, ind, causal=causal)
        else:
            _warn_once(f"flashmask: no GPU kernel for {query_states.dtype} head_dim {query_states.shape[-1]} "
                       f"(value head_dim {value_states.shape[-1]}); "
                       "using the exact dense path (O(S^2) memory)")
            out = _dense_attention(query_states, key_states, value_states, indices_to_keep(ind, causal, q_len))
    elif alibi is None and _op_supports(query_states, value_states) and (
            attention_mask is None or _dense_keep_is_causal(attention_mask, q_len, key_states.shape[1])):
        out = paddle_flashmask.flashmask_attention(query_states, key_states, value_states, causal=True)
    else:
        out = _dense_attention(query_states, key_states, value_states, attention_mask, alibi)
    if sequence_parallel:
        out = out.reshape([bsz * q_len, head_dim * num_heads])
    else:
        out = out.reshape([bsz, q_len, head_dim * num_heads])
    return (out, None) if output_attentions else out


def _mark(fn, orig):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapper.__wrapped_orig__ = orig
    wrapper.__pfm_flashmask__ = True
    return wrapper


def _attention_layers(model):
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, llama_modeling.LlamaAttention):
            yield layer


def is_enabled() -> bool:
    return _STATE["enabled"]


def enable_flashmask(model=None):
    """Route LLaMA attention through the flashmask op. Idempotent; returns ``model``.

    Call it before building models (they bind the patched function), and/or pass a built model
    (any wrapper: LoRAModel, DataParallel, a reward model) to rebind its attention layers.
    """
    orig_sdpa, orig_fusion, orig_is_causal = _originals()
    if not getattr(llama_modeling.scaled_dot_product_attention, "__pfm_flashmask__", False):
        llama_modeling.scaled_dot_product_attention = _mark(flashmask_attn_func, orig_sdpa)
    if not getattr(fusion_ops.fusion_flash_attention, "__pfm_flashmask__", False):
        fusion_ops.fusion_flash_attention = _mark(flashmask_attn_func, orig_fusion)
    if not getattr(llama_modeling.is_casual_mask, "__pfm_flashmask__", False):
        llama_modeling.is_casual_mask = _mark(exact_is_causal_mask, orig_is_causal)
    _STATE["enabled"] = True
    if model is not None:
        for layer in _attention_layers(model):
            if not getattr(layer.attn_func, "__pfm_flashmask__", False):
                setattr(layer, _ORIG_ATTR, layer.attn_func)
                layer.attn_func = llama_modeling.scaled_dot_product_attention
    return model


def disable_flashmask(model=None):
    """Undo :func:`enable_flashmask`: restore PaddleNLP's functions (and, for a model passed in,
    its layers' original ``attn_func``). Layers still bound to the wrapper forward to PaddleNLP."""
    if _STATE["orig_sdpa"] is not None:
        llama_modeling.scaled_dot_product_attention = _STATE["orig_sdpa"]
        fusion_ops.fusion_flash_attention = _STATE["orig_fusion"]
        llama_modeling.is_casual_mask = _STATE["orig_is_causal"]
    _STATE["enabled"] = False
    if model is not None:
        for layer in _attention_layers(model):
            orig = getattr(layer, _ORIG_ATTR, None)
            if orig is not None:
                layer.attn_func = orig
                delattr(layer, _ORIG_ATTR)
            elif getattr(layer.attn_func, "__pfm_flashmask__", False):
                layer.attn_func = _STATE["orig_sdpa"]
    return model


@contextlib.contextmanager
def flashmask_enabled(model=None):
    """``with flashmask_enabled(model): ...`` enables the patch and restores the previous state."""
    was = _STATE["enabled"]
    enable_flashmask(model)
    try:
        yield model
    finally:
        if not was:
            disable_flashmask(model)
