"""benchmarks/tile_geometry.py: its numpy mirror of the kernels' tile classification
(classify_tile / classify_tile_parts in mask_bounds.h) must be sound against the dense mask (a
skipped tile holds no visible pair, a whole tile no masked one), and its area shares must be what a
closed form gives where there is one."""

import numpy as np
import pytest
from script_loader import load_script

from paddle_flashmask import masks

geometry = load_script("benchmarks/tile_geometry.py")

MASK_NAMES = sorted(masks.MASK_BUILDERS)


def _dense_tiles(keep, block_m, block_n):
    """(any visible, all visible) per tile of a dense keep mask [B, Hm, Sq, Sk]."""
    sq, sk = keep.shape[-2:]
    any_visible, all_visible = [], []
    for r in range(0, sq, block_m):
        row_any, row_all = [], []
        for c in range(0, sk, block_n):
            tile = keep[..., r:r + block_m, c:c + block_n]
            row_any.append(tile.any((-2, -1)))
            # A ragged last key block is masked past the keys' end: never "all visible".
            row_all.append(tile.all((-2, -1)) & (c + block_n <= sk))
        any_visible.append(np.stack(row_any, -1))
        all_visible.append(np.stack(row_all, -1))
    return np.stack(any_visible, -2), np.stack(all_visible, -2)


@pytest.mark.parametrize("name", MASK_NAMES)
@pytest.mark.parametrize("block_m, block_n", [(128, 64), (64, 128), (128, 128), (64, 32), (48, 64)])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(777, 777), (300, 517)])
def test_classification_is_sound_against_the_dense_mask(name, block_m, block_n, seqlen_q, seqlen_k):
    idx, causal = masks.example_mask(name, seqlen_k, batch_size=2, num_heads=2, seed=3, place="numpy")
    idx = np.minimum(idx, seqlen_q)  # row bounds within the query rows
    kinds = geometry.classify_tiles(idx, causal, seqlen_q, seqlen_k, block_m, block_n)
    any_visible, all_visible = _dense_tiles(masks.to_dense(idx, causal, seqlen_q), block_m, block_n)
    assert kinds.shape == any_visible.shape
    assert not any_visible[kinds == geometry.SKIP].any(), "a skipped tile holds visible pairs"
    assert all_visible[kinds == geometry.FULL].all(), "a whole tile holds masked pairs"
    assert (kinds == geometry.SKIP).any() or name in ("qk_sparse", "random_eviction", "prefix_lm_causal")


def test_causal_without_a_mask_is_exact():
    # Bottom-right causal: the diagonal tiles are masked elementwise, those above it skipped.
    kinds = geometry.classify_tiles(None, True, 512, 512, 128, 64)[0, 0]
    rows, cols = np.meshgrid(np.arange(4), np.arange(8), indexing="ij")
    expected = np.where(cols * 64 > rows * 128 + 127, geometry.SKIP,
                        np.where(cols * 64 + 63 > rows * 128, geometry.PARTIAL, geometry.FULL))
    np.testing.assert_array_equal(kinds, expected)


@pytest.mark.parametrize("block", [64, 128])
def test_causal_share_is_the_closed_form(block):
    seqlen = 16 * block
    n = seqlen // block
    share, masked = geometry.tile_geometry(None, True, seqlen, seqlen, block, block)
    assert share == pytest.approx((seqlen * (seqlen + 1) / 2) / (n * (n + 1) / 2 * block * block))
    assert masked == pytest.approx(n / (n * (n + 1) / 2))


def test_full_attention_computes_only_visible_pairs():
    share, masked = geometry.tile_geometry(None, False, 1000, 1000, 128, 64)
    assert share == 1.0 and masked > 0  # the ragged last blocks are clipped, and masked


def test_a_wide_tile_combines_its_summary_blocks():
    # Rows 128-191 of documents [64, 192]: keys 0-63 (document 1) are all masked there, keys
    # 64-127 (document 2, below the diagonal) all visible. The 128-key tile holding both is
    # masked elementwise, as classify_tile_parts combines its 64-key parts.
    idx = masks.causal_document_mask([64, 192], seqlen=256, place="numpy")
    narrow = geometry.classify_tiles(idx, True, 256, 256, 64, 64)[0, 0]
    wide = geometry.classify_tiles(idx, True, 256, 256, 64, 128)[0, 0]
    assert (narrow[2, 0], narrow[2, 1], wide[2, 0]) == (geometry.SKIP, geometry.FULL, geometry.PARTIAL)


@pytest.mark.parametrize("name", ["causal_document", "share_question", "global_sliding_window"])
def test_wide_tiles_are_their_parts_combined(name):
    idx, causal = masks.example_mask(name, 1000, seed=5, place="numpy")
    narrow = geometry.classify_tiles(idx, causal, 1000, 1000, 64, 64)
    wide = geometry.classify_tiles(idx, causal, 1000, 1000, 64, 128)
    pairs = narrow.reshape(narrow.shape[:-1] + (8, 2))  # 16 key blocks of 64 (the last ragged), 8 of 128
    expected = np.where(pairs[..., 0] == pairs[..., 1], pairs[..., 0], geometry.PARTIAL)
    np.testing.assert_array_equal(wide, expected)


def test_rejects_tiles_that_straddle_summary_blocks():
    with pytest.raises(ValueError, match="block_n 96 and summary_cols 64"):
        geometry.classify_tiles(None, True, 256, 256, 64, 96)


def test_table_for_the_benchmark_masks(capsys):
    assert geometry.main(["--lengths", "2048", "--masks", "causal_document", "sliding_window"]) == 0
    out, halves = capsys.readouterr().out.split("one live 64-key half")
    rows = [line for line in out.splitlines() if line.startswith("| causal_document") or line.startswith("| sliding")]
    assert len(rows) == 4  # the kernels' tiles, then the same aligned to the diagonal blocks
    # then the backward's steps with one live key half, plain causal's first
    half_rows = [line.split("|")[1:5] for line in halves.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r[0].strip() for r in half_rows[1:]] == ["causal", "causal_document", "sliding_window"]
    assert all(0 <= float(r[3]) < 1 for r in half_rows[1:])
    for row in rows:
        shares = [float(x) for x in row.strip("|").split("|")[2:6]]
        assert all(0.3 < s <= 1.05 for s in shares)
    (fixed, aligned) = (rows[0], rows[2])
    assert all(float(a) >= float(f) for f, a in zip(fixed.split("|")[3:7], aligned.split("|")[3:7]))


def test_table_takes_plain_causal(capsys):
    """Plain causal (no column mask) is one diagonal block: its aligned share is its own, 1.00 of itself."""
    assert geometry.main(["--lengths", "1024", "--masks", "causal"]) == 0
    out = capsys.readouterr().out.split("one live 64-key half")[0]
    rows = [line for line in out.splitlines() if line.startswith("| causal ")]
    assert len(rows) == 2
    assert rows[0].split("|")[3:7] == rows[1].split("|")[3:7]
    assert all(float(x) == 1.0 for x in rows[1].split("|")[3:7])
    assert rows[1].split("|")[7].strip() == "1"


def _dense_splits(keep):
    """Rows s where no visible pair crosses s (neither row >= s with key < s nor the reverse)."""
    n = keep.shape[-1]
    return [s for s in range(1, n) if not keep[:s, s:].any() and not keep[s:, :s].any()]


@pytest.mark.parametrize("name", MASK_NAMES)
@pytest.mark.parametrize("seqlen", [300, 777])
def test_segments_are_the_dense_masks_diagonal_blocks(name, seqlen):
    idx, causal = masks.example_mask(name, seqlen, batch_size=2, num_heads=2, seed=4, place="numpy")
    keep = masks.to_dense(idx, causal, seqlen)
    found = geometry.segments(idx, causal, seqlen)
    assert [len(per_batch) for per_batch in found] == [idx.shape[1]] * idx.shape[0]
    for b in range(idx.shape[0]):
        for h in range(idx.shape[1]):
            cuts = [start for start, _ in found[b][h][1:]]
            assert cuts == _dense_splits(keep[b, h]), (b, h)
            assert found[b][h][0][0] == 0 and found[b][h][-1][1] == seqlen


def test_segments_of_packed_documents_are_the_documents():
    lengths = [100, 300, 57, 567]
    idx = masks.causal_document_mask(lengths, 1024, place="numpy")
    starts = np.cumsum([0] + lengths)
    assert geometry.segments(idx, True, 1024) == [[list(zip(starts[:-1], starts[1:]))]]


@pytest.mark.parametrize("block_m, block_n", [(128, 64), (64, 128)])
def test_segment_aligned_documents_are_causal_blocks(block_m, block_n):
    # Each document tiled from its own first row and key is a causal square of its length, its
    # last tiles counted whole (the kernels compute them so); only the sequence's end clips.
    lengths = [100, 300, 57, 567]
    idx = masks.causal_document_mask(lengths, 1024, place="numpy")
    area = sum(n * (n + 1) // 2 for n in lengths)
    computed, start = 0, 0
    for n in lengths:
        tiles = -(-n // block_m)
        for t in range(tiles):  # row tile t sees key tiles up to its last row's, within the document
            last_row = min(n, (t + 1) * block_m) - 1
            for c in range(last_row // block_n + 1):
                rows = min(block_m, 1024 - (start + t * block_m))
                cols = min(block_n, 1024 - (start + c * block_n))
                computed += rows * cols
        start += n
    got = geometry.segment_aligned_geometry(idx, True, 1024, block_m, block_n)
    assert got == pytest.approx(area / computed)
    assert got > geometry.tile_geometry(idx, True, 1024, 1024, block_m, block_n)[0]


def test_key_halves_of_plain_causal_are_the_diagonal_steps():
    """Causal at 1024 with 64 x 128 steps: key block j sees query blocks 2j..15, and only its first
    (rows 128j..128j+63) leaves its second half (keys 128j+64..) wholly masked."""
    steps, single = geometry.key_halves(None, True, 1024, 1024)
    assert steps == sum(16 - 2 * j for j in range(8))
    assert single == 8


@pytest.mark.parametrize("name", MASK_NAMES)
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(777, 777), (300, 517)])
def test_key_halves_are_the_dense_masks_halves(name, seqlen_q, seqlen_k):
    """A step is live where its 64 x 128 tile holds a visible pair. The summaries' count bounds the
    dense mask's live steps from above (a summary is conservative), and every half they call dead
    holds no visible pair, so a kernel that skips it computes the same."""
    idx, causal = masks.example_mask(name, seqlen_k, batch_size=2, num_heads=2, seed=5, place="numpy")
    idx = np.minimum(idx, seqlen_q)
    steps, single = geometry.key_halves(idx, causal, seqlen_q, seqlen_k)
    halves, _ = _dense_tiles(masks.to_dense(idx, causal, seqlen_q), 64, 64)
    n_tiles = -(-seqlen_k // 128)
    if halves.shape[-1] < 2 * n_tiles:
        halves = np.concatenate([halves, np.zeros(halves.shape[:-1] + (1,), bool)], -1)
    pairs = halves.reshape(halves.shape[:-1] + (n_tiles, 2))
    dense_steps = int(pairs.any(-1).sum())
    assert steps >= dense_steps
    kinds = geometry._part_kinds(idx, causal, seqlen_q, seqlen_k, 64, 64)
    assert not halves[..., :kinds.shape[-1]][kinds == geometry.SKIP].any(), "a dead half holds visible pairs"
    assert 0 <= single <= steps


def test_key_halves_take_two_summary_blocks_only():
    with pytest.raises(ValueError, match="two summary blocks"):
        geometry.key_halves(None, True, 512, 512, block_n=64)
