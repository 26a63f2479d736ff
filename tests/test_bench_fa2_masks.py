"""The FA2 peer's mask instances (benchmarks/bench_fa2_masks.py) are the masks the library builds:
FA2 runs documents as varlen (cu_seqlens) and the window by window_size_left, while our kernels read
the columns the script writes; both must describe the same attention, and the TFLOP/s area must be
the dense mask's."""

import numpy as np
import pytest
from script_loader import load_script

from paddle_flashmask import masks

bench = load_script("benchmarks/bench_fa2_masks.py")


@pytest.mark.parametrize("seqlen", [2048, 8192])
def test_documents_are_the_library_mask_of_their_lengths(seqlen):
    for name, (lo, hi) in (("causal_document", (256, max(257, seqlen // 3))), ("short_documents", (128, 512))):
        lens, window, cols = bench.instance(name, seqlen)
        assert window is None and sum(lens) == seqlen
        assert all(lo <= n <= hi for n in lens[:-1]) and 1 <= lens[-1] <= hi
        expected = masks.causal_document_mask([lens], seqlen=seqlen).numpy()[0, 0, :, 0]
        np.testing.assert_array_equal(cols, expected)


def test_window_is_the_library_sliding_window():
    lens, window, cols = bench.instance("sliding_window", 4096)
    assert lens is None and window == bench.WINDOW
    expected = masks.sliding_window_mask(4096, bench.WINDOW).numpy()[0, 0, :, 0]
    np.testing.assert_array_equal(cols, expected)


@pytest.mark.parametrize("name", ["causal", "causal_document", "short_documents", "sliding_window"])
def test_area_is_the_dense_mask_count(name):
    s = 700
    lens, window, cols = bench.instance(name, s)
    if name == "sliding_window":
        cols = np.minimum(s, np.arange(s) + 100 + 1).astype(np.int32)
    rows, keys = np.arange(s)[:, None], np.arange(s)[None, :]
    dense = keys <= rows
    if cols is not None:
        dense &= rows < cols[None, :]
    assert bench.unmasked_area(s, cols) == dense.sum()


def test_mask_files_round_trip(tmp_path):
    cases = [("causal", 1024), ("causal_document", 8192), ("sliding_window", 2048)]
    bench.write_masks(cases, str(tmp_path))
    lines = (tmp_path / "index.txt").read_text().split("\n")
    assert lines[0] == "causal 1024 -"
    name, s, path = lines[1].split()
    assert (name, int(s)) == ("causal_document", 8192)
    np.testing.assert_array_equal(np.fromfile(path, dtype=np.int32), bench.instance("causal_document", 8192)[2])
