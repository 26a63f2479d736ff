"""The CUDA sources compile for sm_80 and sm_90a with the machine's nvcc (CI has
no GPU; this keeps the kernels from rotting between device runs). The kernel
core is framework-neutral, so no Paddle GPU build is needed for this."""

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from paddle_flashmask import _op_sources

NVCC = shutil.which("nvcc") or next(
    (p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None
)
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def compile_one(source, out_dir):
    obj = os.path.join(out_dir, os.path.basename(source) + ".o")
    cmd = [NVCC, "-std=c++17", "-O2", "-c", source, "-o", obj, "-Xptxas", "-v",
           "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    return source, res.returncode, res.stdout + res.stderr


def test_cuda_sources_compile_for_sm80_and_sm90a(tmp_path):
    sources = _op_sources.cuda_sources()
    assert len(sources) >= 9  # 2 head dims x 2 dtypes x fwd/bwd + prep + api
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda s: compile_one(s, str(tmp_path)), sources))
    failures = [(s, log) for s, rc, log in results if rc != 0]
    assert not failures, "\n\n".join(f"{s}:\n{log[-3000:]}" for s, log in failures)
    # The forward kernels must not spill (the report lists one line per kernel and arch).
    for source, _, log in results:
        if "_fwd_" in os.path.basename(source):
            spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
            assert spills and not any(spills), f"{source} spills: {spills}"
