"""Measured context-parallel runs (JSON lines of bench_cp_multi_gpu.py --bench, one file per
machine) -> a markdown table and a plot of the scaling efficiency T1 / (W x slowest rank's step).

    python3 benchmarks/report_cp_multi_gpu.py benchmarks/results/h200x2/cp_multi_gpu.jsonl \
        benchmarks/results/h100x4/cp_multi_gpu.jsonl --out benchmarks/results/cp_multi_gpu.md \
        --plot benchmarks/results/cp_multi_gpu.png

Later records of the same (device, mask, S, W, method, layout) win. A step that failed on the
device (NaN) shows as n/a.
"""

import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_cp import draw_efficiency_panels, report  # noqa: E402


def load(paths):
    recs = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    key = (r.get("device", ""), r["mask"], r["seqlen"], r["world_size"], r["method"], r.get("layout"))
                    recs[key] = r
    return list(recs.values())


def method_label(r):
    return r["method"] if r["method"] != "allgather" else f"allgather ({r.get('layout', 'auto')})"


def num(x, fmt):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def table(recs):
    lines = ["| device | mask | S | W | method | T1 ms | step ms, slowest rank | busiest / mean | "
             "T1 / (W x step) | compute ms, slowest | exchanges ms, slowest | TFLOP/s per GPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: (r.get("device", ""), r["world_size"], r["mask"], r["seqlen"],
                                         method_label(r))):
        lines.append(f"| {r.get('device', '')} | {r['mask']} | {r['seqlen'] // 1024}K | {r['world_size']} | "
                     f"{method_label(r)} | {num(r.get('t1_ms'), '.1f')} | {num(max(r['step_ms']), '.1f')} | "
                     f"{num(r['busiest_over_mean'], '.3f')} | {num(r.get('efficiency'), '.3f')} | "
                     f"{num(max(r['compute_ms']), '.1f')} | {num(max(r['exchanges_ms']), '.1f')} | "
                     f"{num(r.get('tflops_per_gpu'), '.0f')} |")
    return "\n".join(lines)


def plot(recs, path):
    series = sorted({(r.get("device", ""), r["world_size"], method_label(r)) for r in recs})

    def points(m, device, W, label):
        return [(r["seqlen"], r["efficiency"]) for r in recs
                if r["mask"] == m and r.get("device", "") == device and r["world_size"] == W
                and method_label(r) == label and r.get("efficiency") is not None and not math.isnan(r["efficiency"])]

    curves = {m: [(f"{label}, {W} x {device.replace('NVIDIA ', '').split()[0]}", points(m, device, W, label))
                  for device, W, label in series]
              for m in {r["mask"] for r in recs}}
    draw_efficiency_panels(curves, path, "T1 / (W x slowest step), measured", 0.85)


def main():
    report(load, table, plot, nargs="+")


if __name__ == "__main__":
    main()
