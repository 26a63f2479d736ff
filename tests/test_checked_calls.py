"""flashmask_attention runs a call whose signature passed the argument checks before without
running them again (paddle_flashmask/_checked_calls.py). What must hold: a repeated call gives
the result a checked one gives, and every change that a check would reject still raises, on
the first call after a good one with the same shapes (argument types, environment switches,
index and block-mask values, kernel-family settings)."""

import numpy as np
import paddle
import pytest

import paddle_flashmask as pfm
from paddle_flashmask import _checked_calls, masks
from reference import attention_fwd_bwd, keep_mask

B, S, H, HK, D = 1, 70, 4, 2, 32


def rand(*shape, seed=0):
    return paddle.to_tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


@pytest.fixture
def qkv():
    _checked_calls.clear()
    return rand(B, S, H, D, seed=1), rand(B, S, HK, D, seed=2), rand(B, S, HK, D, seed=3)


def reference(q, k, v, indices, causal, window=None):
    keep = keep_mask(None if indices is None else indices.numpy(), causal, B, HK, S, S, window=window)
    return attention_fwd_bwd(q.numpy(), k.numpy(), v.numpy(), keep, D**-0.5)["out"]


def test_repeated_call_skips_the_checks_and_matches_the_reference(qkv, monkeypatch):
    q, k, v = qkv
    indices = masks.causal_document_mask([30, 25, 15])
    first = pfm.flashmask_attention(q, k, v, indices, causal=True)
    assert len(_checked_calls._calls) == 1

    def no_checks(*args, **kwargs):
        raise AssertionError("the checks ran again for a signature that passed them")

    monkeypatch.setattr(pfm.attention, "_check_call", no_checks)
    again = pfm.flashmask_attention(q, k, v, indices, causal=True)
    np.testing.assert_array_equal(again.numpy(), first.numpy())
    np.testing.assert_allclose(again.numpy(), reference(q, k, v, indices, True), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bad, exc", [
    (dict(causal=1), TypeError),               # 1 == True: the key tells the types apart
    (dict(causal=np.int64(1)), TypeError),
    (dict(dropout=False), TypeError),          # False == 0.0
    (dict(window_size=(True, 3)), TypeError),  # (1, 3) passed before
    (dict(window_size=[1, -3]), ValueError),
    (dict(softmax_scale=-1.0), ValueError),
    (dict(return_softmax_lse=1), TypeError),
    (dict(deterministic=1), TypeError),
])
def test_a_bad_option_after_a_good_call_still_raises(qkv, bad, exc):
    q, k, v = qkv
    good = dict(causal=True, dropout=0.0, window_size=(1, 3), softmax_scale=None, return_softmax_lse=False,
                deterministic=False)
    pfm.flashmask_attention(q, k, v, **good)
    pfm.flashmask_attention(q, k, v, **good)  # now a known signature
    with pytest.raises(exc):
        pfm.flashmask_attention(q, k, v, **{**good, **bad})


def test_a_list_window_is_the_tuple_window(qkv):
    q, k, v = qkv
    as_tuple = pfm.flashmask_attention(q, k, v, causal=True, window_size=(5, 5))
    as_list = pfm.flashmask_attention(q, k, v, causal=True, window_size=[5, 5])
    np.testing.assert_array_equal(as_list.numpy(), as_tuple.numpy())
    with pytest.raises(TypeError):
        pfm.flashmask_attention(q, k, v, causal=True, window_size={"left": 5})  # unhashable and wrong


def test_environment_switches_are_part_of_the_signature(qkv, monkeypatch):
    q, k, v = qkv
    pfm.flashmask_attention(q, k, v, causal=True)
    monkeypatch.setenv("PADDLE_FLASHMASK_SM90_FWD_OVERLAP", "7")
    with pytest.raises(ValueError, match="PADDLE_FLASHMASK_SM90_FWD_OVERLAP"):
        pfm.flashmask_attention(q, k, v, causal=True)
    monkeypatch.setenv("PADDLE_FLASHMASK_SM90_FWD_OVERLAP", "1")
    pfm.flashmask_attention(q, k, v, causal=True)
    monkeypatch.setenv("PADDLE_FLASHMASK_GPU_KERNEL", "tpu")
    with pytest.raises(ValueError, match="PADDLE_FLASHMASK_GPU_KERNEL"):
        pfm.flashmask_attention(q, k, v, causal=True)
    monkeypatch.delenv("PADDLE_FLASHMASK_GPU_KERNEL")
    monkeypatch.setenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", "zero")
    with pytest.raises(ValueError, match="PADDLE_FLASHMASK_SPLIT_SEQLEN"):
        pfm.flashmask_attention(q, k, v, causal=True)


def test_new_index_and_block_mask_values_are_checked_on_a_known_signature(qkv):
    q, k, v = qkv
    good = masks.causal_document_mask([40, 30])
    pfm.flashmask_attention(q, k, v, good, causal=True)
    bad = paddle.to_tensor(np.full(good.shape, S + 5, dtype="int32"))  # same shape, rows past the end
    with pytest.raises(ValueError, match="startend_row_indices values"):
        pfm.flashmask_attention(q, k, v, bad, causal=True)
    blocks = [1, 1, 1, 1]  # [B, Hm, ceil(S/128), ceil(S/128)] = [1, 1, 1, 1]
    ok = paddle.to_tensor(np.ones(blocks, dtype="int32"))
    pfm.flashmask_attention(q, k, v, good, causal=True, block_mask=ok)
    with pytest.raises(ValueError, match="block_mask values"):
        pfm.flashmask_attention(q, k, v, good, causal=True, block_mask=paddle.to_tensor(np.full(blocks, 2, "int32")))


def test_strided_views_and_parameters_take_the_checked_path(qkv):
    q, k, v = qkv
    want = pfm.flashmask_attention(q, k, v, causal=True).numpy()
    # a transposed-back view: same shape as q, not contiguous where Paddle keeps strides
    q_view = paddle.transpose(paddle.transpose(q, [0, 2, 1, 3]).contiguous(), [0, 2, 1, 3])
    np.testing.assert_allclose(pfm.flashmask_attention(q_view, k, v, causal=True).numpy(), want, rtol=1e-6)
    q_param = paddle.create_parameter(q.shape, "float32",
                                      default_initializer=paddle.nn.initializer.Assign(q.numpy()))
    assert _checked_calls.signature(q_param, k, v, None, None, (), ()) is None
    np.testing.assert_allclose(pfm.flashmask_attention(q_param, k, v, causal=True).numpy(), want, rtol=1e-6)


def test_gradients_through_a_known_signature(qkv):
    q, k, v = qkv
    for t in (q, k, v):
        t.stop_gradient = False
    grads = []
    for _ in range(2):  # checked, then known
        out = pfm.flashmask_attention(q, k, v, causal=True)
        grads.append([g.numpy() for g in paddle.grad([out], [q, k, v], [paddle.ones_like(out)])])
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)


def test_the_cache_stays_bounded(qkv):
    q, k, v = qkv
    for scale in np.linspace(0.1, 1.0, _checked_calls._MAX_CALLS + 5):
        pfm.flashmask_attention(q, k, v, causal=True, softmax_scale=float(scale))
    assert 0 < len(_checked_calls._calls) <= _checked_calls._MAX_CALLS
