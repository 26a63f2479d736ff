"""Finds or builds the custom op library.

The library's module name carries a fingerprint of the op sources, the
compiler flags and the Paddle version, so a stale build is never picked up:
an op installed by `python setup_ops.py install` is used when it matches the
sources, otherwise the op is JIT-built once into a cache directory
(PADDLE_FLASHMASK_CACHE, default ~/.cache/paddle_flashmask).
"""

import contextlib
import fcntl
import hashlib
import importlib
import os
import pkgutil
import sys
import threading
import warnings

from . import _op_sources

_lock = threading.Lock()
_ops = None


def fingerprint():
    """Short hash of everything that goes into the op binary."""
    import paddle

    h = hashlib.sha256()
    for path in _op_sources.source_paths() + _op_sources.header_paths():
        h.update(os.path.relpath(path, _op_sources.OPS_DIR).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(" ".join(_op_sources.cxx_flags()).encode())
    if _op_sources.cuda_enabled():
        h.update(" ".join(_op_sources.nvcc_flags()).encode())
    h.update(paddle.__version__.encode())
    return h.hexdigest()[:12]


def module_name():
    return f"{_op_sources.OP_MODULE_NAME}_{fingerprint()}"


def cache_dir():
    root = os.environ.get("PADDLE_FLASHMASK_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "paddle_flashmask"
    )
    return os.path.join(root, module_name())


@contextlib.contextmanager
def _file_lock(path):
    # Several processes (a distributed launch, parallel test runs) may ask for
    # the first build at once: one builds, the others wait and reuse it.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _jit_build(name):
    from paddle.utils import cpp_extension

    build_dir = cache_dir()
    with _file_lock(build_dir + ".lock"):
        os.makedirs(build_dir, exist_ok=True)
        marker = os.path.join(build_dir, ".built")
        if not os.path.exists(marker):
            print(
                f"paddle_flashmask: building the custom op into {build_dir} "
                "(first use only, about a minute)...",
                file=sys.stderr,
                flush=True,
            )
        module = cpp_extension.load(
            name=name,
            sources=_op_sources.source_paths(),
            extra_cxx_cflags=_op_sources.cxx_flags(),
            extra_cuda_cflags=_op_sources.nvcc_flags() if _op_sources.cuda_enabled() else None,
            build_directory=build_dir,
            verbose=False,
        )
        open(marker, "w").close()
    return module


def _installed_without_sources():
    # A non-editable install carries no custom_ops/: take the op that
    # `python setup_ops.py install` put beside it, whatever its fingerprint.
    prefix = _op_sources.OP_MODULE_NAME + "_"
    found = sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith(prefix))
    if not found:
        raise ImportError(
            "paddle_flashmask: the custom op is not built and its sources (custom_ops/) are not "
            "next to the package. Install from a checkout: `pip install -e .` (JIT-builds on first "
            "use) or `python setup_ops.py install`."
        )
    return importlib.import_module(found[-1])


def load_ops():
    """The op module (functions pfm_flashmask_attention, pfm_flashmask_check_indices)."""
    global _ops
    if _ops is not None:
        return _ops
    with _lock:
        if _ops is None:
            if not os.path.isdir(_op_sources.OPS_DIR):
                _ops = _installed_without_sources()
                return _ops
            name = module_name()
            try:
                _ops = importlib.import_module(name)  # from `python setup_ops.py install`
            except ImportError:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # cpp_extension's "no ccache" notice
                    _ops = _jit_build(name)
    return _ops
