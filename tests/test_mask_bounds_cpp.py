"""The kernels (Hopper and FA2-class) mask partial tiles through MaskedRows (two intervals per key
column, custom_ops/flashmask/mask_bounds.h). The header is host code too, so its
equivalence with the direct definition (four bounds, causal diagonal, end of the
keys) is checked here with the C++ compiler, on random columns of every form."""

from cpp_checks import needs_cxx, run_cpp_check


@needs_cxx
def test_masked_rows_matches_column_bounds(tmp_path):
    mismatches, checked = run_cpp_check("masked_rows_check", tmp_path)
    assert checked > 1_000_000
    assert mismatches == 0, f"{mismatches} of {checked} elements differ"
