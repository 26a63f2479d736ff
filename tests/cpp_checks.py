"""Host-side checks of the kernels' headers: a C++ program in tests/cpp/ compiled with the
machine's C++ compiler and run, printing "<mismatches> <checks>"."""

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CXX = shutil.which("g++") or shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler")


def run_cpp_check(name, tmp_path, flags=()):
    """Compiles tests/cpp/<name>.cc (with `flags`), runs it and returns its (mismatches, checks)."""
    exe = tmp_path / name
    source = os.path.join(HERE, "cpp", f"{name}.cc")
    subprocess.run([CXX, "-std=c++17", "-O1", *flags, source, "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    mismatches, checked = (int(x) for x in res.stdout.split())
    return mismatches, checked
