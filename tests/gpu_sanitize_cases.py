"""Small forward+backward calls of every mask form on the GPU, for
compute-sanitizer (memcheck / racecheck / synccheck) on the device:

    compute-sanitizer --tool memcheck --kernel-name kns=flashmask python3 tests/gpu_sanitize_cases.py

SANITIZE_HEAD_DIMS=256 (a comma list of query/key head dims) narrows the head dims; each runs with
the value head dim the GPU kernels take with it (validation.GPU_VALUE_HEAD_DIMS: "192" means q/k
192 with v 128). The window and many-tiles cases at the end (head dims 64 and 128) run only where
128 is among them.
"""

import os
import sys

import numpy as np
import paddle

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask import masks, validation  # noqa: E402
from paddle_flashmask.attention import gpu_supports  # noqa: E402

GPU = paddle.CUDAPlace(0)


def to_gpu(a, dtype="bfloat16"):
    return paddle.to_tensor(a, place=paddle.CPUPlace()).astype(dtype)._copy_to(GPU, True)


def many_tiles_per_cta_wide(rng, dim):
    """A head dim above 128 (192/128, 256), about 2 tiles per CTA of the persistent Hopper
    forward: one Q buffer handed over between tiles, and the backward's P/dS hand-over between the
    warpgroups (256 elsewhere: the FA2-class kernels). Skipped where no kernel takes it."""
    dim_v = validation.gpu_value_head_dim(dim)
    if not gpu_supports(to_gpu(np.zeros((1, 1, 1, dim), np.float32)), dim, False, value_head_dim=dim_v):
        return
    idx, causal = masks.example_mask("causal_document", 1024, batch_size=2, num_heads=1, seed=1, place="numpy")
    q = to_gpu(rng.standard_normal((2, 1024, 16, dim)).astype(np.float32))
    k = to_gpu(rng.standard_normal((2, 1024, 4, dim)).astype(np.float32))
    v = to_gpu(rng.standard_normal((2, 1024, 4, dim_v)).astype(np.float32))
    q.stop_gradient = False
    out = pfm.flashmask_attention(q, k, v, paddle.to_tensor(idx, place=GPU), causal=causal, deterministic=False)
    (dq,) = paddle.grad([out], [q], [to_gpu(rng.standard_normal((2, 1024, 16, dim_v)).astype(np.float32))])
    assert np.isfinite(dq._copy_to(paddle.CPUPlace(), True).astype("float32").numpy()).all()
    print(f"ok many tiles per CTA D={dim}/{dim_v}", flush=True)


def main():
    rng = np.random.default_rng(0)
    seqlen = 200  # ragged: 3 full 64-blocks and a partial one
    cases = [("causal", None, True), ("full", None, False)]
    for name in ("causal_document", "causal_blockwise", "document", "global_sliding_window"):
        idx, causal = masks.example_mask(name, seqlen, batch_size=1, num_heads=2, seed=0, place="numpy")
        cases.append((name, idx, causal))
    wanted = os.environ.get("SANITIZE_HEAD_DIMS", "")
    dims = [int(d) for d in wanted.split(",")] if wanted else list(validation.GPU_HEAD_DIMS)
    for dim in dims:
        dim_v = validation.gpu_value_head_dim(dim) or dim  # 192: v 128; a dim no kernel takes: v alike
        for name, idx, causal in cases:
            q = to_gpu(rng.standard_normal((1, seqlen, 4, dim)).astype(np.float32))
            k = to_gpu(rng.standard_normal((1, seqlen, 2, dim)).astype(np.float32))
            v = to_gpu(rng.standard_normal((1, seqlen, 2, dim_v)).astype(np.float32))
            dout = to_gpu(rng.standard_normal((1, seqlen, 4, dim_v)).astype(np.float32))
            for t in (q, k, v):
                t.stop_gradient = False
            ind = None if idx is None else paddle.to_tensor(idx, place=GPU)
            for deterministic in (False, True):  # True: the query-major dQ kernel
                # 192/128: Hopper kernels only, not deterministic
                if not gpu_supports(q, dim, deterministic, value_head_dim=dim_v):
                    print(f"skip {name} D={dim}/{dim_v} deterministic={deterministic} (not taken on this GPU)",
                          flush=True)
                    continue
                out = pfm.flashmask_attention(q, k, v, ind, causal=causal, deterministic=deterministic)
                grads = paddle.grad([out], [q, k, v], [dout])
                host = [g._copy_to(paddle.CPUPlace(), True).astype("float32").numpy() for g in [out] + list(grads)]
                assert all(np.isfinite(h).all() for h in host), name
                print(f"ok {name} D={dim}/{dim_v} deterministic={deterministic}", flush=True)
    for dim in [d for d in dims if d > 128]:
        many_tiles_per_cta_wide(rng, dim)
    if wanted and 128 not in dims:
        return
    for window in (5, (30, 3)):
        q = to_gpu(rng.standard_normal((1, seqlen, 2, 64)).astype(np.float32))
        pfm.flashmask_attention(q, q, q, window_size=window, causal=False)
        print(f"ok window {window}", flush=True)
    # Several tiles per CTA of the persistent Hopper forward (the slots' hand-over, a GQA
    # group's heads side by side): 512 tiles, forward only.
    idx, causal = masks.example_mask("causal_document", 1024, batch_size=2, num_heads=1, seed=0, place="numpy")
    q = to_gpu(rng.standard_normal((2, 1024, 32, 128)).astype(np.float32))
    k = to_gpu(rng.standard_normal((2, 1024, 8, 128)).astype(np.float32))
    out = pfm.flashmask_attention(q, k, k, paddle.to_tensor(idx, place=GPU), causal=causal)
    assert np.isfinite(out._copy_to(paddle.CPUPlace(), True).astype("float32").numpy()).all()
    print("ok many tiles per CTA", flush=True)


if __name__ == "__main__":
    main()
