"""Context-parallel helper ops on CPU against numpy references: the index remap
for a rank's row chunks (dense-mask equality for every form), the backward with
caller-supplied out/lse (equal to autograd; additive over key parts), the
partial-result merge, the fp32-summed accumulate and the unit gather, with
every dtype, edge cases and the raw ops' errors."""

import zlib

import numpy as np
import paddle
import pytest

import paddle_flashmask as pfm
from paddle_flashmask import masks
from reference import random_indices, round_to_dtype

# Errors raised by PD_THROW/PD_CHECK (OSError in Paddle 3.x).
PD_ERRORS = (OSError, RuntimeError, ValueError)
FLOAT_DTYPES = ["float32", "float16", "bfloat16"]


@pytest.fixture(scope="module")
def ops():
    return pfm.load_ops()


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def tensor(a, dtype=None):
    t = paddle.to_tensor(np.ascontiguousarray(a))
    return t if dtype is None else t.astype(dtype)


def f32(t):
    return t.astype("float32").numpy()


def round_to(a, dtype):
    """float32 numpy -> the values `dtype` stores (round to nearest even), as float32."""
    return round_to_dtype(a, dtype)


def nonzero_normal(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return np.where(x == 0, np.float32(0.5), x)


# --------------------------------------------------------------------------------------
# pfm_cp_remap_indices
# --------------------------------------------------------------------------------------


def dense_masked(indices, causal, num_rows, key_ids=None):
    """Dense MASKED [B, Hm, rows, Sk] bool from the column semantics (Sq == Sk == S,
    or rows/keys of a rank: key_ids gives each column's global key for the causal part).
    indices None: causal only, [1, 1, rows, Sk]."""
    if indices is None:
        g = np.asarray(key_ids)
        i = np.arange(num_rows)[:, None]
        return (i < g[None, :])[None, None]
    idx = np.asarray(indices, dtype=np.int64)
    i = np.arange(num_rows)[None, None, :, None]
    col = lambda k: idx[..., k][:, :, None, :]  # noqa: E731
    c = idx.shape[-1]
    if causal:
        g = np.arange(idx.shape[2]) if key_ids is None else np.asarray(key_ids)
        below_diag = i < g[None, None, None, :]
        lower = (i >= col(0)) if c == 1 else ((i >= col(0)) & (i < col(1)))
        return lower | below_diag
    if c == 2:
        return (i >= col(0)) | (i < col(1))
    return ((i >= col(0)) & (i < col(1))) | ((i >= col(2)) & (i < col(3)))


def rank_layout(rng, seqlen, chunk_size, pick=None):
    """A random subset of whole chunks: (sorted global rows, row_table int32)."""
    n_chunks = -(-seqlen // chunk_size)
    held = rng.random(n_chunks) < 0.5 if pick is None else np.asarray(pick, dtype=bool)
    table = [0]
    rows = []
    for c in range(n_chunks):
        lo, hi = c * chunk_size, min((c + 1) * chunk_size, seqlen)
        if held[c]:
            rows += range(lo, hi)
        table.append(len(rows))
    return np.array(rows, dtype=np.int64), np.array(table, dtype=np.int32)


def run_remap(ops, indices, key_rows, row_table, causal, chunk_size, seqlen):
    out = ops.pfm_cp_remap_indices(
        None if indices is None else tensor(indices.astype(np.int32)),
        tensor(np.asarray(key_rows, dtype=np.int64)),
        tensor(np.asarray(row_table, dtype=np.int32)),
        causal,
        chunk_size,
        seqlen,
    )
    assert out.dtype == paddle.int32
    return out.numpy()


REMAP_FORMS = [(True, 0), (True, 1), (True, 2), (False, 2), (False, 4)]


def test_dense_reference_matches_library_to_dense(rng):
    # The test's own column semantics agree with masks.to_dense (Sq == Sk).
    for causal, c in [f for f in REMAP_FORMS if f[1]]:
        idx = random_indices(rng, 2, 3, 37, 37, causal, c)
        np.testing.assert_array_equal(dense_masked(idx, causal, 37), ~masks.to_dense(idx, causal, seqlen_q=37))


@pytest.mark.parametrize("causal,cols", REMAP_FORMS)
@pytest.mark.parametrize("seqlen,chunk_size", [(1, 1), (7, 3), (64, 16), (100, 7), (130, 64), (50, 200)])
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 3)])
def test_remap_dense_equality(ops, rng, causal, cols, seqlen, chunk_size, batch, heads):
    if cols == 0:
        batch = heads = 1
    for trial in range(4):
        pick = None
        n_chunks = -(-seqlen // chunk_size)
        if trial == 0:
            pick = np.ones(n_chunks)  # every chunk: the identity remap
        elif trial == 1:
            pick = np.zeros(n_chunks)  # no rows at all
        rows, table = rank_layout(rng, seqlen, chunk_size, pick)
        # Any subset of keys in any order, with the first and last key present.
        keys = rng.permutation(seqlen)[: rng.integers(1, seqlen + 1)]
        keys = np.concatenate([keys, [0, seqlen - 1]]).astype(np.int64)
        idx = None if cols == 0 else random_indices(rng, batch, heads, seqlen, seqlen, causal, cols)
        out = run_remap(ops, idx, keys, table, causal, chunk_size, seqlen)
        out_cols = 2 if cols == 0 else (2 * cols if causal else cols)
        assert out.shape == (batch, heads, len(keys), out_cols)
        assert out.min() >= 0 and out.max() <= len(rows)
        if cols == 0:
            want = dense_masked(None, True, seqlen, np.arange(seqlen))
        else:
            want = dense_masked(idx, causal, seqlen)
        want = want[:, :, rows][:, :, :, keys]
        got = dense_masked(out, False, len(rows))
        np.testing.assert_array_equal(got, want)
        if trial == 0:  # all rows held: ss is the identity
            if cols == 0:
                np.testing.assert_array_equal(out[0, 0, :, 0], np.full(len(keys), seqlen))
            else:
                np.testing.assert_array_equal(out[..., :cols], idx[:, :, keys])
            if causal:
                np.testing.assert_array_equal(out[..., -1], np.broadcast_to(keys, out.shape[:3]))


def test_remap_values_by_hand(ops):
    # S = 10, chunks of 4: rank holds chunk 0 (rows 0-3) and chunk 2 (rows 8-9); L = 6.
    table = np.array([0, 4, 4, 6], dtype=np.int32)
    keys = np.array([9, 0, 5], dtype=np.int64)
    # ss: 0->0, 3->3, 4->4, 6->4, 8->4, 9->5, 10->6.
    idx = np.zeros((1, 1, 10, 1), dtype=np.int32)
    idx[0, 0, [9, 0, 5], 0] = [10, 3, 6]
    out = run_remap(ops, idx, keys, table, True, 4, 10)
    np.testing.assert_array_equal(out[0, 0], [[6, 5], [3, 0], [4, 4]])
    out = run_remap(ops, None, keys, table, True, 4, 10)
    np.testing.assert_array_equal(out[0, 0], [[6, 5], [6, 0], [6, 4]])
    idx4 = np.zeros((1, 1, 10, 4), dtype=np.int32)
    idx4[0, 0, 9] = [1, 8, 9, 10]
    out = run_remap(ops, idx4, np.array([9]), table, False, 4, 10)
    np.testing.assert_array_equal(out[0, 0], [[1, 4, 5, 6]])
    idx2 = np.zeros((1, 1, 10, 2), dtype=np.int32)
    idx2[0, 0, 0] = [2, 9]
    out = run_remap(ops, idx2, np.array([0]), table, True, 4, 10)
    np.testing.assert_array_equal(out[0, 0], [[2, 5, 0, 0]])


def test_remap_clamps_out_of_range_bounds(ops, rng):
    rows, table = rank_layout(rng, 40, 8, [1, 0, 1, 1, 0])
    keys = np.arange(40)
    idx = rng.integers(-50, 100, size=(2, 1, 40, 4)).astype(np.int32)
    out = run_remap(ops, idx, keys, table, False, 8, 40)
    np.testing.assert_array_equal(out, run_remap(ops, np.clip(idx, 0, 40), keys, table, False, 8, 40))


@pytest.mark.parametrize("causal,cols", REMAP_FORMS)
def test_remap_padding_slots_hide_every_row(ops, rng, causal, cols):
    # key_rows -1 (a padding slot, allgather's spaced-out parts): a column whose every band
    # covers all L rows, so it hides them and leaves a key block's min/max summary as it was;
    # the real keys around it come out as they do alone
    rows, table = rank_layout(rng, 50, 8, [1, 0, 1, 1, 0, 1, 1])
    keys = np.array([3, -1, 17, 49, -1, -1, 0], dtype=np.int64)
    idx = None if cols == 0 else random_indices(rng, 2, 2, 50, 50, causal, cols)
    out = run_remap(ops, idx, keys, table, causal, 8, 50)
    pad = keys < 0
    L = len(rows)
    np.testing.assert_array_equal(out[:, :, pad], np.broadcast_to([0, L] * (out.shape[-1] // 2), out[:, :, pad].shape))
    assert dense_masked(out, False, L)[..., pad].all()
    np.testing.assert_array_equal(out[:, :, ~pad], run_remap(ops, idx, keys[~pad], table, causal, 8, 50))


def test_remap_empty_keys(ops):
    out = run_remap(ops, None, np.zeros(0, np.int64), np.array([0, 2, 4], np.int32), True, 2, 4)
    assert out.shape == (1, 1, 0, 2)


def remap_args(causal=True, cols=1, seqlen=8, chunk=4, key_rows=None, table=None, idx_dtype="int32",
               idx_shape=None):
    shape = idx_shape or (1, 1, seqlen, cols)
    idx = None if cols == 0 else tensor(np.ones(shape, dtype=np.int32)).astype(idx_dtype)
    kr = tensor(np.array([0, 3, 5], dtype=np.int64)) if key_rows is None else key_rows
    tb = tensor(np.array([0, 4, 6], dtype=np.int32)) if table is None else table
    return idx, kr, tb, causal, chunk, seqlen


@pytest.mark.parametrize("kwargs,match", [
    (dict(key_rows=tensor(np.array([0, 8], np.int64))), r"key_rows\[1\] = 8 is outside \[0, 8\)"),
    (dict(key_rows=tensor(np.array([-2], np.int64))), r"key_rows\[0\] = -2 is outside .* not -1"),
    (dict(key_rows=tensor(np.array([0], np.int32))), "key_rows must be int64"),
    (dict(key_rows=tensor(np.zeros((1, 2), np.int64))), "key_rows must be int64"),
    (dict(table=tensor(np.array([0, 4], np.int32))), r"row_table must have .* = 3 entries, got 2"),
    (dict(table=tensor(np.array([0, 4, 6], np.int64))), "row_table must be int32"),
    (dict(chunk=0), "chunk_size must be positive"),
    (dict(seqlen=0, table=tensor(np.array([0], np.int32))), "seqlen must be positive"),
    (dict(idx_shape=(1, 1, 9, 1)), "9 key columns, expected seqlen = 8"),
    (dict(idx_shape=(1, 8, 1)), r"int32 \[B, Hm, S, C\]"),
    (dict(idx_dtype="int64"), r"int32 \[B, Hm, S, C\]"),
    (dict(cols=4), "causal takes 1 or 2"),
    (dict(causal=False, cols=1), "non-causal 2 or 4"),
    (dict(causal=False, cols=0), "no mask to remap"),
])
def test_remap_bad_input(ops, kwargs, match):
    with pytest.raises(PD_ERRORS, match=match):
        ops.pfm_cp_remap_indices(*remap_args(**kwargs))


# --------------------------------------------------------------------------------------
# pfm_flashmask_attention_bwd
# --------------------------------------------------------------------------------------

ATTN_FORMS = [(True, 0), (True, 1), (True, 2), (False, 0), (False, 2), (False, 4)]


def qkv(rng, b, sq, sk, h, hk, d, dtype):
    mk = lambda *s: tensor(nonzero_normal(rng, s)).astype(dtype)  # noqa: E731
    return mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d), mk(b, sq, h, d)


def fwd(ops, q, k, v, idx, causal, scale):
    return ops.pfm_flashmask_attention(q, k, v, idx, None, scale, causal, -1, -1, 0, False)


def bwd(ops, q, k, v, idx, out, lse, dout, causal, scale):
    return ops.pfm_flashmask_attention_bwd(q, k, v, idx, None, out, lse, dout, scale, causal, -1, -1, 0, False)


@pytest.mark.parametrize("causal,cols", ATTN_FORMS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bwd_equals_autograd(ops, rng, causal, cols, dtype):
    b, s, h, hk, d = 2, 70, 4, 2, 16
    q, k, v, dout = qkv(rng, b, s, s, h, hk, d, dtype)
    idx = None if cols == 0 else tensor(random_indices(rng, b, hk, s, s, causal, cols))
    for t in (q, k, v):
        t.stop_gradient = False
    out, lse = fwd(ops, q, k, v, idx, causal, 0.3)
    want = paddle.grad([out], [q, k, v], grad_outputs=[dout])
    got = bwd(ops, q, k, v, idx, out.detach(), lse.detach(), dout, causal, 0.3)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(f32(g), f32(w))


@pytest.mark.parametrize("cols", [0, 2, 4])
@pytest.mark.parametrize("split", [1, 33, 64, 95])
def test_bwd_split_keys_adds_up(ops, rng, cols, split):
    # Ring attention: each key part's backward with the FULL out/lse; dq adds up over
    # the parts, dk/dv are the full gradients' slices. (Non-causal forms: a causal mask
    # over split keys is first remapped to one.)
    b, s, h, hk, d = 2, 96, 4, 2, 16
    q, k, v, dout = qkv(rng, b, s, s, h, hk, d, "float32")
    idx_np = None if cols == 0 else random_indices(rng, b, 1, s, s, False, cols)
    idx = None if idx_np is None else tensor(idx_np)
    out, lse = fwd(ops, q, k, v, idx, False, 0.25)
    dq, dk, dv = bwd(ops, q, k, v, idx, out, lse, dout, False, 0.25)
    parts = []
    for sl in (slice(0, split), slice(split, s)):
        pidx = None if idx_np is None else tensor(idx_np[:, :, sl])
        kp, vp = tensor(k.numpy()[:, sl]), tensor(v.numpy()[:, sl])
        # The part's gradients, and its own forward (merged back to the full one below).
        parts.append(list(bwd(ops, q, kp, vp, pidx, out, lse, dout, False, 0.25))
                     + list(fwd(ops, q, kp, vp, pidx, False, 0.25)))
    np.testing.assert_allclose(f32(parts[0][0]) + f32(parts[1][0]), f32(dq), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate([f32(parts[0][1]), f32(parts[1][1])], 1), f32(dk),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate([f32(parts[0][2]), f32(parts[1][2])], 1), f32(dv),
                               rtol=1e-5, atol=1e-5)
    m_out, m_lse = ops.pfm_cp_merge(parts[0][3], parts[0][4], parts[1][3], parts[1][4])
    np.testing.assert_allclose(f32(m_out), f32(out), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m_lse.numpy(), lse.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which,match", [
    ("out_shape", r"out must be \[batch, seqlen_q, heads, value head_dim\]"),
    ("out_dtype", r"out must be \[batch, seqlen_q, heads, value head_dim\]"),
    ("lse_shape", r"softmax_lse must be float32 \[batch, heads, seqlen_q\]"),
    ("lse_dtype", r"softmax_lse must be float32"),
    ("dout", r"dout must be \[batch, seqlen_q, heads, value head_dim\]"),
])
def test_bwd_bad_input(ops, rng, which, match):
    q, k, v, dout = qkv(rng, 1, 8, 8, 2, 2, 8, "float32")
    out, lse = fwd(ops, q, k, v, None, True, 0.3)
    if which == "out_shape":
        out = tensor(np.ones((1, 7, 2, 8), np.float32))
    elif which == "out_dtype":
        out = out.astype("float16")
    elif which == "lse_shape":
        lse = tensor(np.ones((1, 8, 2), np.float32))
    elif which == "lse_dtype":
        lse = lse.astype("float16")
    else:
        dout = tensor(np.ones((1, 8, 2, 4), np.float32))
    with pytest.raises(PD_ERRORS, match=match):
        bwd(ops, q, k, v, None, out, lse, dout, True, 0.3)


# --------------------------------------------------------------------------------------
# pfm_cp_merge
# --------------------------------------------------------------------------------------


def merge_reference(oa, la, ob, lb):
    oa, ob = oa.astype(np.float64), ob.astype(np.float64)
    la, lb = la.astype(np.float64), lb.astype(np.float64)
    m = np.maximum(la, lb)
    empty = m == -np.inf
    ms = np.where(empty, 0.0, m)
    wa, wb = np.exp(la - ms), np.exp(lb - ms)
    s = np.where(empty, 1.0, wa + wb)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, ms + np.log(s))
    to_rows = lambda w: w.transpose(0, 2, 1)[..., None]  # [B, H, L] -> [B, L, H, 1]  # noqa: E731
    out = (to_rows(wa) * oa + to_rows(wb) * ob) / to_rows(s)
    return np.where(to_rows(empty), 0.0, out), lse


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 37, 3, 5), (1, 64, 4, 128), (3, 9, 2, 64)])
def test_merge(ops, rng, dtype, shape):
    b, l, h, d = shape
    oa = round_to(nonzero_normal(rng, shape), dtype)
    ob = round_to(nonzero_normal(rng, shape), dtype)
    la = (3 * nonzero_normal(rng, (b, h, l))).astype(np.float32)
    lb = (3 * nonzero_normal(rng, (b, h, l))).astype(np.float32)
    # Rows empty in one part, in both, and far apart.
    pick = rng.random((b, h, l))
    la[pick < 0.2] = -np.inf
    lb[(pick > 0.15) & (pick < 0.35)] = -np.inf
    la[pick > 0.9] += 80.0
    out, lse = ops.pfm_cp_merge(tensor(oa, dtype), tensor(la), tensor(ob, dtype), tensor(lb))
    assert out.dtype == tensor(oa, dtype).dtype and out.shape == list(shape)
    assert lse.dtype == paddle.float32 and lse.shape == [b, h, l]
    want_out, want_lse = merge_reference(oa, la, ob, lb)
    got_lse = lse.numpy()
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(got_lse[fin], want_lse[fin], rtol=1e-6, atol=1e-6)
    tol = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    np.testing.assert_allclose(f32(out), want_out, rtol=tol, atol=tol)
    empty = np.isneginf(want_lse).transpose(0, 2, 1)
    assert np.all(f32(out)[empty] == 0.0)
    # Both parts' weights count: where b is empty the result is exactly a.
    only_a = (np.isneginf(lb) & np.isfinite(la)).transpose(0, 2, 1)
    np.testing.assert_array_equal(f32(out)[only_a], oa[only_a])


def test_merge_keeps_a_nan_row_nan(ops, rng):
    # A part's row that met a NaN (LSE NaN) stays NaN whatever the other part holds, an empty
    # row (-inf) included, in either argument order: max() would drop the NaN and hide it.
    shape = (1, 3, 1, 4)
    o = round_to(nonzero_normal(rng, shape), "float32")
    nan_lse = np.array([[[np.nan, np.nan, 0.5]]], np.float32)
    other = np.array([[[-np.inf, 1.5, np.nan]]], np.float32)
    for la, lb in ((nan_lse, other), (other, nan_lse)):
        out, lse = ops.pfm_cp_merge(tensor(o, "float32"), tensor(la), tensor(o, "float32"), tensor(lb))
        assert np.all(np.isnan(lse.numpy())) and np.all(np.isnan(f32(out)))


@pytest.mark.parametrize("which,match", [
    ("out_b_shape", "out_b must match out_a"),
    ("out_b_dtype", "out_b must match out_a"),
    ("lse_shape", r"float32 \[B, H, L\] = \[2, 3, 5\]"),
    ("lse_dtype", r"float32 \[B, H, L\]"),
    ("rank", r"4-D \[B, L, H, D\]"),
    ("int_dtype", "expected float32, float16 or bfloat16"),
])
def test_merge_bad_input(ops, which, match):
    oa = np.ones((2, 5, 3, 4), np.float32)
    ob, la, lb = oa.copy(), np.ones((2, 3, 5), np.float32), np.ones((2, 3, 5), np.float32)
    a, b_ = tensor(oa), tensor(ob)
    ta, tb = tensor(la), tensor(lb)
    if which == "out_b_shape":
        b_ = tensor(np.ones((2, 5, 3, 8), np.float32))
    elif which == "out_b_dtype":
        b_ = b_.astype("float16")
    elif which == "lse_shape":
        tb = tensor(np.ones((2, 5, 3), np.float32))
    elif which == "lse_dtype":
        ta = ta.astype("float16")
    elif which == "rank":
        a = b_ = tensor(np.ones((2, 5, 12), np.float32))
    else:
        a, b_ = a.astype("int32"), b_.astype("int32")
    with pytest.raises(PD_ERRORS, match=match):
        ops.pfm_cp_merge(a, ta, b_, tb)


# --------------------------------------------------------------------------------------
# pfm_cp_accumulate
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5, 2, 9), (2, 64, 4, 128), (70000,)])
def test_accumulate(ops, rng, dtype, shape):
    a = tensor(nonzero_normal(rng, shape), dtype)
    b = tensor(nonzero_normal(rng, shape), dtype)
    out = ops.pfm_cp_accumulate(a, b)
    assert out.dtype == a.dtype and out.shape == list(shape)
    # Summed in fp32, rounded once.
    np.testing.assert_array_equal(f32(out), round_to(f32(a) + f32(b), dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("pieces", [2, 3, 7])
def test_accumulate_pieces(ops, rng, dtype, pieces):
    """b holds P tensors of a's shape back to back (the dK/dV pieces every other rank sends):
    out = a + b_0 + ... + b_{P-1}, summed in fp32 in that order, rounded once."""
    shape = (2, 33, 3, 8)
    a = tensor(nonzero_normal(rng, shape), dtype)
    b = tensor(nonzero_normal(rng, (pieces,) + shape), dtype)
    out = ops.pfm_cp_accumulate(a, b)
    assert out.shape == list(shape)
    want = f32(a).copy()
    for p in range(pieces):
        want = (want + f32(b)[p]).astype(np.float32)
    np.testing.assert_array_equal(f32(out), round_to(want, dtype))


@pytest.mark.parametrize("which,match", [
    ("shape", r"P >= 1 tensors of a's shape and dtype back to back, got a \[4, 3\] and b \[5, 2\]"),
    ("dtype", "P >= 1 tensors of a's shape and dtype"),
    ("int", "expected float32, float16 or bfloat16"),
])
def test_accumulate_bad_input(ops, which, match):
    a = tensor(np.ones((4, 3), np.float32))
    b = {"shape": tensor(np.ones((5, 2), np.float32)), "dtype": a.astype("float16"),
         "int": a.astype("int64")}[which]
    if which == "int":
        a = b
    with pytest.raises(PD_ERRORS, match=match):
        ops.pfm_cp_accumulate(a, b)


# --------------------------------------------------------------------------------------
# pfm_cp_gather_units
# --------------------------------------------------------------------------------------


def random_values(rng, shape, dtype):
    if dtype in ("int32", "int64"):
        hi = 2**31 - 1 if dtype == "int32" else 2**62
        x = rng.integers(1, hi, size=shape).astype(dtype)
        return tensor(x), x
    t = tensor(nonzero_normal(rng, shape), dtype)
    return t, f32(t)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + ["int32", "int64"])
@pytest.mark.parametrize("units,unit,out_shape", [
    (5, 1, lambda n: [n]),
    (6, 3, lambda n: [n, 3]),
    (9, 8, lambda n: [n, 2, 4]),
    (12, 128, lambda n: [n * 128]),
    (4, 1000, lambda n: [n, 1000]),
])
def test_gather_units(ops, rng, dtype, units, unit, out_shape):
    x, x_np = random_values(rng, (units * unit,), dtype)
    n = 2 * units + 1
    src = rng.integers(0, units, size=n).astype(np.int64)  # repeats and skipped units
    src[:2] = [units - 1, 0]
    out = ops.pfm_cp_gather_units(x, tensor(src), unit, out_shape(n))
    assert out.dtype == x.dtype and out.shape == out_shape(n)
    got = out.numpy() if dtype.startswith("int") else f32(out)
    want = x_np.reshape(units, unit)[src].reshape(out_shape(n))
    np.testing.assert_array_equal(got, want)


def test_gather_units_permutes_head_groups(ops, rng):
    # [B, S, H, D] -> head groups moved: unit = heads_per_group * D over a [B*S*G] grid.
    b, s, g, hg, d = 2, 5, 3, 2, 8
    x, x_np = random_values(rng, (b, s, g * hg, d), "bfloat16")
    perm = np.array([2, 0, 1])
    src = (np.arange(b * s)[:, None] * g + perm[None, :]).reshape(-1).astype(np.int64)
    out = ops.pfm_cp_gather_units(x, tensor(src), hg * d, [b, s, g * hg, d])
    want = x_np.reshape(b, s, g, hg, d)[:, :, perm].reshape(b, s, g * hg, d)
    np.testing.assert_array_equal(f32(out), want)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + ["int32"])
def test_gather_units_minus_one_writes_a_zero_unit(ops, rng, dtype):
    x, x_np = random_values(rng, (4 * 6,), dtype)
    src = np.array([3, -1, 0, -1, -1, 2], np.int64)
    out = ops.pfm_cp_gather_units(x, tensor(src), 6, [6, 6])
    got = out.numpy() if dtype.startswith("int") else f32(out)
    want = np.where((src >= 0)[:, None], x_np.reshape(4, 6)[np.maximum(src, 0)], 0)
    np.testing.assert_array_equal(got, want)


def test_gather_units_empty(ops):
    x = tensor(np.arange(1, 25, dtype=np.float32))
    out = ops.pfm_cp_gather_units(x, tensor(np.zeros(0, np.int64)), 8, [0, 8])
    assert out.shape == [0, 8]


@pytest.mark.parametrize("kwargs,match", [
    (dict(src=[0, 3]), r"src\[1\] = 3 is outside \[0, 3\)"),
    (dict(src=[-2, 0]), r"src\[0\] = -2 is outside"),
    (dict(unit=0), "unit must be positive"),
    (dict(unit=5), "24 elements, not a multiple of unit = 5"),
    (dict(out_shape=[2, 9]), r"out_shape \[2, 9\] holds 18 elements, but N x unit = 2 x 8 = 16"),
    (dict(out_shape=[-2, -8]), "negative dim"),
    (dict(src_dtype="int32"), r"src must be int64 \[N\]"),
    (dict(src=[[0, 1]]), r"src must be int64 \[N\]"),
    (dict(x_dtype="bool"), "x must be float32, float16, bfloat16, int32 or int64"),
])
def test_gather_units_bad_input(ops, kwargs, match):
    x = tensor(np.arange(1, 25, dtype=np.float32)).astype(kwargs.get("x_dtype", "float32"))
    src = tensor(np.array(kwargs.get("src", [0, 2]), dtype=np.int64)).astype(kwargs.get("src_dtype", "int64"))
    with pytest.raises(PD_ERRORS, match=match):
        ops.pfm_cp_gather_units(x, src, kwargs.get("unit", 8), kwargs.get("out_shape", [2, 8]))


# --------------------------------------------------------------------------------------
# pfm_cp_concat
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + ["int32", "int64"])
@pytest.mark.parametrize("axis,shapes", [
    (1, [(2, 3, 4, 5), (2, 7, 4, 5), (2, 1, 4, 5)]),  # query rows of [B, S, H, D]
    (2, [(2, 4, 3), (2, 4, 6)]),                        # LSE [B, H, S]
    (0, [(3, 2), (1, 2)]),
    (1, [(2, 0, 3), (2, 5, 3)]),                        # an empty piece
])
def test_concat(ops, rng, dtype, axis, shapes):
    pieces = [random_values(rng, s, dtype) for s in shapes]
    out = ops.pfm_cp_concat([t for t, _ in pieces], axis)
    got = out.numpy() if dtype.startswith("int") else f32(out)
    np.testing.assert_array_equal(got, np.concatenate([a for _, a in pieces], axis))
    assert out.dtype == pieces[0][0].dtype


@pytest.mark.parametrize("xs,axis,match", [
    (lambda: [tensor(np.zeros((2, 3), np.float32)), tensor(np.zeros((3, 3), np.float32))], 1, "differ off the axis"),
    (lambda: [tensor(np.zeros((2, 3), np.float32)), tensor(np.zeros((2, 3), np.int32))], 0, "dtypes differ"),
    (lambda: [tensor(np.zeros((2, 3), np.float32)), tensor(np.zeros((2, 3, 1), np.float32))], 0, "ranks differ"),
    (lambda: [tensor(np.zeros((2, 3), np.float32))], 2, "axis 2 is out of range"),
])
def test_concat_bad_input(ops, xs, axis, match):
    with pytest.raises(PD_ERRORS, match=match):
        ops.pfm_cp_concat(xs(), axis)
