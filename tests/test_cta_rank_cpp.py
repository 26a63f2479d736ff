"""The FA2-class kernels' CTA orders (custom_ops/flashmask/cuda/fa2_cta_order.cuh) permute the
ranks of their grids' CTAs, and an ordered launch runs rank order[u] as its CTA u: rank r must be
the r-th CTA of the grid's own launch, or an order of every rank would still leave tiles out or run
them twice. The rank decodes are host code too, so they are checked against a walk of the grids
here with the C++ compiler (the forward's grid, the backward's with its deferred rows and padding)."""

from cpp_checks import needs_cxx, run_cpp_check


@needs_cxx
def test_cta_ranks_walk_the_grids(tmp_path):
    mismatches, checked = run_cpp_check("cta_rank_check", tmp_path)
    assert checked > 10_000
    assert mismatches == 0, f"{mismatches} of {checked} checks failed"
