"""Argument checks for flashmask_attention.

Every malformed call fails here, with ValueError/TypeError naming the argument
and what was expected, before any kernel runs.
"""

import functools
import numbers

import numpy as np
import paddle

from . import _op_sources
from ._env import EnvNames

_FLOAT32_MAX = float(np.finfo(np.float32).max)

FLOAT_DTYPES = (paddle.float32, paddle.float16, paddle.bfloat16)
# a hashed lookup (one compare) where the tuple's costs up to three: the checks run every call
_FLOAT_DTYPE_SET = frozenset(FLOAT_DTYPES)
_DTYPE_NAMES = "float32, float16 or bfloat16"

# Bit flags returned by the index check op (custom_ops/flashmask/flashmask_params.h).
_INDEX_ERRORS = (
    (1, "has values below 0"),
    (2, "has values above the query length {sq}"),
    (4, "has a column whose lower start (LTS, [..., 0]) is above its lower end (LTE, [..., 1])"),
    (8, "has a column whose upper start (UTS, [..., 2]) is above its upper end (UTE, [..., 3])"),
)


def _is_tensor(t):
    """A dygraph Tensor, or a static-graph variable while building a program."""
    if isinstance(t, paddle.Tensor):
        return True
    static_types = tuple(
        c for c in (getattr(paddle.static, "Variable", None), getattr(getattr(paddle, "pir", None), "Value", None)) if c
    )
    return bool(static_types) and isinstance(t, static_types)


def _shape_str(t):
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_qkv(query, key, value):
    """Returns (batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim); value may have its
    own head dim (MLA-style: q/k 192, v 128), which the output then has."""
    # Each tensor's shape and dtype read once: every read builds a new object (0.3-0.4 us).
    shapes, dtypes = [], []
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not _is_tensor(t):
            raise TypeError(f"{name} must be a paddle.Tensor, got {type(t).__name__}")
        dtype, shape = t.dtype, t.shape
        if dtype not in _FLOAT_DTYPE_SET and dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be {_DTYPE_NAMES}, got {dtype}")
        if len(shape) != 4:
            raise ValueError(
                f"{name} must be 4-D [batch, seqlen, num_heads, head_dim], got shape {_shape_str(t)}"
            )
        shapes.append(shape)
        dtypes.append(dtype)
    if dtypes[1] != dtypes[0] or dtypes[2] != dtypes[0]:
        raise TypeError(
            f"query, key and value must share one dtype, got {dtypes[0]}, {dtypes[1]}, {dtypes[2]}"
        )
    (b, sq, h, d), (bk, sk, hk, dk), value_shape = shapes
    if list(value_shape[:3]) != [bk, sk, hk] or value_shape[3] == 0:
        raise ValueError(f"value must be [batch, seqlen_k, num_heads_k] of key {_shape_str(key)} with a head_dim "
                         f"> 0 of its own, got {_shape_str(value)}")
    if bk != b:
        raise ValueError(f"key batch size {bk} does not match query batch size {b}")
    if dk != d:
        raise ValueError(f"key head_dim {dk} does not match query head_dim {d}")
    if min(b, sq, sk, h, d) == 0:  # first: no heads at all is an empty tensor, not a GQA ratio
        raise ValueError(
            f"query and key must be non-empty, got query {_shape_str(query)}, key {_shape_str(key)}"
        )
    if hk == 0 or h % hk != 0:
        raise ValueError(
            f"query num_heads ({h}) must be a multiple of key num_heads ({hk}) for GQA/MQA"
        )
    # Static-graph variables carry no place: the program's device decides.
    if paddle.in_dynamic_mode():
        place = query.place
        if not (same_place(key.place, place) and same_place(value.place, place)):
            places = sorted({str(t.place) for t in (query, key, value)})
            raise ValueError(f"query, key and value must be on one device, got {places}")
    return b, sq, sk, h, hk, d


def same_place(a, b):
    """Whether two Places are one device, on every call of the op. GPU places by their device
    ids: Place._equals costs about 12 us a call on the GPU runtime (a cProfile of the op on an
    H100, `benchmarks/op_overhead.py --profile`; 0.7 us on the CPU), str() of both more. Other
    places by _equals where Paddle has it, else str()."""
    if hasattr(a, "is_gpu_place") and hasattr(b, "is_gpu_place"):
        a_gpu, b_gpu = a.is_gpu_place(), b.is_gpu_place()
        if a_gpu or b_gpu:
            return a_gpu and b_gpu and a.gpu_device_id() == b.gpu_device_id()
    equals = getattr(a, "_equals", None)
    return equals(b) if equals is not None else str(a) == str(b)


def on_gpu(query):
    """Whether a dygraph call runs on a GPU (static graphs have no place yet: False). The op's
    wrapper asks once and hands the answer to the checks below (``gpu=``): a Place costs a few
    microseconds a read on the GPU runtime, and each check would read its own."""
    return paddle.in_dynamic_mode() and query.place.is_gpu_place()


def _gpu(query, gpu):
    return on_gpu(query) if gpu is None else gpu


def check_on_query_device(name, tensor, query, query_place=None):
    """``tensor`` (indices, block mask) on ``query``'s device (``query_place``: query.place, when
    the caller has it); static graphs have no place yet."""
    if paddle.in_dynamic_mode():
        place = query.place if query_place is None else query_place
        if not same_place(tensor.place, place):
            raise ValueError(f"{name} must be on the device of query ({place}), got {tensor.place}")


def normalize_window(window_size, seqlen_q, seqlen_k):
    """int w -> (w, w); (left, right) kept; None -> None. Both must be >= 0.

    A side longer than the sequences restricts nothing, so it is clipped to
    max(seqlen_q, seqlen_k) (the op's attributes are int32)."""
    if window_size is None:
        return None
    if isinstance(window_size, bool):
        raise TypeError("window_size must be an int or a (left, right) pair of ints, got bool")
    if isinstance(window_size, numbers.Integral):
        window_size = (int(window_size), int(window_size))
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be an int or a (left, right) pair of ints, got {window_size!r}")
    left, right = window_size
    for side, w in (("left", left), ("right", right)):
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"window_size {side} must be an int, got {w!r}")
        if w < 0:
            raise ValueError(f"window_size {side} must be >= 0, got {w}")
    longest = max(seqlen_q, seqlen_k)
    return min(int(left), longest), min(int(right), longest)


def check_indices_shape(indices, causal, batch, seqlen_k, num_heads_k, num_heads):
    if not _is_tensor(indices):
        raise TypeError(f"startend_row_indices must be a paddle.Tensor, got {type(indices).__name__}")
    dtype, shape = indices.dtype, indices.shape  # each read builds a new object
    if dtype != paddle.int32:
        raise TypeError(f"startend_row_indices must be int32, got {dtype}")
    if len(shape) != 4:
        raise ValueError(
            "startend_row_indices must be 4-D [batch, mask_heads, seqlen_k, C], "
            f"got shape {_shape_str(indices)}"
        )
    bm, hm, skm, c = shape
    if bm != batch:
        raise ValueError(f"startend_row_indices batch size {bm} does not match query batch size {batch}")
    if hm not in (1, num_heads_k, num_heads):
        raise ValueError(
            f"startend_row_indices mask heads (dim 1) must be 1, the key num_heads {num_heads_k} or the query "
            f"num_heads {num_heads}, got {hm}"
        )
    if skm != seqlen_k:
        raise ValueError(
            f"startend_row_indices dim 2 must equal the key length {seqlen_k} (it indexes key columns), got {skm}"
        )
    allowed = (1, 2) if causal else (2, 4)
    if c not in allowed:
        mode = "causal=True" if causal else "causal=False"
        raise ValueError(
            f"startend_row_indices last dim must be {allowed[0]} or {allowed[1]} with {mode}, got {c}"
        )


BLOCK_MASK_SIZE = 128


def check_block_mask(block_mask, query, batch, seqlen_q, seqlen_k, num_heads_k, num_heads, num_mask_heads):
    """Paddle's block_mask: int32 [B or 1, Hm, ceil(Sq/128), ceil(Sk/128)] (1 keeps the 128 x 128
    block), Hm that of the indices (1, Hk or H without indices), on the query's device. Its values
    are check_block_mask_values' (a copy to the host: the wrapper asks once per tensor)."""
    if not _is_tensor(block_mask):
        raise TypeError(f"block_mask must be a paddle.Tensor, got {type(block_mask).__name__}")
    if block_mask.dtype != paddle.int32:
        raise TypeError(f"block_mask must be int32, got {block_mask.dtype}")
    rows = -(-seqlen_q // BLOCK_MASK_SIZE)
    cols = -(-seqlen_k // BLOCK_MASK_SIZE)
    shape = [int(d) for d in block_mask.shape]
    heads_ok = len(shape) == 4 and (shape[1] == num_mask_heads if num_mask_heads is not None
                                    else shape[1] in (1, num_heads_k, num_heads))
    if not heads_ok or shape[0] not in (1, batch) or shape[2:] != [rows, cols]:
        heads = f"{num_mask_heads} (the indices' mask heads)" if num_mask_heads is not None else f"1, {num_heads_k} or {num_heads}"
        raise ValueError(f"block_mask must be [batch {batch} or 1, {heads}, ceil(seqlen_q/128) = {rows}, "
                         f"ceil(seqlen_k/128) = {cols}], got {shape}")
    check_on_query_device("block_mask", block_mask, query)


def check_block_mask_values(block_mask):
    """0 or 1 everywhere (a dygraph tensor; one copy to the host on GPU)."""
    values = block_mask.numpy()
    if values.size and (values.min() < 0 or values.max() > 1):
        raise ValueError("block_mask values must be 0 (masked block) or 1 (kept block)")


def check_indices_values(flags, seqlen_q):
    """Raises for the error flags reported by the index check op."""
    problems = [msg.format(sq=seqlen_q) for bit, msg in _INDEX_ERRORS if flags & bit]
    if problems:
        raise ValueError(
            f"startend_row_indices values must be query rows in [0, {seqlen_q}] with start <= end; it "
            + "; it ".join(problems)
        )


def check_scalar_args(dropout, softmax_scale, training):
    check_flag("training", training)  # training="no" must not silently mean True
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real):
        raise TypeError(f"dropout must be a float in [0, 1), got {dropout!r}")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if dropout > 0.0 and training:
        raise NotImplementedError("flashmask_attention: dropout > 0 is not implemented yet; pass dropout=0.0")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
            raise TypeError(f"softmax_scale must be a positive float or None, got {softmax_scale!r}")
        s = float(softmax_scale)
        # The op takes a float32 attribute: anything past its range would become inf.
        if not (s > 0.0 and s <= _FLOAT32_MAX):
            raise ValueError(
                f"softmax_scale must be a positive finite float (float32 range), got {softmax_scale}"
            )


def check_flag(name, value):
    """Booleans only: causal="no" must not silently mean True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_gpu_kernel(what, value, allowed):
    """A GPU kernel family name (case-insensitive) -> its lower-case form.
    `what` names where it came from (the argument or the env variable)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a GPU kernel name, one of {_choices(allowed)}, got {value!r}")
    key = value.strip().lower()
    if key not in allowed:
        raise ValueError(f"{what} must be a GPU kernel name, one of {_choices(allowed)}, got {value!r}")
    return key


def _choices(allowed):
    return ", ".join(repr(a) for a in allowed)


# Query/key head dims the CUDA kernels take; 32 runs on the FA2-class kernels only, 192 on the Hopper ones
# only (SM90_ONLY_HEAD_DIMS), the others on both. 80 runs on head dim 96's tiles, its last 16 columns zero,
# as FlashAttention-2 and -3 run it, in both families, forward and backward.
GPU_HEAD_DIMS = (32, 64, 80, 96, 128, 192, 256)

# The value head dim the CUDA kernels take with each of GPU_HEAD_DIMS: the same, except 192,
# which they take with value head dim 128 only (MLA-style, as DeepSeek's q/k 192 and v 128).
GPU_VALUE_HEAD_DIMS = {**{d: d for d in GPU_HEAD_DIMS}, 192: 128}

# What the Hopper kernels take (custom_ops/flashmask/cuda/sm90), value head dims as above.
SM90_HEAD_DIMS = (64, 80, 96, 128, 192, 256)

# Head dims with no FA2-class kernel: on GPU they need the Hopper kernels (compute capability
# 9.0, a build that has them, a kernel family other than "fa2"), and the deterministic
# backward (its query-major dQ pass is FA2-class) cannot take them. 256 has FA2-class kernels
# (every GPU; a deterministic backward at 256 runs them, on Hopper too).
SM90_ONLY_HEAD_DIMS = (192,)


def gpu_value_head_dim(head_dim):
    """The value head dim the CUDA kernels take with query/key ``head_dim`` (None: no GPU kernel
    takes that head dim)."""
    return GPU_VALUE_HEAD_DIMS.get(head_dim)


def gpu_head_dims_label(head_dim):
    """``head_dim`` as the messages name it: "head_dim 192 with value head_dim 128" where the
    GPU kernels take value's own head dim with it, "head_dim 128" otherwise."""
    value_head_dim = gpu_value_head_dim(head_dim)
    if value_head_dim is None or value_head_dim == head_dim:
        return f"head_dim {head_dim}"
    return f"head_dim {head_dim} with value head_dim {value_head_dim}"


def _gpu_value_head_dim_rule():
    """The GPU value head dims in words, from GPU_VALUE_HEAD_DIMS (kept in step with it)."""
    own = [f"value head_dim {v} with {d} (the Hopper kernels)" if d in SM90_ONLY_HEAD_DIMS
           else f"value head_dim {v} with {d}" for d, v in GPU_VALUE_HEAD_DIMS.items() if v != d]
    return " and ".join(own + ["value head_dim equal to head_dim otherwise"])


# GPUs of these compute capabilities (RTX 30x0/40x0, A10, A40, L4, L40) allow 99 KB of shared memory a
# block. The FA2-class kernels take tiles that fit there (kernel_traits.h, SmemClass), except the forward
# at these head dims (none) and the backward at these; kernel_traits.h asserts the two lists at compile time.
SMEM_99K_CAPABILITIES = ((8, 6), (8, 9))
FA2_FORWARD_BEYOND_99K = ()
FA2_BACKWARD_BEYOND_99K = (256,)


def check_shared_memory(query, head_dim, backward, gpu=None):
    """A call whose FA2-class kernel needs more shared memory a block than the GPU allows (compute
    capability 8.6/8.9: 99 KB; the Hopper and A100-class GPUs take every kernel): a ValueError here
    rather than the launch's C++ error, which Paddle 2.6 cannot carry back. ``backward``: the call's
    gradient will be asked for (any of query/key/value has stop_gradient=False); ``gpu``: on_gpu(query)
    where the caller has it."""
    if not _gpu(query, gpu):
        return
    if head_dim not in FA2_FORWARD_BEYOND_99K and not (backward and head_dim in FA2_BACKWARD_BEYOND_99K):
        return  # cheapest first: most calls stop here without asking the device
    major, minor = compute_capability(query.place.gpu_device_id())
    if (major, minor) not in SMEM_99K_CAPABILITIES:
        return
    what = "forward" if head_dim in FA2_FORWARD_BEYOND_99K else "backward"
    with_grad = [d for d in GPU_HEAD_DIMS
                 if d not in SM90_ONLY_HEAD_DIMS + FA2_FORWARD_BEYOND_99K + FA2_BACKWARD_BEYOND_99K]
    forward_only = [d for d in FA2_BACKWARD_BEYOND_99K if d not in FA2_FORWARD_BEYOND_99K]
    raise ValueError(
        f"head_dim {head_dim} on a compute capability {major}.{minor} GPU: its {what} kernel needs more than the "
        f"99 KB of shared memory a block this GPU allows; there the GPU kernels take head_dim {with_grad} with "
        f"gradients and {forward_only} without (stop_gradient=True on query, key and value); use one of "
        f"those or the CPU")


def check_gpu_value_head_dim(head_dim, value_head_dim):
    """Value's head dim as the CUDA kernels take it with query/key ``head_dim`` (one of
    GPU_HEAD_DIMS): GPU_VALUE_HEAD_DIMS; None stands for value's head dim equal to head_dim."""
    if value_head_dim is None:
        value_head_dim = head_dim
    if value_head_dim != gpu_value_head_dim(head_dim):
        raise ValueError(
            f"value head_dim {value_head_dim} with query/key head_dim {head_dim} on GPU: the GPU kernels take "
            f"{_gpu_value_head_dim_rule()}; the CPU kernel takes any")


def check_device_support(query, head_dim, value_head_dim=None, gpu_kernel_name="auto", gpu=None):
    """The CUDA kernels take fp16/bf16 with head_dim 32, 64, 80, 96, 128, 256 or (on the Hopper kernels
    only) 192, value's head dim that of GPU_VALUE_HEAD_DIMS (None: value's equals
    head_dim); the CPU kernel takes any. ``gpu_kernel_name`` is the call's kernel family
    (attention.get_gpu_kernel()). The other device checks (deterministic, sm90 forced, length)
    take the head dim alone: a head dim that passed here has its one value head dim. ``gpu``:
    on_gpu(query) where the caller has it."""
    if not _gpu(query, gpu):
        return  # static graphs are checked by the op when they run
    if query.dtype not in (paddle.float16, paddle.bfloat16):
        raise TypeError(f"query/key/value on GPU must be float16 or bfloat16, got {query.dtype}")
    if head_dim not in GPU_HEAD_DIMS:
        raise ValueError(f"head_dim on GPU must be one of {GPU_HEAD_DIMS}, got {head_dim} (the CPU kernel takes "
                         "any head_dim)")
    check_gpu_value_head_dim(head_dim, value_head_dim)
    if head_dim in SM90_ONLY_HEAD_DIMS:
        why_not = sm90_unavailable_reason(query, gpu_kernel_name)
        if why_not is not None:
            raise ValueError(
                f"{gpu_head_dims_label(head_dim)} on GPU runs on the Hopper (sm90) kernels only: needs a compute "
                f"capability 9.0 GPU (H100/H200), a build of the op with the sm90 kernels and gpu_kernel "
                f"'auto' or 'sm90'; got {why_not} (the CPU kernel takes any head_dim)")


def sm90_unavailable_reason(query, gpu_kernel_name):
    """Why a call on ``query``'s GPU cannot take the Hopper kernels, or None when it can.
    Cheapest checks first: this runs on every call of a Hopper-only head dim."""
    if gpu_kernel_name == "fa2":
        return "gpu_kernel 'fa2' (set_gpu_kernel / PADDLE_FLASHMASK_GPU_KERNEL)"
    major, minor = compute_capability(query.place.gpu_device_id())
    if (major, minor) != (9, 0):
        return f"a compute capability {major}.{minor} GPU"
    if _op_sources.sm90_built() is False:
        return ("a build of the op without the sm90 kernels (it needs 90a in PADDLE_FLASHMASK_CUDA_ARCHS and "
                "the CUTLASS headers, `pip install --no-deps nvidia-cutlass==4.2.0.0`)")
    return None


def check_sm90_only_length(query, head_dim, seqlen_q, seqlen_k, what):
    """A head dim only the Hopper kernels take, in one kernel call longer than they take (no
    FA2-class kernel to fall back on): a ValueError here rather than the op's C++ error, which
    Paddle 2.6 cannot carry back. Self-attention without window_size/block_mask never gets here
    (long_sequence cuts it into pieces)."""
    if head_dim not in SM90_ONLY_HEAD_DIMS or not paddle.in_dynamic_mode() or not query.place.is_gpu_place():
        return
    from .long_sequence import sm90_max_seqlen

    limit = sm90_max_seqlen(head_dim)
    if max(seqlen_q, seqlen_k) > limit:
        raise ValueError(
            f"{gpu_head_dims_label(head_dim)} on GPU takes at most {limit} query rows and keys per kernel call, got "
            f"{what} of {seqlen_q} and {seqlen_k} (self-attention without window_size or block_mask is cut "
            f"into pieces automatically; otherwise shorten the call or use the CPU)")


# The FA2-class forward and deterministic dQ pass launch a (heads, query blocks, batch) grid
# (flashmask_launch.cuh, launch_rows_heads_fastest), whose y extent stops at 65535 blocks of 128
# query rows (64 at head dim 256, whose 99 KB tiles take 64, and in the deterministic dQ pass).
FA2_MAX_QUERY_BLOCKS = 65535


def fa2_max_query_rows(head_dim, deterministic):
    """The most query rows one FA2-class kernel call takes."""
    return FA2_MAX_QUERY_BLOCKS * (64 if deterministic or head_dim > 128 else 128)


def check_fa2_query_rows(query, seqlen_q, head_dim, deterministic):
    """A GPU call longer than the FA2-class kernels' grid takes (what runs a call the Hopper
    kernels do not, or beyond their 2^19 tokens when it is not cut into pieces): a ValueError
    here rather than the op's C++ error, which Paddle 2.6 cannot carry back."""
    limit = fa2_max_query_rows(head_dim, deterministic)
    if seqlen_q <= limit or not paddle.in_dynamic_mode() or not query.place.is_gpu_place():
        return
    raise ValueError(
        f"query of {seqlen_q} rows: the FA2-class GPU kernels take at most {limit} query rows per call "
        f"({FA2_MAX_QUERY_BLOCKS} blocks); split the sequence (context parallel: plan=, group=) or run "
        f"self-attention without window_size or block_mask on a Hopper GPU, which cuts it into pieces")


def check_deterministic_support(query, head_dim, deterministic):
    """deterministic=True (given, or the FLAGS_cudnn_deterministic default) on GPU with a head dim
    its backward lacks: the query-major dQ pass is FA2-class, and those kernels have no 192 (256
    takes the FA2-class backward, on Hopper too). The CPU backward takes any head dim and is
    always deterministic."""
    if not deterministic or head_dim not in SM90_ONLY_HEAD_DIMS:
        return
    if not paddle.in_dynamic_mode() or not query.place.is_gpu_place():
        return  # static graphs are checked by the op when they run
    raise ValueError(
        f"deterministic=True with head_dim {head_dim} on GPU: the deterministic backward has no head_dim "
        f"{head_dim} kernel; pass deterministic=False (deterministic=None follows FLAGS_cudnn_deterministic)")


# The GPU kernels' integer tuning switches (environment, read by the op at each call), checked
# here because Paddle 2.6 cannot carry the op's own error back to Python:
# name -> (lowest, highest) integer value. PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST: how many of the
# last key blocks of every head the FA2-class backward runs after all the others (its default,
# 16 at 128-key blocks, is flashmask_launch.cuh's bwd_light_last); PADDLE_FLASHMASK_SM90_BWD_ORDER*:
# the Hopper backward's CTA order (flashmask_sm90_api.cu, bwd_cta_ordered and its settings);
# PADDLE_FLASHMASK_SM90_BWD_FINISH_OVERLAP: its finish beside the main kernel's last CTAs (1, the
# default) or after it (flashmask_sm90_launch.cuh, bwd_finish_overlap);
# PADDLE_FLASHMASK_SM90_FWD_WIDE_KEYS: the Hopper forward's 176-key tiles for calls with no mask at
# head dim 128 (1, the default) or its 128-key kernel (flashmask_sm90_launch.cuh, fwd_wide_keys);
# PADDLE_FLASHMASK_FA2_BWD_DKV_DIRECT: without GQA (and in deterministic mode, per query head, summed
# after it) the FA2-class backward stores dK/dV in the output dtype itself (1, the default) or adds
# them into fp32 slots converted after it (flashmask_launch.cuh, fa2_dkv_direct);
# PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS: with GQA groups of up to 4 query heads at head dims 64, 128 and
# 256, the FA2-class backward stores dK/dV per query head in the output dtype and sums each group
# after it (1, the default) or adds them into fp32 kv-head slots (0; flashmask_launch.cuh,
# fa2_gqa_heads_stored);
# PADDLE_FLASHMASK_SM90_BWD_DKV_DIRECT: the same for the Hopper backward without GQA (1, the default;
# 0: fp32 slots; flashmask_sm90_api.cu, bwd_dkv_direct);
# PADDLE_FLASHMASK_SM90_BWD_CHAINS_FIRST / _CHAIN_MIN_STEPS: the Hopper backward's longest key blocks
# before every GQA group's (sm90/bwd_cta_order.cuh) and the floor of their steps;
# PADDLE_FLASHMASK_SM90_FWD_HEAVY_FIRST / _HEAVY_MIN_BLOCKS: the Hopper forward's longest tiles first
# (sm90/fwd_tile_order.cuh) and the floor of their live key blocks;
# PADDLE_FLASHMASK_FA2_FWD_HEAVY_FIRST / _HEAVY_MIN_BLOCKS and PADDLE_FLASHMASK_FA2_BWD_HEAVY_FIRST /
# _HEAVY_MIN_STEPS: the FA2-class kernels' longest CTAs first (cuda/fa2_cta_order.cuh) and the floor
# of their live blocks (the forward's 64-key blocks, the backward's query steps);
# PADDLE_FLASHMASK_FA2_FWD_HEAD_PAIRS: the FA2-class forward's tiles of two query heads' 64-row
# blocks where the heads pair up (1, the default; cuda/fwd_grid.h) or one head's 128 rows (0);
# PADDLE_FLASHMASK_FA2_FWD_HEAD_QUADS: four query heads' 32-row blocks a tile at head dims 96 and
# 256 where the GQA groups split into fours (1, the default) or pairs there (0);
# PADDLE_FLASHMASK_NUM_THREADS: the CPU kernels' threads (cpu/parallel.h; unset: the cores this
# process may run on). Bounded so that a stray value fails here rather than in thread creation.
INTEGER_ENV_SWITCHES = {
    "PADDLE_FLASHMASK_NUM_THREADS": (1, 1024),
    "PADDLE_FLASHMASK_SM90_FWD_OVERLAP": (0, 1),
    "PADDLE_FLASHMASK_SM90_FWD_WIDE_KEYS": (0, 1),
    "PADDLE_FLASHMASK_SM90_FWD_PINGPONG": (0, 1),
    "PADDLE_FLASHMASK_SM90_FWD_GQA_TILES": (0, 1),
    "PADDLE_FLASHMASK_SM90_BWD_HEAD_GROUP": (0, 1024),
    "PADDLE_FLASHMASK_SM90_BWD_GROUP_MAX_STEPS": (0, 1 << 20),
    "PADDLE_FLASHMASK_SM90_BWD_ORDER": (0, 1),
    "PADDLE_FLASHMASK_SM90_BWD_ORDER_CAP": (0, 1 << 24),
    "PADDLE_FLASHMASK_SM90_BWD_ORDER_CLASSES": (1, 256),
    "PADDLE_FLASHMASK_SM90_BWD_FINISH_OVERLAP": (0, 1),
    "PADDLE_FLASHMASK_SM90_BWD_CHAINS_FIRST": (0, 1),
    "PADDLE_FLASHMASK_SM90_BWD_CHAIN_MIN_STEPS": (1, 1 << 24),
    "PADDLE_FLASHMASK_SM90_FWD_HEAVY_FIRST": (0, 1),
    "PADDLE_FLASHMASK_SM90_FWD_HEAVY_MIN_BLOCKS": (1, 1 << 15),
    "PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST": (0, 4096),
    "PADDLE_FLASHMASK_FA2_FWD_HEAVY_FIRST": (0, 1),
    "PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS": (1, 1 << 24),
    "PADDLE_FLASHMASK_FA2_BWD_HEAVY_FIRST": (0, 1),
    "PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS": (1, 1 << 24),
    "PADDLE_FLASHMASK_FA2_FWD_HEAD_PAIRS": (0, 1),
    "PADDLE_FLASHMASK_FA2_FWD_HEAD_QUADS": (0, 1),
    "PADDLE_FLASHMASK_FA2_BWD_DKV_DIRECT": (0, 1),
    "PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS": (0, 1),
    "PADDLE_FLASHMASK_SM90_BWD_DKV_DIRECT": (0, 1),
}


# The FA2-class kernels' switches (read by the op at each launch, flashmask_launch.cuh): name ->
# the values they take. PADDLE_FLASHMASK_FA2_SMEM_CLASS "99k" runs the tiles of the 99 KB GPUs on
# every GPU (kernel_traits.h, SmemClass; to test and time them on the larger ones);
# PADDLE_FLASHMASK_FA2_BWD picks the main backward kernel.
FA2_SMEM_CLASS_ENV = "PADDLE_FLASHMASK_FA2_SMEM_CLASS"
FA2_ENV_CHOICES = {
    FA2_SMEM_CLASS_ENV: ("auto", "99k"),
    "PADDLE_FLASHMASK_FA2_BWD": ("staged", "split"),
}


_ENV_SWITCHES = EnvNames(list(INTEGER_ENV_SWITCHES) + list(FA2_ENV_CHOICES))


def env_switch_values():
    """The switches' values as set, unchecked (check_env_switches checks them): a key that changes
    with any of them."""
    return _ENV_SWITCHES.raw_values()


def check_env_switches():
    """The INTEGER_ENV_SWITCHES that are set hold integers in their range, and the FA2_ENV_CHOICES
    one of their values (whatever the place: a wrong value is wrong everywhere, and static graphs
    have no place yet)."""
    for name, value in _ENV_SWITCHES.set_values():
        if name in INTEGER_ENV_SWITCHES:
            lo, hi = INTEGER_ENV_SWITCHES[name]
            if not (value.isdigit() and lo <= int(value) <= hi):
                raise ValueError(f"environment variable {name} must be an integer in [{lo}, {hi}], got {value!r}")
        elif value not in FA2_ENV_CHOICES[name]:
            raise ValueError(f"environment variable {name} must be one of {FA2_ENV_CHOICES[name]}, got {value!r}")


@functools.lru_cache(maxsize=None)
def compute_capability(device_id):
    """(major, minor) of a GPU, asked once per device (the query is not free on every call)."""
    props = paddle.device.cuda.get_device_properties(device_id)
    return int(props.major), int(props.minor)


def check_sm90_forced(query, head_dim, gpu_kernel_name):
    """gpu_kernel "sm90" forced on a call the Hopper kernels cannot run: a clear ValueError here,
    before the op (Paddle 2.6 cannot carry the op's own C++ error back to Python). Value's head
    dim is check_device_support's (192 reaches here with 128 only)."""
    if gpu_kernel_name != "sm90" or not paddle.in_dynamic_mode() or not query.place.is_gpu_place():
        return
    major, minor = compute_capability(query.place.gpu_device_id())
    if (major, minor) != (9, 0):
        raise ValueError(
            f"gpu_kernel 'sm90' (set_gpu_kernel / PADDLE_FLASHMASK_GPU_KERNEL) needs a compute "
            f"capability 9.0 GPU (H100/H200), this one is {major}.{minor}; use 'auto' or 'fa2'")
    if head_dim not in SM90_HEAD_DIMS:
        raise ValueError(
            f"gpu_kernel 'sm90' takes head_dim {SM90_HEAD_DIMS}, got {head_dim}; use 'auto' or 'fa2'")
    if _op_sources.sm90_built() is False:
        raise ValueError(
            "gpu_kernel 'sm90' (set_gpu_kernel / PADDLE_FLASHMASK_GPU_KERNEL): this build of the op "
            "has no sm90 kernels (it needs 90a in PADDLE_FLASHMASK_CUDA_ARCHS and the CUTLASS headers, "
            "`pip install --no-deps nvidia-cutlass==4.2.0.0`); use 'auto' or 'fa2'")
