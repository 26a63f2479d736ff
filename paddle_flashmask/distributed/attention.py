"""flashmask_attention over a context-parallel group: this rank's rows of the
single-device result, gradients to this rank's q/k/v."""

from __future__ import annotations

import collections
import hashlib
import os
import weakref

import numpy as np
import paddle

from .. import validation
from ..attention import (GPU_KERNELS, _check_index_values, _contiguous, _inplace_version, _resolve_deterministic,
                         get_gpu_kernel)
from .._loader import load_ops
from . import allgather, comm, ulysses
from .plan import ContextParallelPlan, mask_fingerprint

_METHODS = {"allgather": (allgather.AllGatherAttention, allgather.Spec),
            "ulysses": (ulysses.UlyssesAttention, ulysses.Spec)}

# Every call agrees on errors and plans with one small all_reduce before any data moves:
# a decision to skip it could differ between ranks (a rank-local error) and leave the others
# waiting in a collective. PADDLE_FLASHMASK_CP_AGREE=0 skips it for trusted pipelines.
_AGREE = os.environ.get("PADDLE_FLASHMASK_CP_AGREE", "1") != "0"


def _shape(t):
    return tuple(int(d) for d in t.shape)


def _check_plan_and_mask(plan, group, indices, causal):
    # Identical on every rank for identical arguments: raise at once.
    if not isinstance(plan, ContextParallelPlan):
        raise TypeError(f"plan must be a paddle_flashmask.distributed.ContextParallelPlan, got {type(plan).__name__}")
    size = comm.group_size(group)
    if size != plan.world_size:
        raise ValueError(f"the plan was built for world_size {plan.world_size}, but the group has {size} ranks")
    if causal != plan.causal:
        raise ValueError(f"causal={causal} but the plan was built with causal={plan.causal}")
    if indices is None:
        if plan.indices_shape is not None:
            raise ValueError("startend_row_indices is None but the plan was built from indices "
                             f"{list(plan.indices_shape)}; pass the same global indices")
        return
    if not validation._is_tensor(indices):
        raise TypeError(f"startend_row_indices must be a paddle.Tensor, got {type(indices).__name__}")
    if indices.dtype != paddle.int32:
        raise TypeError(f"startend_row_indices must be int32, got {indices.dtype}")
    if plan.indices_shape is None or _shape(indices) != plan.indices_shape:
        raise ValueError(f"startend_row_indices {list(_shape(indices))} must be the GLOBAL indices the plan was "
                         f"built from ({None if plan.indices_shape is None else list(plan.indices_shape)})")
    _check_same_mask(plan, indices)


def _check_same_mask(plan, indices):
    # One host copy per indices tensor (all layers share one); a plan of another mask
    # would compute a wrong answer quietly. The entry holds a weak reference: a new tensor
    # that reuses a dead one's id is checked again.
    key = ("mask_ok", id(indices))
    version = _inplace_version(indices)
    entry = plan._device_cache.get(key)
    if entry is not None and entry[0]() is indices and entry[1] == version:
        return
    if mask_fingerprint(indices.numpy(), plan.causal, plan.seqlen) != plan.fingerprint:
        raise ValueError("startend_row_indices differ from the indices the plan was built from; build the plan "
                         "from this batch's global indices")
    try:
        plan._device_cache[key] = (weakref.ref(indices), version)
    except TypeError:  # no weak references to this tensor type: checked on every call
        pass


def _check_local_shapes(plan, rank, q, k, v, method):
    """This rank's q/k/v against the plan (a ValueError naming the problem)."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not validation._is_tensor(t):
            raise ValueError(f"{name} must be a paddle.Tensor, got {type(t).__name__}")
        if len(t.shape) != 4:
            raise ValueError(f"{name} must be 4-D [batch, local_rows, heads, head_dim], got {list(t.shape)}")
    L = plan.num_local_rows(rank)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if int(t.shape[1]) != L:
            raise ValueError(f"rank {rank}: {name} holds {int(t.shape[1])} rows but the plan gives this rank {L} "
                             "(pass the rows of plan.local_rows(rank), in that order)")
    try:
        validation.check_qkv(q, k, v)
    except (TypeError, ValueError) as e:
        raise ValueError(f"rank {rank}: {e}") from None
    if method == "ulysses":
        W = plan.world_size
        H, Hk = int(q.shape[2]), int(k.shape[2])
        if H % W or Hk % W:
            raise ValueError(f"method='ulysses' needs the query heads ({H}) and key/value heads ({Hk}) divisible "
                             f"by the group size {W}; use method='allgather'")


def _call_signature(q, k, v, indices, options):
    """What every rank must pass alike, as an int below 2^40: the tensors' dtypes and shapes but
    this rank's row count, the indices' shape and the call's other arguments as checked."""
    def shape(t):
        dims = _shape(t)
        return (dims[0],) + dims[2:]

    parts = (str(q.dtype), str(k.dtype), str(v.dtype), shape(q), shape(k), shape(v),
             None if indices is None else _shape(indices), options)
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:5], "little")


def _exchange_settings():
    """The switches that shape the exchange's messages (read at import, or set by tests): ranks
    that disagree on them would send messages of different sizes, which gloo aborts on."""
    return (allgather.SPARSE_EXCHANGE, allgather.SPACED_PARTS, allgather.FUSE_OWN, allgather.KEYS_PER_PART,
            comm._FORCE_PADDING)


def _agreement_place(tensors):
    """Where the agreement's all_reduce runs: the first tensor argument's place, else the
    process's current device (a rank whose query is not a tensor must still meet the others
    on their backend: NCCL's ranks on the GPU)."""
    for t in tensors:
        if validation._is_tensor(t):
            return t.place
    return paddle.device.get_device()


def _agree(plan, group, tensors, local_error, signature):
    """Every rank learns whether any rank's checks failed, and whether the ranks hold the same
    plan and call signature, before any data moves; then each raises alike (a rank's own error
    as it was raised)."""
    size = comm.group_size(group)
    if size > 1 and _AGREE:
        # One MAX over (error, hashes, negated hashes): a hash agrees only where its largest and
        # smallest value over the group are equal. (A sum could hide a rank whose hash is the
        # others' mean, and let it go on alone into the exchange.)
        plan_hash = plan._agreement_hash() if isinstance(plan, ContextParallelPlan) else 0
        words = np.array([1 if local_error else 0, plan_hash, signature, -plan_hash, -signature], dtype=np.int64)
        t = paddle.to_tensor(words, place=_agreement_place(tensors))
        paddle.distributed.all_reduce(t, op=paddle.distributed.ReduceOp.MAX, group=group)
        bad, max_plan, max_signature, neg_min_plan, neg_min_signature = (int(x) for x in t.numpy())
        if local_error:
            raise local_error
        if bad:
            raise ValueError("context-parallel flashmask_attention: other rank(s) of the group got bad input "
                             "(their error names it); no rank went on")
        if max_plan != -neg_min_plan:
            raise ValueError("the ranks of the group passed different plans (built from different masks, "
                             "methods, chunk sizes or layouts); every rank must build the plan from the same "
                             "global indices and arguments")
        if max_signature != -neg_min_signature:
            raise ValueError("the ranks of the group passed different arguments: every rank must pass q/k/v of "
                             "the same dtypes, batch, heads and head dims, the same indices shape and the same "
                             "causal, softmax_scale, deterministic and return_softmax_lse, and run with "
                             "the same PADDLE_FLASHMASK_CP_* exchange switches")
    elif local_error:
        raise local_error


# What the checks derive for a call, besides the tensors.
_CheckedCall = collections.namedtuple("_CheckedCall", "causal return_softmax_lse deterministic scale gpu_kernel_name")


def _check_call(plan, group, rank, query, key, value, indices, causal, return_softmax_lse, softmax_scale,
                deterministic, dropout, window_size, training):
    """Every argument check of the context-parallel call (each raises naming the argument), run
    before the ranks agree, so that a mistake on one rank raises on all of them."""
    if plan is None:
        raise ValueError("plan is required: build paddle_flashmask.distributed.ContextParallelPlan from the "
                         "global indices")
    causal = validation.check_flag("causal", causal)
    return_softmax_lse = validation.check_flag("return_softmax_lse", return_softmax_lse)
    validation.check_scalar_args(dropout, softmax_scale, training)
    validation.check_env_switches()  # the kernels' switches, as the single-device op checks them
    if window_size is not None:
        raise NotImplementedError("window_size is not taken by the context-parallel op: build the global "
                                  "indices with paddle_flashmask.masks.sliding_window_mask and the plan from them")
    _check_plan_and_mask(plan, group, indices, causal)
    _check_local_shapes(plan, rank, query, key, value, plan.method)
    B, L, H, D = _shape(query)
    if indices is not None and int(indices.shape[0]) not in (1, B):
        raise ValueError(f"startend_row_indices batch size {int(indices.shape[0])} does not match "
                         f"query batch size {B}")
    if indices is not None and int(indices.shape[1]) not in (1, int(key.shape[2]), H):
        raise ValueError(f"startend_row_indices mask heads must be 1, the key heads {int(key.shape[2])} or the "
                         f"query heads {H}, got {int(indices.shape[1])}")
    if indices is not None:
        validation.check_on_query_device("startend_row_indices", indices, query)
    gpu_kernel_name = get_gpu_kernel()
    validation.check_device_support(query, D, int(value.shape[3]), gpu_kernel_name)
    validation.check_sm90_forced(query, D, gpu_kernel_name)
    deterministic = _resolve_deterministic(deterministic)
    validation.check_deterministic_support(query, D, deterministic)
    validation.check_shared_memory(query, D, backward=not all(t.stop_gradient for t in (query, key, value)))
    if indices is not None:
        from ..attention import _validate_indices

        if _validate_indices:
            _check_index_values(load_ops(), indices, plan.seqlen, causal)
    if plan.world_size > 1:
        validation.check_sm90_only_length(query, D, plan.num_local_rows(rank), plan.num_local_rows(rank),
                                          "this rank's rows (context parallel)")
    scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
    return _CheckedCall(causal, return_softmax_lse, deterministic, scale, gpu_kernel_name)


def flashmask_attention(query, key, value, startend_row_indices=None, *, causal=False, plan=None, group=None,
                        return_softmax_lse=False, softmax_scale=None, deterministic=None, dropout=0.0,
                        window_size=None, training=True, name=None):
    """Context-parallel FlashMask attention.

    Args:
        query, key, value: this rank's rows ``[B, L, H | Hk, D]``, in ``plan.local_rows(rank)``
            order.
        startend_row_indices: the GLOBAL indices ``[B | 1, Hm, S, C]`` the plan was built from
            (``None`` for plain causal / full attention with a plan built from ``None``).
        causal (bool): as in ``paddle_flashmask.flashmask_attention``; must match the plan.
        plan (ContextParallelPlan): the rows every rank holds and the method.
        group: the communication group (its rank order is the plan's); default fleet's
            sep/context-parallel group when fleet is initialised, else the global group.
        return_softmax_lse, softmax_scale, deterministic, dropout, training: as in the
            single-device op.

    Returns this rank's rows of the single-device ``flashmask_attention`` result (and its LSE
    ``[B, H, L]`` with ``return_softmax_lse``); gradients reach the local q/k/v. Bad input
    raises on every rank of the group.
    """
    if group is None:
        group = comm.get_context_parallel_group()
    rank = comm.group_rank(group)
    options = (causal, return_softmax_lse, softmax_scale, deterministic, dropout, window_size, training)
    try:
        call = _check_call(plan, group, rank, query, key, value, startend_row_indices, *options)
        # the arguments as the call takes them (deterministic=None and False alike, a scale of 1 and
        # 1.0 alike; dropout and training: no dropout runs, the checks raise on any that would) and
        # the exchange's switches
        agreed = (call.causal, call.return_softmax_lse, call.deterministic, call.scale, _exchange_settings())
        error, signature = None, _call_signature(query, key, value, startend_row_indices, repr(agreed))
    except (TypeError, ValueError, NotImplementedError) as e:
        call, error, signature = None, e, 0
    _agree(plan, group, (query, key, value), error, signature)
    if plan.world_size == 1:  # one rank holds every row: the single-device op, no collectives
        from ..attention import flashmask_attention as single

        return single(query, key, value, startend_row_indices, causal=call.causal,
                      return_softmax_lse=call.return_softmax_lse, softmax_scale=softmax_scale,
                      deterministic=call.deterministic, dropout=dropout, training=training)
    B, D = int(query.shape[0]), int(query.shape[3])
    layer, spec_cls = _METHODS[plan.method]
    spec = spec_cls(plan, rank, group, startend_row_indices, call.causal, call.scale, GPU_KERNELS[call.gpu_kernel_name],
                    call.deterministic, B, query.place, D)
    out, lse = layer.apply(_contiguous(query), _contiguous(key), _contiguous(value), spec)
    if call.return_softmax_lse:
        lse.stop_gradient = True
        return out, lse
    return out
