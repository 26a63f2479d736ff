"""Tests for paddle_flashmask.masks (pure numpy/paddle CPU, no custom op needed)."""

import importlib.util
import pathlib
import sys

import numpy as np
import paddle
import pytest

try:
    from paddle_flashmask import masks as M
except Exception:  # package __init__ may need a not-yet-built op: load the module by path
    _path = pathlib.Path(__file__).resolve().parents[1] / "paddle_flashmask" / "masks.py"
    _spec = importlib.util.spec_from_file_location("_flashmask_masks", _path)
    M = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(M)


def pic(text):
    """Parse a 0/1 picture (rows = queries, columns = keys) into a bool array."""
    rows = [line.split() for line in text.strip().splitlines()]
    return np.array([[c == "1" for c in r] for r in rows], dtype=bool)


def cols(*vectors):
    """Per-column vectors -> indices array [1, 1, S, C]."""
    return np.stack([np.asarray(v) for v in vectors], axis=-1)[None, None].astype(np.int32)


# --------------------------------------------------------------------------------------
# the ten-token examples of Paddle's flashmask_attention docstring
# --------------------------------------------------------------------------------------

TRIL = pic("\n".join(" ".join("1" if j <= i else "0" for j in range(10)) for i in range(10)))

SLIDING = pic("""
1 0 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 1 0 0 0 0 0 0 0
0 1 1 1 0 0 0 0 0 0
0 0 1 1 1 0 0 0 0 0
0 0 0 1 1 1 0 0 0 0
0 0 0 0 1 1 1 0 0 0
0 0 0 0 0 1 1 1 0 0
0 0 0 0 0 0 1 1 1 0
0 0 0 0 0 0 0 1 1 1
""")

CAUSAL_DOC = pic("""
1 0 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 1 0 0 0 0 0 0 0
1 1 1 1 0 0 0 0 0 0
0 0 0 0 1 0 0 0 0 0
0 0 0 0 1 1 0 0 0 0
0 0 0 0 1 1 1 0 0 0
0 0 0 0 0 0 0 1 0 0
0 0 0 0 0 0 0 1 1 0
0 0 0 0 0 0 0 1 1 1
""")

DOC = pic("""
1 1 1 1 0 0 0 0 0 0
1 1 1 1 0 0 0 0 0 0
1 1 1 1 0 0 0 0 0 0
1 1 1 1 0 0 0 0 0 0
0 0 0 0 1 1 1 0 0 0
0 0 0 0 1 1 1 0 0 0
0 0 0 0 1 1 1 0 0 0
0 0 0 0 0 0 0 1 1 1
0 0 0 0 0 0 0 1 1 1
0 0 0 0 0 0 0 1 1 1
""")

SHARE_Q = pic("""
1 0 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 1 0 0 0 0 0 0 0
1 1 1 1 0 0 0 0 0 0
1 1 1 1 1 0 0 0 0 0
1 1 1 1 1 1 0 0 0 0
1 1 1 1 1 1 1 0 0 0
1 1 1 1 0 0 0 1 0 0
1 1 1 1 0 0 0 1 1 0
1 1 1 1 0 0 0 1 1 1
""")

GLOBAL_SW = pic("""
1 1 1 1 1 1 1 1 1 1
1 1 1 1 1 1 1 1 1 1
1 1 1 1 0 0 0 0 0 0
1 1 1 1 1 0 0 0 0 0
1 1 0 1 1 1 0 0 0 0
1 1 0 0 1 1 1 0 0 0
1 1 0 0 0 1 1 1 0 0
1 1 0 0 0 0 1 1 1 0
1 1 0 0 0 0 0 1 1 1
1 1 0 0 0 0 0 0 1 1
""")

BLOCKWISE = pic("""
1 0 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 1 0 0 0 0 0 0 0
1 1 1 1 0 0 0 0 0 0
0 0 0 0 1 0 0 0 0 0
0 0 0 0 1 1 0 0 0 0
0 0 0 0 1 1 1 0 0 0
1 1 1 1 1 1 1 1 0 0
1 1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 1 1 1 1
""")

PREFIX_DOC = pic("""
1 1 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 1 0 0 0 0 0 0 0
0 0 0 1 1 0 0 0 0 0
0 0 0 1 1 0 0 0 0 0
0 0 0 0 0 1 1 0 0 0
0 0 0 0 0 1 1 0 0 0
0 0 0 0 0 1 1 1 0 0
0 0 0 0 0 1 1 1 1 0
0 0 0 0 0 1 1 1 1 1
""")

PREFIX_CAUSAL = pic("""
1 1 1 1 1 0 0 0 0 0
1 1 1 1 1 0 0 0 0 0
1 1 1 1 1 0 0 0 0 0
1 1 1 1 1 0 0 0 0 0
1 1 1 1 1 0 0 0 0 0
1 1 1 1 1 1 0 0 0 0
1 1 1 1 1 1 1 0 0 0
1 1 1 1 1 1 1 1 0 0
1 1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 1 1 1 1
""")

QK_SPARSE = pic("""
1 0 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 1 1 1 1 0 0 0 0
1 1 1 1 1 1 0 0 0 0
1 1 1 1 1 1 0 0 0 0
1 1 1 1 1 1 1 1 1 0
1 1 1 1 1 1 1 1 1 1
""")

# name -> (built tensor, causal flag, Paddle docstring indices, Paddle docstring picture)
TEN_TOKEN_CASES = {
    "causal": (lambda: M.causal_mask(10), True, cols([10] * 10), TRIL),
    "sliding_window": (
        lambda: M.sliding_window_mask(10, 2), True, cols([3, 4, 5, 6, 7, 8, 9, 10, 10, 10]), SLIDING),
    "causal_document": (
        lambda: M.causal_document_mask([4, 3, 3]), True, cols([4, 4, 4, 4, 7, 7, 7, 10, 10, 10]), CAUSAL_DOC),
    "document": (
        lambda: M.document_mask([4, 3, 3]), False,
        cols([4, 4, 4, 4, 7, 7, 7, 10, 10, 10], [0, 0, 0, 0, 4, 4, 4, 7, 7, 7]), DOC),
    "share_question": (
        lambda: M.share_question_mask([(4, [3, 3])]), True,
        cols([10, 10, 10, 10, 7, 7, 7, 10, 10, 10]), SHARE_Q),
    "global_sliding_window": (
        lambda: M.global_sliding_window_mask(10, 2, 1), False,
        cols([10, 10, 4, 5, 6, 7, 8, 9, 10, 10], [10] * 10,
             [0, 0, 0, 0, 2, 2, 2, 2, 2, 2], [0, 0, 0, 0, 3, 4, 5, 6, 7, 8]), GLOBAL_SW),
    "causal_blockwise": (
        lambda: M.causal_blockwise_mask([4, 3, 3]), True,
        cols([4, 4, 4, 4, 10, 10, 10, 10, 10, 10], [7, 7, 7, 7, 10, 10, 10, 10, 10, 10]), BLOCKWISE),
    "prefix_lm_document": (
        lambda: M.prefix_lm_document_mask([(2, 3), (2, 2), (2, 5)]), False,
        cols([3, 3, 3, 5, 5, 10, 10, 10, 10, 10], [0, 0, 2, 3, 3, 5, 5, 7, 8, 9]), PREFIX_DOC),
    "prefix_lm_causal": (
        lambda: M.prefix_lm_causal_mask(10, 5), False,
        cols([10] * 10, [0, 0, 0, 0, 0, 5, 6, 7, 8, 9]), PREFIX_CAUSAL),
    "qk_sparse": (
        lambda: M.qk_sparse_mask(10, [(2, 3), (6, 2)]), True,
        cols([10, 10, 2, 3, 4, 5, 6, 7, 10, 10], [10, 10, 5, 5, 5, 5, 8, 8, 10, 10]), QK_SPARSE),
}


@pytest.mark.parametrize("name", sorted(TEN_TOKEN_CASES))
def test_ten_token_examples(name):
    build, causal, ref_idx, ref_pic = TEN_TOKEN_CASES[name]
    t = build()
    assert isinstance(t, paddle.Tensor)
    assert t.dtype == paddle.int32
    assert M.MASK_BUILDERS[name][1] is causal
    got = t.numpy()
    assert got.shape == ref_idx.shape
    if name == "qk_sparse":
        # Paddle's docstring encodes the unmasked column 5 as the empty interval (5, 5);
        # we use the canonical empty interval (S, S). Everything else must match exactly.
        keep = np.ones(10, dtype=bool)
        keep[5] = False
        np.testing.assert_array_equal(got[:, :, keep], ref_idx[:, :, keep])
        assert got[0, 0, 5, 0] >= got[0, 0, 5, 1] and ref_idx[0, 0, 5, 0] >= ref_idx[0, 0, 5, 1]
    else:
        np.testing.assert_array_equal(got, ref_idx)
    # the dense picture, both for our indices and for the docstring's own indices
    np.testing.assert_array_equal(M.to_dense(got, causal)[0, 0], ref_pic)
    np.testing.assert_array_equal(M.to_dense(ref_idx, causal)[0, 0], ref_pic)


def test_random_eviction_ten_tokens():
    t = M.random_eviction_mask(10, num_heads=3, batch_size=2, start_row=5, seed=0)
    a = t.numpy()
    assert a.shape == (2, 3, 10, 1) and t.dtype == paddle.int32
    lts = a[..., 0]
    j = np.arange(10)
    assert np.all(lts > j) and np.all(lts <= 10)
    # exactly S - start_row evictions per head happen at rows >= start_row
    assert np.all(((lts < 10) & (lts >= 5)).sum(-1) <= 5)
    assert np.all(lts[lts < 10] >= 5)
    # heads differ, seeds are reproducible
    assert not np.array_equal(lts[0, 0], lts[0, 1])
    np.testing.assert_array_equal(a, M.random_eviction_mask(10, 3, 2, start_row=5, seed=0).numpy())
    # the docstring example (seed 0, one head)
    np.testing.assert_array_equal(
        M.random_eviction_mask(10, 1, start_row=5, seed=0).numpy()[0, 0, :, 0],
        [10, 10, 7, 5, 9, 10, 7, 10, 9, 10])
    keep = M.to_dense(a, True)
    assert keep[..., j, j].all()  # every row keeps its diagonal key
    # no eviction at all when start_row == seqlen
    assert (M.random_eviction_mask(10, 1, start_row=10).numpy() == 10).all()


# --------------------------------------------------------------------------------------
# batching / padding conventions
# --------------------------------------------------------------------------------------


def test_document_batching_and_padding():
    a = M.causal_document_mask([[3, 2], [4, 4]]).numpy()
    assert a.shape == (2, 1, 8, 1)
    np.testing.assert_array_equal(a[0, 0, :, 0], [3, 3, 3, 5, 5, 8, 8, 8])  # padding = own doc
    np.testing.assert_array_equal(a[1, 0, :, 0], [4, 4, 4, 4, 8, 8, 8, 8])
    b = M.causal_document_mask([2, 2], batch_size=3, seqlen=6).numpy()
    assert b.shape == (3, 1, 6, 1)
    np.testing.assert_array_equal(b[2, 0, :, 0], [2, 2, 4, 4, 6, 6])
    d = M.document_mask([2, 2], seqlen=6).numpy()[0, 0]
    np.testing.assert_array_equal(d.T, [[2, 2, 4, 4, 6, 6], [0, 0, 2, 2, 4, 4]])
    keep = M.to_dense(M.document_mask([2, 2], seqlen=6).numpy(), False)[0, 0]
    assert keep[4:, 4:].all() and not keep[4:, :4].any() and not keep[:4, 4:].any()
    p = M.prefix_lm_document_mask([(1, 2)], seqlen=4).numpy()[0, 0]
    np.testing.assert_array_equal(p.T, [[2, 2, 4, 4], [0, 1, 2, 3]])
    s = M.share_question_mask([[(1, [1, 1])], [(2, [1]), (1, [1])]]).numpy()
    np.testing.assert_array_equal(s[0, 0, :, 0], [3, 2, 3, 5, 5])
    np.testing.assert_array_equal(s[1, 0, :, 0], [3, 3, 3, 5, 5])
    cb = M.causal_blockwise_mask([2, 2, 2], seqlen=8).numpy()[0, 0]
    np.testing.assert_array_equal(cb.T, [[2, 2, 8, 8, 8, 8, 8, 8], [4, 4, 8, 8, 8, 8, 8, 8]])
    q = M.qk_sparse_mask(6, [[(1, 2)], [(3, 3)]]).numpy()
    np.testing.assert_array_equal(q[1, 0].T, [[6, 6, 6, 3, 4, 5], [6, 6, 6, 6, 6, 6]])
    gw = M.global_sliding_window_mask(10, 2, (1, 2)).numpy()[0, 0]
    keep = M.to_dense(gw[None, None], False)[0, 0]
    i, j = np.meshgrid(np.arange(10), np.arange(10), indexing="ij")
    expect = (i < 2) | (j < 2) | ((i - j <= 1) & (j - i <= 2))  # 1 key back, 2 ahead
    np.testing.assert_array_equal(keep, expect)


def test_place_argument():
    t = M.causal_mask(4, place=paddle.CPUPlace())
    assert t.place.is_cpu_place()


# --------------------------------------------------------------------------------------
# to_dense against a slow loop reference
# --------------------------------------------------------------------------------------


def loop_reference(idx, causal, sq):
    B, H, sk, C = idx.shape
    keep = np.ones((B, H, sq, sk), dtype=bool)
    for b in range(B):
        for h in range(H):
            for j in range(sk):
                v = [int(x) for x in idx[b, h, j]]
                for i in range(sq):
                    if causal:
                        masked = j > i + sk - sq
                        if C == 1:
                            masked |= i >= v[0]
                        else:
                            masked |= v[0] <= i < v[1]
                    elif C == 2:
                        masked = i >= v[0] or i < v[1]
                    else:
                        masked = v[0] <= i < v[1] or v[2] <= i < v[3]
                    keep[b, h, i, j] = not masked
    return keep


@pytest.mark.parametrize("causal,C", [(True, 1), (True, 2), (False, 2), (False, 4)])
@pytest.mark.parametrize("sq,sk", [(9, 9), (5, 11), (12, 7)])
def test_to_dense_matches_loop(causal, C, sq, sk):
    rng = np.random.default_rng(sq * 100 + sk * 10 + C + int(causal))
    idx = rng.integers(0, sq + 1, size=(2, 3, sk, C)).astype(np.int32)
    if rng.random() < 0.5:  # also exercise sorted (start <= end) intervals
        for a, b_ in ((0, 1), (2, 3)):
            if b_ < C:
                lo = np.minimum(idx[..., a], idx[..., b_])
                hi = np.maximum(idx[..., a], idx[..., b_])
                idx[..., a], idx[..., b_] = lo, hi
    ref = loop_reference(idx, causal, sq)
    got = M.to_dense(idx, causal, seqlen_q=sq)
    assert isinstance(got, np.ndarray) and got.dtype == bool
    np.testing.assert_array_equal(got, ref)
    tp = M.to_dense(paddle.to_tensor(idx), causal, seqlen_q=sq)
    assert isinstance(tp, paddle.Tensor) and tp.dtype == paddle.bool
    assert list(tp.shape) == [2, 3, sq, sk]
    np.testing.assert_array_equal(tp.numpy(), ref)


def test_to_dense_default_sq_and_bottom_right():
    idx = np.full((1, 1, 4, 1), 2, dtype=np.int32)  # rows >= 2 masked
    got = M.to_dense(idx, True, seqlen_q=2)[0, 0]
    # Sq=2, Sk=4: row i sees keys j <= i + 2
    np.testing.assert_array_equal(got, [[1, 1, 1, 0], [1, 1, 1, 1]])
    assert M.to_dense(idx, True).shape == (1, 1, 4, 4)


# --------------------------------------------------------------------------------------
# example_mask
# --------------------------------------------------------------------------------------


def check_indices(a, causal, S, B, H):
    assert a.dtype == np.int32
    C = a.shape[-1]
    assert a.ndim == 4 and a.shape[0] == B and a.shape[2] == S
    assert a.shape[1] in (1, H)
    assert C in ((1, 2) if causal else (2, 4))
    assert a.min() >= 0 and a.max() <= S
    if causal and C == 2:
        assert np.all(a[..., 0] <= a[..., 1])
    if not causal and C == 4:
        assert np.all(a[..., 0] <= a[..., 1]) and np.all(a[..., 2] <= a[..., 3])


@pytest.mark.parametrize("S", [1, 2, 3, 7, 77, 1000])
@pytest.mark.parametrize("name", sorted(M.MASK_BUILDERS))
def test_example_mask(name, S):
    B, H = 2, 3
    t, causal = M.example_mask(name, S, batch_size=B, num_heads=H, seed=S)
    assert isinstance(t, paddle.Tensor) and t.dtype == paddle.int32
    assert causal is M.MASK_BUILDERS[name][1]
    a = t.numpy()
    check_indices(a, causal, S, B, H)
    assert a.shape[1] == (H if name == "random_eviction" else 1)
    # realistic instances never leave a query row with nothing to attend to
    keep = M.to_dense(a, causal)
    assert keep.any(axis=-1).all()
    # reproducible
    np.testing.assert_array_equal(a, M.example_mask(name, S, B, H, seed=S)[0].numpy())


def test_example_mask_large_and_varied():
    for name in M.MASK_BUILDERS:
        t, causal = M.example_mask(name, 131072, batch_size=1, num_heads=2, seed=0)
        check_indices(t.numpy(), causal, 131072, 1, 2)
    a = M.example_mask("causal_document", 4096, batch_size=4, seed=1)[0].numpy()
    assert len({tuple(np.unique(a[b, 0, :, 0])) for b in range(4)}) > 1  # rows differ
    b = M.example_mask("causal_document", 4096, batch_size=4, seed=2)[0].numpy()
    assert not np.array_equal(a, b)


def test_example_mask_errors():
    with pytest.raises(ValueError, match="name"):
        M.example_mask("nope", 10)
    with pytest.raises(ValueError, match="seqlen"):
        M.example_mask("causal", 0)


# --------------------------------------------------------------------------------------
# plot_mask
# --------------------------------------------------------------------------------------


def test_plot_mask(tmp_path):
    t, causal = M.example_mask("share_question", 64, seed=0)
    p = M.plot_mask(t, causal, tmp_path / "sq.png", title="share question")
    data = (tmp_path / "sq.png").read_bytes()
    assert str(p) == str(tmp_path / "sq.png")
    assert len(data) > 100 and data[:8] == b"\x89PNG\r\n\x1a\n"
    # numpy input, another head, Sq != Sk, and a large mask (subsampled)
    a = M.random_eviction_mask(50, 2).numpy()
    M.plot_mask(a, True, str(tmp_path / "ev.png"), head=1, seqlen_q=30)
    assert (tmp_path / "ev.png").stat().st_size > 100
    big, c = M.example_mask("global_sliding_window", 20000)
    M.plot_mask(big, c, tmp_path / "big.png")
    assert (tmp_path / "big.png").stat().st_size > 100


# --------------------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("call,match", [
    (lambda: M.causal_mask(0), "seqlen"),
    (lambda: M.causal_mask(4, batch_size=0), "batch_size"),
    (lambda: M.sliding_window_mask(8, -1), "window"),
    (lambda: M.sliding_window_mask(8, 1.5), "window"),
    (lambda: M.causal_document_mask([4, -1, 3]), "doc_lens"),
    (lambda: M.causal_document_mask([4, 3, 3], seqlen=9), "doc_lens"),
    (lambda: M.causal_document_mask([4.0, 3.0]), "doc_lens"),
    (lambda: M.causal_document_mask([]), "doc_lens"),
    (lambda: M.document_mask([[2, 2], [3]], batch_size=3), "batch_size"),
    (lambda: M.document_mask([5, 5], seqlen=8), "doc_lens"),
    (lambda: M.causal_blockwise_mask([2, -2, 2]), "doc_lens"),
    (lambda: M.share_question_mask([(4, [3, -3])]), "answer_len"),
    (lambda: M.share_question_mask([(-1, [3])]), "prompt_len"),
    (lambda: M.share_question_mask([(4, [3, 3])], seqlen=5), "segments"),
    (lambda: M.share_question_mask([[(4, 3)]]), "segments"),
    (lambda: M.global_sliding_window_mask(10, -1, 1), "global_tokens"),
    (lambda: M.global_sliding_window_mask(10, 2, -1), "window"),
    (lambda: M.global_sliding_window_mask(10, 2, (1, 2, 3)), "window"),
    (lambda: M.prefix_lm_document_mask([(3, 2)]), "prefix_len"),
    (lambda: M.prefix_lm_document_mask([(1, 2)], seqlen=1), "docs"),
    (lambda: M.prefix_lm_causal_mask(10, 11), "prefix_len"),
    (lambda: M.prefix_lm_causal_mask(10, -1), "prefix_len"),
    (lambda: M.qk_sparse_mask(10, [(2, 3), (4, 2)]), "maskout_pairs"),
    (lambda: M.qk_sparse_mask(10, [(8, 3)]), "maskout_pairs"),
    (lambda: M.qk_sparse_mask(10, [(2, -1)]), "maskout_pairs"),
    (lambda: M.random_eviction_mask(10, 1, start_row=11), "start_row"),
    (lambda: M.random_eviction_mask(10, 1, start_row=0), "start_row"),
    (lambda: M.random_eviction_mask(10, 0), "num_heads"),
    (lambda: M.to_dense(np.zeros((1, 1, 4, 4), np.int32), True), "last dim"),
    (lambda: M.to_dense(np.zeros((1, 1, 4, 1), np.int32), False), "last dim"),
    (lambda: M.to_dense(np.zeros((4, 1), np.int32), True), "4-D"),
    (lambda: M.to_dense(np.full((1, 1, 4, 1), 4, np.int32), "False"), "causal must be a bool"),
    # lengths: containers of the wrong kind, rows that are not flat lists of ints, int32's limit
    (lambda: M.causal_document_mask({3: 1}), "doc_lens must be a list"),
    (lambda: M.causal_document_mask({3, 2}), "doc_lens must be a list"),
    (lambda: M.causal_document_mask([3, [2]]), "flat list of integer lengths"),
    (lambda: M.causal_document_mask([[2], 3]), "flat list of integer lengths"),
    (lambda: M.causal_document_mask([True, True, 3]), "flat list of integer lengths"),
    (lambda: M.causal_document_mask([2**62, 2**62]), "int32"),
    (lambda: M.causal_document_mask([1], seqlen=2**31), "seqlen must be at most"),
    # every builder that takes seqlen stops at int32's limit before it allocates anything
    (lambda: M.causal_mask(2**31), "seqlen must be at most"),
    (lambda: M.sliding_window_mask(2**31, 4), "seqlen must be at most"),
    (lambda: M.global_sliding_window_mask(2**31, 1, 4), "seqlen must be at most"),
    (lambda: M.prefix_lm_causal_mask(2**31, 4), "seqlen must be at most"),
    (lambda: M.qk_sparse_mask(2**31, [(2, 3)]), "seqlen must be at most"),
    (lambda: M.random_eviction_mask(2**31, 1), "seqlen must be at most"),
    (lambda: M.causal_document_mask(np.array([2**64 - 1], np.uint64)), "int32"),
    (lambda: M.causal_mask(4, place="no_such_device"), "place="),
    (lambda: M.share_question_mask([[(2, [1])], 5]), "each batch row must be a list"),
    (lambda: M.prefix_lm_document_mask([1, 2]), "each batch row must be a list"),
    (lambda: M.prefix_lm_document_mask([[(1, 2)], 5]), "each batch row must be a list"),
    (lambda: M.global_sliding_window_mask(8, 1, {1: 2, 3: 4}), "window"),
    (lambda: M.random_eviction_mask(8, 1, seed=-1), "seed"),
    (lambda: M.example_mask("causal", 16, seed=-1), "seed"),
    (lambda: M.example_mask(["causal"], 16), "name must be one of"),
    (lambda: M.plot_mask(np.full((1, 1, 4, 1), 4, np.int32), True, "x.png", batch=0.5), "batch"),
])
def test_argument_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_windows_wider_than_the_sequence_are_the_whole_sequence():
    # No int64 wrap of j + window + 1: a window past the sequence is the whole of it.
    for w in (100, 2**63 - 3, sys.maxsize):
        np.testing.assert_array_equal(M.sliding_window_mask(4, w, place="numpy").ravel(), [4, 4, 4, 4])
        np.testing.assert_array_equal(M.global_sliding_window_mask(4, 0, w, place="numpy")[0, 0, :, 0], [4, 4, 4, 4])
        np.testing.assert_array_equal(M.global_sliding_window_mask(4, 0, (1, w), place="numpy"),
                                      M.global_sliding_window_mask(4, 0, (1, 4), place="numpy"))


def test_lengths_from_a_paddle_tensor():
    np.testing.assert_array_equal(M.causal_document_mask(paddle.to_tensor([3, 2]), place="numpy"),
                                  M.causal_document_mask([3, 2], place="numpy"))
