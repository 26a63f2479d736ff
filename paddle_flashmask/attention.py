"""flashmask_attention: the public entry point, a drop-in for Paddle 3.x's
`paddle.nn.functional.flashmask_attention` that also runs on CPU."""

import collections
import os
import weakref

import paddle

from . import _checked_calls, long_sequence, validation
from ._env import getenv
from ._loader import _not_to_static, load_ops


# Index values are checked once per indices tensor (one small kernel and one
# flag read back on GPU). Turn off for speed once a data pipeline is trusted.
_validate_indices = os.environ.get("PADDLE_FLASHMASK_VALIDATE_INDICES", "1") != "0"


# GPU kernel family (flashmask::GpuKernel in custom_ops/flashmask/flashmask_params.h).
GPU_KERNELS = {"auto": 0, "fa2": 1, "sm90": 2}
_GPU_KERNEL_ENV = "PADDLE_FLASHMASK_GPU_KERNEL"
_gpu_kernel = None  # None: the env variable, else "auto"


def set_gpu_kernel(name):
    """Chooses the GPU kernel family for later calls (forward and backward):

    - ``"auto"`` (default): the Hopper kernels (TMA + wgmma) on a compute capability 9.0
      GPU when the build has them and they take the call's head dim and dtype, the
      FA2-class (mma.sync) kernels otherwise;
    - ``"fa2"``: always the FA2-class kernels;
    - ``"sm90"``: always the Hopper kernels; a call they cannot run raises an error
      instead of falling back (for tests and benchmarks).

    ``None`` goes back to the default: env ``PADDLE_FLASHMASK_GPU_KERNEL``, else
    ``"auto"``. The CPU kernel ignores this. Returns the previous setting (None when
    it was the default), so ``set_gpu_kernel(old)`` restores it.
    """
    global _gpu_kernel
    if name is not None:
        name = validation.check_gpu_kernel("set_gpu_kernel: name", name, tuple(GPU_KERNELS))
    old, _gpu_kernel = _gpu_kernel, name
    return old


def get_gpu_kernel():
    """The GPU kernel family later calls use: "auto", "fa2" or "sm90" (see set_gpu_kernel)."""
    if _gpu_kernel is not None:
        return _gpu_kernel
    env = getenv(_GPU_KERNEL_ENV) or "auto"  # unset or empty: the default
    return validation.check_gpu_kernel(_GPU_KERNEL_ENV, env, tuple(GPU_KERNELS))


_has_deterministic_flag = True  # False once this Paddle build turned out not to know it
_DETERMINISTIC_FLAG = "FLAGS_cudnn_deterministic"


def _paddle_flags():
    """Paddle's flag registry, read by name (what paddle.get_flags reads after checking its
    argument: 0.3 us a read against 5.7 on the CPU machine), or None where this Paddle lacks it."""
    core = getattr(getattr(paddle, "base", None), "core", None)
    read = getattr(core, "globals", None)
    return read() if read is not None else None


_flags = _paddle_flags()


def _default_deterministic():
    # Paddle's own flash attention follows FLAGS_cudnn_deterministic; builds without it (CPU
    # Paddle) do not know the flag, and asking raises (RuntimeError from the registry).
    global _has_deterministic_flag
    if not _has_deterministic_flag:
        return False
    try:
        if _flags is not None:
            return bool(_flags[_DETERMINISTIC_FLAG])
        return bool(paddle.get_flags([_DETERMINISTIC_FLAG])[_DETERMINISTIC_FLAG])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError):
        _has_deterministic_flag = False
        return False


def _resolve_deterministic(deterministic):
    """The call's deterministic argument as a bool: None follows the Paddle flag."""
    if deterministic is None:
        return _default_deterministic()
    return validation.check_flag("deterministic", deterministic)


def gpu_supports(query, head_dim, deterministic=None, value_head_dim=None, backward=True):
    """Whether flashmask_attention takes a call of ``query``'s dtype, query/key ``head_dim`` and
    ``value_head_dim`` (None: equal to ``head_dim``) on ``query``'s GPU with the current kernel
    family and this ``deterministic`` (None: the default), and, with ``backward``, its gradient,
    without raising; True off the GPU (the CPU kernel takes every call). For callers with a fallback of their own (paddlenlp_patches):
    head_dim 192 with value head_dim 128 runs on the Hopper kernels only and not in
    deterministic mode, so it is taken on some GPUs and calls only (head_dim 256 runs on
    every GPU, deterministic included)."""
    gpu_kernel_name = get_gpu_kernel()  # a bad setting raises: it is no reason to fall back
    deterministic = _resolve_deterministic(deterministic)
    try:
        validation.check_device_support(query, head_dim, value_head_dim, gpu_kernel_name)
        validation.check_deterministic_support(query, head_dim, deterministic)
        validation.check_shared_memory(query, head_dim, backward)
    except (TypeError, ValueError):
        return False
    return True


def set_index_validation(enabled):
    """Enables/disables the value check of startend_row_indices (default on;
    env PADDLE_FLASHMASK_VALIDATE_INDICES=0 turns it off). Returns the old setting.
    A tensor that passed is not checked again while it lives unchanged (every layer of
    a model shares one indices tensor, so the GPU flag read-back happens once per
    batch, not once per layer); an in-place change makes it checked again, except through
    ``Tensor.set_value`` and ``Tensor.copy_`` (and writes through another framework's view of
    the memory, such as DLPack), which do not bump Paddle's inplace version (pass a new tensor,
    or call this function, which forgets every checked tensor). With it off, out-of-range values
    are not detected (the kernels stay memory-safe: values are only compared, never used as
    addresses). ``enabled`` must be a bool."""
    global _validate_indices
    old, _validate_indices = _validate_indices, validation.check_flag("enabled", enabled)
    _checked_indices.clear()
    return old


# id(indices) -> (weakref, inplace version, seqlen_q, causal) of tensors that
# passed the value check. The weak reference tells a live tensor from a new one
# that reuses a dead one's id. Dead entries are dropped when a tensor is added
# (no weakref callbacks: nothing of ours runs when Paddle frees a tensor).
_checked_indices = {}
_CHECKED_PRUNE_AT = 64


def _already_checked(indices, seqlen_q, causal):
    entry = _checked_indices.get(id(indices))
    return (entry is not None and entry[0]() is indices
            and entry[1:] == (_inplace_version(indices), seqlen_q, causal))


def _remember_checked(indices, seqlen_q, causal):
    try:
        ref = weakref.ref(indices)
    except TypeError:  # a tensor type without weak references: check every call
        return
    if len(_checked_indices) >= _CHECKED_PRUNE_AT:
        for key in [k for k, entry in _checked_indices.items() if entry[0]() is None]:
            del _checked_indices[key]
        if len(_checked_indices) >= _CHECKED_PRUNE_AT:  # all alive: start over
            _checked_indices.clear()
    _checked_indices[id(indices)] = (ref, _inplace_version(indices), seqlen_q, causal)


def _inplace_version(t):
    return t._inplace_version() if hasattr(t, "_inplace_version") else None


@_not_to_static
def _check_index_values(ops, indices, seqlen_q, causal):
    # Reads one flag back to the host: plain Python even under dynamic-to-static.
    if _already_checked(indices, seqlen_q, causal):
        return
    flags = ops.pfm_flashmask_check_indices(_contiguous(indices), seqlen_q, causal)
    validation.check_indices_values(int(flags.numpy()[0]), seqlen_q)
    _remember_checked(indices, seqlen_q, causal)


def _assert_values_in_program(ops, call, startend_row_indices, block_mask):
    """Under to_static(full_graph=True) the values exist only when the program runs: Assert ops
    in it stop a run with bad ones, where eager raises check_indices_values' ValueError. Paddle's
    assert error names no argument, so each prints the tensor it checks (under the program's name
    for it) and, for the indices, the check op's error bits (validation._INDEX_ERRORS). Every call
    checks: there is no tensor to remember."""
    assert_op = paddle.static.nn.control_flow.Assert
    if block_mask is not None:
        kept = paddle.logical_and(block_mask >= 0, block_mask <= 1)
        assert_op(paddle.all(kept), data=[block_mask], summarize=16, name="block_mask values must be 0 or 1")
    if startend_row_indices is not None and _validate_indices:
        flags = ops.pfm_flashmask_check_indices(_contiguous(startend_row_indices), call.seqlen_q, call.causal)
        assert_op(paddle.all(flags == 0), data=[startend_row_indices, flags], summarize=16,
                  name=f"startend_row_indices values must be query rows in [0, {call.seqlen_q}] with start <= end")


def _contiguous(t):
    # Paddle >= 2.6 may hand us strided views; the kernels read dense layouts.
    if hasattr(t, "is_contiguous") and not t.is_contiguous():
        return t.contiguous()
    return t


@_not_to_static  # argument checks are plain Python; the op itself works in both modes
def flashmask_attention(
    query,
    key,
    value,
    startend_row_indices=None,
    *,
    dropout=0.0,
    causal=False,
    window_size=None,
    return_softmax_lse=False,
    return_seed_offset=False,
    fixed_seed_offset=None,
    rng_name="",
    training=True,
    name=None,
    softmax_scale=None,
    block_mask=None,
    deterministic=None,
):
    r"""FlashMask attention: ``softmax(Q K^T * scale + M) V`` with a column-wise sparse mask M.

    Args:
        query (Tensor): ``[batch, seqlen_q, num_heads, head_dim]``, float32, float16 or bfloat16.
            The CPU kernel takes any head_dim; on GPU float16/bfloat16 with head_dim 32, 64, 80,
            96, 128 or 256, and 192 (with value head_dim 128) on the Hopper (sm90) kernels only (a
            compute capability 9.0 GPU, a build with them, gpu_kernel not ``"fa2"``) and not with
            ``deterministic``.
        key (Tensor): ``[batch, seqlen_k, num_heads_k, head_dim]``; ``num_heads`` must be a
            multiple of ``num_heads_k`` (GQA/MQA).
        value (Tensor): ``[batch, seqlen_k, num_heads_k, head_dim_v]``, the shape of ``key`` except
            possibly the head dim (MLA-style, e.g. 192 for q/k and 128 for v); the output has
            ``head_dim_v``. The CPU kernel takes any; on GPU ``head_dim_v`` equals ``head_dim``,
            except 128 with head_dim 192 (``validation.GPU_VALUE_HEAD_DIMS``).
        startend_row_indices (Tensor, optional): int32 ``[batch, Hm, seqlen_k, C]`` with Hm 1
            (broadcast over heads), ``num_heads_k`` (one mask per GQA group) or ``num_heads`` (one per
            query head). For key column j (values are query rows):

            - ``causal=True, C=1``: rows ``i >= LTS_j`` are masked;
            - ``causal=True, C=2``: rows ``LTS_j <= i < LTE_j`` are masked;
            - ``causal=False, C=2``: rows ``i >= LTS_j`` or ``i < UTE_j`` are masked;
            - ``causal=False, C=4``: rows ``LTS_j <= i < LTE_j`` or ``UTS_j <= i < UTE_j``.

            ``None`` means plain causal or full attention. ``paddle_flashmask.masks`` builds them.
        dropout (float): must be 0.0 while training (dropout is not implemented yet).
        causal (bool): also mask keys after the query, aligned bottom-right when
            ``seqlen_q != seqlen_k`` (row i sees keys ``j <= i + seqlen_k - seqlen_q``).
        window_size (int | tuple, optional): sliding window ``(left, right)`` (an int w means
            ``(w, w)``): row i sees keys ``i - left .. i`` (causal) or ``i - left .. i + right``,
            positions counted from the first query and the first key; with ``causal=True`` and
            ``seqlen_q != seqlen_k`` the causal limit is aligned bottom-right, the window is not.
            Cannot be combined with ``startend_row_indices``.
        return_softmax_lse (bool): also return the float32 log-sum-exp ``[batch, num_heads,
            seqlen_q]`` (-inf on rows whose keys are all masked). It carries no gradient.
        softmax_scale (float, optional): defaults to ``1 / sqrt(head_dim)``.
        training (bool): dropout applies only while training.
        deterministic (bool, optional): makes the GPU backward bit-reproducible: dQ is computed
            query-major without atomics and the GQA group's dK/dV are reduced in a fixed order
            (somewhat slower). ``None`` follows Paddle's ``FLAGS_cudnn_deterministic`` where this
            Paddle has that flag (as Paddle's own flash attention does), else False. On GPU it
            does not take head_dim 192 (a ValueError: pass False). The CPU backward is always
            deterministic (and independent of the thread count).
        block_mask (Tensor, optional): int32 ``[batch or 1, Hm, ceil(seqlen_q / 128),
            ceil(seqlen_k / 128)]`` of 0/1, as Paddle's: 0 masks a whole 128 x 128 block of
            (query rows, key columns) on top of the column mask (Hm: the indices' mask heads, or
            1, ``num_heads_k`` or ``num_heads`` without indices). Masked blocks are skipped, never loaded, by
            every kernel (CPU, FA2-class, Hopper).
        return_seed_offset, fixed_seed_offset, rng_name: accepted for signature
            compatibility with Paddle; only their defaults are supported.
        name: unused, kept for Paddle compatibility.

    Returns:
        ``out`` ``[batch, seqlen_q, num_heads, head_dim_v]`` (the shape of ``query`` unless value has
        its own head dim), or ``(out, softmax_lse)`` when ``return_softmax_lse``.
        A query row whose keys are all masked outputs zeros, and no NaN/inf reaches any
        gradient. A NaN in a query row, or among the scores it sees, makes that row's output
        and LSE NaN, as the dense softmax does (never the zeros of a masked row). A NaN or inf
        in the value of a key a row does not see can still reach that row when both share a
        kernel tile (``0 * NaN`` is NaN, as in the dense product): keep padding finite.
    """
    options = (dropout, causal, window_size, return_softmax_lse, return_seed_offset, rng_name, training,
               softmax_scale, deterministic, fixed_seed_offset is None)
    sig = _checked_calls.signature(query, key, value, startend_row_indices, block_mask, options,
                                   _checks_environment(deterministic))
    call = _checked_calls.lookup(sig)
    if call is None:
        call = _check_call(query, key, value, startend_row_indices, block_mask, dropout=dropout, causal=causal,
                           window_size=window_size, return_softmax_lse=return_softmax_lse,
                           return_seed_offset=return_seed_offset, fixed_seed_offset=fixed_seed_offset,
                           rng_name=rng_name, training=training, softmax_scale=softmax_scale,
                           deterministic=deterministic)
        _checked_calls.remember(sig, call)
    return _run_call(call, query, key, value, startend_row_indices, block_mask)


# What the argument checks derive for a call, all the op call needs besides the tensors.
_CheckedCall = collections.namedtuple(
    "_CheckedCall", "seqlen_q causal return_softmax_lse deterministic gpu_kernel scale window split")


def _checks_environment(deterministic):
    """The process state the argument checks read, raw (a bad value is the checks' to report):
    the kernel family setting and its environment variable, the kernels' switches, the piece
    length, and the deterministic default where the call leaves it to Paddle's flag."""
    return (_gpu_kernel, getenv(_GPU_KERNEL_ENV), validation.env_switch_values(), long_sequence.split_env_value(),
            _default_deterministic() if deterministic is None else None)


def _check_call(query, key, value, startend_row_indices, block_mask, *, dropout, causal, window_size,
                return_softmax_lse, return_seed_offset, fixed_seed_offset, rng_name, training, softmax_scale,
                deterministic):
    """Every argument check of flashmask_attention (each raises ValueError/TypeError naming the
    argument), and what they decide: a _CheckedCall. Reads no tensor values (_run_call does)."""
    batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim = validation.check_qkv(query, key, value)
    gpu_kernel_name = get_gpu_kernel()
    query_place = query.place if paddle.in_dynamic_mode() else None  # read once: see validation.on_gpu
    gpu = query_place is not None and query_place.is_gpu_place()
    validation.check_device_support(query, head_dim, int(value.shape[3]), gpu_kernel_name, gpu=gpu)
    validation.check_scalar_args(dropout, softmax_scale, training)
    causal = validation.check_flag("causal", causal)
    return_softmax_lse = validation.check_flag("return_softmax_lse", return_softmax_lse)
    deterministic = _resolve_deterministic(deterministic)
    validation.check_deterministic_support(query, head_dim, deterministic)
    validation.check_shared_memory(query, head_dim, not all(t.stop_gradient for t in (query, key, value)), gpu=gpu)
    validation.check_sm90_forced(query, head_dim, gpu_kernel_name)
    validation.check_env_switches()
    if return_seed_offset or fixed_seed_offset is not None or rng_name:
        raise NotImplementedError(
            "flashmask_attention: return_seed_offset/fixed_seed_offset/rng_name only matter with "
            "dropout, which is not implemented yet"
        )
    if block_mask is not None:
        num_mask_heads = None if startend_row_indices is None else int(startend_row_indices.shape[1])
        validation.check_block_mask(block_mask, query, batch, seqlen_q, seqlen_k, num_heads_k, num_heads,
                                    num_mask_heads)  # its values: _run_call, once a tensor
    window = validation.normalize_window(window_size, seqlen_q, seqlen_k)
    if window is not None and startend_row_indices is not None:
        raise ValueError("window_size cannot be combined with startend_row_indices; pass only one")
    if startend_row_indices is not None:
        validation.check_indices_shape(startend_row_indices, causal, batch, seqlen_k, num_heads_k, num_heads)
        validation.check_on_query_device("startend_row_indices", startend_row_indices, query, query_place)
    split = long_sequence.should_split(query, key, window, block_mask, gpu_kernel_name, head_dim,
                                       validation.SM90_HEAD_DIMS)
    if not split:
        validation.check_sm90_only_length(query, head_dim, seqlen_q, seqlen_k, "query/key")
        validation.check_fa2_query_rows(query, seqlen_q, head_dim, deterministic)
    scale = float(softmax_scale) if softmax_scale is not None else head_dim**-0.5
    return _CheckedCall(seqlen_q, causal, return_softmax_lse, deterministic, GPU_KERNELS[gpu_kernel_name], scale,
                        window, split)


def _run_call(call, query, key, value, startend_row_indices, block_mask):
    """The op on a checked call: the per-tensor value checks (once a tensor), then the kernels."""
    ops = load_ops()
    if not paddle.in_dynamic_mode():
        _assert_values_in_program(ops, call, startend_row_indices, block_mask)
    else:
        if block_mask is not None and not _already_checked(block_mask, -1, "block_mask"):
            # values read back once per tensor: every layer of a model gets the same block_mask
            validation.check_block_mask_values(block_mask)
            _remember_checked(block_mask, -1, "block_mask")
        if startend_row_indices is not None and _validate_indices:
            _check_index_values(ops, startend_row_indices, call.seqlen_q, call.causal)

    q, k, v = _contiguous(query), _contiguous(key), _contiguous(value)
    indices = None if startend_row_indices is None else _contiguous(startend_row_indices)
    if call.split:
        # beyond what one Hopper kernel call takes: pieces, merged exactly (long_sequence.py)
        out, lse = long_sequence.attention(q, k, v, indices, call.causal, call.scale, call.gpu_kernel,
                                           call.deterministic)
    else:
        left, right = call.window if call.window is not None else (-1, -1)
        out, lse = ops.pfm_flashmask_attention(
            q,
            k,
            v,
            indices,
            None if block_mask is None else _contiguous(block_mask),
            call.scale,
            call.causal,
            left,
            right,
            call.gpu_kernel,
            call.deterministic,
        )
    if call.return_softmax_lse:
        lse.stop_gradient = True
        return out, lse
    return out
