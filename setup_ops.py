"""Build the paddle-flashmask custom op ahead of time with Paddle's cpp_extension.

    python setup_ops.py install     # or: python setup_ops.py build
    python setup_ops.py cuda-objects DIR   # only the CUDA kernels, as objects (no Paddle needed)

compiles the op (CPU, plus CUDA when the installed Paddle has CUDA) into the
package's build cache (PADDLE_FLASHMASK_CACHE, default ~/.cache/paddle_flashmask)
under a name that carries the sources' fingerprint, exactly where the package
looks for it; without this step the first call builds it. (Paddle's
`cpp_extension.setup(...) install` egg layout differs between Paddle 2.6 and 3.x
and breaks on absolute source paths, so the JIT loader's cache is the one
install location used for both.)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    if len(argv) == 2 and argv[0] == "cuda-objects":
        # The kernels are framework-neutral: build them where nvcc is (in parallel)
        # and link them elsewhere with PADDLE_FLASHMASK_CUDA_OBJECTS=DIR.
        from paddle_flashmask import _op_sources

        objects = _op_sources.compile_cuda_objects(argv[1])
        print(f"{len(objects)} CUDA objects in {argv[1]} (fingerprint {_op_sources.cuda_fingerprint()})")
        return 0
    if len(argv) != 1 or argv[0] not in ("install", "build"):
        print(__doc__)
        return 2
    from paddle_flashmask import _loader, _op_sources  # lazy package: imports no op

    ops = _loader.load_ops()
    kinds = "CPU + CUDA" if _op_sources.cuda_enabled() else "CPU"
    print(f"paddle_flashmask op ({kinds}) ready: {_loader.cache_dir()} ({ops.__name__})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
