"""The FA2-class backward adds dQ into 64-row tiles in its accumulators' order
(custom_ops/flashmask/cuda/dq_tile_layout.h) and bwd_finish reads them back
through the inverse map. The header is host code too, so the round trip
(kernel's warp split -> tile -> row layout) and the tiles' cover of dq_accum are
checked here with the C++ compiler; compiling it also runs the header's
compile-time bijection proof."""

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CXX = shutil.which("g++") or shutil.which("c++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_dq_tile_layout_round_trip(tmp_path):
    exe = tmp_path / "dq_tile_layout_check"
    subprocess.run([CXX, "-std=c++17", "-O1", os.path.join(HERE, "cpp", "dq_tile_layout_check.cc"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    mismatches, checked = (int(x) for x in res.stdout.split())
    assert checked > 100_000
    assert mismatches == 0, f"{mismatches} of {checked} checks failed"
