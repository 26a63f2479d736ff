"""paddle-flashmask: FlashMask attention as a Paddle custom op, on CPU (and GPU).

    import paddle_flashmask as pfm
    out = pfm.flashmask_attention(q, k, v, pfm.masks.causal_document_mask([4, 3, 3]), causal=True)

The op library is loaded (or JIT-built) on the first call, not at import.
"""

from . import masks
from ._loader import load_ops
from .attention import flashmask_attention, get_gpu_kernel, set_gpu_kernel, set_index_validation

__all__ = [
    "flashmask_attention",
    "set_gpu_kernel",
    "get_gpu_kernel",
    "set_index_validation",
    "masks",
    "load_ops",
    "build",
]
__version__ = "0.1.0"


def build():
    """Builds (or finds) the custom op now instead of on first use."""
    return load_ops()
