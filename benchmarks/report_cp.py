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


def plot(recs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    masks = sorted({r["mask"] for r in recs})
    fig, axes = plt.subplots(1, len(masks), figsize=(4 * len(masks), 3.4), sharey=True)
    axes = axes if len(masks) > 1 else [axes]
    for ax, m in zip(axes, masks):
        for W, label in sorted({(r["world_size"], method_label(r)) for r in recs}):
            pts = sorted((r["seqlen"], r["efficiency_compute"]) for r in recs
                         if r["mask"] == m and r["world_size"] == W and method_label(r) == label
                         and r.get("efficiency_compute") is not None)
            if pts:
                style = "s--" if label == "ulysses" else "o-"
                ax.plot([p[0] // 1024 for p in pts], [p[1] for p in pts], style, label=f"{label} W={W}")
        ax.axhline(0.9, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_title(m)
        ax.set_xlabel("tokens (K)")
    axes[0].set_ylabel("T1 / (W x busiest rank), compute only")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--out")
    ap.add_argument("--plot")
    args = ap.parse_args()
    recs = load(args.jsonl)
    text = table(recs)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    if args.plot:
        plot(recs, args.plot)


if __name__ == "__main__":
    main()
