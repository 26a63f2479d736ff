"""CUDA kernels against references computed on the host.

Skipped unless Paddle has CUDA and a GPU. Written for the trimmed device
runtime (see README, "GPU"), where Paddle's own GPU kernels do not run: the
tests only move tensors to/from the GPU, call our ops and paddle.grad with
explicit grad_outputs; every cast and comparison happens on the host.

Every correctness test runs once per GPU kernel family (the `gpu_kernel`
fixture): "fa2" (mma.sync, any GPU) and "sm90" (TMA + wgmma, compute
capability 9.0 only: skipped elsewhere, never on an H100/H200).
"""

import re
import zlib

import numpy as np
import paddle
import pytest

import paddle_flashmask as pfm
from paddle_flashmask import masks, validation
from reference import attention_fwd_bwd, keep_mask, random_indices, rel_err

pytestmark = pytest.mark.skipif(
    not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0,
    reason="needs Paddle with CUDA and a GPU",
)

TOL = 1e-2  # bf16/fp16 inputs, fp32 accumulation
FORMS = [(True, 0), (True, 1), (True, 2), (False, 0), (False, 2), (False, 4)]


# Head dims the sm90 kernels take (flashmask_api_cuda.cu refuses others when forced); 192
# with value head dim 128 only; 80 on 96's tiles.
SM90_HEAD_DIMS = (64, 80, 96, 128, 192, 256)
# Head dims of the tests run per family (32: the FA2-class kernels only, skipped for "sm90";
# 80 runs on 96's tiles padded, in both families). 256 runs on both families (the FA2-class kernels
# on every GPU, deterministic included)
# and has more tests of its own below; 192/128 (the Hopper kernels only, no deterministic
# backward) has its own.
DIMS = [d for d in (32, 64, 80, 96, 128, 256) if d in validation.GPU_HEAD_DIMS]
HD256 = 256
# MLA's head dims (DeepSeek: q/k 192, v 128), the one pair with a value head dim of its own
MLA_DIM, MLA_DIM_V = 192, 128


def gpu():
    return paddle.CUDAPlace(0)


def device_capability():
    """(major, minor) of GPU 0 as ints."""
    props = paddle.device.cuda.get_device_properties(0)
    return int(props.major), int(props.minor)


def is_sm90():
    """True on compute capability 9.0 (H100, H200, H800, GH200): where the sm90 kernels run."""
    return device_capability() == (9, 0)


@pytest.fixture(params=["fa2", "sm90"])
def gpu_kernel(request):
    """Runs the test with one kernel family forced (pfm.set_gpu_kernel), restored after."""
    if request.param == "sm90" and not is_sm90():
        pytest.skip(f"the sm90 kernels need compute capability 9.0, GPU 0 is {device_capability()}")
    old = pfm.set_gpu_kernel(request.param)
    yield request.param
    pfm.set_gpu_kernel(old)


def skip_unsupported(dim):
    kernel = pfm.get_gpu_kernel()
    if kernel == "sm90" and dim not in SM90_HEAD_DIMS:
        pytest.skip(f"the sm90 kernels take head dims {SM90_HEAD_DIMS}, not {dim}")
    if dim in validation.SM90_ONLY_HEAD_DIMS and (kernel == "fa2" or not is_sm90()):
        pytest.skip(f"head dim {dim} runs on the sm90 kernels only (gpu_kernel {kernel!r}, GPU 0 is "
                    f"{device_capability()})")


def to_gpu(array, dtype):
    """numpy -> host tensor -> cast on the host -> copy to the GPU."""
    host = paddle.to_tensor(np.ascontiguousarray(array), place=paddle.CPUPlace())
    if dtype != str(host.dtype).split(".")[-1]:
        host = host.astype(dtype)
    return host._copy_to(gpu(), True)


def to_host_f64(t):
    host = t._copy_to(paddle.CPUPlace(), True)
    if host.dtype != paddle.float32:
        host = host.astype("float32")
    return host.numpy().astype(np.float64)


def cpu_reference(q, k, v, dout, indices, causal, window):
    """Our CPU op in fp32 on the same (rounded) inputs: the reference for long sequences."""
    cpu = paddle.CPUPlace()  # explicit: a GPU build of Paddle defaults to the GPU
    ts = [paddle.to_tensor(x.astype(np.float32), place=cpu, stop_gradient=False) for x in (q, k, v)]
    idx = None if indices is None else paddle.to_tensor(indices, place=cpu)
    out, lse = pfm.flashmask_attention(*ts, idx, causal=causal, window_size=window, return_softmax_lse=True)
    grads = paddle.grad([out], ts, [paddle.to_tensor(dout.astype(np.float32), place=cpu)])
    res = {"out": out.numpy(), "lse": lse.numpy()}
    res.update({n: g.numpy() for n, g in zip(("dq", "dk", "dv"), grads)})
    return res


def gpu_inputs(seed, batch, seqlen_q, seqlen_k, heads, heads_k, dim, dtype, dim_v=None):
    """q, k, v (requiring grad) and dout on the GPU, standard normal; v and dout of head dim
    ``dim_v`` (default ``dim``)."""
    dim_v = dim if dim_v is None else dim_v
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((batch, seqlen_q, heads, dim)).astype(np.float32),
              rng.standard_normal((batch, seqlen_k, heads_k, dim)).astype(np.float32),
              rng.standard_normal((batch, seqlen_k, heads_k, dim_v)).astype(np.float32),
              rng.standard_normal((batch, seqlen_q, heads, dim_v)).astype(np.float32)]
    q, k, v, dout = (to_gpu(a, dtype) for a in arrays)
    for t in (q, k, v):
        t.stop_gradient = False
    return q, k, v, dout


def gpu_run(q, k, v, dout, indices, causal, window=None, deterministic=None):
    """One forward + backward on the GPU; results on the host (float64, LSE float32)."""
    idx = None if indices is None else paddle.to_tensor(indices, place=gpu())
    out, lse = pfm.flashmask_attention(q, k, v, idx, causal=causal, window_size=window,
                                       return_softmax_lse=True, deterministic=deterministic)
    dq, dk, dv = paddle.grad([out], [q, k, v], [dout])
    return {"out": to_host_f64(out), "lse": lse._copy_to(paddle.CPUPlace(), True).numpy(),
            "dq": to_host_f64(dq), "dk": to_host_f64(dk), "dv": to_host_f64(dv)}


def run_gpu_case(seed, batch, seqlen_q, seqlen_k, heads, heads_k, dim, causal, indices=None,
                 window=None, dtype="bfloat16", use_cpu_reference=False, deterministic=None, dim_v=None):
    skip_unsupported(dim)
    q, k, v, dout = gpu_inputs(seed, batch, seqlen_q, seqlen_k, heads, heads_k, dim, dtype, dim_v)
    got = gpu_run(q, k, v, dout, indices, causal, window, deterministic)

    rounded = [to_host_f64(t) for t in (q, k, v, dout)]  # what the GPU actually saw
    if use_cpu_reference:
        ref = cpu_reference(*rounded, indices, causal, window)
        mags = {}
    else:
        win = None if window is None else ((window, window) if isinstance(window, int) else window)
        hm = heads_k if indices is None else indices.shape[1]
        keep = keep_mask(indices, causal, batch, hm, seqlen_q, seqlen_k, win)
        ref = attention_fwd_bwd(*rounded[:3], keep, dim**-0.5, rounded[3])
        mags = {n: ref[n + "_mag"] for n in ("dq", "dk", "dv")}

    for name in ("out", "dq", "dk", "dv"):  # out and dv of value's head dim
        assert got[name].shape == ref[name].shape, (name, got[name].shape, ref[name].shape)
    finite = np.isfinite(ref["lse"])
    np.testing.assert_array_equal(np.isfinite(got["lse"]), finite)
    assert np.all(got["out"][~finite.transpose(0, 2, 1)] == 0)
    errors = {"out": rel_err(got["out"], ref["out"])}
    if finite.any():
        errors["lse"] = rel_err(got["lse"][finite], ref["lse"][finite])
    for name in ("dq", "dk", "dv"):
        assert np.all(np.isfinite(got[name])), f"{name} has NaN/inf"
        errors[name] = rel_err(got[name], ref[name], mags.get(name))
    for name, err in errors.items():
        assert err < (1e-4 if name == "lse" else TOL), f"{name}: {err:.3e} (all: {errors})"
    return errors


def seed_of(*parts):
    return zlib.crc32(repr(parts).encode())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen", [1, 77, 1000])
def test_forms_lengths(gpu_kernel, dtype, dim, causal, cols, seqlen):
    idx = None if cols == 0 else random_indices(np.random.default_rng(seqlen), 2, 2, seqlen, seqlen, causal, cols)
    run_gpu_case(seed_of(dtype, dim, causal, cols, seqlen), 2, seqlen, seqlen, 4, 2, dim, causal, idx,
                 dtype=dtype)


@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(100, 300), (300, 100), (4097, 4097)])
def test_unequal_and_long(gpu_kernel, causal, cols, seqlen_q, seqlen_k):
    rng = np.random.default_rng(seqlen_q * 7 + seqlen_k)
    idx = None if cols == 0 else random_indices(rng, 1, 1, seqlen_q, seqlen_k, causal, cols)
    run_gpu_case(seed_of(causal, cols, seqlen_q, seqlen_k), 1, seqlen_q, seqlen_k, 2, 1, 128, causal, idx,
                 use_cpu_reference=seqlen_q > 2000)


@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 2, 2), (8, 2, 8), (8, 1, 1), (8, 1, 8), (4, 4, 4)])
def test_gqa_mask_heads(gpu_kernel, heads, heads_k, hm):
    idx = random_indices(np.random.default_rng(heads * 10 + hm), 2, hm, 333, 333, False, 4)
    run_gpu_case(seed_of(heads, heads_k, hm), 2, 333, 333, heads, heads_k, 64, False, idx)


@pytest.mark.parametrize("name", sorted(masks.MASK_BUILDERS))
def test_builders_8k(gpu_kernel, name):
    idx, causal = masks.example_mask(name, 8192, batch_size=1, num_heads=2, seed=1, place=paddle.CPUPlace())
    heads_k = idx.shape[1] if idx.shape[1] > 1 else 2
    run_gpu_case(seed_of(name), 1, 8192, 8192, 2 * heads_k, heads_k, 128, causal, idx.numpy(),
                 use_cpu_reference=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [3, (100, 17)])
def test_window(gpu_kernel, causal, window):
    run_gpu_case(seed_of(causal, window), 1, 500, 500, 2, 2, 64, causal, window=window)


def fully_masked_rows_indices():
    """C = 4 indices over 300 keys in which query rows [0, 130) see nothing (LSE -inf, O = 0)
    and rows [200, 260) are masked as well."""
    idx = np.zeros((1, 1, 300, 4), dtype=np.int32)
    idx[..., 1] = 130
    idx[..., 2], idx[..., 3] = 200, 260
    return idx


def test_fully_masked_rows(gpu_kernel):
    idx = fully_masked_rows_indices()
    run_gpu_case(1, 1, 300, 300, 2, 1, 128, False, idx)


def dead_query_blocks_indices(causal, cols, seqlen, live_rows):
    """[2, 2, seqlen, cols] indices: mask head 0 of batch row 0 hides rows >= live_rows from every
    column (the query blocks past them see no key: both forwards' row aggregate skips them); the
    other three (batch, mask head) rows are random, so whole-row aggregates of different rows must
    not mix."""
    idx = random_indices(np.random.default_rng(live_rows + cols), 2, 2, seqlen, seqlen, causal, cols)
    if causal and cols == 1:
        idx[0, 0, :, 0] = live_rows
    elif cols == 2 and not causal:
        idx[0, 0, :, 0], idx[0, 0, :, 1] = live_rows, 0  # LTS: masked from live_rows on; UTE 0
    else:  # causal C = 2 (LTS, LTE) and C = 4 (LTS, LTE, UTS, UTE): the lower band [live_rows, Sq)
        idx[0, 0, :, 0], idx[0, 0, :, 1] = live_rows, seqlen
        if cols == 4:
            idx[0, 0, :, 2], idx[0, 0, :, 3] = 0, 0
    return idx


@pytest.mark.parametrize("causal,cols", [f for f in FORMS if f[1] != 0])
@pytest.mark.parametrize("live_rows", [0, 100, 256])
def test_dead_query_blocks(gpu_kernel, causal, cols, live_rows):
    idx = dead_query_blocks_indices(causal, cols, 700, live_rows)
    run_gpu_case(seed_of(causal, cols, live_rows), 2, 700, 700, 4, 2, 128, causal, idx)


def scattered_key_runs_indices(rng, causal, cols, mask_heads, seqlen_q, seqlen_k):
    """[1, mask_heads, seqlen_k, cols] indices whose columns hide every query row but in five runs of
    1-3000 keys anywhere (across the 2048-key coarse summaries): a run's columns show rows [a, b)
    (causal forms: rows [0, b)). In the C = 4 form rows [0, 16) see every key besides (global rows),
    and the columns outside the runs hide the rest by their lower interval, those inside by both
    intervals: the context-parallel part of global + sliding window, where no whole-row aggregate
    shows a dead block but the coarse summaries do."""
    idx = np.zeros((1, mask_heads, seqlen_k, cols), np.int32)
    hidden = {(True, 1): [0], (True, 2): [0, seqlen_q], (False, 2): [0, 0], (False, 4): [16, seqlen_q, 0, 0]}
    idx[...] = hidden[(causal, cols)]
    for h in range(mask_heads):
        for _ in range(5):
            n = int(rng.integers(1, 3000))
            start = int(rng.integers(0, seqlen_k - n))
            keys = slice(start, start + n)
            a = rng.integers(16, seqlen_q, n)
            b = np.minimum(seqlen_q, a + rng.integers(1, 200, n))
            if causal:
                idx[0, h, keys, 0] = b  # LTS (LTE stays Sq): rows < b see the key
            elif cols == 2:
                idx[0, h, keys, 0], idx[0, h, keys, 1] = b, a  # LTS, UTE: rows [a, b) see it
            else:
                idx[0, h, keys] = np.stack([b, np.full(n, seqlen_q), np.full(n, 16), a], axis=-1)
    return idx


@pytest.mark.parametrize("causal,cols", [f for f in FORMS if f[1] != 0])
@pytest.mark.parametrize("dim", [128, HD256])
def test_scattered_key_runs(gpu_kernel, causal, cols, dim):
    # 384 query rows against 70001 keys seen in a few runs: both forwards pass the runs' gaps through
    # the coarse summaries (these instances have 4-39 rounds of key blocks
    # that find nothing with live blocks after them, at key blocks of 128 and of 64).
    rng = np.random.default_rng(seed_of("runs", causal, cols))
    idx = scattered_key_runs_indices(rng, causal, cols, 2, 384, 70001)
    run_gpu_case(seed_of("runs", causal, cols, dim), 1, 384, 70001, 4, 2, dim, causal, idx,
                 use_cpu_reference=True)


@pytest.mark.parametrize("dim", [64, 128, HD256])
@pytest.mark.parametrize("deterministic", [False, True])
def test_nan_in_a_query_row_stays_nan(gpu_kernel, dim, deterministic):
    # A NaN in one query row: that row's O, LSE and dQ are NaN, as on the CPU (and in the dense
    # softmax), not the zeros and -inf of an empty row; the other rows' O and LSE are as without it.
    skip_unsupported(dim)
    if deterministic and dim in validation.SM90_ONLY_HEAD_DIMS:
        pytest.skip("deterministic mode does not take the Hopper-only head dims")
    rng = np.random.default_rng(seed_of("nan-row", dim))
    arrays = [rng.standard_normal((1, 300, 4, dim)).astype(np.float32),
              rng.standard_normal((1, 300, 2, dim)).astype(np.float32),
              rng.standard_normal((1, 300, 2, dim)).astype(np.float32),
              rng.standard_normal((1, 300, 4, dim)).astype(np.float32)]
    idx = masks.causal_document_mask([100, 130, 70]).numpy()
    runs = []
    for poisoned in (False, True):
        q = arrays[0].copy()
        if poisoned:
            q[0, 150, 1, 7] = np.nan
        tensors = [to_gpu(a, "bfloat16") for a in (q, *arrays[1:])]
        for t in tensors[:3]:
            t.stop_gradient = False
        runs.append(gpu_run(*tensors, idx, True, deterministic=deterministic))
    clean, nan = runs
    assert np.all(np.isnan(nan["out"][0, 150, 1])) and np.isnan(nan["lse"][0, 1, 150])
    assert np.all(np.isnan(nan["dq"][0, 150, 1]))
    others = np.ones(clean["out"].shape, bool)
    others[0, 150, 1] = False
    np.testing.assert_allclose(nan["out"][others], clean["out"][others], rtol=0, atol=0)
    lse_others = np.ones(clean["lse"].shape, bool)
    lse_others[0, 1, 150] = False
    np.testing.assert_allclose(nan["lse"][lse_others], clean["lse"][lse_others], rtol=0, atol=0)
    # the other rows' dQ never reads the NaN row (dK/dV of the keys it sees do, as in the dense backward)
    assert np.all(np.isfinite(nan["dq"][others]))


# --------------------------------------------------------------------------------------
# deterministic backward: dQ query-major without atomics, per-query-head dK/dV slots
# reduced in a fixed order; same tolerances as above, and bit-identical reruns
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim,dtype", [c for c in [(32, "float16"), (64, "bfloat16"), (80, "bfloat16"), (96, "float16"),
                                                  (128, "bfloat16"), (128, "float16"), (256, "float16")]
                                         if c[0] in DIMS])  # 256 in bf16: the deterministic tests below
@pytest.mark.parametrize("heads_k", [1, 2])
@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen", [77, 1000])
def test_deterministic_forms(gpu_kernel, dim, dtype, heads_k, causal, cols, seqlen):
    rng = np.random.default_rng(seed_of("det-idx", heads_k, causal, cols, seqlen))
    idx = None if cols == 0 else random_indices(rng, 2, heads_k, seqlen, seqlen, causal, cols)
    run_gpu_case(seed_of("det", dim, dtype, heads_k, causal, cols, seqlen), 2, seqlen, seqlen, 4, heads_k,
                 dim, causal, idx, dtype=dtype, deterministic=True)


@pytest.mark.parametrize("name", ["causal_document", "share_question"])
@pytest.mark.parametrize("heads_k", [1, 2])
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("seqlen", [77, 1000])
def test_deterministic_packed_masks(gpu_kernel, name, heads_k, dim, seqlen):
    idx, causal = masks.example_mask(name, seqlen, batch_size=2, num_heads=1, seed=seqlen, place=paddle.CPUPlace())
    run_gpu_case(seed_of("det", name, heads_k, dim, seqlen), 2, seqlen, seqlen, 4, heads_k, dim, causal,
                 idx.numpy(), deterministic=True)


@pytest.mark.parametrize("dim", [128, HD256])
@pytest.mark.parametrize("heads_k", [1, 2])
def test_deterministic_fully_masked_rows(gpu_kernel, heads_k, dim):
    idx = fully_masked_rows_indices()
    run_gpu_case(seed_of("det-empty", heads_k) if dim == 128 else seed_of("det-empty", heads_k, dim), 1, 300, 300,
                 4, heads_k, dim, False, idx, deterministic=True)


@pytest.mark.parametrize("dim", [64, HD256])
@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 2), (False, 4)])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(100, 300), (300, 100)])
def test_deterministic_unequal_lengths(gpu_kernel, causal, cols, seqlen_q, seqlen_k, dim):
    # Causal with Sq > Sk: the first Sq - Sk rows see no key (LSE -inf, dQ 0).
    rng = np.random.default_rng(seqlen_q * 7 + seqlen_k)
    idx = None if cols == 0 else random_indices(rng, 1, 1, seqlen_q, seqlen_k, causal, cols)
    seed = seed_of("det", causal, cols, seqlen_q, seqlen_k) if dim == 64 else seed_of("det", causal, cols, seqlen_q,
                                                                                      seqlen_k, dim)
    run_gpu_case(seed, 1, seqlen_q, seqlen_k, 4, 1, dim, causal, idx, deterministic=True)


# --------------------------------------------------------------------------------------
# The FA2-class tiles of the 99 KB GPUs (compute capability 8.6/8.9; kernel_traits.h,
# SmemClass): the forward at 256 and the backward at 64, 96 and 128, run on this GPU under
# PADDLE_FLASHMASK_FA2_SMEM_CLASS=99k (the other kernels have one set of tiles and run as
# always); both backward modes
# --------------------------------------------------------------------------------------


@pytest.fixture
def fa2_kernel():
    """The FA2-class kernels forced for the test (on Hopper too), restored after."""
    old = pfm.set_gpu_kernel("fa2")
    yield
    pfm.set_gpu_kernel(old)


@pytest.fixture
def fa2_99k_tiles(monkeypatch, fa2_kernel):
    monkeypatch.setenv(validation.FA2_SMEM_CLASS_ENV, "99k")


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dim", [64, 80, 96, 128, HD256])  # 80: on 96's 99 KB tiles, padded
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen", [77, 1000])
def test_fa2_99k_tiles_forms(fa2_99k_tiles, deterministic, dim, dtype, causal, cols, seqlen):
    rng = np.random.default_rng(seed_of("99k-idx", causal, cols, seqlen))
    idx = None if cols == 0 else random_indices(rng, 2, 2, seqlen, seqlen, causal, cols)
    run_gpu_case(seed_of("99k", deterministic, dim, dtype, causal, cols, seqlen), 2, seqlen, seqlen, 4, 2, dim,
                 causal, idx, dtype=dtype, deterministic=deterministic)


@pytest.mark.parametrize("dim", [64, 96, 128, HD256])
@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 2), (False, 4)])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(100, 300), (300, 100)])
def test_fa2_99k_tiles_unequal_lengths(fa2_99k_tiles, dim, causal, cols, seqlen_q, seqlen_k):
    rng = np.random.default_rng(seed_of("99k-unequal", causal, cols, seqlen_q, seqlen_k))
    idx = None if cols == 0 else random_indices(rng, 1, 1, seqlen_q, seqlen_k, causal, cols)
    run_gpu_case(seed_of("99k-unequal", dim, causal, cols, seqlen_q, seqlen_k), 1, seqlen_q, seqlen_k, 4, 1, dim,
                 causal, idx)


@pytest.mark.parametrize("dim", [64, 96, 128, HD256])
@pytest.mark.parametrize("name", ["causal_document", "share_question"])
def test_fa2_99k_tiles_packed_masks(fa2_99k_tiles, dim, name):
    idx, causal = masks.example_mask(name, 1000, batch_size=2, num_heads=1, seed=7, place=paddle.CPUPlace())
    run_gpu_case(seed_of("99k-packed", dim, name), 2, 1000, 1000, 8, 2, dim, causal, idx.numpy())


@pytest.mark.parametrize("dim", [64, 96, 128, HD256])
@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 2, 2), (8, 2, 8), (8, 1, 8)])
def test_fa2_99k_tiles_gqa_mask_heads(fa2_99k_tiles, dim, heads, heads_k, hm):
    idx = random_indices(np.random.default_rng(seed_of("99k-gqa", hm)), 2, hm, 333, 333, False, 4)
    run_gpu_case(seed_of("99k-gqa", dim, heads, heads_k, hm), 2, 333, 333, heads, heads_k, dim, False, idx)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dim", [64, 96, 128, HD256])
def test_fa2_99k_tiles_fully_masked_rows(fa2_99k_tiles, deterministic, dim):
    run_gpu_case(seed_of("99k-empty", dim, deterministic), 1, 300, 300, 4, 2, dim, False,
                 fully_masked_rows_indices(), deterministic=deterministic)


@pytest.mark.parametrize("dim", [64, 80, 96, 128])
def test_fa2_99k_tiles_long(fa2_99k_tiles, dim):
    idx, causal = masks.example_mask("causal_document", 4097, batch_size=1, num_heads=1, seed=3,
                                     place=paddle.CPUPlace())
    seed = seed_of("99k-long") if dim == 128 else seed_of("99k-long", dim)
    run_gpu_case(seed, 1, 4097, 4097, 2, 1, dim, causal, idx.numpy(), use_cpu_reference=True)


# --------------------------------------------------------------------------------------
# sm90 backward with several query heads of a GQA group per CTA (dK/dV summed in
# registers; stored when one CTA covers the whole group, added with atomics when not),
# every key block alike or fitted per key block (fewer heads where it has more work)
# --------------------------------------------------------------------------------------

BWD_HEAD_GROUP_ENV = "PADDLE_FLASHMASK_SM90_BWD_HEAD_GROUP"
BWD_GROUP_MAX_STEPS_ENV = "PADDLE_FLASHMASK_SM90_BWD_GROUP_MAX_STEPS"
FWD_PINGPONG_ENV = "PADDLE_FLASHMASK_SM90_FWD_PINGPONG"


@pytest.fixture
def sm90_bwd_head_group(request, monkeypatch):
    """Forces the sm90 kernels and the backward's grouping: request.param is (query heads
    per CTA, most steps of a grouped CTA or None for the default; 0 = every key block alike)."""
    if not is_sm90():
        pytest.skip(f"the sm90 kernels need compute capability 9.0, GPU 0 is {device_capability()}")
    head_group, max_steps = request.param
    monkeypatch.setenv(BWD_HEAD_GROUP_ENV, str(head_group))
    if max_steps is not None:
        monkeypatch.setenv(BWD_GROUP_MAX_STEPS_ENV, str(max_steps))
    old = pfm.set_gpu_kernel("sm90")
    yield request.param
    pfm.set_gpu_kernel(old)


# At 333 rows (6 query blocks of 64), 6 steps mixes key blocks of 4, 2 and 1 heads
# per CTA; the default (80) groups every key block.
HEAD_GROUP_PLANS = [(2, 0), (4, 0), (8, 0), (4, 6), (8, 6), (4, None)]


@pytest.mark.parametrize("sm90_bwd_head_group", HEAD_GROUP_PLANS, indirect=True, ids=str)
@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 2, 2), (8, 2, 8), (8, 1, 1), (8, 1, 8)])
@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 4)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_sm90_bwd_head_groups(sm90_bwd_head_group, heads, heads_k, hm, causal, cols, deterministic):
    rng = np.random.default_rng(seed_of("hg-idx", heads, heads_k, hm, causal, cols))
    idx = None if cols == 0 else random_indices(rng, 2, hm, 333, 333, causal, cols)
    run_gpu_case(seed_of("hg", sm90_bwd_head_group, heads, heads_k, hm, causal, cols), 2, 333, 333, heads,
                 heads_k, 128, causal, idx, deterministic=deterministic)


@pytest.mark.parametrize("sm90_bwd_head_group", [(4, 0), (4, 6)], indirect=True, ids=str)
def test_sm90_bwd_head_group_fully_masked_and_reproducible(sm90_bwd_head_group):
    idx = fully_masked_rows_indices()
    run_gpu_case(seed_of("hg-empty"), 1, 300, 300, 8, 2, 128, False, idx, deterministic=True)
    run_gpu_case(seed_of("hg-empty-nd"), 1, 300, 300, 8, 2, 128, False, idx, deterministic=False)
    q, k, v, dout = gpu_inputs(seed_of("hg-repro"), 1, 300, 300, 8, 2, 128, "bfloat16")
    first = gpu_run(q, k, v, dout, idx, False, deterministic=True)
    again = gpu_run(q, k, v, dout, idx, False, deterministic=True)
    for key in ("out", "lse", "dq", "dk", "dv"):
        np.testing.assert_array_equal(again[key], first[key], err_msg=f"{key} differs between runs")


BWD_FINISH_OVERLAP_ENV = "PADDLE_FLASHMASK_SM90_BWD_FINISH_OVERLAP"


@pytest.mark.parametrize("overlap", ["0", "1"])
@pytest.mark.parametrize("sm90_bwd_head_group", [(4, None), (1, 0)], indirect=True, ids=str)
@pytest.mark.parametrize("dim,dim_v", [(64, None), (192, 128), (256, None)])
@pytest.mark.parametrize("causal,cols", [(True, 1), (False, 2)])
def test_sm90_bwd_finish(sm90_bwd_head_group, monkeypatch, overlap, dim, dim_v, causal, cols):
    # The sm90 backward's finish (dQ tiles; under fitted grouping also the dK/dV blocks left in
    # their fp32 slots) takes its work unit by unit, (batch, kv head), as the main kernel's CTAs
    # count them done: beside their last wave (1, the default) or after the whole kernel (0).
    # Two batches x three kv heads with a mask head each make six units of uneven work.
    monkeypatch.setenv(BWD_FINISH_OVERLAP_ENV, overlap)
    rng = np.random.default_rng(seed_of("finish-idx", causal, cols))
    idx = random_indices(rng, 2, 3, 700, 900, causal, cols)
    run_gpu_case(seed_of("finish", overlap, sm90_bwd_head_group, dim, causal, cols), 2, 700, 900, 6, 3, dim,
                 causal, idx, dim_v=dim_v)


# --------------------------------------------------------------------------------------
# sm90 forward schedules: the intra-warpgroup overlap (softmax of block i under P V of
# block i - 1; the default), the serial loop, pingpong between the consumer warpgroups
# --------------------------------------------------------------------------------------

def set_switch(monkeypatch, name, value):
    """Sets the environment switch `name` to `value`, or (None) unsets it: the op's default."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("light_last", [None, "0", "1", "3", "100"])
@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 1, 8)])
@pytest.mark.parametrize("causal,cols", [(True, 0), (False, 4)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_fa2_bwd_light_last(fa2_kernel, monkeypatch, light_last, heads, heads_k, hm, causal, cols, deterministic):
    # The FA2-class backward runs the last k key blocks of every head after all the others,
    # heads fastest (flashmask_launch.cuh, bwd_light_last; default 16 of 128-key blocks, so at
    # 517 keys every block is deferred): the grid's order (0), a mixed one (1, 3), the default and
    # more than the call has (100), GQA and per-head masks, against the float64 reference.
    set_switch(monkeypatch, "PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST", light_last)
    rng = np.random.default_rng(seed_of("light-idx", heads, heads_k, hm, causal, cols))
    idx = None if cols == 0 else random_indices(rng, 2, hm, 517, 517, causal, cols)
    for dim in (64, 128, 256):
        run_gpu_case(seed_of("light", light_last, heads, heads_k, hm, causal, cols, dim), 2, 517, 517, heads,
                     heads_k, dim, causal, idx, deterministic=deterministic)


@pytest.mark.parametrize("dim", [64, 128])
def test_fa2_bwd_light_last_default_with_blocks_in_the_grid_order(fa2_kernel, dim):
    # 2700 keys: 22 key blocks of 128, so the default defers 16 and runs 6 in the grid's order.
    rng = np.random.default_rng(seed_of("light-long-idx", dim))
    idx = random_indices(rng, 1, 1, 2700, 2700, True, 1)
    run_gpu_case(seed_of("light-long", dim), 1, 2700, 2700, 4, 2, dim, True, idx)


def dkv_direct_indices(monkeypatch, env, direct, hm, seed_name="dkv-direct-idx"):
    """Sets the dK/dV direct-store switch `env` to `direct` (None: unset, the default) and returns
    causal C=1 indices [2, hm, 517, 1] in which keys 128-300 are seen by no query row, so a CTA
    with no live query block must store zeros (every buffer comes from paddle.empty); 517 keys end
    in a ragged block."""
    set_switch(monkeypatch, env, direct)
    rng = np.random.default_rng(seed_of(seed_name, hm))
    idx = random_indices(rng, 2, hm, 517, 517, True, 1)
    idx[:, :, 128:301, 0] = np.arange(128, 301, dtype=idx.dtype)  # start at the diagonal: no row
    return idx


@pytest.mark.parametrize("direct", [None, "0"])
@pytest.mark.parametrize("gqa_heads", [None, "0"])
@pytest.mark.parametrize("heads_k,hm", [(4, 1), (4, 4), (2, 1), (1, 4)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_fa2_bwd_dkv_direct(fa2_kernel, monkeypatch, direct, gqa_heads, heads_k, hm, deterministic):
    # The FA2-class backward stores dK/dV in the output dtype itself (the default,
    # BwdParams::dkv_direct): straight into dk/dv without GQA, and with GQA (groups of up to 4, or
    # in deterministic mode) per query head into dk_heads/dv_heads that bwd_finish sums per kv
    # head; or (=0, and with PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS=0 for GQA outside deterministic
    # mode) adds them into fp32 slots converted after it; 4 query heads over 4, 2 or 1 kv heads,
    # masks shared or per head, a key block no query row sees (dkv_direct_indices).
    set_switch(monkeypatch, "PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS", gqa_heads)
    idx = dkv_direct_indices(monkeypatch, "PADDLE_FLASHMASK_FA2_BWD_DKV_DIRECT", direct, hm)
    for dim in (64, 128, 256):
        run_gpu_case(seed_of("dkv-direct", direct, gqa_heads, heads_k, hm, deterministic, dim), 2, 517, 517, 4,
                     heads_k, dim, True, idx, deterministic=deterministic)


@pytest.mark.parametrize("direct", [None, "0"])
@pytest.mark.parametrize("heads_k,hm", [(4, 1), (4, 4), (2, 1)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_sm90_bwd_dkv_direct(monkeypatch, direct, heads_k, hm, deterministic):
    # The Hopper backward without GQA stores dK/dV in the output dtype itself (the default,
    # sm90::bwd_dkv_direct) or (=0) stores them into fp32 slots converted after it; with GQA the
    # switch changes nothing. A key block no query row sees (dkv_direct_indices; 64-key CTAs at
    # 256); 80 runs on 96's tiles (its columns 80-95 never stored), 192 with value 128 (no
    # deterministic mode).
    if not is_sm90():
        pytest.skip(f"the sm90 kernels need compute capability 9.0, GPU 0 is {device_capability()}")
    idx = dkv_direct_indices(monkeypatch, "PADDLE_FLASHMASK_SM90_BWD_DKV_DIRECT", direct, hm, "sm90-dkv-direct-idx")
    old = pfm.set_gpu_kernel("sm90")
    try:
        for dim, dim_v in ((64, None), (80, None), (128, None), (HD256, None), (MLA_DIM, MLA_DIM_V)):
            if deterministic and dim > 128:
                continue  # the Hopper backward has no deterministic mode past 128
            run_gpu_case(seed_of("sm90-dkv-direct", direct, heads_k, hm, deterministic, dim), 2, 517, 517, 4,
                         heads_k, dim, True, idx, deterministic=deterministic, dim_v=dim_v)
    finally:
        pfm.set_gpu_kernel(old)


FWD_OVERLAP_ENV = "PADDLE_FLASHMASK_SM90_FWD_OVERLAP"
# (pingpong, overlap); pingpong takes precedence (flashmask_sm90_launch.cuh)
FWD_SCHEDULES = {"pingpong": (1, 0), "overlap": (0, 1), "serial": (0, 0)}


@pytest.fixture
def sm90_fwd_schedule(request, monkeypatch):
    """Forces the sm90 kernels and one forward schedule (a key of FWD_SCHEDULES)."""
    if not is_sm90():
        pytest.skip(f"the sm90 kernels need compute capability 9.0, GPU 0 is {device_capability()}")
    pingpong, overlap = FWD_SCHEDULES[request.param]
    monkeypatch.setenv(FWD_PINGPONG_ENV, str(pingpong))
    monkeypatch.setenv(FWD_OVERLAP_ENV, str(overlap))
    old = pfm.set_gpu_kernel("sm90")
    yield request.param
    pfm.set_gpu_kernel(old)


@pytest.mark.parametrize("sm90_fwd_schedule", list(FWD_SCHEDULES), indirect=True)
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(77, 77), (1000, 1000), (300, 517)])
def test_sm90_fwd_schedules(sm90_fwd_schedule, dim, causal, cols, seqlen_q, seqlen_k):
    rng = np.random.default_rng(seed_of("pp-idx", causal, cols, seqlen_q, seqlen_k))
    idx = None if cols == 0 else random_indices(rng, 2, 2, seqlen_q, seqlen_k, causal, cols)
    run_gpu_case(seed_of("pp", dim, causal, cols, seqlen_q, seqlen_k), 2, seqlen_q, seqlen_k, 4, 2, dim, causal,
                 idx)


@pytest.mark.parametrize("sm90_fwd_schedule", list(FWD_SCHEDULES), indirect=True)
def test_sm90_fwd_schedules_fully_masked_rows(sm90_fwd_schedule):
    idx = fully_masked_rows_indices()
    run_gpu_case(seed_of("pp-empty"), 1, 300, 300, 8, 2, 128, False, idx)


FWD_GQA_TILES_ENV = "PADDLE_FLASHMASK_SM90_FWD_GQA_TILES"


@pytest.mark.parametrize("gqa_tiles", [0, 1])
@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 2, 8), (6, 3, 3), (4, 4, 1)])
@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 2)])
def test_sm90_fwd_tile_orders(monkeypatch, gqa_tiles, heads, heads_k, hm, causal, cols):
    # The persistent forward's tile order: a GQA group's query heads side by side (1, the
    # default) or one head's query blocks side by side (0); every tile exactly once either way.
    if not is_sm90():
        pytest.skip(f"the sm90 kernels need compute capability 9.0, GPU 0 is {device_capability()}")
    monkeypatch.setenv(FWD_GQA_TILES_ENV, str(gqa_tiles))
    old = pfm.set_gpu_kernel("sm90")
    try:
        rng = np.random.default_rng(seed_of("tiles-idx", heads, heads_k, hm, causal, cols))
        idx = None if cols == 0 else random_indices(rng, 3, hm, 517, 517, causal, cols)
        run_gpu_case(seed_of("tiles", gqa_tiles, heads, heads_k, hm, causal, cols), 3, 517, 517, heads, heads_k,
                     128, causal, idx)
    finally:
        pfm.set_gpu_kernel(old)


FWD_WIDE_KEYS_ENV = "PADDLE_FLASHMASK_SM90_FWD_WIDE_KEYS"


@pytest.mark.parametrize("wide", ["0", "1"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads,heads_k", [(2, 300, 517, 4, 2), (1, 1000, 1056, 4, 1),
                                                                    (2, 2048, 2100, 16, 4)])
def test_sm90_fwd_wide_keys(monkeypatch, wide, dtype, batch, seqlen_q, seqlen_k, heads, heads_k):
    # Calls with no mask at head dim 128 take the Hopper forward's 176-key tiles (1, the default)
    # or its 128-key kernel (0): a ragged last key block (517 = 2 x 176 + 165), none (1056 =
    # 6 x 176), and about 4 tiles per CTA over the one Q buffer (2048 rows x 16 heads x 2).
    if not is_sm90():
        pytest.skip(f"the sm90 kernels need compute capability 9.0, GPU 0 is {device_capability()}")
    monkeypatch.setenv(FWD_WIDE_KEYS_ENV, wide)
    old = pfm.set_gpu_kernel("sm90")
    try:
        run_gpu_case(seed_of("wide", wide, dtype, seqlen_q, seqlen_k), batch, seqlen_q, seqlen_k, heads, heads_k,
                     128, False, dtype=dtype)
    finally:
        pfm.set_gpu_kernel(old)


def _long_tiles_first(monkeypatch, first):
    """Both Hopper orders on (first "1") or off ("0"), their floors at 1 so that short calls have
    many heavy tiles and chains."""
    for name in ("PADDLE_FLASHMASK_SM90_FWD_HEAVY_FIRST", "PADDLE_FLASHMASK_SM90_BWD_CHAINS_FIRST"):
        monkeypatch.setenv(name, first)
    for name in ("PADDLE_FLASHMASK_SM90_FWD_HEAVY_MIN_BLOCKS", "PADDLE_FLASHMASK_SM90_BWD_CHAIN_MIN_STEPS"):
        monkeypatch.setenv(name, "1")


def _global_rows_indices(rng, batch, mask_heads, seqlen):
    """Global tokens beside a window (their rows see every key, every row sees them), the
    global count and window per (batch, mask head)."""
    rows = []
    for _ in range(batch):
        heads = [masks.global_sliding_window_mask(seqlen, int(rng.integers(1, 70)), int(rng.integers(20, 200)),
                                                  place="numpy")[0, 0] for _ in range(mask_heads)]
        rows.append(np.stack(heads))
    return np.ascontiguousarray(np.stack(rows), dtype=np.int32)


@pytest.mark.parametrize("first", ["0", "1"])
@pytest.mark.parametrize("sorted_order", ["0", "1"])
@pytest.mark.parametrize("batch,heads,heads_k,hm", [(2, 8, 2, 1), (2, 8, 2, 8), (3, 6, 3, 3), (1, 4, 4, 1)])
def test_sm90_long_tiles_first(monkeypatch, first, sorted_order, batch, heads, heads_k, hm):
    # The Hopper forward's heavy tiles and the backward's chains first (fwd_tile_order.cuh,
    # bwd_cta_order.cuh), their floors lowered to 1 so that a short call has many of them: every
    # tile and key block exactly once, whichever order, on the global rows' mask whose long rows
    # and columns are what they are for; the backward sorted within groups or not.
    if not is_sm90():
        pytest.skip(f"the sm90 kernels need compute capability 9.0, GPU 0 is {device_capability()}")
    _long_tiles_first(monkeypatch, first)
    monkeypatch.setenv("PADDLE_FLASHMASK_SM90_BWD_ORDER", sorted_order)
    old = pfm.set_gpu_kernel("sm90")
    try:
        rng = np.random.default_rng(seed_of("long-tiles-idx", batch, heads, hm))
        idx = _global_rows_indices(rng, batch, hm, 1037)
        run_gpu_case(seed_of("long-tiles", first, sorted_order, batch, heads, hm), batch, 1037, 1037, heads, heads_k,
                     128, False, idx)
    finally:
        pfm.set_gpu_kernel(old)


@pytest.mark.parametrize("dim", [64, 96, 256])
def test_sm90_long_tiles_first_head_dims(monkeypatch, dim):
    # The same orders at the other head dims' tiles (64-key blocks at 256).
    if not is_sm90():
        pytest.skip(f"the sm90 kernels need compute capability 9.0, GPU 0 is {device_capability()}")
    _long_tiles_first(monkeypatch, "1")
    old = pfm.set_gpu_kernel("sm90")
    try:
        rng = np.random.default_rng(seed_of("long-tiles-dims-idx", dim))
        idx = _global_rows_indices(rng, 2, 2, 777)
        run_gpu_case(seed_of("long-tiles-dims", dim), 2, 777, 777, 4, 2, dim, False, idx)
    finally:
        pfm.set_gpu_kernel(old)


def _fa2_long_ctas_first(monkeypatch, first):
    """Both FA2-class CTA orders on (first "1") or off ("0"), their floors at 1 so that short calls
    have many heavy CTAs."""
    for name in ("PADDLE_FLASHMASK_FA2_FWD_HEAVY_FIRST", "PADDLE_FLASHMASK_FA2_BWD_HEAVY_FIRST"):
        monkeypatch.setenv(name, first)
    for name in ("PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS", "PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS"):
        monkeypatch.setenv(name, "1")


@pytest.mark.parametrize("first", ["0", "1"])
@pytest.mark.parametrize("light_last", ["0", "3"])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("batch,heads,heads_k,hm", [(2, 8, 2, 1), (2, 8, 2, 8), (3, 6, 3, 3), (1, 4, 4, 1)])
def test_fa2_long_ctas_first(fa2_kernel, monkeypatch, first, light_last, deterministic, batch, heads, heads_k, hm):
    # The FA2-class kernels' heavy CTAs first (cuda/fa2_cta_order.cuh), their floors lowered to 1
    # so that a short call has many: every tile and key block exactly once, whichever order, on
    # the global rows' mask whose long rows and columns are what the order is for; the backward's
    # ranks with and without deferred rows (light_last), GQA and per-head masks.
    _fa2_long_ctas_first(monkeypatch, first)
    monkeypatch.setenv("PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST", light_last)
    rng = np.random.default_rng(seed_of("fa2-long-ctas-idx", batch, heads, hm))
    idx = _global_rows_indices(rng, batch, hm, 1037)
    run_gpu_case(seed_of("fa2-long-ctas", first, light_last, deterministic, batch, heads, hm), batch, 1037, 1037,
                 heads, heads_k, 128, False, idx, deterministic=deterministic)


@pytest.mark.parametrize("dim", [64, 80, 96, 256])
@pytest.mark.parametrize("causal,cols", [(False, 2), (True, 1), (True, 2), (False, 4)])
def test_fa2_long_ctas_first_head_dims(fa2_kernel, monkeypatch, dim, causal, cols):
    # The same orders on the other head dims' tiles (64-key blocks and 64-row forward tiles at
    # 256, 128-row backward steps at 64) and on other mask forms, keys and rows ragged.
    _fa2_long_ctas_first(monkeypatch, "1")
    rng = np.random.default_rng(seed_of("fa2-long-ctas-dims-idx", dim, causal, cols))
    global_rows = not causal and cols == 2
    idx = _global_rows_indices(rng, 2, 2, 777) if global_rows else random_indices(rng, 2, 2, 777, 777, causal, cols)
    run_gpu_case(seed_of("fa2-long-ctas-dims", dim, causal, cols), 2, 777, 777, 4, 2, dim, causal, idx)


@pytest.mark.parametrize("split", [False, True])
def test_fa2_long_ctas_first_split_and_99k(fa2_kernel, monkeypatch, split):
    # The split backward (PADDLE_FLASHMASK_FA2_BWD=split), which keeps the grid's order behind an
    # ordered forward, and the ordered launches on the 99 KB tiles (the forward at 256 on 4 warps,
    # the backward's narrow key blocks).
    _fa2_long_ctas_first(monkeypatch, "1")
    if split:
        monkeypatch.setenv("PADDLE_FLASHMASK_FA2_BWD", "split")
    else:
        monkeypatch.setenv(validation.FA2_SMEM_CLASS_ENV, "99k")
    rng = np.random.default_rng(seed_of("fa2-long-ctas-split-idx", split))
    idx = _global_rows_indices(rng, 2, 1, 901)
    for dim in (64, 128) if split else (128, HD256):
        run_gpu_case(seed_of("fa2-long-ctas-split", split, dim), 2, 901, 901, 8, 2, dim, False, idx)


FA2_FWD_HEAD_PAIRS_ENV = "PADDLE_FLASHMASK_FA2_FWD_HEAD_PAIRS"
FA2_FWD_HEAD_QUADS_ENV = "PADDLE_FLASHMASK_FA2_FWD_HEAD_QUADS"


def _head_tiles_case(monkeypatch, tag, quads, dim, heads, heads_k, hm, causal, cols):
    """One multi-head-tile case (pairs on, quads as given) on random indices, 2 x 333 rows and keys,
    against the dense reference; `tag` names its seeds."""
    monkeypatch.setenv(FA2_FWD_HEAD_PAIRS_ENV, "1")
    monkeypatch.setenv(FA2_FWD_HEAD_QUADS_ENV, quads)
    rng = np.random.default_rng(seed_of(f"{tag}-idx", heads, hm, causal, cols))
    idx = random_indices(rng, 2, hm, 333, 333, causal, cols)
    run_gpu_case(seed_of(tag, dim, heads, heads_k, hm, causal, cols), 2, 333, 333, heads, heads_k, dim, causal, idx)


@pytest.mark.parametrize("dim", [64, 80, 128, HD256])
@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 4, 4), (6, 3, 3), (4, 1, 1), (8, 2, 8)])
@pytest.mark.parametrize("causal,cols", [(True, 1), (False, 2), (True, 2), (False, 4)])
def test_fa2_forward_head_pairs(fa2_kernel, monkeypatch, dim, heads, heads_k, hm, causal, cols):
    # The FA2-class forward's head pairs (cuda/fwd_grid.h: two query heads' 64-row blocks a
    # tile, in calls with a column mask) where the heads pair up (groups of 4, 2 and 2 with 1
    # or Hk mask heads; 4 query heads on one KV head) and, with 8 mask heads for 8 query heads,
    # where they do not (one head's 128 rows); ragged rows and keys, every column form. Quads
    # off, so that the groups of 4 pair too.
    _head_tiles_case(monkeypatch, "fa2-pairs", "0", dim, heads, heads_k, hm, causal, cols)


@pytest.mark.parametrize("dim", [80, 96, HD256])
@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 1, 1), (16, 4, 4), (4, 1, 1), (12, 6, 1)])
@pytest.mark.parametrize("causal,cols", [(True, 1), (False, 2), (True, 2), (False, 4)])
def test_fa2_forward_head_quads(fa2_kernel, monkeypatch, dim, heads, heads_k, hm, causal, cols):
    # Head quads (cuda/fwd_grid.h: four query heads' 32-row blocks a tile; the head dims that
    # take them, flashmask_launch.cuh's fwd_takes_quads, 80 on 96's tiles) where the GQA groups
    # split into fours (groups of 4 and 8, one or Hk mask heads) and, with groups of 2, where
    # they do not (pairs); ragged rows and keys, every column form.
    _head_tiles_case(monkeypatch, "fa2-quads", "1", dim, heads, heads_k, hm, causal, cols)


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("dim", [32, 96, 128, HD256])
@pytest.mark.parametrize("causal,cols,hm", [(True, 1, 1), (True, 2, 2), (False, 2, 2), (False, 4, 1)])
def test_fa2_forward_head_pairs_bitwise(fa2_kernel, monkeypatch, ordered, dim, causal, cols, hm):
    # Pairing changes which rows share a tile, not what a row computes: a row meets its visible
    # key blocks in the same order, and a block that one head's 128-row tile runs and a 64-row
    # block skips is masked for every row of that block (its scores -inf: P = 0, the row's
    # maximum and sum unchanged). So out and LSE, and the deterministic gradients computed from
    # them, are bit for bit those of single-head tiles, for pairs (64-row blocks) and quads
    # (32-row blocks of the 8:2 heads' groups of 4, at the head dims that take them: 96 and 256;
    # pairs again at the others); in the grid's order and, with the order's
    # floors at 1, in the longest-first one (the tiles' own passes over their row blocks).
    skip_unsupported(dim)
    if ordered:
        _fa2_long_ctas_first(monkeypatch, "1")
    rng = np.random.default_rng(seed_of("fa2-pairs-bitwise-idx", causal, cols, hm))
    idx = random_indices(rng, 1, hm, 1000, 1000, causal, cols)
    q, k, v, dout = gpu_inputs(seed_of("fa2-pairs-bitwise", ordered, dim, causal, cols), 1, 1000, 1000, 8, 2, dim,
                               "bfloat16")
    runs = {}
    for tiles, pairs, quads in (("one head", "0", "1"), ("pairs", "1", "0"), ("quads", "1", "1")):
        monkeypatch.setenv(FA2_FWD_HEAD_PAIRS_ENV, pairs)
        monkeypatch.setenv(FA2_FWD_HEAD_QUADS_ENV, quads)
        runs[tiles] = gpu_run(q, k, v, dout, idx, causal, deterministic=True)
    for tiles in ("pairs", "quads"):
        for key in ("out", "lse", "dq", "dk", "dv"):
            np.testing.assert_array_equal(runs[tiles][key], runs["one head"][key], err_msg=f"{key}: head {tiles} differ")


def _short_document_lengths(rng, seqlen):
    """Documents of 100-300 tokens filling `seqlen` (the last cut short): tiles of 1-3 live key blocks."""
    lens = []
    while sum(lens) < seqlen:
        lens.append(min(int(rng.integers(100, 301)), seqlen - sum(lens)))
    return lens


def _many_tiles_indices(mask, batch, seqlen):
    """Causal indices of the many-tiles tests (None: plain causal)."""
    rng = np.random.default_rng(seed_of("many-tiles", mask))
    if mask == "short_documents":
        return masks.causal_document_mask(_short_document_lengths(rng, seqlen), seqlen, batch, place="numpy")
    if mask == "empty_query_blocks":  # every column masks rows [512, 768)
        idx = np.zeros((batch, 1, seqlen, 2), dtype=np.int32)
        idx[..., 0], idx[..., 1] = 512, 768
        return idx
    return None


@pytest.mark.parametrize("sm90_fwd_schedule", list(FWD_SCHEDULES), indirect=True)
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("mask", ["causal", "short_documents", "empty_query_blocks"])
def test_sm90_fwd_many_tiles_per_cta(sm90_fwd_schedule, dim, mask):
    # 512 tiles, about 4 per CTA of the persistent forward (the tests above give each CTA
    # one): tiles back to back in one CTA, tiles of no live block (rows 512..767 see
    # nothing) between them, a GQA group's heads side by side.
    batch, seqlen, heads, heads_k = 2, 2048, 16, 4
    causal, idx = True, _many_tiles_indices(mask, batch, seqlen)
    run_gpu_case(seed_of("many-tiles", sm90_fwd_schedule, dim, mask), batch, seqlen, seqlen, heads, heads_k, dim,
                 causal, idx, use_cpu_reference=True)


REPRO_CASES = {
    # name: (heads, heads_k, seqlen, causal, mask builder or None)
    "gqa8to1_causal_document": (8, 1, 2048, True, "causal_document"),
    "gqa4to2_share_question": (4, 2, 1000, True, "share_question"),
    "mha_full": (2, 2, 777, False, None),
}


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("case", sorted(REPRO_CASES))
def test_deterministic_is_bitwise_reproducible(gpu_kernel, dim, case):
    skip_unsupported(dim)
    heads, heads_k, seqlen, causal, name = REPRO_CASES[case]
    idx = None
    if name is not None:
        idx = masks.example_mask(name, seqlen, batch_size=2, num_heads=1, seed=5, place=paddle.CPUPlace())[0].numpy()
    q, k, v, dout = gpu_inputs(seed_of("repro", case, dim), 2, seqlen, seqlen, heads, heads_k, dim, "bfloat16")
    first = gpu_run(q, k, v, dout, idx, causal, deterministic=True)
    for _ in range(3):
        again = gpu_run(q, k, v, dout, idx, causal, deterministic=True)
        for key in ("out", "lse", "dq", "dk", "dv"):
            np.testing.assert_array_equal(again[key], first[key], err_msg=f"{key} differs between runs")


def test_deterministic_default_follows_paddle_flag():
    # deterministic=None reads FLAGS_cudnn_deterministic through Paddle's flag registry
    # (attention._paddle_flags), which GPU builds of Paddle have and CPU builds lack: read
    # here for real, with no patched registry.
    flag = "FLAGS_cudnn_deterministic"
    old = paddle.get_flags([flag])[flag]
    try:
        for value in (True, False, True):
            paddle.set_flags({flag: value})
            assert pfm.attention._default_deterministic() is value
        # the call itself takes the deterministic path: on the Hopper, 192/128 refuses it
        # (elsewhere the head dims themselves are refused first)
        if is_sm90():
            q, k, v = _hopper_only_inputs(MLA_DIM, MLA_DIM_V)
            with pytest.raises(ValueError, match=f"deterministic=True with head_dim {MLA_DIM}"):
                pfm.flashmask_attention(q, k, v, causal=True)
    finally:
        paddle.set_flags({flag: old})
    assert pfm.attention._default_deterministic() is bool(old)


def test_sm90_helper_recognises_hopper():
    # The sm90 cases must never be skipped on an H100/H200 because of is_sm90().
    name = paddle.device.cuda.get_device_name(0)
    if re.search(r"\bG?H(100|200|800|20)\b", name):
        assert is_sm90(), f"{name} reports compute capability {device_capability()}"


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 4)])
def test_auto_takes_head_dim_256(causal, cols, deterministic):
    # "auto" on any GPU: the Hopper kernels on compute capability 9.0 (deterministic: their
    # forward, then the FA2-class backward), the FA2-class ones elsewhere.
    old = pfm.set_gpu_kernel("auto")
    try:
        idx = None if cols == 0 else random_indices(np.random.default_rng(256), 2, 2, 333, 333, causal, cols)
        run_gpu_case(seed_of("auto256", causal, cols, deterministic), 2, 333, 333, 8, 2, HD256, causal, idx,
                     deterministic=deterministic)
    finally:
        pfm.set_gpu_kernel(old)


@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 4)])
def test_auto_takes_head_dim_96(causal, cols):
    # "auto": the Hopper kernels on a compute capability 9.0 GPU (they take 96 too), the FA2-class ones elsewhere.
    old = pfm.set_gpu_kernel("auto")
    try:
        idx = None if cols == 0 else random_indices(np.random.default_rng(96), 2, 2, 333, 333, causal, cols)
        run_gpu_case(seed_of("auto96", causal, cols), 2, 333, 333, 8, 2, 96, causal, idx)
    finally:
        pfm.set_gpu_kernel(old)


@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 4)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_auto_takes_head_dim_80(causal, cols, deterministic):
    # "auto": on a Hopper the Hopper kernels (deterministic: the Hopper backward with the FA2-class
    # dQ pass), elsewhere the FA2-class ones, all on head dim 96's tiles with the last 16 columns
    # zero on load and never stored (GQA 8:2, ragged length).
    old = pfm.set_gpu_kernel("auto")
    try:
        idx = None if cols == 0 else random_indices(np.random.default_rng(80), 2, 2, 333, 333, causal, cols)
        run_gpu_case(seed_of("auto80", causal, cols, deterministic), 2, 333, 333, 8, 2, 80, causal, idx,
                     deterministic=deterministic)
    finally:
        pfm.set_gpu_kernel(old)


def test_forced_sm90_raises_where_it_cannot_run():
    # Elsewhere than compute capability 9.0 any call; on it, a head dim sm90 does not take.
    dim = 32 if is_sm90() else 64
    if is_sm90() and dim in SM90_HEAD_DIMS:
        pytest.skip("the sm90 kernels take every head dim the FA2 ones do")
    q, k, v, _ = gpu_inputs(0, 1, 64, 64, 2, 2, dim, "bfloat16")
    old = pfm.set_gpu_kernel("sm90")
    try:
        with pytest.raises(ValueError, match="sm90"):
            to_host_f64(pfm.flashmask_attention(q, k, v, causal=True))
    finally:
        pfm.set_gpu_kernel(old)


def test_query_rows_beyond_the_fa2_grid_rejected():
    # The FA2-class forward's grid holds 65535 query blocks (launch_rows_heads_fastest): one row
    # more is a ValueError naming the limit, before the op. Cross-attention with few keys keeps
    # the tensors small (the query: 537 MB); deterministic halves the block.
    for deterministic in (False, True):
        rows = validation.fa2_max_query_rows(32, deterministic) + 1
        q = to_gpu(np.zeros((1, rows, 1, 32), np.float32), "bfloat16")
        k = to_gpu(np.ones((1, 128, 1, 32), np.float32), "bfloat16")
        with pytest.raises(ValueError, match="at most .* query rows per call"):
            pfm.flashmask_attention(q, k, k, causal=False, deterministic=deterministic)
        del q


def test_bad_indices_rejected_on_gpu():
    q = to_gpu(np.random.default_rng(0).standard_normal((1, 64, 2, 64)).astype(np.float32), "bfloat16")
    bad = np.full((1, 1, 64, 1), 65, dtype=np.int32)
    with pytest.raises(ValueError, match="startend_row_indices"):
        pfm.flashmask_attention(q, q, q, paddle.to_tensor(bad, place=gpu()), causal=True)


# --------------------------------------------------------------------------------------
# head dim 256 on both families (the `gpu_kernel` fixture: FA2-class on every GPU, Hopper on
# compute capability 9.0), beyond the per-family tests above (forms and lengths, deterministic)
# that take it from DIMS. Few sizes: the float64 reference grows with the head dim.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(100, 300), (300, 100)])
def test_head_dim_256_unequal_lengths(gpu_kernel, causal, cols, seqlen_q, seqlen_k):
    rng = np.random.default_rng(seqlen_q * 7 + seqlen_k)
    idx = None if cols == 0 else random_indices(rng, 1, 1, seqlen_q, seqlen_k, causal, cols)
    run_gpu_case(seed_of("hd256", causal, cols, seqlen_q, seqlen_k), 1, seqlen_q, seqlen_k, 4, 1, HD256,
                 causal, idx, deterministic=False)


@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 2, 8), (8, 1, 8)])
def test_head_dim_256_gqa_mask_heads(gpu_kernel, heads, heads_k, hm):
    idx = random_indices(np.random.default_rng(heads * 10 + hm), 2, hm, 333, 333, False, 4)
    run_gpu_case(seed_of("hd256", heads, heads_k, hm), 2, 333, 333, heads, heads_k, HD256, False, idx,
                 deterministic=False)


@pytest.mark.parametrize("name", ["causal_document", "share_question"])
@pytest.mark.parametrize("heads_k", [1, 2])
def test_head_dim_256_packed_masks(gpu_kernel, name, heads_k):
    idx, causal = masks.example_mask(name, 1000, batch_size=2, num_heads=1, seed=1000, place=paddle.CPUPlace())
    run_gpu_case(seed_of("hd256", name, heads_k), 2, 1000, 1000, 4, heads_k, HD256, causal, idx.numpy(),
                 deterministic=False)


def test_head_dim_256_fully_masked_rows(gpu_kernel):
    idx = fully_masked_rows_indices()
    run_gpu_case(seed_of("hd256-empty"), 1, 300, 300, 4, 2, HD256, False, idx, deterministic=False)


@pytest.mark.parametrize("sm90_fwd_schedule", list(FWD_SCHEDULES), indirect=True)
@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 4)])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1000, 1000), (300, 517)])
def test_head_dim_256_fwd_schedules(sm90_fwd_schedule, causal, cols, seqlen_q, seqlen_k):
    rng = np.random.default_rng(seed_of("pp-idx", causal, cols, seqlen_q, seqlen_k))
    idx = None if cols == 0 else random_indices(rng, 2, 2, seqlen_q, seqlen_k, causal, cols)
    run_gpu_case(seed_of("pp", HD256, causal, cols, seqlen_q, seqlen_k), 2, seqlen_q, seqlen_k, 4, 2,
                 HD256, causal, idx, deterministic=False)


@pytest.mark.parametrize("mask", ["causal", "short_documents", "empty_query_blocks"])
def test_head_dim_256_many_tiles_per_cta(gpu_kernel, mask):
    # sm90: about 4 tiles per CTA of the persistent forward, as test_sm90_fwd_many_tiles_per_cta
    # (default schedule only): the next tile's Q waits on the last one's GEMMs at this head dim;
    # fa2: 2048 tokens, 16 heads, plain causal / short documents / empty query blocks
    batch, seqlen, heads, heads_k = 2, 2048, 16, 4
    causal, idx = True, _many_tiles_indices(mask, batch, seqlen)
    run_gpu_case(seed_of("many-tiles-hd256", mask), batch, seqlen, seqlen, heads, heads_k, HD256, causal,
                 idx, use_cpu_reference=True, deterministic=False)




# --------------------------------------------------------------------------------------
# head dim 192 with value head dim 128 (MLA): the Hopper kernels only (compute capability
# 9.0, not "fa2", non-deterministic backward only, 2^18 tokens per call);
# the one pair whose value has a head dim of its own on GPU. out and dV have 128 columns.
# --------------------------------------------------------------------------------------


@pytest.fixture
def mla_dims():
    """The sm90 kernels forced, for head dims 192/128 (skipped where they do not run)."""
    if not is_sm90():
        pytest.skip(f"head dims {MLA_DIM}/{MLA_DIM_V} need compute capability 9.0, GPU 0 is {device_capability()}")
    old = pfm.set_gpu_kernel("sm90")
    yield MLA_DIM, MLA_DIM_V
    pfm.set_gpu_kernel(old)


def run_mla_case(seed, batch, seqlen_q, seqlen_k, heads, heads_k, causal, indices=None, **kwargs):
    """run_gpu_case at q/k 192, v 128, non-deterministic."""
    return run_gpu_case(seed, batch, seqlen_q, seqlen_k, heads, heads_k, MLA_DIM, causal, indices,
                        deterministic=False, dim_v=MLA_DIM_V, **kwargs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen", [77, 1000])
def test_head_dim_192_128_forms(mla_dims, dtype, causal, cols, seqlen):
    idx = None if cols == 0 else random_indices(np.random.default_rng(seqlen), 2, 2, seqlen, seqlen, causal, cols)
    run_mla_case(seed_of("mla", dtype, causal, cols, seqlen), 2, seqlen, seqlen, 4, 2, causal, idx, dtype=dtype)


@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 2), (False, 4)])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(100, 300), (300, 100)])
def test_head_dim_192_128_unequal_lengths(mla_dims, causal, cols, seqlen_q, seqlen_k):
    # causal with Sq > Sk: the first Sq - Sk rows see no key
    rng = np.random.default_rng(seqlen_q * 7 + seqlen_k)
    idx = None if cols == 0 else random_indices(rng, 1, 1, seqlen_q, seqlen_k, causal, cols)
    run_mla_case(seed_of("mla", causal, cols, seqlen_q, seqlen_k), 1, seqlen_q, seqlen_k, 4, 1, causal, idx,
                 dtype="float16")


@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 2, 2), (8, 2, 8), (8, 1, 8)])
def test_head_dim_192_128_gqa_mask_heads(mla_dims, heads, heads_k, hm):
    idx = random_indices(np.random.default_rng(heads * 10 + hm), 2, hm, 333, 333, False, 4)
    run_mla_case(seed_of("mla", heads, heads_k, hm), 2, 333, 333, heads, heads_k, False, idx)


@pytest.mark.parametrize("name", ["causal_document", "share_question"])
@pytest.mark.parametrize("heads_k", [1, 2])
def test_head_dim_192_128_packed_masks(mla_dims, name, heads_k):
    idx, causal = masks.example_mask(name, 1000, batch_size=2, num_heads=1, seed=1000, place=paddle.CPUPlace())
    run_mla_case(seed_of("mla", name, heads_k), 2, 1000, 1000, 4, heads_k, causal, idx.numpy())


def test_head_dim_192_128_fully_masked_rows(mla_dims):
    idx = fully_masked_rows_indices()
    run_mla_case(seed_of("mla-empty"), 1, 300, 300, 4, 2, False, idx)


@pytest.mark.parametrize("sm90_fwd_schedule", list(FWD_SCHEDULES), indirect=True)
@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 4)])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1000, 1000), (300, 517)])
def test_head_dim_192_128_fwd_schedules(sm90_fwd_schedule, causal, cols, seqlen_q, seqlen_k):
    rng = np.random.default_rng(seed_of("pp-idx", causal, cols, seqlen_q, seqlen_k))
    idx = None if cols == 0 else random_indices(rng, 2, 2, seqlen_q, seqlen_k, causal, cols)
    run_mla_case(seed_of("pp", MLA_DIM, causal, cols, seqlen_q, seqlen_k), 2, seqlen_q, seqlen_k, 4, 2, causal, idx)


@pytest.mark.parametrize("mask", ["causal", "short_documents", "empty_query_blocks"])
def test_head_dim_192_128_many_tiles_per_cta(mla_dims, mask):
    # about 4 tiles per CTA of the persistent forward, as test_sm90_fwd_many_tiles_per_cta
    # (default schedule only)
    batch, seqlen, heads, heads_k = 2, 2048, 16, 4
    causal, idx = True, _many_tiles_indices(mask, batch, seqlen)
    run_mla_case(seed_of("many-tiles-mla", mask), batch, seqlen, seqlen, heads, heads_k, causal, idx,
                 use_cpu_reference=True)


@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 0), (False, 4)])
def test_head_dim_192_128_long_sequence_pieces(mla_dims, monkeypatch, causal, cols):
    # as test_long_sequence_pieces: cut at 512 tokens (beyond 2^18 at this head dim unforced)
    monkeypatch.setenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", "512")
    S = 1300
    idx = None if cols == 0 else random_indices(np.random.default_rng(S + cols), 1, 2, S, S, causal, cols)
    run_mla_case(seed_of("pieces-mla", causal, cols), 1, S, S, 8, 2, causal, idx)




# The Hopper-only head dims (q/k, v) and how the messages name them (256 is not among them
# since the FA2-class kernels take it: test_auto_takes_head_dim_256 and the tests above).
HOPPER_ONLY_PAIRS = [pytest.param(MLA_DIM, MLA_DIM_V, "head_dim 192 with value head_dim 128", id="192-128")]


@pytest.mark.parametrize("dim,dim_v,label", HOPPER_ONLY_PAIRS)
def test_auto_takes_hopper_only_head_dims_on_hopper(dim, dim_v, label):
    # "auto" on compute capability 9.0: the Hopper kernels (no FA2-class kernel to fall back to)
    if not is_sm90():
        pytest.skip(f"{label} needs compute capability 9.0, GPU 0 is {device_capability()}")
    old = pfm.set_gpu_kernel("auto")
    try:
        idx = random_indices(np.random.default_rng(dim), 2, 2, 333, 333, True, 2)
        run_gpu_case(seed_of(f"auto{dim}"), 2, 333, 333, 8, 2, dim, True, idx, deterministic=False, dim_v=dim_v)
    finally:
        pfm.set_gpu_kernel(old)


def _hopper_only_inputs(dim, dim_v):
    return gpu_inputs(seed_of(f"hopper-only-raise-{dim}"), 1, 64, 64, 2, 2, dim, "bfloat16", dim_v)[:3]


@pytest.mark.parametrize("dim,dim_v,label", HOPPER_ONLY_PAIRS)
@pytest.mark.parametrize("how", ["argument", "flag"])
def test_hopper_only_head_dims_deterministic_raises(monkeypatch, how, dim, dim_v, label):
    q, k, v = _hopper_only_inputs(dim, dim_v)
    kwargs = {"deterministic": True}
    if how == "flag":  # deterministic=None follows FLAGS_cudnn_deterministic
        monkeypatch.setattr(pfm.attention, "_has_deterministic_flag", True)
        monkeypatch.setattr(pfm.attention, "_flags", {"FLAGS_cudnn_deterministic": True})
        kwargs = {}
    # elsewhere than compute capability 9.0 the head dims themselves are refused first
    match = f"deterministic=True with head_dim {dim}" if is_sm90() else f"{label} on GPU runs on the Hopper"
    with pytest.raises(ValueError, match=match):
        pfm.flashmask_attention(q, k, v, causal=True, **kwargs)


@pytest.mark.parametrize("dim,dim_v,label", HOPPER_ONLY_PAIRS)
@pytest.mark.parametrize("kernel,why", [("fa2", "gpu_kernel 'fa2'"), ("auto", "a compute capability")])
def test_hopper_only_head_dims_off_the_hopper_kernels_raise(kernel, why, dim, dim_v, label):
    # forced onto the FA2-class kernels, or "auto" on a GPU other than compute capability 9.0
    if kernel == "auto" and is_sm90():
        pytest.skip(f"a compute capability 9.0 GPU runs {label}")
    q, k, v = _hopper_only_inputs(dim, dim_v)
    old = pfm.set_gpu_kernel(kernel)
    try:
        with pytest.raises(ValueError, match=rf"{label} on GPU runs on the Hopper \(sm90\) kernels only: .*got {why}"):
            pfm.flashmask_attention(q, k, v, causal=True, deterministic=False)
    finally:
        pfm.set_gpu_kernel(old)


def test_value_head_dim_128_with_192_only():
    # value head dim 128 belongs to 192 alone, and 192 takes no other (on every GPU, every family)
    for dim, dim_v in ((192, 192), (256, 128)):
        q, k, v = gpu_inputs(seed_of("mla-pairs", dim, dim_v), 1, 64, 64, 2, 2, dim, "bfloat16", dim_v)[:3]
        with pytest.raises(ValueError, match=rf"value head_dim {dim_v} with query/key head_dim {dim} on GPU: the "
                                             r"GPU kernels take value head_dim 128 with 192 \(the Hopper kernels\)"):
            pfm.flashmask_attention(q, k, v, causal=True, deterministic=False)


# --------------------------------------------------------------------------------------
# block_mask: 128 x 128 blocks masked on top of the column mask (both families)
# --------------------------------------------------------------------------------------


# (False, 0): a block mask alone, which keeps the Hopper forward off its 176-key tiles.
@pytest.mark.parametrize("causal,cols", [(True, 1), (True, 2), (False, 2), (False, 4), (True, 0), (False, 0)])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(300, 300), (129, 700), (1000, 1000)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_block_mask(gpu_kernel, causal, cols, seqlen_q, seqlen_k, deterministic):
    batch, heads, heads_k, dim = 2, 8, 2, 128
    rng = np.random.default_rng(seed_of("block_mask", causal, cols, seqlen_q, seqlen_k))
    hm = heads_k if cols else 1
    indices = random_indices(rng, batch, hm, seqlen_q, seqlen_k, causal, cols) if cols else None
    bm = (rng.random((batch, hm, -(-seqlen_q // 128), -(-seqlen_k // 128))) < 0.6).astype(np.int32)
    bm[0, 0, 0, :] = 0  # the first 128 rows of batch 0, mask head 0 see no key
    q, k, v, dout = gpu_inputs(seed_of("bm_in", seqlen_q), batch, seqlen_q, seqlen_k, heads, heads_k, dim,
                               "bfloat16")
    idx = None if indices is None else paddle.to_tensor(indices, place=gpu())
    out, lse = pfm.flashmask_attention(q, k, v, idx, causal=causal, block_mask=paddle.to_tensor(bm, place=gpu()),
                                       return_softmax_lse=True, deterministic=deterministic)
    dq, dk, dv = paddle.grad([out], [q, k, v], [dout])
    got = {"out": to_host_f64(out), "lse": lse._copy_to(paddle.CPUPlace(), True).numpy(),
           "dq": to_host_f64(dq), "dk": to_host_f64(dk), "dv": to_host_f64(dv)}
    rounded = [to_host_f64(t) for t in (q, k, v, dout)]
    keep = keep_mask(indices, causal, batch, hm, seqlen_q, seqlen_k)
    blocks = np.repeat(np.repeat(bm, 128, 2), 128, 3)[:, :, :seqlen_q, :seqlen_k].astype(bool)
    keep = keep & np.broadcast_to(blocks, keep.shape)
    ref = attention_fwd_bwd(*rounded[:3], keep, dim**-0.5, rounded[3])
    finite = np.isfinite(ref["lse"])
    np.testing.assert_array_equal(np.isfinite(got["lse"]), finite)
    assert np.all(got["out"][~finite.transpose(0, 2, 1)] == 0)
    assert rel_err(got["lse"][finite], ref["lse"][finite]) < 1e-4
    assert rel_err(got["out"], ref["out"]) < TOL
    for name in ("dq", "dk", "dv"):
        assert np.all(np.isfinite(got[name])), name
        assert rel_err(got[name], ref[name], ref.get(name + "_mag")) < TOL, name


# Self-attention cut into pieces (paddle_flashmask/long_sequence.py: beyond 2^19 tokens on Hopper,
# 2^18 at head dims 192 and 256), forced here at 512 tokens: the remap, merge, sum and concat ops
# around the kernels, on the GPU (192/128: test_head_dim_192_128_long_sequence_pieces).
@pytest.mark.parametrize("dim", [64, HD256])
@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 1), (False, 0), (False, 4)])
def test_long_sequence_pieces(gpu_kernel, monkeypatch, dim, causal, cols):
    monkeypatch.setenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", "512")
    S = 1300
    idx = None if cols == 0 else random_indices(np.random.default_rng(S + cols), 1, 2, S, S, causal, cols)
    run_gpu_case(seed_of("pieces", causal, cols), 1, S, S, 8, 2, dim, causal, idx)


def test_value_head_dim_of_its_own_rejected_on_gpu():
    # the GPU kernels take one head dim for q, k and v but 192/128 (the CPU kernel takes value's own)
    q, k, _, _ = gpu_inputs(3, 1, 64, 64, 2, 1, 64, "bfloat16")
    v = to_gpu(np.ones((1, 64, 1, 32), np.float32), "bfloat16")
    with pytest.raises(ValueError, match="value head_dim 32 with query/key head_dim 64 on GPU: the GPU kernels take"):
        pfm.flashmask_attention(q, k, v, causal=True)
