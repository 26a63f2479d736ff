"""Self-attention longer than one Hopper kernel call takes, cut into query pieces and key parts
(paddle_flashmask/long_sequence.py), against the float64 dense-mask reference. On CPU the cut is
forced with PADDLE_FLASHMASK_SPLIT_SEQLEN (pieces of 128 tokens here); the same pieces, remap,
merge, sum and concat ops run on the GPU beyond 2^19 tokens."""

import numpy as np
import paddle
import pytest

import paddle_flashmask as pfm
from paddle_flashmask import long_sequence, masks
from reference import attention_fwd_bwd, keep_mask, random_indices, rel_err

FORMS = [(True, 0), (True, 1), (True, 2), (False, 0), (False, 2), (False, 4)]


@pytest.fixture
def split_at_128(monkeypatch):
    """Pieces of at most 128 tokens; the test fails unless the call really went through them."""
    monkeypatch.setenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", "128")
    calls = []
    real = long_sequence.attention
    monkeypatch.setattr(long_sequence, "attention", lambda *a: (calls.append(1), real(*a))[1])
    yield
    assert calls, "the call did not run in pieces"


def f64(t):
    return t.astype("float32").numpy().astype(np.float64)


def check(rng, S, causal, idx, B=2, H=4, Hk=2, D=16, Dv=None, dtype="float32", tol=1e-5):
    Dv = Dv or D
    q, k, v, do = (paddle.to_tensor(rng.standard_normal(s).astype(np.float32)).astype(dtype)
                   for s in ((B, S, H, D), (B, S, Hk, D), (B, S, Hk, Dv), (B, S, H, Dv)))
    for t in (q, k, v):
        t.stop_gradient = False
    it = None if idx is None else paddle.to_tensor(idx)
    out, lse = pfm.flashmask_attention(q, k, v, it, causal=causal, return_softmax_lse=True)
    grads = paddle.grad([out], [q, k, v], [do])
    hm = Hk if idx is None else idx.shape[1]
    ref = attention_fwd_bwd(f64(q), f64(k), f64(v), keep_mask(idx, causal, B, hm, S, S), D ** -0.5, f64(do))
    assert list(out.shape) == [B, S, H, Dv] and lse.stop_gradient
    assert rel_err(f64(out), ref["out"]) < tol
    finite = np.isfinite(ref["lse"])
    np.testing.assert_array_equal(np.isfinite(lse.numpy()), finite)
    if finite.any():
        assert rel_err(lse.numpy()[finite], ref["lse"][finite]) < 1e-5
    assert np.all(f64(out)[~finite.transpose(0, 2, 1)] == 0)  # rows that see no key
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert rel_err(f64(g), ref[name], ref.get(name + "_mag")) < tol, name


@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("S", [129, 300, 517])
def test_pieces_match_the_dense_reference(split_at_128, causal, cols, S):
    rng = np.random.default_rng(S * 10 + cols)
    idx = None if cols == 0 else random_indices(rng, 2, 2, S, S, causal, cols)
    check(rng, S, causal, idx)


@pytest.mark.parametrize("name", ["causal_document", "share_question", "global_sliding_window", "document"])
def test_pieces_with_packed_masks_and_gqa(split_at_128, name):
    rng = np.random.default_rng(len(name))
    idx, causal = masks.example_mask(name, 400, batch_size=2, num_heads=1, seed=3)
    check(rng, 400, causal, idx.numpy(), H=6, Hk=2)


def test_pieces_with_a_mask_per_query_head_and_value_head_dim(split_at_128):
    rng = np.random.default_rng(7)
    check(rng, 300, False, random_indices(rng, 2, 4, 300, 300, False, 4), Dv=8)


@pytest.mark.parametrize("causal,cols", [(True, 0), (True, 2), (False, 4)])
def test_pieces_with_the_mla_head_dims(split_at_128, causal, cols):
    # q/k 192 with v 128 (the Hopper kernels' pair of its own): pieces of q, k and v, merged out/dv of 128
    rng = np.random.default_rng(192 + cols)
    idx = None if cols == 0 else random_indices(rng, 1, 2, 300, 300, causal, cols)
    check(rng, 300, causal, idx, B=1, H=4, Hk=2, D=192, Dv=128)


def test_pieces_in_bfloat16(split_at_128):
    rng = np.random.default_rng(8)
    check(rng, 300, True, random_indices(rng, 1, 1, 300, 300, True, 1), B=1, dtype="bfloat16", tol=1e-2)


def test_pieces_only_where_taken(monkeypatch):
    q = paddle.zeros([1, 300, 2, 16])
    k = paddle.zeros([1, 300, 1, 16])
    monkeypatch.setenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", "128")
    take = lambda **kw: long_sequence.should_split(kw.get("q", q), kw.get("k", k), kw.get("window"),
                                                   kw.get("block_mask"), "auto", 16, (64, 128))
    assert take()
    assert not take(window=(4, 4)) and not take(block_mask=paddle.ones([1, 1, 3, 3], dtype="int32"))
    assert not take(k=paddle.zeros([1, 200, 1, 16]))  # Sq != Sk: one call
    assert not take(q=paddle.zeros([1, 128, 2, 16]), k=paddle.zeros([1, 128, 1, 16]))  # short enough
    monkeypatch.delenv("PADDLE_FLASHMASK_SPLIT_SEQLEN")
    assert not take()  # by default only beyond 2^19 tokens on a Hopper GPU


def test_bad_split_length(monkeypatch):
    monkeypatch.setenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", "many")
    with pytest.raises(ValueError, match="PADDLE_FLASHMASK_SPLIT_SEQLEN must be a positive integer"):
        pfm.flashmask_attention(paddle.zeros([1, 300, 2, 16]), paddle.zeros([1, 300, 1, 16]),
                                paddle.zeros([1, 300, 1, 16]), causal=True)


@pytest.mark.parametrize("S,limit", [(384, 128), (385, 128), (1000, 300), (700, 256), (257, 200)])
def test_piece_bounds(S, limit):
    pieces = long_sequence._Pieces(S, 1, paddle.CPUPlace(), limit)
    sizes = np.diff(pieces.bounds)
    assert pieces.bounds[0] == 0 and pieces.bounds[-1] == S and np.all(sizes > 0)
    assert np.all(sizes <= max(128, limit // 128 * 128))  # each piece one kernel call's worth
    assert all(b % 128 == 0 for b in pieces.bounds[:-1])  # pieces start on whole tiles


@pytest.mark.parametrize("S,limit", [(385, "128"), (1000, "300"), (257, "200")])
def test_piece_boundaries_exact(monkeypatch, S, limit):
    monkeypatch.setenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", limit)
    rng = np.random.default_rng(S)
    check(rng, S, True, random_indices(rng, 1, 1, S, S, True, 2), B=1, H=2, Hk=1)


# --------------------------------------------------------------------------------------
# The Hopper kernels' longest sequence per call depends on the head dim (2^18 at 192 and 256:
# their tiles leave less shared memory for the live lists); the cut must follow it.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim,limit", [(64, 1 << 19), (128, 1 << 19), (192, 1 << 18), (256, 1 << 18)])
def test_sm90_longest_sequence_per_head_dim(monkeypatch, head_dim, limit):
    monkeypatch.delenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", raising=False)
    assert long_sequence.sm90_max_seqlen(head_dim) == limit
    assert long_sequence.split_seqlen(head_dim) == (limit, False)
    monkeypatch.setenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", "1000")  # forced: the same for every head dim
    assert long_sequence.split_seqlen(head_dim) == (1000, True)


class _FakeHopperQuery:
    """What splits() reads of a bf16 query on GPU 0 (no tensor of 2^18 rows needed)."""

    class place:
        @staticmethod
        def is_gpu_place():
            return True

        @staticmethod
        def gpu_device_id():
            return 0

    dtype = paddle.bfloat16

    def __init__(self, seqlen, head_dim):
        self.shape = [1, seqlen, 8, head_dim]


@pytest.mark.parametrize("head_dim,seqlen,cut", [(256, 1 << 18, False), (256, (1 << 18) + 1, True),
                                                 (192, 1 << 18, False), (192, (1 << 18) + 1, True),
                                                 (128, (1 << 18) + 1, False), (128, (1 << 19) + 1, True),
                                                 (64, 1 << 19, False)])
def test_hopper_splits_beyond_the_head_dims_limit(monkeypatch, head_dim, seqlen, cut):
    monkeypatch.delenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", raising=False)
    monkeypatch.setattr(long_sequence.validation, "compute_capability", lambda device_id: (9, 0))
    q = _FakeHopperQuery(seqlen, head_dim)
    # the head dims the op hands it (attention.py, ulysses.py)
    assert long_sequence.splits(q, False, head_dim, long_sequence.validation.SM90_HEAD_DIMS) is cut


@pytest.mark.parametrize("head_dim,head_dim_v,pieces", [(256, 256, 3), (192, 128, 3), (64, 64, 2)])
def test_pieces_cut_at_the_limit_splits_decided_with(monkeypatch, head_dim, head_dim_v, pieces):
    # Both limits scaled down (CPU-sized), no PADDLE_FLASHMASK_SPLIT_SEQLEN: the unforced cut
    # must take the head dim's limit, as splits() does, and stay exact.
    monkeypatch.delenv("PADDLE_FLASHMASK_SPLIT_SEQLEN", raising=False)
    monkeypatch.setattr(long_sequence, "SM90_MAX_SEQLEN", 256)
    monkeypatch.setattr(long_sequence, "SM90_MAX_SEQLEN_WIDE_HEADS", 128)
    rng = np.random.default_rng(head_dim)
    S = 300
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, S, h, d)).astype(np.float32))
               for h, d in ((2, head_dim), (1, head_dim), (1, head_dim_v)))
    idx = paddle.to_tensor(random_indices(rng, 1, 1, S, S, True, 1))
    scale = head_dim ** -0.5
    out, lse, state = long_sequence.pieces_forward(q, k, v, idx, True, scale, 0, False)
    assert state[0].n == pieces and max(np.diff(state[0].bounds)) <= long_sequence.sm90_max_seqlen(head_dim)
    ref_out, ref_lse = pfm.flashmask_attention(q, k, v, idx, causal=True, return_softmax_lse=True)
    assert rel_err(out.numpy(), ref_out.numpy()) < 1e-5
    finite = np.isfinite(ref_lse.numpy())  # rows that see no key: -inf in both
    np.testing.assert_array_equal(np.isfinite(lse.numpy()), finite)
    assert rel_err(lse.numpy()[finite], ref_lse.numpy()[finite]) < 1e-5
