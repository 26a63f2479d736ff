"""Medians and spreads of benchmark cells over the rounds of one device call.

A cell's per-call reading moves 5-10% between calls of one H200 (power cap, the clock state left by
what ran before: NOTES.md, twenty-fourth to thirty-fourth sessions), more than the margins issue 16's
per-call targets are read by. `gpu_suite.sh` with BENCH_ROUNDS=N runs our sweep and the peers' N
times, alternately, each record tagged with its round (`bench_gpu.py` / `bench_gpu_peers.py
--round`). This script gives each cell's median over the rounds with its range, per call and back
to back, and ours against each peer in the same round (fwd+bwd time, peer over ours).

    python3 benchmarks/rounds_summary.py RESULTS_DIR_OR_JSONL [...] [--out rounds.md]
"""

import argparse
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import back_to_back_tflops, dims_label, head_dims_of  # noqa: E402

OURS_PREFIX = "paddle_flashmask"


def input_files(paths):
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(glob.glob(os.path.join(path, "**", "*.jsonl"), recursive=True))
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise SystemExit(f"rounds_summary.py: {path}: no such file or directory")
    if not files:
        raise SystemExit("rounds_summary.py: no *.jsonl in " + ", ".join(paths))
    return files


def cell_key(r):
    return (r["impl"], r["mask"], int(r["seqlen"]), int(r["heads"]), int(r["heads_k"])) + head_dims_of(r)


def load(paths):
    """{cell key: {round: record}} of the records that carry a round; records without one, or
    failed ones, are left out (a round measured twice: the later record)."""
    cells = {}
    for path in input_files(paths):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                if "error" in r or r.get("round") is None:
                    continue
                cells.setdefault(cell_key(r), {})[int(r["round"])] = r
    return cells


def rate(r, part, back_to_back=False):
    """TFLOP/s of `part` ("fwd" / "bwd"), per call or from the back-to-back time (None without)."""
    return back_to_back_tflops(r, part) if back_to_back else r[f"{part}_tflops"]


def fwd_bwd_ms(r, back_to_back=False):
    if not back_to_back:
        return r["fwd_ms"] + r["bwd_ms"]
    if r.get("fwd_b2b_ms") is None or r.get("bwd_b2b_ms") is None:
        return None
    return r["fwd_b2b_ms"] + r["bwd_b2b_ms"]


def spread(values, digits=0):
    """'median [lowest-highest]' of the values that are there, '-' if none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    fmt = f"{{:.{digits}f}}"
    med = fmt.format(statistics.median(values))
    if len(values) == 1:
        return med
    return f"{med} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def sort_key(key):
    impl, mask, seqlen, heads, heads_k, dim, dim_v = key
    return seqlen, -heads_k, dim, dim_v, mask, not impl.startswith(OURS_PREFIX), impl


def render(cells):
    lines = ["# Cells over the rounds of one call", "",
             "TFLOP/s on the unmasked area: median over the rounds [lowest-highest]; per call (CUDA events "
             "around each call, the median of a round's repeats) and back to back.", "",
             "| impl | mask | S | H:Hk | head dim | rounds | fwd per call | fwd back to back | bwd per call | "
             "bwd back to back |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(cells, key=sort_key):
        impl, mask, seqlen, heads, heads_k, dim, dim_v = key
        recs = list(cells[key].values())
        cols = [spread([rate(r, part, b2b) for r in recs]) for part in ("fwd", "bwd") for b2b in (False, True)]
        lines.append(f"| {impl} | {mask} | {seqlen} | {heads}:{heads_k} | {dims_label((dim, dim_v))} | {len(recs)} | "
                     + " | ".join(cols) + " |")
    lines += ["", "Ours against each peer in the same round: peer fwd+bwd time / ours (> 1: ours faster), "
              "median over the rounds both measured [lowest-highest].", "",
              "| ours | peer | mask | S | H:Hk | head dim | rounds | per call | back to back |",
              "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(cells, key=sort_key):
        if not key[0].startswith(OURS_PREFIX):
            continue
        for peer_key in sorted(k for k in cells if not k[0].startswith(OURS_PREFIX) and k[1:] == key[1:]):
            rounds = sorted(set(cells[key]) & set(cells[peer_key]))
            if not rounds:
                continue
            ratios = []
            for b2b in (False, True):
                vals = []
                for rnd in rounds:
                    ours_ms, peer_ms = fwd_bwd_ms(cells[key][rnd], b2b), fwd_bwd_ms(cells[peer_key][rnd], b2b)
                    vals.append(None if ours_ms is None or peer_ms is None else peer_ms / ours_ms)
                ratios.append(spread(vals, digits=2))
            impl, mask, seqlen, heads, heads_k, dim, dim_v = key
            lines.append(f"| {impl} | {peer_key[0]} | {mask} | {seqlen} | {heads}:{heads_k} | "
                         f"{dims_label((dim, dim_v))} | {len(rounds)} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="result directories (searched for *.jsonl) or JSON-lines files")
    ap.add_argument("--out", default=None, help="write the markdown here (default: standard output)")
    args = ap.parse_args(argv)
    cells = load(args.inputs)
    if not cells:
        raise SystemExit("rounds_summary.py: no record with a round in " + ", ".join(args.inputs))
    text = render(cells)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
