import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def default_gpu_kernel(monkeypatch):
    """No explicit set_gpu_kernel setting and no PADDLE_FLASHMASK_GPU_KERNEL; the caller's
    state comes back after."""
    import paddle_flashmask as pfm

    monkeypatch.delenv("PADDLE_FLASHMASK_GPU_KERNEL", raising=False)
    old = pfm.set_gpu_kernel(None)
    yield
    pfm.set_gpu_kernel(old)
