"""The FA2-class backward adds dQ into 64-row tiles in its accumulators' order
(custom_ops/flashmask/cuda/dq_tile_layout.h) and bwd_finish reads them back
through the inverse map. The header is host code too, so the round trip
(kernel's warp split -> tile -> row layout) and the tiles' cover of dq_accum are
checked here with the C++ compiler; compiling it also runs the header's
compile-time bijection proof."""

from cpp_checks import needs_cxx, run_cpp_check


@needs_cxx
def test_dq_tile_layout_round_trip(tmp_path):
    mismatches, checked = run_cpp_check("dq_tile_layout_check", tmp_path)
    assert checked > 100_000
    assert mismatches == 0, f"{mismatches} of {checked} checks failed"
