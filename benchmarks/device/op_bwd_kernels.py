"""Which kernels one backward of the op launches, and how long each takes: the op through
paddle.grad (OP_BWD_WHICH=grad) or the op alone (=alone: tensor_ops.attention_bwd, out and LSE
given), causal 8K, bf16, 32:8 heads, D=128. Issue 16: the op's backward took 4% (alone) and 8%
(through autograd) more GPU time than the harness's run_bwd_cuda on the same H200 (NOTES.md,
"The op against the bare kernel").

Run under Nsight Compute in the Paddle GPU runtime (gpu_suite.sh STAGES=kernels); only the
marked call is profiled (cuProfilerStart/Stop around it, through the driver API, so no runtime
version matters):

    OP_BWD_WHICH=grad ncu --profile-from-start off --cache-control none --clock-control none \\
        --metrics gpu__time_duration.sum --csv python3 benchmarks/device/op_bwd_kernels.py > grad.csv
    python3 benchmarks/device/op_bwd_kernels.py --summary grad.csv

ncu serializes the kernels (no overlap, none of the sm90 finish's programmatic launch), so the
durations are each kernel's own; the list shows what runs besides the main kernel.
"""

import csv
import ctypes
import os
import sys


def summary(path):
    """Kernel name, grid, duration (us) per profiled launch of an ncu --csv log, and their sum."""
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    total = 0.0
    print(f"# {os.path.basename(path)}")
    print("| # | kernel | grid | block | us |")
    print("|---|---|---|---|---|")
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        us = value / 1e3 if row.get("Metric Unit") in ("ns", "nsecond") else value
        total += us
        print(f"| {row['ID']} | {row['Kernel Name'][:90]} | {row['Grid Size']} | {row['Block Size']} | {us:.1f} |")
    print(f"total {total:.1f} us")


def main():
    import paddle

    from op_probe_case import op_calls

    which = os.environ.get("OP_BWD_WHICH", "grad")
    _, calls = op_calls()
    call = calls["bwd paddle.grad" if which == "grad" else "bwd op alone"]
    driver = ctypes.CDLL("libcuda.so.1")
    for _ in range(3):  # warm-up: allocator pools, the wrapper's caches
        call()
    paddle.device.cuda.synchronize()
    driver.cuProfilerStart()
    call()
    paddle.device.cuda.synchronize()
    driver.cuProfilerStop()
    print(f"done: {which}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        main()
