"""The summary of a fa2_masks.sh device call (stdlib only: it runs in the device's plain python3).

    python3 benchmarks/device/fa2_masks_summary.py OUT_DIR

reads OUT_DIR/fa2_masks.log (our harness rows per pass, the FA2 peer's checks) and
OUT_DIR/fa2_peer.jsonl (FA2's timings), writes OUT_DIR/fa2_masks_summary.md and prints it.
TFLOP/s on the unmasked area (fwd 4·area·H·D, bwd 2.5x). Our rows come from the Paddle-free
harness (CUDA events around each call, its host work a few microseconds), so FA2's column to set
beside them is its back-to-back figure (8 calls queued, torch's dispatch hidden); its per-call
figure, events around each call, is given too. "x causal" is each side against its own plain
causal at the same length, issue 15's 0.75 target read for both.
"""

import json
import os
import re
import sys


def parse_ours(path):
    """{(family, mask, S): {pass: (fwd TF, bwd TF)}}, and the log's FAILED / check lines."""
    rows, notes, pass_no = {}, [], None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if m := re.match(r"^## ours pass (\d+)", line):
                pass_no = int(m.group(1))
            elif line.startswith("## nvidia-smi"):
                notes.append(line[3:] + ": " + next(f, "").strip())
                pass_no = None
            elif line.startswith("## "):
                pass_no = None
            elif pass_no is not None and re.match(r"^\| (fa2|sm90) ", line):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                # kernel | mask | S | H:Hk | D/Dv | heads/steps | fwd ms | fwd TF | bwd ms | bwd TF | ...
                try:
                    key = (cells[0], cells[1], int(cells[2]))
                    rows.setdefault(key, {})[pass_no] = (float(cells[7]), float(cells[9]))
                except (IndexError, ValueError):
                    notes.append(f"unparsed: {line}")
            elif line.startswith("FAILED") or line.startswith("# check") or line.startswith("# FA2"):
                notes.append(line)
    return rows, notes


def parse_peer(path):
    peer = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                peer[(rec["impl"], rec["mask"], rec["seqlen"])] = rec
    return peer


def mean(passes, i):
    vals = [v[i] for v in passes.values()]
    return sum(vals) / len(vals) if vals else None


def fmt(x, digits=0):
    return "-" if x is None else f"{x:.{digits}f}"


def main(argv):
    if len(argv) != 1:
        print(__doc__)
        return 2
    out_dir = argv[0]
    ours, notes = parse_ours(os.path.join(out_dir, "fa2_masks.log"))
    peer = parse_peer(os.path.join(out_dir, "fa2_peer.jsonl"))
    cases = sorted({(m, s) for (_, m, s) in ours} | {(m, s) for (_, m, s) in peer},
                   key=lambda c: (c[1], c[0] != "causal", c[0]))

    def ours_tf(family, mask, s, i):
        return mean(ours.get((family, mask, s), {}), i)

    def fa2_tf(mask, s, i, b2b=True):
        rec = peer.get(("fa2_native_gqa", mask, s))
        if rec is None:
            return None
        return rec[("fwd_b2b_tflops", "bwd_b2b_tflops")[i]] if b2b else rec[("fwd_tflops", "bwd_tflops")[i]]

    def passes(family, mask, s, i):
        p = ours.get((family, mask, s), {})
        return "/".join(f"{p[k][i]:.0f}" for k in sorted(p)) or "-"

    md = ["# FlashAttention-2 on its native masks beside ours (fa2_masks.sh)", ""]
    md += [f"- {n}" for n in notes] + [""]
    md += ["TFLOP/s on the unmasked area, bf16, 32:8 heads, D = 128. Ours: harness, passes as p1/p2. FA2: torch's",
           "FlashAttention-2 (aten._flash_attention_forward, native GQA; documents varlen, the window by",
           "window_size_left), back to back (per call in parentheses). x FA2: ours (mean of passes) / FA2 back",
           "to back. x causal: against the same side's plain causal at the same length.", ""]
    head = ["mask", "S", "ours fa2-class fwd", "FA2 fwd", "x FA2", "ours bwd", "FA2 bwd", "x FA2",
            "ours x causal fwd, bwd", "FA2 x causal fwd, bwd", "sm90 fwd / bwd", "sm90 x FA2 fwd, bwd"]
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mask, s in cases:
        row = [mask, f"{s // 1024}K"]
        for i in (0, 1):
            o, f = ours_tf("fa2", mask, s, i), fa2_tf(mask, s, i)
            per_call = fa2_tf(mask, s, i, b2b=False)
            row += [passes("fa2", mask, s, i), f"{fmt(f)} ({fmt(per_call)})",
                    "-" if o is None or not f else f"{o / f:.2f}"]
        for side in (lambda m, i: ours_tf("fa2", m, s, i), lambda m, i: fa2_tf(m, s, i)):
            cells = []
            for i in (0, 1):
                x, c = side(mask, i), side("causal", i)
                cells.append("-" if x is None or not c else f"{x / c:.2f}")
            row.append(", ".join(cells))
        row.append(f"{passes('sm90', mask, s, 0)} / {passes('sm90', mask, s, 1)}")
        cells = []
        for i in (0, 1):
            o, f = ours_tf("sm90", mask, s, i), fa2_tf(mask, s, i)
            cells.append("-" if o is None or not f else f"{o / f:.2f}")
        row.append(", ".join(cells))
        md.append("| " + " | ".join(row) + " |")
    repeat = [(s, r) for (impl, m, s), r in peer.items() if impl == "fa2_sdpa_repeat_kv"]
    if repeat:
        md += ["", "Plain causal, FA2 native GQA against SDPA flash with K/V repeated to 32 heads inside the timed",
               "call (bench_gpu_peers.py's FA2 peer until now), per call, fwd / bwd TFLOP/s:", ""]
        for s, r in sorted(repeat):
            n = peer.get(("fa2_native_gqa", "causal", s))
            md.append(f"- {s // 1024}K: native {fmt(n and n['fwd_tflops'])} / {fmt(n and n['bwd_tflops'])}, "
                      f"repeated K/V {r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f}")
    text = "\n".join(md) + "\n"
    with open(os.path.join(out_dir, "fa2_masks_summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
