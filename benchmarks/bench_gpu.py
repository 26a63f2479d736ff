"""GPU benchmark of paddle_flashmask's CUDA kernels (a script, not a test).

Per mask and length: forward and backward time, TFLOP/s on the unmasked area
(fwd 2*area*H*(D + Dv), i.e. 4*area*H*D where value's head dim Dv = D; bwd 2.5x fwd) and
peak memory. --dim is the query/key head dim, --dim-v value's (default: the one the GPU
kernels take with --dim, 128 with 192, else --dim). Results go to a JSON-lines
file that benchmarks/report.py turns into RESULTS.md and a plot, next to the
PyTorch peers measured by bench_gpu_peers.py in the same device call.

Runs in the trimmed Paddle GPU runtime too: only our ops, host<->device
copies and paddle.grad are used; inputs are made on the host.

Times are GPU time between CUDA events recorded on Paddle's stream around each
call (the method bench_gpu_peers.py uses for the PyTorch peers), median of the
repeats; host time per call (wall clock to a synchronize) is recorded as well.
"""

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import paddle  # noqa: E402

import paddle_flashmask as pfm  # noqa: E402
from mask_area import BENCH_MASKS, attention_flops, bench_mask, gpu_value_head_dim  # noqa: E402
from paddle_flashmask import masks  # noqa: E402

def device_tensor(array, dtype, place):
    host = paddle.to_tensor(array, place=paddle.CPUPlace())
    return host.astype(dtype)._copy_to(place, True)


class StreamEvents:
    """CUDA events on Paddle's current stream through the driver API (Paddle
    2.6's Event has no elapsed time)."""

    def __init__(self):
        stream = paddle.device.cuda.current_stream()
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            handle = getattr(getattr(stream, "stream_base", None), "cuda_stream", None)
        if handle is None:
            raise RuntimeError("no raw stream handle on this Paddle")
        self.stream = ctypes.c_void_p(int(handle))
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.start, self.end = self._event(), self._event()

    def _check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed with CUresult {status}")

    def _event(self):
        event = ctypes.c_void_p()
        self._check(self.cuda.cuEventCreate(ctypes.byref(event), 0), "cuEventCreate")
        return event

    def time_ms(self, fn):
        self._check(self.cuda.cuEventRecord(self.start, self.stream), "cuEventRecord")
        fn()
        self._check(self.cuda.cuEventRecord(self.end, self.stream), "cuEventRecord")
        self._check(self.cuda.cuEventSynchronize(self.end), "cuEventSynchronize")
        ms = ctypes.c_float()
        self._check(self.cuda.cuEventElapsedTime(ctypes.byref(ms), self.start, self.end),
                    "cuEventElapsedTime")
        return ms.value


def back_to_back_ms(fn, calls, events):
    """GPU ms per call of `calls` calls queued without a sync in between (events around
    them all): the host's dispatch hides under the GPU work where it is shorter, as
    between a model's layers. None without events."""
    if events is None:
        return None

    def run_all():
        for _ in range(calls):
            fn()

    paddle.device.cuda.synchronize()
    return events.time_ms(run_all) / calls


def timed(fn, repeats, events):
    """(GPU seconds, median of `repeats`, or None without events; host wall seconds of
    one more call, to a synchronize, or the median of `repeats` without events)."""
    gpu, wall = [], []
    for _ in range(repeats if events is not None else 0):
        paddle.device.cuda.synchronize()
        gpu.append(events.time_ms(fn) / 1e3)
    for _ in range(1 if events is not None else repeats):
        paddle.device.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        paddle.device.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
    return (float(np.median(gpu)) if gpu else None), float(np.median(wall))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--dim", type=int, default=128, help="query/key head dim")
    ap.add_argument("--dim-v", type=int, default=None,
                    help="value head dim (default: the GPU kernels' for --dim: 128 with 192, else --dim)")
    ap.add_argument("--masks", nargs="+", default=BENCH_MASKS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--back-to-back", type=int, default=8,
                    help="calls queued without a sync for the *_b2b_ms figures (0: none)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new cases after this")
    ap.add_argument("--out", default="gpu_results.jsonl")
    ap.add_argument("--round", type=int, default=None,
                    help="which round of a multi-round call this sweep is (recorded; benchmarks/rounds_summary.py)")
    ap.add_argument("--gpu-kernels", nargs="+", default=["sm90", "fa2"],
                    help="kernel families to time (paddle_flashmask.set_gpu_kernel names)")
    args = ap.parse_args()
    dim_v = gpu_value_head_dim(args.dim) if args.dim_v is None else args.dim_v

    place = paddle.CUDAPlace(0)
    device = paddle.device.cuda.get_device_name(0)
    start = time.time()
    pfm.build()
    try:
        events = StreamEvents()
    except (RuntimeError, OSError, AttributeError) as e:
        print(f"(no CUDA events: {e}; timing host wall clock)")
        events = None
    rng = np.random.default_rng(0)
    out = open(args.out, "a")
    print(f"# paddle_flashmask CUDA on {device}, {args.dtype}, D={args.dim}, Dv={dim_v}, B=1")
    print("| kernel | mask | S | H:Hk | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seqlen in args.lengths:
        for heads_k in args.kv_heads:
            if time.time() - start > args.budget_s:
                break
            shape_q = (1, seqlen, args.heads, args.dim)
            shape_k = (1, seqlen, heads_k, args.dim)
            shape_v = (1, seqlen, heads_k, dim_v)
            shape_out = (1, seqlen, args.heads, dim_v)
            q = device_tensor(rng.standard_normal(shape_q, dtype=np.float32), args.dtype, place)
            k = device_tensor(rng.standard_normal(shape_k, dtype=np.float32), args.dtype, place)
            v = device_tensor(rng.standard_normal(shape_v, dtype=np.float32), args.dtype, place)
            dout = device_tensor(rng.standard_normal(shape_out, dtype=np.float32), args.dtype, place)
            for t in (q, k, v):
                t.stop_gradient = False
            cases = [(name, kernel) for name in args.masks for kernel in args.gpu_kernels]
            for name, kernel in cases:
                if time.time() - start > args.budget_s:
                    print(f"(budget reached, skipping the rest at S={seqlen})")
                    break
                idx_np, causal = bench_mask(masks, name, seqlen, heads_k)
                idx = None if idx_np is None else paddle.to_tensor(idx_np, place=place)
                fwd_flops, bwd_flops = attention_flops(idx_np, causal, seqlen, seqlen, args.heads, args.dim,
                                                       head_dim_v=dim_v)
                try:
                    pfm.set_gpu_kernel(kernel)
                    t_start = time.time()  # the timed window, for the GPU's clock log (clock_summary.py)

                    def fwd():
                        return pfm.flashmask_attention(q, k, v, idx, causal=causal)

                    fwd()  # warm-up (and op load, index check)
                    gpu_fwd, wall_fwd = timed(fwd, args.repeats, events)
                    b2b_fwd = back_to_back_ms(fwd, args.back_to_back, events) if args.back_to_back else None
                    outs = [fwd()]

                    def bwd():
                        return paddle.grad(outs, [q, k, v], [dout], retain_graph=True)

                    bwd()
                    gpu_bwd, wall_bwd = timed(bwd, args.repeats, events)
                    b2b_bwd = back_to_back_ms(bwd, args.back_to_back, events) if args.back_to_back else None
                    t_fwd = wall_fwd if gpu_fwd is None else gpu_fwd
                    t_bwd = wall_bwd if gpu_bwd is None else gpu_bwd
                    t_end = time.time()
                    peak = paddle.device.cuda.max_memory_allocated() / 2**30
                    outs = None  # release the graph before the next mask
                except Exception as e:  # report and go on with the next case
                    print(f"| {kernel} | {name} | {seqlen} | {args.heads}:{heads_k} | error: {type(e).__name__}: {e} |")
                    continue
                rec = dict(impl=f"paddle_flashmask_{kernel}", mask=name, seqlen=seqlen, heads=args.heads,
                           heads_k=heads_k, dim=args.dim, dim_v=dim_v, dtype=args.dtype, device=device,
                           fwd_ms=t_fwd * 1e3, bwd_ms=t_bwd * 1e3,
                           timer="cuda_events" if events is not None else "wall",
                           fwd_wall_ms=wall_fwd * 1e3, bwd_wall_ms=wall_bwd * 1e3,
                           fwd_b2b_ms=b2b_fwd, bwd_b2b_ms=b2b_bwd,
                           fwd_tflops=fwd_flops / t_fwd / 1e12, bwd_tflops=bwd_flops / t_bwd / 1e12,
                           peak_gib=peak, mask_bytes=0 if idx_np is None else int(idx_np.nbytes),
                           t_start=t_start, t_end=t_end)
                if args.round is not None:
                    rec["round"] = args.round
                out.write(json.dumps(rec) + "\n")
                out.flush()
                print(f"| {kernel} | {name} | {seqlen} | {args.heads}:{heads_k} | {rec['fwd_ms']:.2f} | "
                      f"{rec['fwd_tflops']:.1f} | {rec['bwd_ms']:.2f} | {rec['bwd_tflops']:.1f} | {peak:.2f} |",
                      flush=True)
            q = k = v = dout = None  # free this config before the next allocates
    pfm.set_gpu_kernel("auto")


if __name__ == "__main__":
    main()
