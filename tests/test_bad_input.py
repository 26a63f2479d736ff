"""Malformed calls of flashmask_attention must fail early and clearly.

Every bad call raises ValueError/TypeError (NotImplementedError where the API
documents an unsupported option) whose message names the offending argument,
and the attention kernel never runs: a spy wrapped around the op module records
which ops were launched. Shape/type errors must not even reach the op library;
index *value* errors may only run the cheap ``pfm_flashmask_check_indices`` op.
A subprocess test repeats the bad calls in a fresh interpreter to show the
process neither crashes nor hangs. Valid edge cases (values exactly 0 and Sq,
Hm=1 with GQA, empty intervals, ...) must keep working and match the float64
reference.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest

import paddle_flashmask as pfm
from paddle_flashmask import validation
from reference import attention_fwd_bwd, keep_mask

attention_mod = sys.modules["paddle_flashmask.attention"]
F = pfm.flashmask_attention

B, S, H, HK, D = 2, 16, 4, 2, 8
ATTN_OP = "pfm_flashmask_attention"
CHECK_OP = "pfm_flashmask_check_indices"
REPO = pathlib.Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def rand(*shape, dtype="float32", seed=0):
    rng = np.random.default_rng(seed + 7 * len(shape) + sum(shape))
    return paddle.to_tensor(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def qkv(b=B, sq=S, sk=S, h=H, hk=HK, d=D, dtype="float32"):
    return rand(b, sq, h, d, dtype=dtype, seed=1), rand(b, sk, hk, d, dtype=dtype, seed=2), \
        rand(b, sk, hk, d, dtype=dtype, seed=3)


def idx(arr):
    return paddle.to_tensor(np.ascontiguousarray(arr, dtype=np.int32))


def full_idx(value, c, b=B, hm=1, sk=S, dtype="int32"):
    return paddle.full([b, hm, sk, c], value, dtype=dtype)


def valid_idx(causal, c, b=B, hm=1, sk=S, sq=S, seed=0):
    """Random well-formed indices (in [0, sq], start <= end) for the mode."""
    rng = np.random.default_rng(seed)
    a = np.sort(rng.integers(0, sq + 1, size=(b, hm, sk, c)), axis=-1)
    if not causal and c == 2:
        a = a[..., ::-1]  # [LTS, UTE]: any order is fine, use LTS >= UTE (a band)
    return idx(a)


class OpSpy:
    """Wraps the op module and records which pfm_* ops were launched."""

    def __init__(self, real):
        self._real = real
        self.calls = []
        self.loads = 0

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name.startswith("pfm_") and callable(attr):
            def wrapped(*args, **kwargs):
                self.calls.append(name)
                return attr(*args, **kwargs)

            return wrapped
        return attr


@pytest.fixture(scope="module")
def real_ops():
    return pfm.load_ops()  # build (or find) the op once, outside the spied calls


@pytest.fixture
def spy(real_ops, monkeypatch):
    s = OpSpy(real_ops)

    def fake_load_ops():
        s.loads += 1
        return s

    monkeypatch.setattr(attention_mod, "load_ops", fake_load_ops)
    return s


def assert_rejected(spy, exc, match, *args, value_check=False, **kwargs):
    """Call F(*args, **kwargs) and require `exc` matching `match` before any kernel.

    value_check=False: argument-level error, no op may run at all.
    value_check=True: index-value error, only the index check op may run.
    """
    with pytest.raises(exc, match=match) as info:
        F(*args, **kwargs)
    assert ATTN_OP not in spy.calls, f"attention kernel ran before raising {info.value!r}"
    if value_check:
        assert spy.calls == [CHECK_OP], spy.calls
    else:
        assert spy.calls == [], f"ops ran before an argument error: {spy.calls}"
    return info.value


def check_against_reference(q, k, v, indices, causal, window=None, **kwargs):
    out, lse = F(q, k, v, indices, causal=causal, window_size=window, return_softmax_lse=True, **kwargs)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    keep = keep_mask(None if indices is None else indices.numpy(), causal, b, hk, sq, sk,
                     window=None if window is None else (window, window) if isinstance(window, int) else window)
    ref = attention_fwd_bwd(q.numpy(), k.numpy(), v.numpy(), keep, d**-0.5)
    np.testing.assert_allclose(out.numpy(), ref["out"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), ref["lse"], rtol=1e-4, atol=1e-5)
    assert list(out.shape) == list(q.shape[:3]) + [v.shape[3]]  # value may have a head dim of its own
    return out


# --------------------------------------------------------------------------------------
# startend_row_indices: type, rank, shape
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int64", "float32", "int16", "bool"])
def test_indices_dtype_not_int32(spy, dtype):
    q, k, v = qkv()
    bad = full_idx(S, 1).astype(dtype)
    assert_rejected(spy, TypeError, r"startend_row_indices must be int32", q, k, v, bad, causal=True)


@pytest.mark.parametrize("bad", [np.full([B, 1, S, 1], S, np.int32), [[[[S]]]], S],
                         ids=["numpy", "list", "int"])
def test_indices_not_a_tensor(spy, bad):
    q, k, v = qkv()
    assert_rejected(spy, TypeError, r"startend_row_indices must be a paddle\.Tensor", q, k, v, bad,
                    causal=True)


@pytest.mark.parametrize("shape", [[B, S, 1], [B, 1, S, 1, 1], [S, 1], [B * S]],
                         ids=["3d", "5d", "2d", "1d"])
def test_indices_wrong_rank(spy, shape):
    q, k, v = qkv()
    bad = paddle.full(shape, S, dtype="int32")
    assert_rejected(spy, ValueError, r"startend_row_indices must be 4-D", q, k, v, bad, causal=True)


@pytest.mark.parametrize("skm", [S - 1, S + 1, 1])
def test_indices_seqlen_k_mismatch(spy, skm):
    q, k, v = qkv()
    assert_rejected(spy, ValueError, r"startend_row_indices dim 2 must equal the key length",
                    q, k, v, full_idx(S, 1, sk=skm), causal=True)


def test_indices_dim2_is_seqlen_q_instead_of_seqlen_k(spy):
    # Sq != Sk: indexing by query length is a likely mistake and must be caught.
    q, k, v = qkv(sq=8, sk=S)
    assert_rejected(spy, ValueError, r"startend_row_indices dim 2 must equal the key length 16.*got 8",
                    q, k, v, full_idx(8, 1, sk=8), causal=True)


@pytest.mark.parametrize("bm", [1, 3])
def test_indices_batch_mismatch(spy, bm):
    q, k, v = qkv()
    assert_rejected(spy, ValueError, r"startend_row_indices batch size", q, k, v,
                    full_idx(S, 1, b=bm), causal=True)


@pytest.mark.parametrize("causal,c", [(True, 3), (True, 4), (True, 0), (False, 1), (False, 3),
                                      (False, 5)])
def test_indices_column_count_not_taken_by_mode(spy, causal, c):
    q, k, v = qkv()
    assert_rejected(spy, ValueError, r"startend_row_indices last dim", q, k, v, full_idx(S, c),
                    causal=causal)


@pytest.mark.parametrize("hm", [3, 0, 8])
def test_indices_mask_heads_not_1_hk_or_h(spy, hm):
    q, k, v = qkv()
    assert H != HK
    assert_rejected(spy, ValueError, r"startend_row_indices mask heads", q, k, v, full_idx(S, 1, hm=hm),
                    causal=True)


# --------------------------------------------------------------------------------------
# startend_row_indices: values (checked by the index check op, before attention)
# --------------------------------------------------------------------------------------

MODES = [(True, 1), (True, 2), (False, 2), (False, 4)]


@pytest.mark.parametrize("causal,c", MODES)
def test_indices_negative(spy, causal, c):
    q, k, v = qkv()
    for col in range(c):
        spy.calls.clear()
        a = valid_idx(causal, c).numpy()
        a[1, 0, 5, col] = -1
        if col > 0 and (causal or c == 4) and col % 2 == 1:
            a[1, 0, 5, col - 1] = -1  # keep start <= end so only the sign is wrong
        assert_rejected(spy, ValueError, r"startend_row_indices values.*below 0", q, k, v, idx(a),
                        causal=causal, value_check=True)


@pytest.mark.parametrize("causal,c", MODES)
def test_indices_above_seqlen_q(spy, causal, c):
    q, k, v = qkv()
    for col in range(c):
        spy.calls.clear()
        a = valid_idx(causal, c).numpy()
        a[0, 0, 3, col] = S + 1
        if (causal or c == 4) and col % 2 == 0 and col + 1 < c:
            a[0, 0, 3, col + 1] = S + 1  # keep start <= end
        assert_rejected(spy, ValueError, rf"startend_row_indices values.*above the query length {S}",
                        q, k, v, idx(a), causal=causal, value_check=True)


@pytest.mark.parametrize("causal", [True, False])
def test_indices_bound_is_seqlen_q_when_sq_lt_sk(spy, causal):
    sq, sk = 8, 16
    q, k, v = qkv(sq=sq, sk=sk)
    c = 1 if causal else 2
    # sq + 1 <= sk: fine for the key length, but rows only go up to sq.
    bad = full_idx(sq + 1, c, sk=sk)
    err = assert_rejected(spy, ValueError, rf"startend_row_indices values must be query rows in \[0, {sq}\]",
                          q, k, v, bad, causal=causal, value_check=True)
    assert f"above the query length {sq}" in str(err)


def test_indices_bound_is_seqlen_q_when_sq_gt_sk(spy):
    sq, sk = 16, 8
    q, k, v = qkv(sq=sq, sk=sk)
    assert_rejected(spy, ValueError, r"above the query length 16", q, k, v, full_idx(sq + 1, 1, sk=sk),
                    causal=True, value_check=True)
    spy.calls.clear()
    check_against_reference(q, k, v, full_idx(sq, 1, sk=sk), True)  # sq > sk is still allowed


def test_indices_huge_and_int_min(spy):
    q, k, v = qkv()
    for val, what in ((2**31 - 1, "above"), (-(2**31), "below")):
        spy.calls.clear()
        assert_rejected(spy, ValueError, rf"startend_row_indices values.*{what}", q, k, v, full_idx(val, 1),
                        causal=True, value_check=True)


@pytest.mark.parametrize("causal", [True, False])
def test_lower_start_above_end(spy, causal):
    q, k, v = qkv()
    c = 2 if causal else 4
    a = valid_idx(causal, c).numpy()
    a[0, 0, 7, 0], a[0, 0, 7, 1] = 9, 4
    assert_rejected(spy, ValueError, r"startend_row_indices.*lower start \(LTS.*above its lower end \(LTE",
                    q, k, v, idx(a), causal=causal, value_check=True)


def test_upper_start_above_end(spy):
    q, k, v = qkv()
    a = valid_idx(False, 4).numpy()
    a[1, 0, 2, 2], a[1, 0, 2, 3] = 12, 11
    assert_rejected(spy, ValueError, r"startend_row_indices.*upper start \(UTS.*above its upper end \(UTE",
                    q, k, v, idx(a), causal=False, value_check=True)


def test_several_value_problems_all_named(spy):
    q, k, v = qkv()
    a = valid_idx(False, 4).numpy()
    a[0, 0, 0, 0] = -3
    a[0, 0, 1, 3] = S + 5
    a[1, 0, 2, 0:2] = (10, 2)
    a[1, 0, 3, 2:4] = (10, 2)
    err = assert_rejected(spy, ValueError, r"startend_row_indices", q, k, v, idx(a), causal=False,
                          value_check=True)
    msg = str(err)
    for part in ("below 0", "above the query length", "LTS", "UTS"):
        assert part in msg, msg


def test_non_contiguous_bad_indices_caught(spy):
    q, k, v = qkv()
    a = np.stack([np.full([B, 1, S], S), np.full([B, 1, S], -5)], -1).astype(np.int32)
    view = paddle.to_tensor(a)[:, :, :, 1:]  # strided view holding only -5
    assert_rejected(spy, ValueError, r"startend_row_indices values.*below 0", q, k, v, view, causal=True,
                    value_check=True)


def test_indices_tensor_checked_once_while_unchanged(spy):
    # Every layer of a model shares one indices tensor: one check, not one per layer.
    q, k, v = qkv()
    good = full_idx(4, 1)  # valid for both query lengths below
    for _ in range(3):
        F(q, k, v, good, causal=True)
    assert spy.calls == [CHECK_OP] + [ATTN_OP] * 3, spy.calls
    spy.calls.clear()
    F(q[:, :8], k, v, good, causal=True)  # another query length: its own check
    F(q, k, v, full_idx(4, 1), causal=True)  # another tensor, same values
    assert spy.calls == [CHECK_OP, ATTN_OP, CHECK_OP, ATTN_OP], spy.calls


def test_indices_changed_in_place_checked_again(spy):
    q, k, v = qkv()
    t = valid_idx(True, 1)
    F(q, k, v, t, causal=True)
    t[1, 0, 5, 0] = -1  # in place: the tensor that passed is now bad
    spy.calls.clear()
    assert_rejected(spy, ValueError, r"startend_row_indices values.*below 0", q, k, v, t, causal=True,
                    value_check=True)


def test_checked_tensors_do_not_pile_up(spy):
    q, k, v = qkv()
    for _ in range(3 * attention_mod._CHECKED_PRUNE_AT):
        F(q, k, v, full_idx(4, 1), causal=True)  # each dies after its call
    assert len(attention_mod._checked_indices) <= attention_mod._CHECKED_PRUNE_AT
    assert spy.calls.count(CHECK_OP) == 3 * attention_mod._CHECKED_PRUNE_AT


@pytest.mark.parametrize("setting", ["no", "false", 0, 2, None, []])
def test_index_validation_setting_must_be_a_bool(setting):
    old = pfm.set_index_validation(True)
    try:
        with pytest.raises(TypeError, match="enabled must be a bool"):
            pfm.set_index_validation(setting)
        assert pfm.set_index_validation(True) is True  # the bad setting left it as it was
    finally:
        pfm.set_index_validation(old)


def test_disabling_validation_forgets_checked_tensors(spy):
    q, k, v = qkv()
    t = valid_idx(True, 1)
    F(q, k, v, t, causal=True)
    old = pfm.set_index_validation(False)
    try:
        pfm.set_index_validation(True)
        spy.calls.clear()
        F(q, k, v, t, causal=True)
    finally:
        pfm.set_index_validation(old)
    assert spy.calls == [CHECK_OP, ATTN_OP], spy.calls


# --------------------------------------------------------------------------------------
# query / key / value
# --------------------------------------------------------------------------------------


def test_num_heads_not_multiple_of_key_heads(spy):
    q, k, v = qkv(h=3, hk=2)
    assert_rejected(spy, ValueError, r"query num_heads \(3\) must be a multiple of key num_heads \(2\)",
                    q, k, v)
    spy.calls.clear()
    q, k, v = qkv(h=4, hk=3)
    assert_rejected(spy, ValueError, r"num_heads", q, k, v, causal=True)


def test_key_heads_zero(spy):
    q, k, v = qkv(hk=0)
    assert_rejected(spy, ValueError, r"key num_heads \(0\)", q, k, v)


def test_head_dim_mismatch(spy):
    q, _, _ = qkv(d=8)
    _, k, v = qkv(d=16)
    assert_rejected(spy, ValueError, r"key head_dim 16 does not match query head_dim 8", q, k, v)


def test_batch_mismatch_q_k(spy):
    q, _, _ = qkv(b=2)
    _, k, v = qkv(b=3)
    assert_rejected(spy, ValueError, r"key batch size 3 does not match query batch size 2", q, k, v)


@pytest.mark.parametrize("vshape", [[B, S + 1, HK, D], [B, S, 1, D], [1, S, HK, D], [B, S, HK, 0]],
                         ids=["seqlen", "heads", "batch", "head_dim_0"])
def test_value_shape_differs_from_key(spy, vshape):
    q, k, _ = qkv()
    v = rand(*vshape, seed=5)
    assert_rejected(spy, ValueError, r"value must be \[batch, seqlen_k, num_heads_k\]", q, k, v)


@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float64", "bool"])
def test_non_float_inputs(spy, which, dtype):
    t = dict(zip(("query", "key", "value"), qkv()))
    t[which] = (t[which] * 10).astype(dtype)
    assert_rejected(spy, TypeError, rf"{which} must be float32, float16 or bfloat16", t["query"], t["key"],
                    t["value"])


@pytest.mark.parametrize("dq,dk,dv", [("float32", "float16", "float32"), ("float32", "float32", "float16"),
                                      ("float16", "bfloat16", "bfloat16"), ("bfloat16", "float32", "float32")])
def test_mixed_dtypes(spy, dq, dk, dv):
    q, k, v = qkv()
    assert_rejected(spy, TypeError, r"query, key and value must share one dtype", q.astype(dq), k.astype(dk),
                    v.astype(dv))


@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("rank", [3, 5, 2])
def test_wrong_rank_qkv(spy, which, rank):
    t = dict(zip(("query", "key", "value"), qkv()))
    x = t[which]
    t[which] = x.reshape([B, x.shape[1], -1]) if rank == 3 else x.unsqueeze(0) if rank == 5 \
        else x.reshape([B, -1])
    assert_rejected(spy, ValueError, rf"{which} must be 4-D", t["query"], t["key"], t["value"])


def test_all_rank3_qkv(spy):
    q, k, v = (x.reshape([B, x.shape[1], -1]) for x in qkv())
    assert_rejected(spy, ValueError, r"query must be 4-D", q, k, v)


@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("kind", ["numpy", "list", "none"])
def test_non_tensor_inputs(spy, which, kind):
    t = dict(zip(("query", "key", "value"), qkv()))
    t[which] = {"numpy": t[which].numpy(), "list": t[which].numpy().tolist(), "none": None}[kind]
    assert_rejected(spy, TypeError, rf"{which} must be a paddle\.Tensor", t["query"], t["key"], t["value"])


@pytest.mark.parametrize("which", ["query", "key"])
def test_empty_tensors(spy, which):
    q, k, v = qkv()
    if which == "query":
        q = q[:, :0]
    else:
        k, v = k[:, :0], v[:, :0]
    assert_rejected(spy, ValueError, r"query and key must be non-empty", q, k, v)


def test_no_heads_is_an_empty_tensor(spy):
    q, k, v = qkv(h=0, hk=0)  # not "0 must be a multiple of 0"
    assert_rejected(spy, ValueError, r"query and key must be non-empty", q, k, v)


# --------------------------------------------------------------------------------------
# window_size
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [2, (2, 3), 0])
@pytest.mark.parametrize("causal,c", MODES)
def test_window_with_indices(spy, window, causal, c):
    q, k, v = qkv()
    err = assert_rejected(spy, ValueError, r"window_size cannot be combined with startend_row_indices",
                          q, k, v, valid_idx(causal, c), causal=causal, window_size=window)
    assert "startend_row_indices" in str(err)


@pytest.mark.parametrize("window,side", [(-1, "left"), ((-1, 2), "left"), ((2, -1), "right"),
                                         ((-5, -5), "left")])
def test_window_negative(spy, window, side):
    q, k, v = qkv()
    assert_rejected(spy, ValueError, rf"window_size {side} must be >= 0", q, k, v, window_size=window)


@pytest.mark.parametrize("window", [2.5, 2.0, "3", True, (1.0, 2), (1, "2"), (1, None), {"left": 1}, b"2"],
                         ids=["float", "intlike_float", "str", "bool", "float_left", "str_right",
                              "none_right", "dict", "bytes"])
def test_window_wrong_type(spy, window):
    q, k, v = qkv()
    assert_rejected(spy, TypeError, r"window_size", q, k, v, window_size=window)


@pytest.mark.parametrize("window", [(1, 2, 3), (1,), (), [1, 2, 3]])
def test_window_wrong_length(spy, window):
    q, k, v = qkv()
    assert_rejected(spy, TypeError, r"window_size must be an int or a \(left, right\) pair", q, k, v,
                    window_size=window)


# --------------------------------------------------------------------------------------
# dropout / training
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 1e-6])
def test_dropout_while_training_not_implemented(spy, p):
    q, k, v = qkv()
    assert_rejected(spy, NotImplementedError, r"dropout", q, k, v, dropout=p, training=True)
    spy.calls.clear()
    assert_rejected(spy, NotImplementedError, r"dropout", q, k, v, dropout=p)  # training defaults to True


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("training", [True, False])
def test_dropout_out_of_range(spy, p, training):
    q, k, v = qkv()
    assert_rejected(spy, ValueError, r"dropout must be in \[0, 1\)", q, k, v, dropout=p, training=training)


@pytest.mark.parametrize("p", ["0.1", None, True, [0.1]], ids=["str", "none", "bool", "list"])
def test_dropout_wrong_type(spy, p):
    q, k, v = qkv()
    assert_rejected(spy, TypeError, r"dropout must be a float", q, k, v, dropout=p)


@pytest.mark.parametrize("training", ["no", 0, 1, None])
def test_training_must_be_a_bool(spy, training):
    # training=0 with dropout > 0 would otherwise run without dropout, "no" would mean True
    q, k, v = qkv()
    assert_rejected(spy, TypeError, r"training must be a bool", q, k, v, training=training)


@pytest.mark.parametrize("p", [0.1, 0.9, np.float32(0.3)])
def test_dropout_without_training_is_identity(p):
    q, k, v = qkv()
    ind = valid_idx(True, 2)
    ref = F(q, k, v, ind, causal=True)
    out = F(q, k, v, ind, causal=True, dropout=p, training=False)
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


# --------------------------------------------------------------------------------------
# softmax_scale
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0, 0.0, -0.5, -1, float("inf"), -float("inf"), float("nan")])
def test_softmax_scale_not_positive_finite(spy, scale):
    q, k, v = qkv()
    assert_rejected(spy, ValueError, r"softmax_scale must be a positive finite float", q, k, v,
                    softmax_scale=scale)


@pytest.mark.parametrize("scale", ["0.5", True, [0.5], b"1"], ids=["str", "bool", "list", "bytes"])
def test_softmax_scale_wrong_type(spy, scale):
    q, k, v = qkv()
    assert_rejected(spy, TypeError, r"softmax_scale must be a positive float or None", q, k, v,
                    softmax_scale=scale)


def test_softmax_scale_overflowing_float32(spy):
    # 1e39 is a finite Python float but not a float32: it must not become inf in the op.
    q, k, v = qkv()
    assert_rejected(spy, ValueError, r"softmax_scale", q, k, v, softmax_scale=1e39)


@pytest.mark.parametrize("window", [2**31, (2**40, 1), (1, 2**40)])
def test_window_longer_than_int32_means_unlimited(window):
    # A window side longer than the sequence restricts nothing (clipped, not overflowed).
    q, k, v = qkv()
    left, right = (window, window) if isinstance(window, int) else window
    big = 10**6
    got = pfm.flashmask_attention(q, k, v, window_size=window)
    want = pfm.flashmask_attention(q, k, v, window_size=(min(left, big), min(right, big)))
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("name", ["causal", "return_softmax_lse"])
@pytest.mark.parametrize("value", ["no", None, 1, [True]])
def test_flags_must_be_bool(spy, name, value):
    q, k, v = qkv()
    assert_rejected(spy, TypeError, name, q, k, v, **{name: value})


@pytest.mark.parametrize("value", ["yes", 1, 0, 1.0, [True], np.int32(1)], ids=repr)
def test_deterministic_must_be_bool_or_none(spy, value):
    q, k, v = qkv()
    assert_rejected(spy, TypeError, r"deterministic must be a bool", q, k, v, deterministic=value)


# --------------------------------------------------------------------------------------
# GPU kernel family (set_gpu_kernel / PADDLE_FLASHMASK_GPU_KERNEL)
# --------------------------------------------------------------------------------------

GPU_KERNEL_ENV = "PADDLE_FLASHMASK_GPU_KERNEL"
ALLOWED_KERNELS = r"'auto', 'fa2', 'sm90'"


@pytest.mark.parametrize("bad", ["cuda", "", "fa3", "sm_90", "hopper"])
def test_set_gpu_kernel_unknown_name(default_gpu_kernel, bad):
    pfm.set_gpu_kernel("fa2")
    with pytest.raises(ValueError, match=rf"set_gpu_kernel: name must be .*{ALLOWED_KERNELS}, got '{bad}'"):
        pfm.set_gpu_kernel(bad)
    assert pfm.get_gpu_kernel() == "fa2"  # a rejected name changes nothing


@pytest.mark.parametrize("bad", [2, True, b"fa2", ["fa2"]], ids=repr)
def test_set_gpu_kernel_not_a_string(default_gpu_kernel, bad):
    with pytest.raises(TypeError, match=rf"set_gpu_kernel: name must be .*{ALLOWED_KERNELS}"):
        pfm.set_gpu_kernel(bad)
    assert pfm.get_gpu_kernel() == "auto"


def test_gpu_kernel_env_unknown_name(default_gpu_kernel, spy, monkeypatch):
    monkeypatch.setenv(GPU_KERNEL_ENV, "tensorcore")
    with pytest.raises(ValueError, match=rf"{GPU_KERNEL_ENV} must be .*{ALLOWED_KERNELS}, got 'tensorcore'"):
        pfm.get_gpu_kernel()
    q, k, v = qkv()
    assert_rejected(spy, ValueError, rf"{GPU_KERNEL_ENV} must be .*{ALLOWED_KERNELS}", q, k, v, causal=True)
    spy.calls.clear()
    pfm.set_gpu_kernel("fa2")  # an explicit setting wins over the env variable
    check_against_reference(q, k, v, None, True)


# --------------------------------------------------------------------------------------
# unsupported options of Paddle's signature
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bm,exc", [("tensor", ValueError), ("list", TypeError), ("false", TypeError)])
def test_bad_block_mask_rejected(spy, bm, exc):
    """(tests/test_block_mask.py checks block masks themselves.)"""
    q, k, v = qkv()
    val = {"tensor": paddle.ones([B, 1, 1, 7], dtype="int32"), "list": [], "false": False}[bm]
    assert_rejected(spy, exc, r"block_mask", q, k, v, block_mask=val)


def test_return_seed_offset_not_implemented(spy):
    q, k, v = qkv()
    assert_rejected(spy, NotImplementedError, r"return_seed_offset", q, k, v, return_seed_offset=True)


def test_fixed_seed_offset_not_implemented(spy):
    q, k, v = qkv()
    assert_rejected(spy, NotImplementedError, r"fixed_seed_offset", q, k, v,
                    fixed_seed_offset=paddle.zeros([2], dtype="int64"))


def test_rng_name_not_implemented(spy):
    q, k, v = qkv()
    assert_rejected(spy, NotImplementedError, r"rng_name", q, k, v, rng_name="local_seed")


def test_unknown_keyword_and_extra_positional():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="is_causal"):
        F(q, k, v, is_causal=True)
    with pytest.raises(TypeError):
        F(q, k, v, None, 0.0)  # everything after startend_row_indices is keyword-only


# --------------------------------------------------------------------------------------
# valid edge cases must NOT raise (and must be right)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal,c", MODES)
@pytest.mark.parametrize("value", ["zero", "seqlen_q"])
def test_values_exactly_0_and_sq_accepted(causal, c, value):
    q, k, v = qkv()
    ind = full_idx(0 if value == "zero" else S, c)
    out = check_against_reference(q, k, v, ind, causal)
    assert np.isfinite(out.numpy()).all()


@pytest.mark.parametrize("causal,c", MODES)
def test_values_mixing_0_and_sq_accepted(causal, c):
    q, k, v = qkv()
    a = np.zeros([B, 1, S, c], np.int32)
    a[..., -1] = S  # starts 0, ends Sq: the widest interval
    if not causal and c == 2:
        a = a[..., ::-1]  # LTS = Sq, UTE = 0: nothing masked
    check_against_reference(q, k, v, idx(a), causal)


@pytest.mark.parametrize("sq,sk", [(8, 16), (16, 8)])
@pytest.mark.parametrize("causal,c", MODES)
def test_value_sq_accepted_with_sq_ne_sk(sq, sk, causal, c):
    q, k, v = qkv(sq=sq, sk=sk)
    check_against_reference(q, k, v, full_idx(sq, c, sk=sk), causal)
    check_against_reference(q, k, v, valid_idx(causal, c, sk=sk, sq=sq, seed=3), causal)


@pytest.mark.parametrize("causal,c", MODES)
@pytest.mark.parametrize("hm", [1, HK, H])
def test_mask_heads_1_hk_or_h_with_gqa(causal, c, hm):
    q, k, v = qkv()
    assert H != HK
    check_against_reference(q, k, v, valid_idx(causal, c, hm=hm, seed=hm), causal)


def test_mask_heads_1_with_mqa():
    q, k, v = qkv(hk=1)
    check_against_reference(q, k, v, valid_idx(True, 1), True)


@pytest.mark.parametrize("start", [0, 5, S])
def test_empty_interval_causal_c2(start):
    q, k, v = qkv()
    ind = full_idx(start, 2)  # LTS == LTE: nothing masked beyond causal
    out = check_against_reference(q, k, v, ind, True)
    np.testing.assert_allclose(out.numpy(), F(q, k, v, causal=True).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lower,upper", [(3, 0), (S, 7), (0, S)])
def test_empty_intervals_non_causal_c4(lower, upper):
    q, k, v = qkv()
    ind = full_idx(0, 4).numpy()
    ind[..., 0:2] = lower
    ind[..., 2:4] = upper
    out = check_against_reference(q, k, v, idx(ind), False)
    np.testing.assert_allclose(out.numpy(), F(q, k, v).numpy(), rtol=1e-5, atol=1e-6)


def test_non_causal_c2_any_order_accepted():
    # [LTS, UTE] has no start <= end constraint; UTE > LTS masks everything (zero output).
    q, k, v = qkv()
    a = np.zeros([B, 1, S, 2], np.int32)
    a[..., 0], a[..., 1] = 3, 12
    out = check_against_reference(q, k, v, idx(a), False)
    assert np.isfinite(out.numpy()).all()


@pytest.mark.parametrize("window", [0, 3, (2, 0), (0, 5), [1, 1], np.int64(2), S * 4])
@pytest.mark.parametrize("causal", [True, False])
def test_valid_window_sizes(window, causal):
    q, k, v = qkv()
    w = window.tolist() if isinstance(window, np.integer) else window
    check_against_reference(q, k, v, None, causal, window=tuple(w) if isinstance(w, list) else w)


@pytest.mark.parametrize("scale", [0.5, 1, np.float32(0.25), 1e-3])
def test_valid_softmax_scale(scale):
    q, k, v = qkv()
    out = F(q, k, v, causal=True, softmax_scale=scale)
    keep = keep_mask(None, True, B, HK, S, S)
    ref = attention_fwd_bwd(q.numpy(), k.numpy(), v.numpy(), keep, float(scale))
    np.testing.assert_allclose(out.numpy(), ref["out"], rtol=1e-4, atol=1e-5)


def test_library_still_works_after_errors(spy):
    q, k, v = qkv()
    for bad in (full_idx(-1, 1), full_idx(S + 1, 1)):
        with pytest.raises(ValueError):
            F(q, k, v, bad, causal=True)
    spy.calls.clear()
    check_against_reference(q, k, v, valid_idx(True, 1), True)
    assert spy.calls == [CHECK_OP, ATTN_OP]


# --------------------------------------------------------------------------------------
# a fresh interpreter survives all the bad calls (no crash, no hang)
# --------------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import numpy as np, paddle, paddle_flashmask as pfm
    F = pfm.flashmask_attention
    B, S, H, HK, D = 2, 16, 4, 2, 8
    rng = np.random.default_rng(0)
    t = lambda *s: paddle.to_tensor(rng.standard_normal(s).astype("float32"))
    q, k, v = t(B, S, H, D), t(B, S, HK, D), t(B, S, HK, D)
    full = lambda val, c, b=B, hm=1, sk=S, dt="int32": paddle.full([b, hm, sk, c], val, dtype=dt)
    a4 = np.zeros([B, 1, S, 4], np.int32); a4[..., 2:] = (12, 11)
    cases = [
        ((q, k, v, full(S, 1, dt="int64")), dict(causal=True)),
        ((q, k, v, full(S, 1, dt="float32")), dict(causal=True)),
        ((q, k, v, paddle.full([B, S, 1], S, dtype="int32")), dict(causal=True)),
        ((q, k, v, paddle.full([B, 1, S, 1, 1], S, dtype="int32")), dict(causal=True)),
        ((q, k, v, full(S, 1, sk=S - 1)), dict(causal=True)),
        ((q, k, v, full(S, 1, sk=S + 4)), dict(causal=True)),
        ((q, k, v, full(S, 1, b=1)), dict(causal=True)),
        ((q, k, v, full(S, 4)), dict(causal=True)),
        ((q, k, v, full(S, 3)), dict(causal=False)),
        ((q, k, v, full(S, 1)), dict(causal=False)),
        ((q, k, v, full(-1, 1)), dict(causal=True)),
        ((q, k, v, full(-(2**31), 2)), dict(causal=False)),
        ((q, k, v, full(S + 1, 1)), dict(causal=True)),
        ((q, k, v, full(2**31 - 1, 4)), dict(causal=False)),
        ((q, k, v, paddle.to_tensor(np.tile(np.int32([[9, 4]]), [B, 1, S, 1]))), dict(causal=True)),
        ((q, k, v, paddle.to_tensor(a4)), dict(causal=False)),
        ((q, k, v, full(S, 1, hm=2 * H)), dict(causal=True)),
        ((q, k, v, full(S, 1, hm=3)), dict(causal=True)),
        ((t(B, S, 3, D), k, v), {}),
        ((q, t(B, S, HK, 4), t(B, S, HK, 4)), {}),
        ((q, t(3, S, HK, D), t(3, S, HK, D)), {}),
        ((q, k, t(B, S + 1, HK, D)), {}),
        ((q, k, v, full(S, 1)), dict(causal=True, window_size=2)),
        ((q, k, v), dict(window_size=-1)),
        ((q, k, v), dict(window_size="3")),
        ((q, k, v), dict(window_size=(1, 2, 3))),
        ((q.astype("int32"), k, v), {}),
        ((q.astype("int64"), k.astype("int64"), v.astype("int64")), {}),
        ((q, k.astype("float16"), v), {}),
        ((q.reshape([B, S, -1]), k.reshape([B, S, -1]), v.reshape([B, S, -1])), {}),
        ((q.numpy(), k, v), {}),
        ((q, k, v), dict(dropout=0.1)),
        ((q, k, v), dict(dropout=1.5)),
        ((q, k, v), dict(softmax_scale=0)),
        ((q, k, v), dict(softmax_scale=-1.0)),
        ((q, k, v), dict(softmax_scale=float("inf"))),
        ((q, k, v), dict(softmax_scale="1")),
        ((q, k, v), dict(block_mask=paddle.ones([1], dtype="int32"))),
        ((q, k, v), dict(return_seed_offset=True)),
        ((q, k, v), dict(deterministic=1)),
        ((q, k, v), dict(deterministic="true")),
    ]
    for i, (args, kwargs) in enumerate(cases):
        try:
            F(*args, **kwargs)
        except (ValueError, TypeError, NotImplementedError):
            pass
        else:
            raise SystemExit(f"case {i} was accepted")
    out = F(q, k, v, full(S, 1), causal=True)
    assert np.isfinite(out.numpy()).all()
    print("ALL-BAD-CALLS-RAISED", len(cases))
    """
)


def test_bad_calls_do_not_crash_the_process(real_ops):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=str(REPO), env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert "ALL-BAD-CALLS-RAISED 41" in proc.stdout, proc.stdout


@pytest.mark.parametrize("name,value", [("PADDLE_FLASHMASK_SM90_FWD_OVERLAP", "2"),
                                        ("PADDLE_FLASHMASK_SM90_FWD_PINGPONG", "yes"),
                                        ("PADDLE_FLASHMASK_SM90_FWD_GQA_TILES", "2"),
                                        ("PADDLE_FLASHMASK_SM90_FWD_WIDE_KEYS", "true"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_HEAD_GROUP", "-1"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_GROUP_MAX_STEPS", "1e3"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_ORDER", "2"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_ORDER_CAP", "-1"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_ORDER_CLASSES", "0"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_ORDER_CLASSES", "257"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_FINISH_OVERLAP", "on"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_DKV_DIRECT", "2"),
                                        ("PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS", "yes"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_CHAINS_FIRST", "2"),
                                        ("PADDLE_FLASHMASK_SM90_BWD_CHAIN_MIN_STEPS", "0"),
                                        ("PADDLE_FLASHMASK_SM90_FWD_HEAVY_FIRST", "yes"),
                                        ("PADDLE_FLASHMASK_SM90_FWD_HEAVY_MIN_BLOCKS", "32769"),
                                        ("PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST", "-8"),
                                        ("PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST", "4097"),
                                        ("PADDLE_FLASHMASK_FA2_FWD_HEAVY_FIRST", "2"),
                                        ("PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS", "0"),
                                        ("PADDLE_FLASHMASK_FA2_BWD_HEAVY_FIRST", "on"),
                                        ("PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS", "16777217"),
                                        ("PADDLE_FLASHMASK_FA2_FWD_HEAD_PAIRS", "on"),
                                        ("PADDLE_FLASHMASK_FA2_FWD_HEAD_QUADS", "4"),
                                        ("PADDLE_FLASHMASK_FA2_SMEM_CLASS", "99K"),
                                        ("PADDLE_FLASHMASK_FA2_SMEM_CLASS", "a100"),
                                        ("PADDLE_FLASHMASK_FA2_BWD", "fast")])
def test_bad_env_switch(spy, monkeypatch, name, value):
    # Read by the op on GPU, whose own error would not reach Python on Paddle 2.6: rejected
    # in Python on every place, naming the variable.
    monkeypatch.setenv(name, value)
    q, k, v = qkv()
    assert_rejected(spy, ValueError, name, q, k, v, causal=True)


@pytest.mark.parametrize("name,value", [("PADDLE_FLASHMASK_FA2_SMEM_CLASS", "99k"),
                                        ("PADDLE_FLASHMASK_FA2_SMEM_CLASS", "auto"),
                                        ("PADDLE_FLASHMASK_FA2_BWD", "split"),
                                        ("PADDLE_FLASHMASK_FA2_BWD", "staged")])
def test_good_fa2_env_switch_is_taken(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    q, k, v = qkv()
    out = pfm.flashmask_attention(q, k, v, causal=True)
    assert list(out.shape) == list(q.shape) and bool(paddle.isfinite(out).all())


# --------------------------------------------------------------------------------------
# head_dim 192 with value head_dim 128 on GPU: the Hopper (sm90) kernels only, not
# deterministic, at most 2^18 rows and keys per kernel call (head_dim 256 runs on the FA2-class
# kernels too: every GPU, deterministic included, any length). The checks read the query's place,
# dtype and the GPU's compute capability; here a small fake query on a fake GPU place stands in
# (no GPU on the CI machine), the GPU tests repeat them for real.
# --------------------------------------------------------------------------------------

# (query/key head dim, value head dim) of every pair only the Hopper kernels take
HOPPER_ONLY_PAIRS = [(192, 128)]
HOPPER_ONLY_IDS = ["192-128"]
VALUE_RULE = (r"the GPU kernels take value head_dim 128 with 192 \(the Hopper kernels\) and value head_dim "
              r"equal to head_dim otherwise; the CPU kernel takes any")


def hopper_only(dim, dim_v):
    """The start of the message for a Hopper-only pair off the Hopper kernels."""
    pair = f"head_dim {dim}" if dim_v == dim else f"head_dim {dim} with value head_dim {dim_v}"
    return rf"{pair} on GPU runs on the Hopper \(sm90\) kernels only"


hopper_only_pairs = pytest.mark.parametrize("dim,dim_v", HOPPER_ONLY_PAIRS, ids=HOPPER_ONLY_IDS)


class _FakeGpuPlace:
    def is_gpu_place(self):
        return True

    def gpu_device_id(self):
        return 0


class _FakeGpuQuery:
    """What the device checks read of a query on GPU 0."""

    def __init__(self, dtype=paddle.bfloat16):
        self.place, self.dtype = _FakeGpuPlace(), dtype


@pytest.fixture
def fake_gpu(monkeypatch):
    """A bf16 query on a fake GPU 0; ``fake_gpu(capability, sm90_built)`` sets what the checks
    find (defaults: a compute capability 9.0 GPU and a build with the sm90 kernels)."""

    def make(capability=(9, 0), sm90_built=True):
        monkeypatch.setattr(validation, "compute_capability", lambda device_id: capability)
        monkeypatch.setattr(validation._op_sources, "sm90_built", lambda: sm90_built)
        return _FakeGpuQuery()

    return make


@hopper_only_pairs
@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (9, 1)])
def test_hopper_only_head_dims_need_a_hopper_gpu(fake_gpu, capability, dim, dim_v):
    q = fake_gpu(capability=capability)
    with pytest.raises(ValueError, match=rf"{hopper_only(dim, dim_v)}: needs a compute capability 9.0 GPU.*got a "
                                         rf"compute capability {capability[0]}\.{capability[1]} GPU"):
        validation.check_device_support(q, dim, dim_v, "auto")


@hopper_only_pairs
def test_hopper_only_head_dims_not_on_forced_fa2_kernels(fake_gpu, dim, dim_v):
    q = fake_gpu()
    with pytest.raises(ValueError, match=rf"{hopper_only(dim, dim_v)}: .*got gpu_kernel 'fa2'"):
        validation.check_device_support(q, dim, dim_v, "fa2")


@hopper_only_pairs
def test_hopper_only_head_dims_need_a_build_with_the_sm90_kernels(fake_gpu, dim, dim_v):
    q = fake_gpu(sm90_built=False)
    with pytest.raises(ValueError, match=rf"{hopper_only(dim, dim_v)}: .*got a build of the op without the sm90 "
                                         rf"kernels"):
        validation.check_device_support(q, dim, dim_v, "auto")


@hopper_only_pairs
@pytest.mark.parametrize("kernel", ["auto", "sm90"])
@pytest.mark.parametrize("sm90_built", [True, None])  # None: an op installed without its sources
def test_hopper_only_head_dims_taken_on_hopper(fake_gpu, kernel, sm90_built, dim, dim_v):
    q = fake_gpu(sm90_built=sm90_built)
    validation.check_device_support(q, dim, dim_v, kernel)
    validation.check_sm90_forced(q, dim, kernel)
    validation.check_deterministic_support(q, dim, False)
    validation.check_sm90_only_length(q, dim, 1 << 18, 1 << 18, "query/key")


@pytest.mark.parametrize("dim", [32, 64, 80, 96, 128, 256])
def test_other_head_dims_keep_their_kernels_anywhere(fake_gpu, dim):
    # the FA2-class kernels take these on every GPU, whatever the family and build, deterministic
    # included; no length limit of theirs (256 included: the FA2-class kernels take it beyond 2^18)
    for q in (fake_gpu(capability=(8, 0), sm90_built=False), fake_gpu(capability=(8, 9)), fake_gpu()):
        for kernel in ("fa2", "auto"):
            validation.check_device_support(q, dim, dim, kernel)
        validation.check_device_support(q, dim, None, "fa2")
        validation.check_deterministic_support(q, dim, True)
        validation.check_sm90_only_length(q, dim, (1 << 19) + 1, (1 << 19) + 1, "query/key")


@pytest.mark.parametrize("dim_v", [None, 192, 64, 256, 96])  # None: value's head dim equals query's
def test_head_dim_192_takes_value_head_dim_128_only(fake_gpu, dim_v):
    # wherever the call would run: the value head dim is refused before the Hopper checks
    for q in (fake_gpu(), fake_gpu(capability=(8, 0))):
        with pytest.raises(ValueError, match=rf"^value head_dim {dim_v or 192} with query/key head_dim 192 on GPU: "
                                             rf"{VALUE_RULE}$"):
            validation.check_device_support(q, 192, dim_v, "auto")


@pytest.mark.parametrize("dim,dim_v", [(256, 128), (128, 64), (64, 128), (128, 192), (32, 16)])
def test_other_head_dims_take_value_head_dim_equal_only(fake_gpu, dim, dim_v):
    # value head dim 128 is 192's alone: 256 with 128 (the other wide head dim) too is refused
    with pytest.raises(ValueError, match=rf"^value head_dim {dim_v} with query/key head_dim {dim} on GPU: "
                                         rf"{VALUE_RULE}$"):
        validation.check_device_support(fake_gpu(), dim, dim_v, "sm90")


def test_gpu_value_head_dims_table():
    assert validation.GPU_VALUE_HEAD_DIMS == {32: 32, 64: 64, 80: 80, 96: 96, 128: 128, 192: 128, 256: 256}
    assert [validation.gpu_value_head_dim(d) for d in (192, 256, 64, 160)] == [128, 256, 64, None]
    assert set(validation.SM90_ONLY_HEAD_DIMS) <= set(validation.SM90_HEAD_DIMS) <= set(validation.GPU_HEAD_DIMS)
    assert validation.SM90_ONLY_HEAD_DIMS == (192,)


@pytest.mark.parametrize("dim", [72, 88, 160, 512])
def test_gpu_head_dim_list_names_192_and_256(fake_gpu, dim):
    with pytest.raises(ValueError, match=rf"head_dim on GPU must be one of \(32, 64, 80, 96, 128, 192, 256\), got {dim}"):
        validation.check_device_support(fake_gpu(), dim, dim, "auto")


@hopper_only_pairs
def test_hopper_only_head_dims_reject_deterministic_on_gpu(fake_gpu, dim, dim_v):
    with pytest.raises(ValueError, match=rf"deterministic=True with head_dim {dim} on GPU: the deterministic "
                                         rf"backward has no head_dim {dim} kernel; pass deterministic=False"):
        validation.check_deterministic_support(fake_gpu(), dim, True)


@hopper_only_pairs
def test_hopper_only_head_dims_at_most_2_18_rows_and_keys_per_call(fake_gpu, dim, dim_v):
    # no FA2-class kernel to fall back on beyond the Hopper kernels' longest call
    q = fake_gpu()
    label = f"head_dim {dim}" if dim == dim_v else f"head_dim {dim} with value head_dim {dim_v}"
    for sq, sk in (((1 << 18) + 1, 100), (100, (1 << 18) + 1)):
        with pytest.raises(ValueError, match=rf"^{label} on GPU takes at most 262144 query rows and keys per kernel "
                                             rf"call, got query/key of {sq} and {sk}"):
            validation.check_sm90_only_length(q, dim, sq, sk, "query/key")
    validation.check_sm90_only_length(q, 128, (1 << 18) + 1, 100, "query/key")  # 128: up to 2^19, then FA2-class


@pytest.mark.parametrize("capability,sm90_built,dim,why", [
    ((8, 0), True, 192, "needs a compute capability 9.0 GPU"),
    ((9, 0), False, 192, "this build of the op has no sm90 kernels"),
    ((9, 0), True, 32, r"takes head_dim \(64, 80, 96, 128, 192, 256\), got 32"),
])
def test_forced_sm90_where_it_cannot_run(fake_gpu, capability, sm90_built, dim, why):
    with pytest.raises(ValueError, match=rf"gpu_kernel 'sm90'.*{why}"):
        validation.check_sm90_forced(fake_gpu(capability=capability, sm90_built=sm90_built), dim, "sm90")


@hopper_only_pairs
def test_hopper_only_head_dims_run_on_cpu_with_any_kernel_setting_and_deterministic(default_gpu_kernel, dim,
                                                                                    dim_v):
    # the CPU kernel takes any head dim and is always deterministic: none of the GPU rules apply
    pfm.set_gpu_kernel("fa2")
    q, k, _ = qkv(d=dim)
    v = rand(B, S, HK, dim_v, seed=3)
    validation.check_device_support(q, dim, dim_v, "fa2")
    validation.check_deterministic_support(q, dim, True)
    check_against_reference(q, k, v, None, True, deterministic=True)


@hopper_only_pairs
def test_attention_passes_kernel_family_and_deterministic_to_the_device_checks(default_gpu_kernel, monkeypatch, dim,
                                                                               dim_v):
    # the checks above only act on GPU: here (CPU) the call must still hand them what they need
    seen = {}
    real_device, real_det = validation.check_device_support, validation.check_deterministic_support
    monkeypatch.setattr(validation, "check_device_support",
                        lambda *a, **kw: (seen.__setitem__("device", (a, kw)), real_device(*a, **kw))[1])
    monkeypatch.setattr(validation, "check_deterministic_support",
                        lambda *a: (seen.__setitem__("deterministic", a), real_det(*a))[1])
    monkeypatch.setattr(attention_mod, "_has_deterministic_flag", True)
    monkeypatch.setattr(attention_mod, "_flags", {"FLAGS_cudnn_deterministic": True})
    pfm.set_gpu_kernel("fa2")
    q, k, _ = qkv(d=dim)
    F(q, k, rand(B, S, HK, dim_v, seed=3), causal=True)  # deterministic=None: follows the (patched) flag
    args, kw = seen["device"]
    assert args[1:] == (dim, dim_v, "fa2") and kw == {"gpu": False}  # the wrapper's one place read: CPU
    assert seen["deterministic"][1:] == (dim, True)


@hopper_only_pairs
def test_context_parallel_passes_kernel_family_and_deterministic_to_the_device_checks(default_gpu_kernel,
                                                                                      monkeypatch, dim, dim_v):
    from paddle_flashmask.distributed import ContextParallelPlan
    from paddle_flashmask.distributed import flashmask_attention as cp_attention

    seen = []
    real_device, real_det = validation.check_device_support, validation.check_deterministic_support
    monkeypatch.setattr(validation, "check_device_support",
                        lambda *a, **kw: (seen.append(("device",) + a[1:]), real_device(*a, **kw))[1])
    monkeypatch.setattr(validation, "check_deterministic_support",
                        lambda *a: (seen.append(("deterministic",) + a[1:]), real_det(*a))[1])
    pfm.set_gpu_kernel("fa2")
    q, k, _ = qkv(d=dim)
    v = rand(B, S, HK, dim_v, seed=3)
    out = cp_attention(q, k, v, None, causal=True, plan=ContextParallelPlan(None, True, 1, seqlen=S),
                       deterministic=True)
    # its own checks first (then the single-device op's, for a group of one rank)
    assert seen[:2] == [("device", dim, dim_v, "fa2"), ("deterministic", dim, True)]
    assert list(out.shape) == [B, S, H, dim_v]


@hopper_only_pairs
def test_gpu_supports_tells_where_the_hopper_only_head_dims_run(default_gpu_kernel, fake_gpu, monkeypatch, dim,
                                                                dim_v):
    from paddle_flashmask.attention import gpu_supports

    monkeypatch.setattr(attention_mod, "_has_deterministic_flag", False)  # deterministic=None: False
    assert gpu_supports(fake_gpu(), dim, value_head_dim=dim_v)
    assert not gpu_supports(fake_gpu(), dim, deterministic=True, value_head_dim=dim_v)
    assert not gpu_supports(fake_gpu(capability=(8, 0)), dim, value_head_dim=dim_v)
    assert not gpu_supports(fake_gpu(sm90_built=False), dim, value_head_dim=dim_v)
    assert gpu_supports(fake_gpu(capability=(8, 0)), 128, deterministic=True)
    assert not gpu_supports(_FakeGpuQuery(paddle.float32), 128)
    pfm.set_gpu_kernel("fa2")
    assert not gpu_supports(fake_gpu(), dim, value_head_dim=dim_v)
    assert gpu_supports(qkv(d=dim)[0], dim, deterministic=True, value_head_dim=dim_v)  # CPU: every call
    pfm.set_gpu_kernel(None)
    monkeypatch.setattr(attention_mod, "_has_deterministic_flag", True)
    monkeypatch.setattr(attention_mod, "_flags", {"FLAGS_cudnn_deterministic": True})
    # the default follows FLAGS_cudnn_deterministic
    assert not gpu_supports(fake_gpu(), dim, value_head_dim=dim_v)


def test_gpu_supports_takes_head_dim_256_on_every_gpu(default_gpu_kernel, fake_gpu, monkeypatch):
    # the FA2-class kernels take 256: any GPU, any build, any family, deterministic included
    from paddle_flashmask.attention import gpu_supports

    monkeypatch.setattr(attention_mod, "_has_deterministic_flag", False)
    for kernel in (None, "fa2"):
        pfm.set_gpu_kernel(kernel)
        for q in (fake_gpu(), fake_gpu(capability=(8, 0)), fake_gpu(capability=(8, 9)), fake_gpu(sm90_built=False)):
            assert gpu_supports(q, 256) and gpu_supports(q, 256, deterministic=True, value_head_dim=256)
    pfm.set_gpu_kernel(None)


@pytest.mark.parametrize("dim,dim_v", [(192, None), (192, 192), (192, 64), (256, 128), (128, 64), (160, 160)])
def test_gpu_supports_refuses_pairs_no_gpu_kernel_takes(default_gpu_kernel, fake_gpu, monkeypatch, dim, dim_v):
    # value_head_dim=None: equal to head_dim (192/192 has no kernel: the patches' dense fallback)
    from paddle_flashmask.attention import gpu_supports

    monkeypatch.setattr(attention_mod, "_has_deterministic_flag", False)
    assert not gpu_supports(fake_gpu(), dim, value_head_dim=dim_v)
    assert gpu_supports(qkv(d=dim)[0], dim, value_head_dim=dim_v)  # CPU: every call


@pytest.mark.parametrize("capability", [(8, 6), (8, 9)])
def test_head_dims_beyond_99k_of_shared_memory_are_refused(fake_gpu, capability):
    """Compute capability 8.6/8.9 GPUs allow 99 KB of shared memory a block: the FA2-class backward at
    256 needs more (the forward at 256 and the backward at 96/128 run tiles of their own there;
    kernel_traits.h asserts the lists), so Python refuses those calls before the op (Paddle 2.6
    cannot carry the launch's C++ error back)."""
    q = fake_gpu(capability=capability)
    major, minor = capability
    where = rf"head_dim 256 on a compute capability {major}\.{minor} GPU: its backward kernel needs more than the 99 KB"
    for dim in (32, 64, 80, 96, 128):
        validation.check_shared_memory(q, dim, backward=True)
    validation.check_shared_memory(q, 256, backward=False)  # the forward fits
    with pytest.raises(ValueError, match=where + r".*take head_dim \[32, 64, 80, 96, 128\] with "
                                         r"gradients and \[256\] without \(stop_gradient=True"):
        validation.check_shared_memory(q, 256, backward=True)


@pytest.mark.parametrize("capability", [(8, 0), (9, 0)])
def test_every_fa2_class_kernel_fits_a100_and_hopper_shared_memory(fake_gpu, capability):
    q = fake_gpu(capability=capability)
    for dim in (32, 64, 80, 96, 128, 256):
        validation.check_shared_memory(q, dim, backward=True)


def test_gpu_supports_knows_the_99k_shared_memory_gpus(default_gpu_kernel, fake_gpu, monkeypatch):
    from paddle_flashmask.attention import gpu_supports

    monkeypatch.setattr(attention_mod, "_has_deterministic_flag", False)
    assert not gpu_supports(fake_gpu(capability=(8, 9)), 256)  # with its backward (the default)
    assert gpu_supports(fake_gpu(capability=(8, 9)), 96)
    assert not gpu_supports(fake_gpu(capability=(8, 6)), 256)
    assert gpu_supports(fake_gpu(capability=(8, 6)), 256, backward=False)
    assert gpu_supports(fake_gpu(capability=(8, 9)), 128)
    assert gpu_supports(fake_gpu(capability=(8, 6)), 64)
    assert gpu_supports(fake_gpu(capability=(8, 0)), 256)



def test_fa2_query_rows_limit():
    # The FA2-class forward's grid holds 65535 query blocks of 128 rows (64 at head dim 256 and
    # in the deterministic dQ pass): one row more on a GPU is a ValueError naming the limit
    # (tests/test_gpu.py runs it through the op); CPU calls have no such limit. The place is
    # stubbed here: the check reads nothing else of the tensor.
    class GpuPlace:
        def is_gpu_place(self):
            return True

    class Query:
        place = GpuPlace()

    assert validation.fa2_max_query_rows(128, False) == 65535 * 128
    assert validation.fa2_max_query_rows(256, False) == validation.fa2_max_query_rows(64, True) == 65535 * 64
    validation.check_fa2_query_rows(Query(), 65535 * 128, 128, False)
    with pytest.raises(ValueError, match="at most 8388480 query rows per call"):
        validation.check_fa2_query_rows(Query(), 65535 * 128 + 1, 128, False)
    with pytest.raises(ValueError, match="at most 4194240 query rows per call"):
        validation.check_fa2_query_rows(Query(), 65535 * 64 + 1, 64, True)
    validation.check_fa2_query_rows(paddle.zeros([1]), 65535 * 128 + 1, 8, False)  # a CPU tensor: no limit
