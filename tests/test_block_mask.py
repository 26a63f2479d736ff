"""block_mask (Paddle 3.x's block-level mask on top of the column mask, 128 x 128 blocks,
0 = masked): CPU kernels against the float64 dense reference of (column mask AND expanded
block mask), every index form, Hm = 1, Hk and H, GQA, batch broadcast, odd lengths, rows left
with no key; bad block masks raise naming the argument."""

import numpy as np
import paddle
import pytest

import paddle_flashmask as pfm
from reference import attention_fwd_bwd, keep_mask, random_indices, rel_err, round_to_dtype

B, H, HK, D = 2, 4, 2, 16


def expanded(bm, sq, sk):
    return np.repeat(np.repeat(bm, 128, 2), 128, 3)[:, :, :sq, :sk].astype(bool)


def run(q, k, v, do, idx, bm, causal, dtype="float32"):
    qt, kt, vt = (paddle.to_tensor(x).astype(dtype) for x in (q, k, v))
    for t in (qt, kt, vt):
        t.stop_gradient = False
    out, lse = pfm.flashmask_attention(qt, kt, vt, None if idx is None else paddle.to_tensor(idx), causal=causal,
                                       block_mask=paddle.to_tensor(bm), return_softmax_lse=True)
    grads = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(do).astype(dtype)])
    f32 = lambda t: t.astype("float32").numpy()
    return f32(out), lse.numpy(), [f32(g) for g in grads]


@pytest.mark.parametrize("form", [(True, 1), (True, 2), (False, 2), (False, 4), (True, None), (False, None)])
@pytest.mark.parametrize("mask_heads", [1, HK, H])
@pytest.mark.parametrize("seqlens", [(300, 300), (129, 257)])
def test_block_mask_matches_the_dense_reference(form, mask_heads, seqlens):
    causal, C = form
    sq, sk = seqlens
    rng = np.random.default_rng(sq + sk + (C or 0) + mask_heads)
    idx = None if C is None else random_indices(rng, B, mask_heads, sq, sk, causal, C)
    bm_heads = mask_heads
    bm = (rng.random((B, bm_heads, -(-sq // 128), -(-sk // 128))) < 0.6).astype(np.int32)
    bm[0, 0, 0, :] = 0  # rows 0-127 of batch 0, mask head 0 see no key at all
    q, do = (rng.standard_normal((B, sq, H, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, sk, HK, D)).astype(np.float32) for _ in range(2))
    keep_heads = H if mask_heads == H else HK  # heads the mask varies over
    keep = keep_mask(idx, causal, B, keep_heads, sq, sk)
    keep = keep & np.broadcast_to(np.repeat(expanded(bm, sq, sk), keep_heads // bm_heads, 1), keep.shape)
    ref = attention_fwd_bwd(q, k, v, keep, D ** -0.5, do)
    out, lse, (dq, dk, dv) = run(q, k, v, do, idx, bm, causal)
    assert rel_err(out, ref["out"]) < 1e-5
    finite = np.isfinite(ref["lse"])
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], ref["lse"][finite], rtol=1e-5, atol=1e-5)
    assert rel_err(dq, ref["dq"], ref["dq_mag"]) < 1e-5
    assert rel_err(dk, ref["dk"], ref["dk_mag"]) < 1e-5
    assert rel_err(dv, ref["dv"]) < 1e-5
    assert np.all(out[0, :128, : H // bm_heads] == 0) and not np.isnan(dq).any()


def test_block_mask_broadcast_over_batch_and_bf16():
    rng = np.random.default_rng(7)
    sq = sk = 260
    idx = random_indices(rng, B, 1, sq, sk, True, 1)
    bm = (rng.random((1, 1, 3, 3)) < 0.7).astype(np.int32)
    # bf16 values from the start: the reference sees exactly what the op gets
    q, do = (round_to_dtype(rng.standard_normal((B, sq, H, D)), "bfloat16") for _ in range(2))
    k, v = (round_to_dtype(rng.standard_normal((B, sk, HK, D)), "bfloat16") for _ in range(2))
    keep = keep_mask(idx, True, B, HK, sq, sk) & np.broadcast_to(expanded(bm, sq, sk), (B, HK, sq, sk))
    ref = attention_fwd_bwd(q, k, v, keep, D ** -0.5, do)
    out, _, (dq, dk, dv) = run(q, k, v, do, idx, bm, True, dtype="bfloat16")
    assert rel_err(out, ref["out"]) < 1e-2
    assert rel_err(dq, ref["dq"], ref["dq_mag"]) < 1e-2 and rel_err(dk, ref["dk"], ref["dk_mag"]) < 1e-2
    # all ones: the same as no block mask, bit for bit
    ones = np.ones((1, 1, 3, 3), np.int32)
    qt, kt, vt = (paddle.to_tensor(x) for x in (q, k, v))
    it = paddle.to_tensor(idx)
    a = pfm.flashmask_attention(qt, kt, vt, it, causal=True, block_mask=paddle.to_tensor(ones)).numpy()
    b = pfm.flashmask_attention(qt, kt, vt, it, causal=True).numpy()
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad,err,match", [
    (lambda: paddle.ones([B, 1, 3, 3], dtype="int64"), TypeError, "block_mask must be int32"),
    (lambda: np.ones((B, 1, 3, 3), np.int32), TypeError, "block_mask must be a paddle.Tensor"),
    (lambda: paddle.ones([B, 1, 2, 3], dtype="int32"), ValueError, r"ceil\(seqlen_q/128\) = 3"),
    (lambda: paddle.ones([3, 1, 3, 3], dtype="int32"), ValueError, "block_mask must be"),
    (lambda: paddle.ones([B, HK, 3, 3], dtype="int32"), ValueError, "the indices' mask heads"),
    (lambda: paddle.full([B, 1, 3, 3], 2, dtype="int32"), ValueError, "0 \\(masked block\\) or 1"),
])
def test_bad_block_mask_raises(bad, err, match):
    q = paddle.randn([B, 300, H, D])
    k = paddle.randn([B, 300, HK, D])
    idx = paddle.to_tensor(random_indices(np.random.default_rng(0), B, 1, 300, 300, True, 1))
    with pytest.raises(err, match=match):
        pfm.flashmask_attention(q, k, k, idx, causal=True, block_mask=bad())


def test_block_mask_values_read_once_per_tensor_and_again_after_in_place_change(monkeypatch):
    """Every layer gets the same block_mask: its values are read back (a device sync on GPU)
    once, and again only when the tensor changed in place."""
    q = paddle.randn([1, 200, H, D])
    k = paddle.randn([1, 200, HK, D])
    bm = paddle.ones([1, 1, 2, 2], dtype="int32")
    reads = []
    real_numpy = paddle.Tensor.numpy
    monkeypatch.setattr(paddle.Tensor, "numpy",
                        lambda self, *a, **kw: (reads.append(list(self.shape)), real_numpy(self, *a, **kw))[1])
    for _ in range(3):
        pfm.flashmask_attention(q, k, k, causal=True, block_mask=bm)
    assert reads.count([1, 1, 2, 2]) == 1, reads
    bm[0, 0, 1, 1] = 3  # in place: no longer 0/1
    with pytest.raises(ValueError, match="0 \\(masked block\\) or 1"):
        pfm.flashmask_attention(q, k, k, causal=True, block_mask=bm)
