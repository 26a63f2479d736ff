"""flashmask_attention on CPU against the float64 dense-mask reference:
output, LSE and dq/dk/dv for every mask form, GQA/MQA, Hm = 1, Hk and H,
Sq != Sk, odd lengths, fully masked rows and low-precision inputs."""

import sys
import zlib

import numpy as np
import paddle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paddle_flashmask as pfm
from paddle_flashmask import masks
from reference import attention_fwd_bwd, keep_mask, random_indices, rel_err

TOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}
# (causal, C) forms of startend_row_indices; C=0 means no indices.
FORMS = [(True, 0), (True, 1), (True, 2), (False, 0), (False, 2), (False, 4)]


def to_paddle(x, dtype):
    return paddle.to_tensor(np.asarray(x, dtype=np.float32)).astype(dtype)


def as_f64(t):
    return t.astype("float32").numpy().astype(np.float64)


def run_case(rng, batch, seqlen_q, seqlen_k, heads, heads_k, dim, causal, indices=None,
             window=None, dtype="float32", scale=None, use_backward=True, dim_v=None):
    """Runs the op (forward + loss.backward()) and compares with the reference. dim_v: value's
    own head dim (MLA-style), default dim."""
    dim_v = dim if dim_v is None else dim_v
    q = to_paddle(rng.standard_normal((batch, seqlen_q, heads, dim)), dtype)
    k = to_paddle(rng.standard_normal((batch, seqlen_k, heads_k, dim)), dtype)
    v = to_paddle(rng.standard_normal((batch, seqlen_k, heads_k, dim_v)), dtype)
    dout = to_paddle(rng.standard_normal((batch, seqlen_q, heads, dim_v)), dtype)
    for t in (q, k, v):
        t.stop_gradient = False
    idx = None if indices is None else paddle.to_tensor(indices)
    out, lse = pfm.flashmask_attention(
        q, k, v, idx, causal=causal, window_size=window, return_softmax_lse=True, softmax_scale=scale
    )
    assert list(out.shape) == [batch, seqlen_q, heads, dim_v] and out.dtype == q.dtype
    assert lse.shape == [batch, heads, seqlen_q] and lse.dtype == paddle.float32

    mask_heads = heads_k if indices is None else indices.shape[1]
    win = None if window is None else ((window, window) if isinstance(window, int) else window)
    keep = keep_mask(indices, causal, batch, mask_heads, seqlen_q, seqlen_k, win)
    ref = attention_fwd_bwd(as_f64(q), as_f64(k), as_f64(v), keep,
                            dim**-0.5 if scale is None else scale, as_f64(dout))
    tol = TOL[dtype]
    assert rel_err(as_f64(out), ref["out"]) < tol

    got_lse = lse.numpy()
    finite = np.isfinite(ref["lse"])
    np.testing.assert_array_equal(np.isfinite(got_lse), finite)
    assert np.all(got_lse[~finite] == -np.inf)
    if finite.any():
        assert rel_err(got_lse[finite], ref["lse"][finite]) < 1e-5
    # Fully masked rows output exactly 0.
    empty_rows = ~finite.transpose(0, 2, 1)  # [B, Sq, H]
    assert np.all(as_f64(out)[empty_rows] == 0.0)

    if use_backward:
        loss = (out.astype("float32") * dout.astype("float32")).sum()
        loss.backward()
        for name, t in (("dq", q), ("dk", k), ("dv", v)):
            g = as_f64(t.grad)
            assert np.all(np.isfinite(g)), f"{name} has NaN/inf"
            err = rel_err(g, ref[name], ref[name + "_mag"])
            assert err < tol, f"{name}: {err}"
    return out, lse


@pytest.fixture
def rng(request):
    # Independent, reproducible stream per test.
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen", [1, 7, 77, 129, 1000])
def test_forms_odd_lengths(rng, causal, cols, seqlen):
    heads, heads_k = (4, 2) if seqlen < 1000 else (2, 1)
    idx = None if cols == 0 else random_indices(rng, 2, heads_k, seqlen, seqlen, causal, cols)
    run_case(rng, 2, seqlen, seqlen, heads, heads_k, 32, causal, idx)


@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(70, 200), (200, 70), (1, 130), (130, 1)])
def test_unequal_lengths(rng, causal, cols, seqlen_q, seqlen_k):
    idx = None if cols == 0 else random_indices(rng, 1, 2, seqlen_q, seqlen_k, causal, cols)
    run_case(rng, 1, seqlen_q, seqlen_k, 4, 2, 16, causal, idx)


@pytest.mark.parametrize("heads,heads_k", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("mask_heads", ["one", "per_kv_head", "per_query_head"])
@pytest.mark.parametrize("causal,cols", [(True, 1), (False, 4)])
def test_gqa_and_mask_heads(rng, heads, heads_k, mask_heads, causal, cols):
    hm = {"one": 1, "per_kv_head": heads_k, "per_query_head": heads}[mask_heads]
    idx = random_indices(rng, 2, hm, 150, 150, causal, cols)
    run_case(rng, 2, 150, 150, heads, heads_k, 24, causal, idx)


@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("dim,dim_v", [(24, 16), (16, 40), (192, 128)])
def test_value_head_dim_of_its_own(rng, causal, cols, dim, dim_v):
    """MLA-style attention (DeepSeek-V3: q/k 192, v 128): out and dv take value's head dim."""
    seqlen = 77 if dim == 192 else 150
    idx = None if cols == 0 else random_indices(rng, 2, 2, seqlen, seqlen, causal, cols)
    run_case(rng, 2, seqlen, seqlen, 4, 2, dim, causal, idx, dim_v=dim_v)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 130), (130, 70)])
def test_value_head_dim_unequal_lengths_and_precision(rng, dtype, seqlen_q, seqlen_k):
    idx = random_indices(rng, 1, 6, seqlen_q, seqlen_k, False, 4)  # one mask per query head
    run_case(rng, 1, seqlen_q, seqlen_k, 6, 2, 48, False, idx, dtype=dtype, dim_v=32)


def test_value_head_dim_with_fully_masked_rows_and_block_mask(rng):
    S = 260
    idx = masks.causal_document_mask([[100, 60, 100]])  # per-document causal
    bm = np.ones([1, 1, 3, 3], np.int32)
    bm[0, 0, 2, :] = 0  # rows 256-259 see nothing
    q = paddle.to_tensor(rng.standard_normal((1, S, 4, 32)).astype(np.float32), stop_gradient=False)
    k = paddle.to_tensor(rng.standard_normal((1, S, 2, 32)).astype(np.float32), stop_gradient=False)
    v = paddle.to_tensor(rng.standard_normal((1, S, 2, 8)).astype(np.float32), stop_gradient=False)
    do = rng.standard_normal((1, S, 4, 8))
    out = pfm.flashmask_attention(q, k, v, idx, causal=True, block_mask=paddle.to_tensor(bm))
    grads = paddle.grad([out], [q, k, v], [paddle.to_tensor(do.astype(np.float32))])
    keep = keep_mask(idx.numpy(), True, 1, 2, S, S) & (np.arange(S) < 256)[None, None, :, None]
    ref = attention_fwd_bwd(as_f64(q), as_f64(k), as_f64(v), keep, 32**-0.5, do)
    assert rel_err(as_f64(out), ref["out"]) < 1e-5 and np.all(out.numpy()[0, 256:] == 0)
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert rel_err(as_f64(g), ref[name], ref[name + "_mag"]) < 1e-5, name


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal,cols", FORMS)
def test_low_precision(rng, dtype, causal, cols):
    idx = None if cols == 0 else random_indices(rng, 1, 2, 190, 190, causal, cols)
    run_case(rng, 1, 190, 190, 4, 2, 64, causal, idx, dtype=dtype)


@pytest.mark.parametrize("dim", [8, 40, 64, 128, 256])
def test_head_dims(rng, dim):
    idx = masks.causal_document_mask([60, 50, 90]).numpy()
    run_case(rng, 1, 200, 200, 2, 1, dim, True, idx)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [0, 3, (70, 5), (5, 70), 500])
def test_window_size(rng, causal, window):
    run_case(rng, 2, 150, 150, 2, 2, 16, causal, window=window)


@pytest.mark.parametrize("name", sorted(masks.MASK_BUILDERS))
def test_every_builder(rng, name):
    idx, causal = masks.example_mask(name, 333, batch_size=2, num_heads=2, seed=3)
    heads_k = idx.shape[1] if idx.shape[1] > 1 else 2
    run_case(rng, 2, 333, 333, 2 * heads_k, heads_k, 32, causal, idx.numpy())


def test_fully_masked_rows(rng):
    # Non-causal, every column masks rows [0, 100): those rows see nothing.
    seqlen = 160
    idx = np.zeros((1, 1, seqlen, 4), dtype=np.int32)
    idx[..., 0], idx[..., 1] = 0, 100  # LTS, LTE
    idx[..., 2], idx[..., 3] = 150, 155  # UTS, UTE: a second masked band
    out, lse = run_case(rng, 1, seqlen, seqlen, 2, 1, 16, False, idx)
    assert np.all(lse.numpy()[:, :, :100] == -np.inf)
    assert np.all(out.numpy()[:, :100] == 0)


@pytest.mark.parametrize("mask", ["causal", "documents", "window"])
def test_nan_in_a_query_row_stays_nan(rng, mask):
    # A NaN in one query row makes that row's scores all NaN: its output and LSE are NaN, as the
    # dense softmax gives, not the zeros and -inf of a row that sees nothing (which would hide a
    # diverging activation). Every other row is bit for bit the run without the NaN.
    seqlen, heads, dim = 37, 2, 16
    kwargs = {"causal": True}
    if mask == "documents":
        kwargs["startend_row_indices"] = masks.causal_document_mask([9, 20, 8])
    elif mask == "window":
        kwargs = {"causal": False, "window_size": (3, 2)}
    q, k, v = (rng.standard_normal((1, seqlen, heads, dim)).astype("float32") for _ in range(3))
    q_nan = q.copy()
    q_nan[0, 12, 1, 3] = np.nan

    def forward(qa):
        qt, kt, vt = (paddle.to_tensor(a, stop_gradient=False) for a in (qa, k, v))
        out, lse = pfm.flashmask_attention(qt, kt, vt, return_softmax_lse=True, **kwargs)
        dq, dk, dv = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(np.ones_like(q))])
        return out.numpy(), lse.numpy(), dq.numpy()

    out, lse, dq = forward(q)
    out_n, lse_n, dq_n = forward(q_nan)
    assert np.all(np.isnan(out_n[0, 12, 1])) and np.isnan(lse_n[0, 1, 12])
    assert np.all(np.isnan(dq_n[0, 12, 1]))
    others = np.ones(out.shape, bool)
    others[0, 12, 1] = False
    np.testing.assert_array_equal(out_n[others], out[others])
    lse_others = np.ones(lse.shape, bool)
    lse_others[0, 1, 12] = False
    np.testing.assert_array_equal(lse_n[lse_others], lse[lse_others])
    # dQ of the other rows: only the NaN row's own dQ is NaN (dK/dV take its row, as they should)
    assert np.all(np.isfinite(dq_n[others]))


def test_nan_in_every_key_stays_nan(rng):
    # Every score NaN (each key of kv head 0 has a NaN): the heads that read it are NaN everywhere.
    q, k, v = (rng.standard_normal((1, 21, 4, 8)).astype("float32") for _ in range(3))
    k = k[:, :, :2].copy()
    v = v[:, :, :2].copy()
    k[:, :, 0, 5] = np.nan
    out, lse = pfm.flashmask_attention(*(paddle.to_tensor(a) for a in (q, k, v)), causal=True,
                                       return_softmax_lse=True)
    out, lse = out.numpy(), lse.numpy()
    assert np.all(np.isnan(out[:, :, :2])) and np.all(np.isnan(lse[:, :2]))
    assert np.all(np.isfinite(out[:, :, 2:])) and np.all(np.isfinite(lse[:, 2:]))


def test_every_row_masked(rng):
    idx = np.zeros((2, 1, 65, 2), dtype=np.int32)  # LTS = 0: all rows masked
    run_case(rng, 2, 65, 65, 2, 2, 16, False, idx)


def test_plain_attention_matches_full_indices(rng):
    # None and indices that mask nothing give bit-identical results.
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 100, 2, 32)).astype("float32")) for _ in range(3))
    nothing = paddle.to_tensor(np.full((1, 1, 100, 1), 100, dtype=np.int32))
    a = pfm.flashmask_attention(q, k, v, causal=True)
    b = pfm.flashmask_attention(q, k, v, nothing, causal=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_softmax_scale(rng):
    idx = masks.causal_document_mask([30, 70]).numpy()
    run_case(rng, 1, 100, 100, 2, 2, 16, True, idx, scale=0.37)


def test_ten_token_causal_document_example(rng):
    # The documented example: documents 4/3/3 -> a row never sees another document.
    idx = masks.causal_document_mask([4, 3, 3])
    np.testing.assert_array_equal(idx.numpy()[0, 0, :, 0], [4, 4, 4, 4, 7, 7, 7, 10, 10, 10])
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 10, 1, 8)).astype("float32")) for _ in range(3))
    out = pfm.flashmask_attention(q, k, v, idx, causal=True).numpy()
    # Per document, plain causal attention on that document alone.
    for lo, hi in [(0, 4), (4, 7), (7, 10)]:
        alone = pfm.flashmask_attention(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], causal=True).numpy()
        np.testing.assert_allclose(out[:, lo:hi], alone, rtol=1e-6, atol=1e-6)


def test_backward_deterministic_and_thread_independent(rng, monkeypatch):
    idx = paddle.to_tensor(random_indices(rng, 2, 2, 300, 300, False, 4))
    data = [rng.standard_normal((2, 300, 4, 32)).astype("float32")] + [
        rng.standard_normal((2, 300, 2, 32)).astype("float32") for _ in range(2)
    ]

    def grads():
        q, k, v = (paddle.to_tensor(x, stop_gradient=False) for x in data)
        out = pfm.flashmask_attention(q, k, v, idx, causal=False)
        return [out.numpy()] + [g.numpy() for g in paddle.grad([out], [q, k, v], [paddle.ones_like(out)])]

    first = grads()
    monkeypatch.setenv("PADDLE_FLASHMASK_NUM_THREADS", "1")
    single = grads()
    monkeypatch.setenv("PADDLE_FLASHMASK_NUM_THREADS", "3")
    again = grads()
    for a, b, c in zip(first, single, again):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("threads", ["100000", "0", "-3", "abc"])
def test_cpu_thread_count_out_of_range_raises(monkeypatch, threads):
    """A thread count the CPU kernels could not start (100000 aborted the process in thread
    creation) or would have ignored is named before any kernel runs."""
    q = paddle.to_tensor(np.ones((1, 8, 2, 16), np.float32))
    monkeypatch.setenv("PADDLE_FLASHMASK_NUM_THREADS", threads)
    with pytest.raises(ValueError, match=r"PADDLE_FLASHMASK_NUM_THREADS must be an integer in \[1, 1024\]"):
        pfm.flashmask_attention(q, q, q, causal=True)


def grads_of_call(data, idx, causal, **kwargs):
    """out, dq, dk, dv (numpy) of one call on the given q/k/v arrays."""
    q, k, v = (paddle.to_tensor(x, stop_gradient=False) for x in data)
    out = pfm.flashmask_attention(q, k, v, idx, causal=causal, **kwargs)
    dout = paddle.to_tensor(np.linspace(-1, 1, out.size, dtype="float32").reshape(out.shape))
    return [out.numpy()] + [g.numpy() for g in paddle.grad([out], [q, k, v], [dout])]


GPU_KERNEL_ENV = "PADDLE_FLASHMASK_GPU_KERNEL"


@pytest.mark.parametrize("causal,cols,heads,heads_k", [(True, 1, 4, 1), (False, 4, 4, 2), (True, 0, 2, 2)])
def test_deterministic_flag_on_cpu_changes_nothing(rng, causal, cols, heads, heads_k):
    # The CPU backward is deterministic anyway: deterministic=True is the same computation.
    idx = None if cols == 0 else paddle.to_tensor(random_indices(rng, 2, heads_k, 150, 150, causal, cols))
    data = [rng.standard_normal((2, 150, heads, 32)).astype("float32")] + [
        rng.standard_normal((2, 150, heads_k, 32)).astype("float32") for _ in range(2)
    ]
    default = grads_of_call(data, idx, causal)
    for flag in (True, False):
        for a, b in zip(default, grads_of_call(data, idx, causal, deterministic=flag)):
            np.testing.assert_array_equal(a, b)


def test_gpu_kernel_is_irrelevant_on_cpu(rng, default_gpu_kernel):
    idx = paddle.to_tensor(random_indices(rng, 1, 1, 90, 90, True, 2))
    data = [rng.standard_normal((1, 90, 4, 16)).astype("float32")] + [
        rng.standard_normal((1, 90, 2, 16)).astype("float32") for _ in range(2)
    ]
    default = grads_of_call(data, idx, True)
    for name in ("fa2", "sm90", "auto"):
        pfm.set_gpu_kernel(name)
        for a, b in zip(default, grads_of_call(data, idx, True, deterministic=True)):
            np.testing.assert_array_equal(a, b)


def test_set_get_gpu_kernel_round_trip(default_gpu_kernel):
    assert pfm.get_gpu_kernel() == "auto"
    assert pfm.set_gpu_kernel("fa2") is None  # the previous setting: the default
    assert pfm.get_gpu_kernel() == "fa2"
    assert pfm.set_gpu_kernel("SM90") == "fa2"  # names are case-insensitive
    assert pfm.get_gpu_kernel() == "sm90"
    assert pfm.set_gpu_kernel("auto") == "sm90"
    assert pfm.get_gpu_kernel() == "auto"
    old = pfm.set_gpu_kernel("fa2")
    pfm.set_gpu_kernel(old)  # restores
    assert pfm.get_gpu_kernel() == "auto"
    assert pfm.set_gpu_kernel(None) == "auto"
    assert pfm.get_gpu_kernel() == "auto"


def test_gpu_kernel_env_variable(default_gpu_kernel, monkeypatch):
    monkeypatch.setenv(GPU_KERNEL_ENV, "fa2")
    assert pfm.get_gpu_kernel() == "fa2"
    monkeypatch.setenv(GPU_KERNEL_ENV, "Sm90")
    assert pfm.get_gpu_kernel() == "sm90"
    pfm.set_gpu_kernel("fa2")  # an explicit setting wins
    assert pfm.get_gpu_kernel() == "fa2"
    pfm.set_gpu_kernel(None)  # back to the env variable
    assert pfm.get_gpu_kernel() == "sm90"
    monkeypatch.setenv(GPU_KERNEL_ENV, "")  # empty counts as unset
    assert pfm.get_gpu_kernel() == "auto"
    monkeypatch.delenv(GPU_KERNEL_ENV)
    assert pfm.get_gpu_kernel() == "auto"


class ArgSpy:
    """The op module, recording the arguments of each attention call."""

    def __init__(self, real):
        self._real = real
        self.attention_args = []

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name != "pfm_flashmask_attention":
            return attr

        def wrapped(*args):
            self.attention_args.append(args)
            return attr(*args)

        return wrapped


def test_gpu_kernel_and_deterministic_reach_the_op(rng, default_gpu_kernel, monkeypatch):
    attention_mod = sys.modules["paddle_flashmask.attention"]
    spy = ArgSpy(pfm.load_ops())
    monkeypatch.setattr(attention_mod, "load_ops", lambda: spy)
    q = paddle.to_tensor(rng.standard_normal((1, 20, 2, 8)).astype("float32"))

    def attrs(**kwargs):
        pfm.flashmask_attention(q, q, q, causal=True, **kwargs)
        return spy.attention_args[-1][-2:]  # (gpu_kernel, deterministic)

    class NoSuchFlag:  # Paddle's flag registry on a build without the flag (CPU Paddle)
        def __getitem__(self, name):
            raise RuntimeError(f"(NotFound) Cannot find global variable {name}")

    monkeypatch.setattr(attention_mod, "_has_deterministic_flag", True)
    monkeypatch.setattr(attention_mod, "_flags", NoSuchFlag())
    assert attrs() == (0, False)  # a Paddle without FLAGS_cudnn_deterministic
    assert attention_mod._has_deterministic_flag is False  # asked once, not at every call
    monkeypatch.setattr(attention_mod, "_has_deterministic_flag", True)  # a build that has it
    monkeypatch.setattr(attention_mod, "_flags", {"FLAGS_cudnn_deterministic": True})
    assert attrs() == (0, True)  # None follows the flag
    monkeypatch.setattr(attention_mod, "_flags", None)  # no registry: paddle.get_flags
    monkeypatch.setattr(paddle, "get_flags", lambda flags: {"FLAGS_cudnn_deterministic": True})
    assert attrs() == (0, True)
    monkeypatch.setattr(attention_mod, "_flags", {"FLAGS_cudnn_deterministic": True})
    assert attrs(deterministic=False) == (0, False)  # an explicit value wins
    pfm.set_gpu_kernel("fa2")
    assert attrs(deterministic=True) == (1, True)
    monkeypatch.setattr(attention_mod, "_flags", {"FLAGS_cudnn_deterministic": False})  # set_flags since
    pfm.set_gpu_kernel("sm90")
    assert attrs() == (2, False)
    assert all(type(a[-2]) is int and type(a[-1]) is bool for a in spy.attention_args)


# Documents whose ends fall inside the CPU kernel's 64-row tiles (one of a single token, one
# longer than two tiles), a different set per batch row, and padding past the last document.
PACKED_ROWS = [[37, 1, 130, 64, 29], [200, 3, 58]]


@pytest.mark.parametrize("builder, causal", [("causal_document_mask", True), ("document_mask", False),
                                             ("share_question_mask", True)])
@pytest.mark.parametrize("heads, heads_k, per_head", [(4, 2, False), (4, 2, True), (2, 2, False)])
def test_packed_documents_tiled_per_document(rng, builder, causal, heads, heads_k, per_head):
    """Packed documents whose ends fall inside tiles (the case a kernel that tiles each document
    on its own must get right, NOTES: segment-aligned tiles): forward, LSE and gradients against
    the dense reference, with GQA and a mask per kv head."""
    seqlen = 300
    if builder == "share_question_mask":  # (question, [answers]) groups, a different split per row
        rows = [[(37, [20, 1]), (64, [29, 70])], [(5, [100, 3]), (58, [3])]]
        idx = masks.share_question_mask(rows, seqlen, place="numpy")
    else:
        idx = getattr(masks, builder)(PACKED_ROWS, seqlen, place="numpy")
    if per_head:  # a mask head per kv head: the second one's documents split differently
        other = masks.causal_document_mask([[100, 200], [150, 150]], seqlen, place="numpy") if causal else \
            masks.document_mask([[100, 200], [150, 150]], seqlen, place="numpy")
        idx = np.concatenate([idx, other], axis=1)
    run_case(rng, 2, seqlen, seqlen, heads, heads_k, 16, causal, indices=idx.astype(np.int32))


def test_lse_has_no_gradient_and_out_grad_unaffected(rng):
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 20, 2, 8)).astype("float32"), stop_gradient=False)
               for _ in range(3))
    out, lse = pfm.flashmask_attention(q, k, v, causal=True, return_softmax_lse=True)
    assert lse.stop_gradient
    assert not out.stop_gradient


def test_dropout_in_eval_is_ignored(rng):
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 20, 2, 8)).astype("float32")) for _ in range(3))
    a = pfm.flashmask_attention(q, k, v, causal=True, dropout=0.1, training=False)
    b = pfm.flashmask_attention(q, k, v, causal=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_non_contiguous_inputs(rng):
    # A transposed view (e.g. from [B, H, S, D]) must read like its dense copy.
    base = paddle.to_tensor(rng.standard_normal((1, 2, 50, 16)).astype("float32"))
    view = base.transpose([0, 2, 1, 3])
    dense = paddle.to_tensor(view.numpy())
    a = pfm.flashmask_attention(view, view, view, causal=True)
    b = pfm.flashmask_attention(dense, dense, dense, causal=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqlen_q=st.integers(1, 200),
    seqlen_k=st.integers(1, 200),
    group=st.sampled_from([1, 2, 3]),
    heads_k=st.sampled_from([1, 2]),
    mask_heads=st.sampled_from(["one", "per_kv_head", "per_query_head"]),
    form=st.sampled_from(FORMS),
    dim=st.sampled_from([8, 16, 48]),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_random_shapes(seqlen_q, seqlen_k, group, heads_k, mask_heads, form, dim, seed):
    rng = np.random.default_rng(seed)
    causal, cols = form
    hm = {"one": 1, "per_kv_head": heads_k, "per_query_head": group * heads_k}[mask_heads]
    idx = None if cols == 0 else random_indices(rng, 2, hm, seqlen_q, seqlen_k, causal, cols)
    run_case(rng, 2, seqlen_q, seqlen_k, group * heads_k, heads_k, dim, causal, idx)


def test_to_static_default_mode_matches_eager(rng):
    """paddle.jit.to_static with its defaults (SOT, Paddle 3.x's bytecode translation; AST on 2.6):
    out and gradients equal eager's, and bad index values still raise. SOT used to simulate the
    wrapper's checks and fail inside Paddle (UnboundLocalError); the wrapper is marked unified.
    Paddle 2.6 has no such marker and its SOT mis-calls keyword-only arguments: full_graph=True there."""
    if getattr(getattr(paddle.jit, "marker", None), "unified", None) is None:
        pytest.skip("this Paddle (2.6) has no paddle.jit.marker.unified; its to_static needs full_graph=True")

    class Attention(paddle.nn.Layer):
        def forward(self, q, k, v, idx):
            return pfm.flashmask_attention(q, k, v, idx, causal=True) * 2.0

    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 70, 2, 16)).astype("float32"), stop_gradient=False)
               for _ in range(3))
    idx = masks.causal_document_mask([30, 40])
    eager = Attention()(q, k, v, idx)
    static = paddle.jit.to_static(Attention())
    for _ in range(2):  # the first call translates, the second runs what was translated
        out = static(q, k, v, idx)
        np.testing.assert_array_equal(out.numpy(), eager.numpy())
    grads = paddle.grad([out.sum()], [q, k, v])
    for got, want in zip(grads, paddle.grad([eager.sum()], [q, k, v])):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(Exception, match="startend_row_indices values must be query rows"):
        static(q, k, v, paddle.to_tensor(np.full((1, 1, 70, 1), 99, np.int32)))


def test_to_static_full_graph_matches_eager(rng):
    """Dynamic-to-static (AST, full_graph=True) builds the same op into a program."""

    class Attention(paddle.nn.Layer):
        def forward(self, q, k, v, idx):
            return pfm.flashmask_attention(q, k, v, idx, causal=True)

    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 70, 2, 16)).astype("float32")) for _ in range(3))
    idx = masks.causal_document_mask([30, 40])
    eager = Attention()(q, k, v, idx)
    try:
        static = paddle.jit.to_static(Attention(), full_graph=True)
    except TypeError:
        pytest.skip("this Paddle's to_static has no full_graph switch")
    np.testing.assert_allclose(static(q, k, v, idx).numpy(), eager.numpy(), rtol=1e-6, atol=1e-6)


def test_to_static_full_graph_stops_on_bad_values(rng):
    """Under full_graph=True the values exist only when the program runs: bad indices or block_mask
    values stop it (Paddle's Assert error) rather than give zeros, as eager raises; good ones run."""

    class Attention(paddle.nn.Layer):
        def forward(self, q, k, v, idx, block_mask):
            return pfm.flashmask_attention(q, k, v, idx, causal=True, block_mask=block_mask)

    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 70, 2, 16)).astype("float32")) for _ in range(3))
    good = masks.causal_document_mask([30, 40])
    kept = paddle.ones([1, 1, 1, 1], dtype="int32")
    try:
        static = paddle.jit.to_static(Attention(), full_graph=True)
    except TypeError:
        pytest.skip("this Paddle's to_static has no full_graph switch")
    np.testing.assert_allclose(static(q, k, v, good, kept).numpy(), Attention()(q, k, v, good, kept).numpy(),
                               rtol=1e-6, atol=1e-6)
    for idx, block_mask in ((paddle.full([1, 1, 70, 1], -3, dtype="int32"), kept),
                            (paddle.full([1, 1, 70, 1], 71, dtype="int32"), kept),
                            (good, paddle.full([1, 1, 1, 1], 5, dtype="int32"))):
        with pytest.raises(Exception, match="AssertOp|Assert"):
            static(q, k, v, idx, block_mask)
