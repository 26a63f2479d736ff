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


@needs_cxx
def test_tile_parts_classification_is_exact_and_no_less_precise(tmp_path):
    """The Hopper live lists classify a 128-key tile from its two 64-column summaries one at a
    time (classify_tile_parts): kSkip/kFull must hold elementwise, and every tile the merged
    summary decided must be decided the same way."""
    mismatches, checked = run_cpp_check("tile_parts_check", tmp_path)
    assert checked == 40000
    assert mismatches == 0, f"{mismatches} of {checked} tiles misclassified (or a kind never seen)"


@needs_cxx
def test_row_and_coarse_aggregates_hide_only_masked_rows(tmp_path):
    """Both forwards scan no key block for a query block whose row's aggregate summary says every
    column masks all its rows (cuda::rows_see_no_key), and both forwards' scans pass the keys of a
    coarse summary (32 of the 64-column ones) that says so. Both as the prep pass makes
    them (64-column summaries encoded as minima, reduced CTA by CTA over the groups each CTA spans,
    then into 0x7f-filled slots, in the op's workspace layout) must equal the merged summaries of
    their blocks, and every query block they hide must be masked elementwise."""
    mismatches, checked = run_cpp_check("summary_aggregates_check", tmp_path)
    assert checked > 20000
    assert mismatches == 0, f"{mismatches} mismatches over {checked} query blocks (or a case never seen)"


@needs_cxx
def test_hidden_query_blocks_passed_in_at_most_two_steps(tmp_path):
    """The FA2-class staged backward's scan over a key block's query blocks, after a window that
    listed none, goes on from first_block_not_hidden: it must be the first block no single interval
    of the tile's merged summary covers, and every block it passes must be masked elementwise."""
    mismatches, checked = run_cpp_check("hidden_blocks_check", tmp_path)
    assert checked == 20000
    assert mismatches == 0, f"{mismatches} mismatches over {checked} starts (or a case never seen)"
