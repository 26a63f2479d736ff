"""The sm90 kernels mask partial tiles through MaskedRows (two intervals per key
column, custom_ops/flashmask/mask_bounds.h). The header is host code too, so its
equivalence with the direct definition (four bounds, causal diagonal, end of the
keys) is checked here with the C++ compiler, on random columns of every form."""

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CXX = shutil.which("g++") or shutil.which("c++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_masked_rows_matches_column_bounds(tmp_path):
    exe = tmp_path / "masked_rows_check"
    subprocess.run([CXX, "-std=c++17", "-O1", os.path.join(HERE, "cpp", "masked_rows_check.cc"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    mismatches, checked = (int(x) for x in res.stdout.split())
    assert checked > 1_000_000
    assert mismatches == 0, f"{mismatches} of {checked} elements differ"
