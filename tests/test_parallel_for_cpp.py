"""The CPU kernels' parallel_for when the system refuses some of its threads (a thread or memory
limit, a large PADDLE_FLASHMASK_NUM_THREADS on a small container): every item still runs once, on
the threads that did start, where a failed thread creation had ended the process."""

import sys

import pytest

from cpp_checks import needs_cxx, run_cpp_check


@needs_cxx
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="caps the address space via /proc")
def test_parallel_for_runs_every_item_when_threads_are_refused(tmp_path):
    mismatches, checked = run_cpp_check("parallel_for_check", tmp_path, flags=("-pthread",))
    assert checked > 20_000
    assert mismatches == 0, f"{mismatches} of {checked} checks failed"
