"""The host microseconds of a forward call, part by part (the Paddle GPU runtime; a probe).

A synchronized 8K causal forward waits on the host for ~100 us before its kernel starts
(op_overhead.py: per call against GPU only). This splits that host time without a sampler:

    python3 benchmarks/device/op_host_parts.py      (gpu_suite.sh STAGES=hostparts)

- whole calls, in a loop at a short length (the host sets the pace; the stream drained every
  50 calls): the wrapper and the bare op, each with inputs that need gradients (Paddle builds
  the backward node) and without;
- the wrapper's own Python pieces on the same tensors (the signature, the environment, the
  lookup, the contiguity checks) and the tensor attribute reads they are made of;
- cold: one call after the host slept 20 ms with the GPU idle (as after a synchronize), the
  wrapper and the bare op, median of 20.
Prints one table of microseconds a call (minimum over 3 loops of 200).
"""

import os
import sys
import time
import timeit

import numpy as np
import paddle

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]
import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask import _checked_calls  # noqa: E402
from paddle_flashmask import attention as attention_module  # noqa: E402
from paddle_flashmask.attention import GPU_KERNELS  # noqa: E402
from op_probe_case import device_normal  # noqa: E402

SEQLEN = int(os.environ.get("OP_PARTS_SEQLEN", "1024"))
HEADS, HEADS_K, DIM = 32, 8, 128
LOOP, SYNC_EVERY = 200, 50


def main():
    rng = np.random.default_rng(0)

    def dev(shape, grad):
        return device_normal(rng, shape, stop_gradient=not grad)

    pfm.build()
    pfm.set_gpu_kernel("sm90")
    ops = attention_module.load_ops()
    kernel = GPU_KERNELS["sm90"]
    scale = DIM ** -0.5
    qkv = {grad: (dev((1, SEQLEN, HEADS, DIM), grad), dev((1, SEQLEN, HEADS_K, DIM), grad),
                  dev((1, SEQLEN, HEADS_K, DIM), grad)) for grad in (True, False)}
    q, k, v = qkv[True]
    options = (0.0, True, None, False, False, "", True, None, None, True)  # flashmask_attention's, causal=True
    environment = attention_module._checks_environment(None)
    sig = _checked_calls.signature(q, k, v, None, None, options, environment)

    def wrapper(grad):
        return lambda: pfm.flashmask_attention(*qkv[grad], causal=True)

    def bare(grad):
        return lambda: ops.pfm_flashmask_attention(*qkv[grad], None, None, scale, True, -1, -1, kernel, False)

    calls = [
        ("wrapper, inputs need grad", wrapper(True)),
        ("wrapper, no grad", wrapper(False)),
        ("bare op, inputs need grad", bare(True)),
        ("bare op, no grad", bare(False)),
    ]
    pieces = [
        ("signature", lambda: _checked_calls.signature(q, k, v, None, None, options, environment)),
        ("environment", lambda: attention_module._checks_environment(None)),
        ("lookup", lambda: _checked_calls.lookup(sig)),
        ("contiguity x3", lambda: (attention_module._contiguous(q), attention_module._contiguous(k),
                                   attention_module._contiguous(v))),
        ("tensor key", lambda: _checked_calls._tensor_key(q)),
        ("t.place", lambda: q.place),
        ("tuple(t.shape)", lambda: tuple(q.shape)),
        ("t.dtype", lambda: q.dtype),
        ("t.stop_gradient", lambda: q.stop_gradient),
        ("t.is_contiguous()", lambda: q.is_contiguous()),
        ("paddle.in_dynamic_mode()", paddle.in_dynamic_mode),
    ]

    def loop_us(fn):
        def run():
            for i in range(LOOP):
                fn()
                if i % SYNC_EVERY == SYNC_EVERY - 1:
                    paddle.device.cuda.synchronize()
        run()
        return min(timeit.repeat(run, number=1, repeat=3)) / LOOP * 1e6

    def cold_us(fn):
        samples = []
        for _ in range(20):
            paddle.device.cuda.synchronize()
            time.sleep(0.02)
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        paddle.device.cuda.synchronize()
        return float(np.median(samples))

    print(f"# {paddle.device.cuda.get_device_name(0)}, causal {SEQLEN}, bf16, {HEADS}:{HEADS_K}, D={DIM}, sm90")
    print("| part | us a call, in a loop | us, one call after 20 ms asleep |")
    print("|---|---|---|")
    for label, fn in calls:
        print(f"| {label} | {loop_us(fn):.1f} | {cold_us(fn):.1f} |", flush=True)
    for label, fn in pieces:
        print(f"| {label} | {loop_us(fn):.2f} | |", flush=True)


if __name__ == "__main__":
    main()
