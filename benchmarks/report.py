"""Turns the JSON lines of bench_gpu.py and bench_gpu_peers.py into
benchmarks/RESULTS.md (tables) and a PNG plot of TFLOP/s per mask.

    python benchmarks/report.py --ours results/h200_v2/gpu_results.jsonl \
        --peers results/h200_v1/peer_results.jsonl results/h200_v2/peer_results_flex32k.jsonl \
        --title "NVIDIA H200, 2026-11-21" --out RESULTS.md --plot results/tflops_h200.png

Later files win for the same (impl, mask, length, heads); error records only
fill gaps.
"""

import argparse
import json
import os

IMPL_NAMES = {"paddle_flashmask": "ours", "flex_attention": "Flex", "sdpa_dense_mask": "SDPA+mask",
              "sdpa_flash_causal": "SDPA flash"}


def load(paths):
    records = {}
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            key = (r["impl"], r["mask"], r["seqlen"], r["heads"], r["heads_k"])
            if "error" in r and key in records and "error" not in records[key]:
                continue
            records[key] = r
    return records


def fwd_bwd_tflops(r):
    """Combined forward+backward rate (bwd FLOPs = 2.5 x fwd)."""
    flops = r["fwd_tflops"] * r["fwd_ms"] * 3.5  # TFLOP/s * ms = GFLOP
    return flops / (r["fwd_ms"] + r["bwd_ms"])


def cell(r, field):
    if r is None:
        return "-"
    if "error" in r:
        return "n/a"
    return f"{r[field]:.0f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", nargs="+", required=True)
    ap.add_argument("--peers", nargs="+", default=[])
    ap.add_argument("--title", required=True)
    ap.add_argument("--out", default="RESULTS.md")
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    recs = load(args.ours + args.peers)
    masks = []
    for (impl, mask, *_rest) in recs:
        if mask not in masks:
            masks.append(mask)
    configs = sorted({(k[2], k[3], k[4]) for k in recs if k[0] == "paddle_flashmask"},
                     key=lambda c: (c[0], -c[2]))
    lines = [f"# GPU benchmark: {args.title}", "",
             "bf16, head dim 128, batch 1. TFLOP/s count only the unmasked area "
             "(fwd = 4·area·H·D, bwd = 2.5 × fwd); fwd+bwd is the combined rate. "
             "Ours = paddle_flashmask's FA2-class CUDA kernels (mma.sync) in the Paddle 2.6.2 GPU runtime; "
             "peers measured in the same session by a PyTorch 2.11 process: Flex = torch.compile'd "
             "FlexAttention with a block mask built from the same indices (mask build ms apart), "
             "SDPA+mask = scaled_dot_product_attention with a dense bool mask, SDPA flash = its flash "
             "backend on plain causal. Raw data: benchmarks/results/.", ""]
    for seqlen, heads, heads_k in configs:
        lines += [f"## S = {seqlen}, {heads}:{heads_k} heads", "",
                  "| mask | ours fwd | ours bwd | ours fwd+bwd | Flex fwd | Flex bwd | Flex fwd+bwd "
                  "| ours/Flex fwd+bwd | SDPA+mask fwd+bwd | SDPA flash fwd+bwd | ours peak GiB | Flex mask build ms |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for mask in masks:
            ours = recs.get(("paddle_flashmask", mask, seqlen, heads, heads_k))
            if ours is None:
                continue
            flex = recs.get(("flex_attention", mask, seqlen, heads, heads_k))
            dense = recs.get(("sdpa_dense_mask", mask, seqlen, heads, heads_k))
            flash = recs.get(("sdpa_flash_causal", mask, seqlen, heads, heads_k))
            ours_fb = fwd_bwd_tflops(ours)
            flex_ok = flex is not None and "error" not in flex
            flex_fb = fwd_bwd_tflops(flex) if flex_ok else None
            ratio = f"{ours_fb / flex_fb:.2f}" if flex_fb else "-"
            fmt = lambda r: "-" if r is None else ("n/a" if "error" in r else f"{fwd_bwd_tflops(r):.0f}")
            build = f"{flex['mask_build_ms']:.1f}" if flex_ok and flex.get("mask_build_ms") else "-"
            lines.append(
                f"| {mask} | {ours['fwd_tflops']:.0f} | {ours['bwd_tflops']:.0f} | {ours_fb:.0f} | "
                f"{cell(flex, 'fwd_tflops')} | {cell(flex, 'bwd_tflops')} | {fmt(flex)} | {ratio} | "
                f"{fmt(dense)} | {fmt(flash)} | {ours['peak_gib']:.2f} | {build} |")
        lines.append("")
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plot_cfgs = [c for c in configs if c[2] != c[1] and c[0] in (8192, 32768)] or configs[:2]
        fig, axes = plt.subplots(len(plot_cfgs), 1, figsize=(12, 4 * len(plot_cfgs)), squeeze=False)
        for ax, (seqlen, heads, heads_k) in zip(axes[:, 0], plot_cfgs):
            names = [m for m in masks if ("paddle_flashmask", m, seqlen, heads, heads_k) in recs]
            width = 0.27
            for i, impl in enumerate(["paddle_flashmask", "flex_attention", "sdpa_dense_mask"]):
                vals = []
                for m in names:
                    r = recs.get((impl, m, seqlen, heads, heads_k))
                    vals.append(fwd_bwd_tflops(r) if r is not None and "error" not in r else 0)
                ax.bar([x + (i - 1) * width for x in range(len(names))], vals, width, label=IMPL_NAMES[impl])
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=30, ha="right")
            ax.set_ylabel("fwd+bwd TFLOP/s (unmasked area)")
            ax.set_title(f"{args.title}: S={seqlen}, {heads}:{heads_k} heads, bf16, D=128")
            ax.legend()
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
