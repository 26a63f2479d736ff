"""Both kernel families' APIs reach their instantiations through one helper
(custom_ops/flashmask/cuda/head_dim_dispatch.h): every tile head dim and dtype is
checked here with the C++ compiler against each family's list of head dims."""

import os

import pytest

from cpp_checks import needs_cxx, run_cpp_check
from paddle_flashmask import _op_sources

CUDA_INCLUDE = os.path.join(_op_sources.cuda_home(), "include")
HEADERS = os.path.join(_op_sources.OPS_DIR, "flashmask", "cuda")


@needs_cxx
@pytest.mark.skipif(not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda_bf16.h")),
                    reason="no CUDA headers (cuda_bf16.h, cuda_fp16.h)")
def test_head_dim_dispatch_runs_exactly_the_instantiated_pair(tmp_path):
    mismatches, checked = run_cpp_check("head_dim_dispatch_check", tmp_path,
                                        flags=(f"-I{HEADERS}", f"-I{CUDA_INCLUDE}"))
    assert checked == 3 * 321 * 2
    assert mismatches == 0, f"{mismatches} of {checked} checks failed"
