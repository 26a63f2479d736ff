"""Context-parallel results (JSON lines of bench_cp_gpu.py --bench) -> a markdown table and a plot.

    python3 benchmarks/report_cp.py RESULTS.jsonl --out benchmarks/results/context_parallel.md \
        --plot benchmarks/results/context_parallel.png
"""

import argparse
import json


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def method_label(r):
    """The method, and for allgather the plan layout where the record has it."""
    if r["method"] != "allgather" or r.get("layout") not in ("chunks", "local"):
        return r["method"]
    return f"allgather ({r['layout']}{'' if r.get('sparse_exchange', True) else ', dense'})"


def table(recs):
    lines = ["| mask | S | W | method | chunk | plan: area busiest/mean | T1 fwd+bwd ms (TFLOP/s) | "
             "per-rank ms | measured busiest/mean | T1 / (W x busiest) | TFLOP/s per GPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: (r["mask"], r["seqlen"], r["world_size"], method_label(r))):
        t1 = "n/a" if r.get("t1_ms") is None else f"{r['t1_ms']:.1f} ({r['t1_tflops']:.0f})"
        eff = "n/a" if r.get("efficiency_compute") is None else f"{r['efficiency_compute']:.3f}"
        per_gpu = r.get("tflops_per_gpu")
        lines.append(f"| {r['mask']} | {r['seqlen'] // 1024}K | {r['world_size']} | {method_label(r)} | {r['chunk_size']} | "
                     f"{r['work_imbalance']:.3f} | {t1} | "
                     f"{' / '.join(f'{t:.1f}' for t in r['rank_ms'])} | {r['busiest_over_mean']:.3f} | "
                     f"{eff} | {'' if per_gpu is None else f'{per_gpu:.0f}'} |")
    return "\n".join(lines)


def draw_efficiency_panels(curves, path, ylabel, target):
    """One panel per mask, a line per series over the sequence length: curves maps a mask to
    [(label, [(seqlen, efficiency), ...]), ...] (ulysses dashed); `target` a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    masks = sorted(curves)
    fig, axes = plt.subplots(1, len(masks), figsize=(4 * len(masks), 3.4), sharey=True)
    axes = axes if len(masks) > 1 else [axes]
    for ax, m in zip(axes, masks):
        for label, pts in curves[m]:
            if pts:
                pts = sorted(pts)
                style = "s--" if label.startswith("ulysses") else "o-"
                ax.plot([p[0] // 1024 for p in pts], [p[1] for p in pts], style, label=label)
        ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_title(m)
        ax.set_xlabel("tokens (K)")
    axes[0].set_ylabel(ylabel)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(recs, path):
    series = sorted({(r["world_size"], method_label(r)) for r in recs})
    curves = {m: [(f"{label} W={W}",
                   [(r["seqlen"], r["efficiency_compute"]) for r in recs
                    if r["mask"] == m and r["world_size"] == W and method_label(r) == label
                    and r.get("efficiency_compute") is not None])
                  for W, label in series]
              for m in {r["mask"] for r in recs}}
    draw_efficiency_panels(curves, path, "T1 / (W x busiest rank), compute only", 0.9)


def report(load_fn, table_fn, plot_fn, nargs=None):
    """The command line of a results report: JSON lines in (one file, or nargs="+" for several),
    the markdown table printed and written to --out, the plot to --plot."""
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl", nargs=nargs)
    ap.add_argument("--out")
    ap.add_argument("--plot")
    args = ap.parse_args()
    recs = load_fn(args.jsonl)
    text = table_fn(recs)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    if args.plot:
        plot_fn(recs, args.plot)


def main():
    report(load, table, plot)


if __name__ == "__main__":
    main()
