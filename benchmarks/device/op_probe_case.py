"""The call the op probes time (op_bwd_kernels.py, op_host_block.py, op_host_profile.py): causal,
bf16, 32 query / 8 kv heads, D=128, standard normal inputs on GPU 0, in the Paddle GPU runtime.
OP_BWD_SEQLEN (default 8192) and OP_BWD_KERNEL (sm90 or fa2, default sm90) choose the length and
the family, OP_BWD_DIM the head dim (default 128), OP_BWD_MASK causal (default) or full."""

import os
import sys

HEADS, HEADS_K = 32, 8
MASKS = {"causal": True, "full": False}


def device_normal(rng, shape, stop_gradient=True):
    """A bf16 tensor of standard normal values (numpy ``rng``) on GPU 0: made on the host and
    copied, since Paddle's own GPU kernels do not run in the trimmed runtime."""
    import numpy as np
    import paddle

    host = paddle.to_tensor(rng.standard_normal(shape, dtype=np.float32), place=paddle.CPUPlace())
    t = host.astype("bfloat16")._copy_to(paddle.CUDAPlace(0), True)
    t.stop_gradient = stop_gradient
    return t


def op_calls():
    """(description, {name: call}) for the wrapper's forward, the forward op alone, the backward
    through paddle.grad and the backward op alone (out and LSE given: the context-parallel entry)."""
    import numpy as np
    import paddle

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import paddle_flashmask as pfm
    from paddle_flashmask.attention import GPU_KERNELS
    from paddle_flashmask.distributed import tensor_ops

    seqlen = int(os.environ.get("OP_BWD_SEQLEN", "8192"))
    name = os.environ.get("OP_BWD_KERNEL", "sm90")
    dim = int(os.environ.get("OP_BWD_DIM", "128"))
    mask = os.environ.get("OP_BWD_MASK", "causal")
    if mask not in MASKS:
        raise ValueError(f"OP_BWD_MASK must be one of {sorted(MASKS)}, got {mask!r}")
    causal = MASKS[mask]
    rng = np.random.default_rng(0)

    def dev(shape):
        return device_normal(rng, shape)

    pfm.build()
    pfm.set_gpu_kernel(name)
    kernel = GPU_KERNELS[name]
    q, k, v = dev((1, seqlen, HEADS, dim)), dev((1, seqlen, HEADS_K, dim)), dev((1, seqlen, HEADS_K, dim))
    do = dev((1, seqlen, HEADS, dim))
    for t in (q, k, v):
        t.stop_gradient = False
    scale = dim ** -0.5
    out = pfm.flashmask_attention(q, k, v, causal=causal)
    out_raw, lse_raw = tensor_ops.attention_fwd(q, k, v, None, scale, causal, kernel, False)
    calls = {
        "fwd": lambda: pfm.flashmask_attention(q, k, v, causal=causal),
        "fwd op alone": lambda: tensor_ops.attention_fwd(q, k, v, None, scale, causal, kernel, False),
        "bwd paddle.grad": lambda: paddle.grad([out], [q, k, v], [do], retain_graph=True),
        "bwd op alone": lambda: tensor_ops.attention_bwd(q, k, v, None, out_raw, lse_raw, do, scale, causal, kernel,
                                                         False),
    }
    described = f"{paddle.device.cuda.get_device_name(0)}, {mask} {seqlen}, bf16, {HEADS}:{HEADS_K}, D={dim}, {name}"
    return described, calls
