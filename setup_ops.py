"""Build and install the paddle-flashmask custom op with Paddle's cpp_extension.

    python setup_ops.py install

installs the op library as the module `paddle_flashmask_ops_<fingerprint>`,
which `paddle_flashmask` imports when it matches its sources (otherwise the
package JIT-builds the op into a cache directory on first use).
"""

import os
import sys

from paddle.utils.cpp_extension import CppExtension, CUDAExtension, setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paddle_flashmask import _loader, _op_sources  # noqa: E402  (lazy package: builds nothing)

setup(
    # The name carries the sources' fingerprint, so an installed op is never stale.
    name=_loader.module_name(),
    ext_modules=(
        CUDAExtension(
            sources=_op_sources.source_paths(),
            extra_compile_args={"cxx": _op_sources.cxx_flags(), "nvcc": _op_sources.nvcc_flags()},
        )
        if _op_sources.cuda_enabled()
        else CppExtension(
            sources=_op_sources.source_paths(),
            extra_compile_args={"cxx": _op_sources.cxx_flags()},
        )
    ),
)
