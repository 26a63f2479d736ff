"""The GPU kernels of one FlashAttention-2 backward call (torch's, native GQA, bf16, 32:8, D=128 or
env FLASHMASK_HARNESS_DIM) on bench_fa2_masks.py's instances, with their mean times from the torch
profiler: where FA2's backward spends its time around the main kernel (its dot(dO, O) pass, dQ
conversion, the GQA group sum of dK/dV), to set against the harness's "prep+finish ms" (torch only,
no Paddle; the device's plain python3):

    python3 benchmarks/device/fa2_bwd_kernels.py sliding_window:8192 sliding_window:32768 [--calls 5]
"""

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_fa2_masks import DIM, HEADS, KV_HEADS, fa2_call, instance, random_inputs  # noqa: E402


def backward_kernels(name, s, calls):
    """[(kernel name, launches per call, mean us)] of FA2's backward on one instance, by total time."""
    lens, window, _ = instance(name, s)
    dim = int(os.environ.get("FLASHMASK_HARNESS_DIM") or DIM)
    q, k, v, dout = random_inputs(s, "cuda", dim=dim)
    out = fa2_call(q, k, v, lens, window)
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total <= 0 or e.count == 0:
            continue
        rows.append((e.key[:90], e.count / calls, total / e.count, total / calls))
    return sorted(rows, key=lambda r: -r[3])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="NAME:S (causal, causal_document, short_documents, sliding_window)")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {HEADS}:{KV_HEADS} heads, bf16")
    for spec in args.cases:
        name, s = spec.split(":")
        rows = backward_kernels(name, int(s), args.calls)
        total = sum(r[3] for r in rows)
        print(f"\n## {name} {s}: FA2 backward, {total / 1000:.3f} ms of kernels a call\n")
        print("| kernel | launches a call | mean us | us a call | share |\n|---|---|---|---|---|")
        for key, per_call, mean, per_call_us in rows:
            print(f"| `{key}` | {per_call:g} | {mean:.1f} | {per_call_us:.1f} | {per_call_us / total:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
