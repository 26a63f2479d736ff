"""Finds or builds the custom op library.

The library's module name carries a fingerprint of the op sources, the
compiler flags and the Paddle version, so a stale build is never picked up:
an installed op module of that name is used when present, otherwise the op is
JIT-built once into a cache directory (PADDLE_FLASHMASK_CACHE, default
~/.cache/paddle_flashmask); `python setup_ops.py install` does that build ahead
of time.
"""

import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
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


def _fingerprint_matches(objects_dir, fingerprint):
    stamp = os.path.join(objects_dir, "FINGERPRINT")
    return os.path.exists(stamp) and open(stamp).read().strip() == fingerprint


def _cuda_objects(build_dir):
    # The CUDA kernels are compiled by nvcc in parallel (cpp_extension would
    # compile them one by one), or taken prebuilt from
    # PADDLE_FLASHMASK_CUDA_OBJECTS when that directory's FINGERPRINT matches
    # these sources and flags (`python setup_ops.py cuda-objects DIR`).
    # A matching directory may hold only some of the objects (the device's carry limit):
    # the missing ones are compiled here. Every process that loads the op comes
    # through here, so what an earlier process compiled into the cache is taken too
    # (its FINGERPRINT is written once every object is there).
    prebuilt = os.environ.get("PADDLE_FLASHMASK_CUDA_OBJECTS")
    out_dir = os.path.join(build_dir, "cuda_objects")
    fingerprint = _op_sources.cuda_fingerprint()  # hashes every CUDA source: once
    reuse_dirs = []
    if prebuilt:
        if _fingerprint_matches(prebuilt, fingerprint):
            reuse_dirs.append(prebuilt)
        else:
            warnings.warn(
                f"paddle_flashmask: PADDLE_FLASHMASK_CUDA_OBJECTS={prebuilt} does not match these "
                "sources and flags; compiling the CUDA kernels here",
                stacklevel=2,
            )
    if _fingerprint_matches(out_dir, fingerprint):
        reuse_dirs.append(out_dir)
    return _op_sources.compile_cuda_objects(out_dir, reuse_dirs=reuse_dirs)


def _import_built(name, build_dir):
    """The op an earlier process built into build_dir, imported as it is; None if that fails.

    Paddle's load() would run its setup.py in a subprocess on every process start (1-2 s, and
    a "Compiling user custom op" line) only to find the build up to date; the directory's
    name already carries the fingerprint of everything that went into it.
    """
    try:
        from paddle.utils.cpp_extension.extension_utils import _import_module_from_library

        return _import_module_from_library(name, os.path.join(build_dir, name), False)
    except (ImportError, AttributeError, OSError):
        return None


def _jit_build(name):
    from paddle.utils import cpp_extension

    build_dir = cache_dir()
    with _file_lock(build_dir + ".lock"):
        os.makedirs(build_dir, exist_ok=True)
        marker = os.path.join(build_dir, ".built")
        if os.path.exists(marker):
            module = _import_built(name, build_dir)
            if module is not None:
                return module
        else:
            print(
                f"paddle_flashmask: building the custom op into {build_dir} "
                "(first use only, about a minute)...",
                file=sys.stderr,
                flush=True,
            )
        ldflags = []
        if _op_sources.cuda_enabled():
            ldflags = _op_sources.cuda_link_flags(_cuda_objects(build_dir))
        module = cpp_extension.load(
            name=name,
            sources=[os.path.join(_op_sources.OPS_DIR, s) for s in _op_sources.CPU_SOURCES],
            extra_cxx_cflags=_op_sources.cxx_flags(),
            extra_ldflags=ldflags,
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


def _import_installed(name):
    # Only a Python stub generated by Paddle (name.py) is importable as the op;
    # never a bare name.so: dlopen would register its ops before the import
    # fails, and the JIT-built copy would then abort the process on re-registration.
    spec = importlib.util.find_spec(name)
    if spec is None or not (spec.origin or "").endswith(".py"):
        raise ImportError(f"no installed op stub {name}.py")
    return importlib.import_module(name)


def _not_to_static(fn):
    # Dynamic-to-static must call this as plain Python, not transform it: in AST mode and in
    # Paddle 3.x's default SOT mode (bytecode simulation), which `not_to_static` does not reach
    # (SOT simulated the checks and failed inside Paddle with an UnboundLocalError): `unified`.
    # Paddle 2.6 has no such marker, and its SOT mis-calls this function's keyword-only arguments
    # there: on 2.6, to_static needs full_graph=True (AST).
    import paddle

    unified = getattr(getattr(paddle.jit, "marker", None), "unified", None)
    if unified is not None:
        return unified(fn, for_sot=True, for_ast=True)
    marker = getattr(paddle.jit, "not_to_static", None)
    return marker(fn) if marker else fn


@_not_to_static
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
                _ops = _import_installed(name)  # an op installed under this fingerprint
            except ImportError:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # cpp_extension's "no ccache" notice
                    _ops = _jit_build(name)
    return _ops
