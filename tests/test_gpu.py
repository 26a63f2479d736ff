"""CUDA kernels against references computed on the host.

Skipped unless Paddle has CUDA and a GPU. Written for the trimmed device
runtime (see README, "GPU"), where Paddle's own GPU kernels do not run: the
tests only move tensors to/from the GPU, call our ops and paddle.grad with
explicit grad_outputs; every cast and comparison happens on the host.
"""

import zlib

import numpy as np
import paddle
import pytest

import paddle_flashmask as pfm
from paddle_flashmask import masks
from reference import attention_fwd_bwd, keep_mask, random_indices, rel_err

pytestmark = pytest.mark.skipif(
    not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0,
    reason="needs Paddle with CUDA and a GPU",
)

TOL = 1e-2  # bf16/fp16 inputs, fp32 accumulation
FORMS = [(True, 0), (True, 1), (True, 2), (False, 0), (False, 2), (False, 4)]


def gpu():
    return paddle.CUDAPlace(0)


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


def run_gpu_case(seed, batch, seqlen_q, seqlen_k, heads, heads_k, dim, causal, indices=None,
                 window=None, dtype="bfloat16", use_cpu_reference=False):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((batch, seqlen_q, heads, dim)).astype(np.float32),
              rng.standard_normal((batch, seqlen_k, heads_k, dim)).astype(np.float32),
              rng.standard_normal((batch, seqlen_k, heads_k, dim)).astype(np.float32),
              rng.standard_normal((batch, seqlen_q, heads, dim)).astype(np.float32)]
    q, k, v, dout = (to_gpu(a, dtype) for a in arrays)
    for t in (q, k, v):
        t.stop_gradient = False
    idx = None if indices is None else paddle.to_tensor(indices, place=gpu())
    out, lse = pfm.flashmask_attention(q, k, v, idx, causal=causal, window_size=window,
                                       return_softmax_lse=True)
    dq, dk, dv = paddle.grad([out], [q, k, v], [dout])
    got = {"out": to_host_f64(out), "lse": lse._copy_to(paddle.CPUPlace(), True).numpy(),
           "dq": to_host_f64(dq), "dk": to_host_f64(dk), "dv": to_host_f64(dv)}

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
@pytest.mark.parametrize("dim", [32, 64, 128])
@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen", [1, 77, 1000])
def test_forms_lengths(dtype, dim, causal, cols, seqlen):
    idx = None if cols == 0 else random_indices(np.random.default_rng(seqlen), 2, 2, seqlen, seqlen, causal, cols)
    run_gpu_case(seed_of(dtype, dim, causal, cols, seqlen), 2, seqlen, seqlen, 4, 2, dim, causal, idx,
                 dtype=dtype)


@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(100, 300), (300, 100), (4097, 4097)])
def test_unequal_and_long(causal, cols, seqlen_q, seqlen_k):
    rng = np.random.default_rng(seqlen_q * 7 + seqlen_k)
    idx = None if cols == 0 else random_indices(rng, 1, 1, seqlen_q, seqlen_k, causal, cols)
    run_gpu_case(seed_of(causal, cols, seqlen_q, seqlen_k), 1, seqlen_q, seqlen_k, 2, 1, 128, causal, idx,
                 use_cpu_reference=seqlen_q > 2000)


@pytest.mark.parametrize("heads,heads_k,hm", [(8, 2, 1), (8, 2, 2), (8, 1, 1), (4, 4, 4)])
def test_gqa_mask_heads(heads, heads_k, hm):
    idx = random_indices(np.random.default_rng(heads * 10 + hm), 2, hm, 333, 333, False, 4)
    run_gpu_case(seed_of(heads, heads_k, hm), 2, 333, 333, heads, heads_k, 64, False, idx)


@pytest.mark.parametrize("name", sorted(masks.MASK_BUILDERS))
def test_builders_8k(name):
    idx, causal = masks.example_mask(name, 8192, batch_size=1, num_heads=2, seed=1, place=paddle.CPUPlace())
    heads_k = idx.shape[1] if idx.shape[1] > 1 else 2
    run_gpu_case(seed_of(name), 1, 8192, 8192, 2 * heads_k, heads_k, 128, causal, idx.numpy(),
                 use_cpu_reference=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [3, (100, 17)])
def test_window(causal, window):
    run_gpu_case(seed_of(causal, window), 1, 500, 500, 2, 2, 64, causal, window=window)


def test_fully_masked_rows():
    idx = np.zeros((1, 1, 300, 4), dtype=np.int32)
    idx[..., 1] = 130  # rows [0, 130) see nothing
    idx[..., 2], idx[..., 3] = 200, 260
    run_gpu_case(1, 1, 300, 300, 2, 1, 128, False, idx)


def test_bad_indices_rejected_on_gpu():
    q = to_gpu(np.random.default_rng(0).standard_normal((1, 64, 2, 64)).astype(np.float32), "bfloat16")
    bad = np.full((1, 1, 64, 1), 65, dtype=np.int32)
    with pytest.raises(ValueError, match="startend_row_indices"):
        pfm.flashmask_attention(q, q, q, paddle.to_tensor(bad, place=gpu()), causal=True)
