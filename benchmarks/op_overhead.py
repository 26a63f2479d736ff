"""Where the op loses against the bare kernel (a script, not a test; GPU).

For bf16 attention (32:8 heads; head dims from --dims, default 128; masks from --masks, the
benchmark's names, default plain causal) it times, in one process:
- per call: CUDA events around each single call (how bench_gpu.py times; the GPU idles
  while Python dispatches, so host latency counts);
- back to back: events around N calls queued without a sync (host latency hidden when it
  is shorter than the kernel: what a model's layers see);
- host: wall clock of N calls queued without a sync, per call (Python + op dispatch); the
  "op alone" rows call the op without the Python wrapper, so the difference is the wrapper's;
  "checks every call" runs the wrapper with its cache of checked calls emptied before each
  call (the wrapper as it was before that cache);
- GPU only: the call queued behind a 2 ms busy kernel (events around both, less the busy
  kernel alone), so the host's dispatch is over before the GPU reaches the call: every kernel
  and memset the call launches and the gaps between them, none of the host. Per call minus
  GPU only is what the host's latency adds to a synchronized call.
Run it next to the Paddle-free harness (`flashmask_harness --time`) in the same device call.
"""

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import paddle  # noqa: E402

import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask import _checked_calls  # noqa: E402
from paddle_flashmask.attention import GPU_KERNELS  # noqa: E402
from paddle_flashmask.distributed import tensor_ops  # noqa: E402
from bench_gpu import StreamEvents, device_tensor  # noqa: E402
from mask_area import attention_flops, bench_mask  # noqa: E402
from paddle_flashmask import masks as mask_builders  # noqa: E402

# A kernel that spins for `ns` nanoseconds of the GPU's global timer (PTX, JIT-compiled by the
# driver: the Paddle runtime has no kernel of its own we may use).
_BUSY_PTX = b"""
.version 7.0
.target sm_52
.address_size 64
.visible .entry pfm_busy(.param .u64 ns)
{
  .reg .u64 %rd<5>;
  .reg .pred %p;
  ld.param.u64 %rd1, [ns];
  mov.u64 %rd2, %globaltimer;
SPIN:
  mov.u64 %rd3, %globaltimer;
  sub.u64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p, %rd4, %rd1;
  @%p bra SPIN;
  ret;
}
"""


class GpuBusy:
    """Launches pfm_busy on the events' stream through the driver API."""

    def __init__(self, events, ns=2_000_000):
        import ctypes

        self.ctypes, self.events = ctypes, events
        cuda = events.cuda
        module, self.func = ctypes.c_void_p(), ctypes.c_void_p()
        events._check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(_BUSY_PTX)), "cuModuleLoadData")
        events._check(cuda.cuModuleGetFunction(ctypes.byref(self.func), module, b"pfm_busy"), "cuModuleGetFunction")
        self.ns = ctypes.c_uint64(ns)
        self.args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(self.ns), ctypes.c_void_p))

    def launch(self):
        c = self.ctypes
        self.events._check(self.events.cuda.cuLaunchKernel(self.func, 1, 1, 1, 1, 1, 1, 0, self.events.stream,
                                                           self.args, c.c_void_p(0)), "cuLaunchKernel")


def gpu_only_ms(fn, busy, events, repeats=5):
    """GPU time of one call with its host dispatch hidden behind the busy kernel (median)."""
    def busy_then_call():
        busy.launch()
        fn()

    alone = float(np.median([events.time_ms(busy.launch) for _ in range(repeats)]))
    both = float(np.median([events.time_ms(busy_then_call) for _ in range(repeats)]))
    return both - alone


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--kernel", default="sm90")
    ap.add_argument("--masks", nargs="+", default=["causal"], help="benchmark mask names (mask_area.BENCH_MASKS)")
    ap.add_argument("--dims", nargs="+", default=["128"],
                    help='query/key head dims, "D/Dv" for a value head dim of its own (e.g. 192/128)')
    ap.add_argument("--profile", type=int, default=0,
                    help="also profile this many queued forward and backward calls of the first length "
                         "with cProfile (where the host time per call goes: Python checks, the op, paddle.grad)")
    args = ap.parse_args()
    dims = [tuple(int(x) for x in d.split("/")) if "/" in d else (int(d), int(d)) for d in args.dims]
    place = paddle.CUDAPlace(0)
    pfm.build()
    pfm.set_gpu_kernel(args.kernel)
    ev = StreamEvents()
    busy = GpuBusy(ev)
    rng = np.random.default_rng(0)
    H, Hk = 32, 8
    print("| mask | S | D/Dv | pass | per call ms (TFLOP/s) | back to back ms (TFLOP/s) | GPU only ms | host us per call |")
    print("|---|---|---|---|---|---|---|---|")
    for S, (D, Dv), mask in ((S, d, m) for S in args.lengths for d in dims for m in args.masks):
        q, k, v, do = (device_tensor(rng.standard_normal((1, S, h, d), dtype=np.float32), "bfloat16", place)
                       for h, d in ((H, D), (Hk, D), (Hk, Dv), (H, Dv)))
        for t in (q, k, v):
            t.stop_gradient = False
        idx_np, causal = bench_mask(mask_builders, mask, S, Hk)
        idx = None if idx_np is None else paddle.to_tensor(idx_np, place=place)
        fwd_flops, bwd_flops = attention_flops(idx_np, causal, S, S, H, D, head_dim_v=Dv)
        fwd = lambda: pfm.flashmask_attention(q, k, v, idx, causal=causal)
        outs = [fwd()]
        bwd = lambda: paddle.grad(outs, [q, k, v], [do], retain_graph=True)
        # The backward op alone, outside autograd (the context-parallel entry: out and LSE from
        # the caller): what paddle.grad's own machinery adds is the difference to "bwd".
        kernel = GPU_KERNELS[args.kernel]
        out_raw, lse_raw = tensor_ops.attention_fwd(q, k, v, idx, D ** -0.5, causal, kernel, False)
        bwd_op = lambda: tensor_ops.attention_bwd(q, k, v, idx, out_raw, lse_raw, do, D ** -0.5, causal, kernel, False)
        # The forward op without the Python wrapper (its checks): the host time apart is the wrapper's.
        fwd_op = lambda: tensor_ops.attention_fwd(q, k, v, idx, D ** -0.5, causal, kernel, False)
        # The wrapper as before its cache of checked calls: every argument check on every call.
        fwd_checks = lambda: (_checked_calls.clear(), fwd())[1]
        for name, fn, flops in (("fwd", fwd, fwd_flops), ("fwd checks every call", fwd_checks, fwd_flops),
                                ("fwd op alone", fwd_op, fwd_flops), ("bwd", bwd, bwd_flops),
                                ("bwd op alone", bwd_op, bwd_flops)):
            def burst():
                for _ in range(args.calls):
                    fn()

            # Warm-up: a burst, not one call (the first row of an H100 call read 1248 us of host
            # time a call after one warm-up call, ten times the rows after it: first calls' costs).
            burst()
            single = float(np.median([ev.time_ms(fn) for _ in range(5)]))
            many = float(np.median([ev.time_ms(burst) for _ in range(3)])) / args.calls
            gpu = gpu_only_ms(fn, busy, ev)
            host_us = float(np.median([host_time_s(burst) for _ in range(3)])) / args.calls * 1e6
            print(f"| {mask} | {S} | {D}/{Dv} | {name} | {single:.3f} ({flops / single / 1e9:.0f}) "
                  f"| {many:.3f} ({flops / many / 1e9:.0f}) | {gpu:.3f} | {host_us:.0f} |", flush=True)
        if args.profile and S == args.lengths[0] and mask == args.masks[0]:
            for name, fn in (("fwd", fwd), ("bwd", bwd)):
                profile_calls(name, fn, args.profile)
        outs = None


def host_time_s(burst):
    """Host wall clock of one burst of queued calls (the GPU idle before it, drained after)."""
    paddle.device.cuda.synchronize()
    t0 = time.perf_counter()
    burst()
    elapsed = time.perf_counter() - t0
    paddle.device.cuda.synchronize()
    return elapsed


def profile_calls(name, fn, calls):
    """cProfile of `calls` queued calls: the functions with the most own time, per call."""
    import cProfile
    import pstats

    paddle.device.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    paddle.device.cuda.synchronize()
    stats = pstats.Stats(prof)
    print(f"\n{name}: cProfile of {calls} queued calls, own time per call (us), top 15")
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:15]
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        print(f"  {tottime / calls * 1e6:7.1f} own {cumtime / calls * 1e6:7.1f} cum  {ncalls / calls:4.1f}x  "
              f"{os.path.basename(path)}:{line}({func})")


if __name__ == "__main__":
    main()
