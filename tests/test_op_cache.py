"""A process that finds the op built in its cache imports it as it is: no setup.py run by
Paddle's load(), no nvcc (what every rank of a distributed launch does on start)."""

import os
import subprocess
import sys

import numpy as np

from paddle_flashmask import _loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = """
import numpy as np
import paddle
from paddle.utils import cpp_extension

def refuse(*args, **kwargs):
    raise AssertionError("cpp_extension.load ran: the cached op was not imported as it is")

cpp_extension.load = refuse
import paddle_flashmask as pfm

rng = np.random.default_rng(3)
q, k, v = (paddle.to_tensor(rng.standard_normal((1, 37, 2, 16)).astype("float32")) for _ in range(3))
out = pfm.flashmask_attention(q, k, v, causal=True)
np.save(OUT, out.numpy())
"""


def test_cached_op_is_imported_without_a_build(tmp_path):
    import paddle

    import paddle_flashmask as pfm

    _loader.load_ops()  # this process built (or found) the op: the cache holds it
    assert os.path.exists(os.path.join(_loader.cache_dir(), ".built"))
    out_path = tmp_path / "out.npy"
    proc = subprocess.run([sys.executable, "-c", f"OUT = {str(out_path)!r}\n" + _CHILD], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Compiling user custom op" not in proc.stdout + proc.stderr
    rng = np.random.default_rng(3)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 37, 2, 16)).astype("float32")) for _ in range(3))
    expected = pfm.flashmask_attention(q, k, v, causal=True).numpy()
    np.testing.assert_array_equal(np.load(out_path), expected)


def test_cache_without_a_loadable_op_is_built_again(tmp_path, monkeypatch):
    """A marker beside no library (a cache emptied by hand) falls back to Paddle's load()."""
    from paddle.utils import cpp_extension

    monkeypatch.setenv("PADDLE_FLASHMASK_CACHE", str(tmp_path))
    monkeypatch.setenv("PADDLE_FLASHMASK_WITH_CUDA", "0")
    build_dir = _loader.cache_dir()
    os.makedirs(build_dir)
    open(os.path.join(build_dir, ".built"), "w").close()
    loads = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: loads.append(kwargs["name"]) or "built")
    name = _loader.module_name()
    assert _loader._jit_build(name) == "built"
    assert loads == [name]
