"""Does a call of the op wait for the GPU on the host? Each call is queued behind a 20 ms busy
kernel (op_overhead.GpuBusy): a call that returns well within 20 ms queued all its work without
waiting, one that takes ~20 ms synchronized somewhere inside (an allocation, a copy to the host,
a stream wait), and then the GPU idles while the host launches the rest. Issue 16: the op's
backward took 4-8% more GPU time ("GPU only") than the harness's run_bwd_cuda on the same H200
while Nsight Compute lists the same kernels at the same durations (op_bwd_kernels.py).

    python3 benchmarks/device/op_host_block.py   (Paddle GPU runtime; gpu_suite.sh STAGES=kernels)

Prints, per call kind (causal 8K, bf16, 32:8, D=128): the host ms until the call returned and
until the stream drained, medians of 5; GPU only with 2 ms and 20 ms of busy kernel ahead (the
GPU idle, but for one spinning thread, before the call); GPU ms per call of 10 queued back to
back, and GPU only measured right after such a burst. With OP_CLOCK_LOG set, gpu_suite.sh
logs nvidia-smi's SM clock and power every 20 ms beside it.
"""

import os
import sys
import time

import numpy as np
import paddle

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), os.path.dirname(HERE)]  # the repo root, benchmarks/
from bench_gpu import StreamEvents  # noqa: E402
from op_overhead import GpuBusy, gpu_only_ms  # noqa: E402
from op_probe_case import op_calls  # noqa: E402


def main():
    described, calls = op_calls()
    events = StreamEvents()
    busy20, busy2 = GpuBusy(events, ns=20_000_000), GpuBusy(events, ns=2_000_000)
    print(f"# {described}")
    print("| call | host ms to return (20 ms busy ahead) | host ms to drain | GPU only, 2 ms busy | GPU only, 20 ms busy "
          "| back to back, 10 calls | GPU only right after those 10 |")
    print("|---|---|---|---|---|---|---|")

    def stamp(what):  # in nvidia-smi's timestamp format, to read the clock log beside
        now = time.time()
        print(f"# {time.strftime('%Y/%m/%d %H:%M:%S', time.localtime(now))}.{int(now % 1 * 1000):03d} {what}")

    for label, fn in calls.items():
        stamp(f"{label}: isolated calls")
        for _ in range(3):
            fn()
        paddle.device.cuda.synchronize()
        back, drained = [], []
        for _ in range(5):
            paddle.device.cuda.synchronize()
            busy20.launch()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            paddle.device.cuda.synchronize()
            back.append((t1 - t0) * 1e3)
            drained.append((time.perf_counter() - t0) * 1e3)
        g2, g20 = gpu_only_ms(fn, busy2, events), gpu_only_ms(fn, busy20, events)

        # The same call after ~10 calls' worth of sustained GPU work (op_overhead.py times its
        # GPU-only column right after its bursts): events around 10 queued calls, then at once
        # one call behind the 2 ms busy kernel, less that kernel alone.
        def burst():
            for _ in range(10):
                fn()

        b2b, hot = [], []
        stamp(f"{label}: bursts")
        for _ in range(3):
            b2b.append(events.time_ms(burst) / 10)
            hot.append(events.time_ms(lambda: (busy2.launch(), fn())) - events.time_ms(busy2.launch))
        print(f"| {label} | {np.median(back):.3f} | {np.median(drained):.3f} | {g2:.3f} | {g20:.3f} "
              f"| {np.median(b2b):.3f} | {np.median(hot):.3f} |", flush=True)


if __name__ == "__main__":
    main()
