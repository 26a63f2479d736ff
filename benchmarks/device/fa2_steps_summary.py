"""The summary of a fa2_steps.sh device call (stdlib only: it runs in the device's plain python3).

    python3 benchmarks/device/fa2_steps_summary.py OUT_DIR VARIANT [VARIANT ...]

reads OUT_DIR/<variant>.log (the harness's --check-fa2 output, then its --time-fa2 passes, between
'## ...' markers that fa2_steps.sh writes) and OUT_DIR/fa2_steps.log (nvidia-smi, --mma-peak, the
torch FA2 peer's 'peer_json: {...}' records), writes OUT_DIR/fa2_steps_summary.md and prints it.
TFLOP/s cells are 'pass 1/pass 2'; the first variant is the baseline of the ratio table.
"""

import json
import os
import re
import sys

# FA2 peers, preferred first: its native GQA (fa2_gqa_causal), then SDPA flash with K/V repeated to
# the query heads inside the timed call (the only peer before 2026-11-27, 2-11% slower at 32:8).
PEER_PREFERENCE = ("fa2_gqa_causal", "sdpa_flash_causal")

MARK = re.compile(r"^## (check-fa2|time-fa2 pass (\d+)) exit (-?\d+)")


def parse_variant(path):
    """{'desc', 'check_rc', 'failures', 'fail_lines', 'rows': {case: {pass: (fwd, bwd)}},
    'order': [case, ...], 'time_rc': {pass: rc}}"""
    v = dict(desc="", check_rc=None, failures=None, fail_lines=0, rows={}, order=[], time_rc={})
    if not os.path.exists(path):
        v["desc"] = "(no log)"
        return v
    section, pass_no = None, None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## check-fa2") and "exit" not in line:
                section = "check"
            elif m := re.match(r"^## time-fa2 pass (\d+)$", line):
                section, pass_no = "time", int(m.group(1))
            elif m := MARK.match(line):
                if m.group(1) == "check-fa2":
                    v["check_rc"] = int(m.group(3))
                else:
                    v["time_rc"][int(m.group(2))] = int(m.group(3))
                section = None
            elif line.startswith("# ") and not v["desc"]:
                v["desc"] = line[2:]
            elif section == "check" and (m := re.match(r"^(\d+) failures$", line)):
                v["failures"] = int(m.group(1))
            elif section == "check" and line.endswith(" FAIL"):
                v["fail_lines"] += 1
            elif section == "time" and line.startswith("| fa2"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                # kernel | mask | S | H:Hk | D/Dv | heads/steps | fwd ms | fwd TF | bwd ms | bwd TF | ...
                if len(cells) < 10:
                    continue
                det = "det " if cells[0].endswith("det") else ""
                seq, dim = int(cells[2]), int(cells[4].split("/")[0])
                case = f"{det}{cells[1]} {seq // 1024}K D{dim}"
                try:
                    fwd, bwd = float(cells[7]), float(cells[9])
                except ValueError:
                    continue
                if case not in v["rows"]:
                    v["rows"][case] = {}
                    v["order"].append(case)
                v["rows"][case][pass_no] = (fwd, bwd)
    return v


def check_status(v):
    rc, n = v["check_rc"], v["failures"]
    if rc is None or rc == -1:  # -1: skipped (the call's time budget)
        return "NOT RUN"
    if rc == 0 and n == 0:
        return "ok (0 failures)"
    if rc in (124, 137):
        return f"FAILED (timed out, exit {rc})"
    if n is not None:
        return f"FAILED ({n} failures, exit {rc})"
    return f"FAILED (exit {rc}, no failure count: crashed after {v['fail_lines']} FAIL lines)"


def parse_common(path):
    """nvidia-smi lines by label, the --mma-peak table and line, the peer's records and errors."""
    c = dict(smi=[], mma=[], mma_line=None, peers={}, peer_rank={}, peer_impl={}, peer_errors=[], peer_info=None,
             notes=[])
    if not os.path.exists(path):
        return c
    label, in_mma = None, False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            # '## nvidia-smi LABEL', then its csv,noheader lines (one per GPU).
            if m := re.match(r"^## nvidia-smi (.+)$", line):
                label = m.group(1)
                continue
            if label and "," in line and not line.startswith("#"):
                c["smi"].append(f"{label}: {line}")
                continue
            label = None
            # The --mma-peak table: the '|' lines after '## mma-peak' up to the next marker or stamp.
            if line.startswith("## mma-peak"):
                in_mma = True
                continue
            if line.startswith("## ") or line.startswith("["):
                in_mma = False
            if line.startswith("mma_peak:"):
                c["mma_line"] = line
            elif in_mma and line.startswith("|"):
                c["mma"].append(line)
            elif line.startswith("peer_json: "):
                try:
                    rec = json.loads(line[len("peer_json: "):])
                except json.JSONDecodeError:
                    continue
                impl = rec.get("impl")
                if impl not in PEER_PREFERENCE or rec.get("mask") != "causal":
                    continue
                if rec.get("heads_k") != 8 or rec.get("heads") != 32:
                    continue
                case = f"causal {rec['seqlen'] // 1024}K D{rec['dim']}"
                if "error" in rec:
                    c["peer_errors"].append(f"{case} {impl}: {rec['error']}")
                    continue
                rank = PEER_PREFERENCE.index(impl)
                if case in c["peers"] and c["peer_rank"][case] < rank:
                    continue
                fwd, bwd = rec["fwd_tflops"], rec["bwd_tflops"]
                # Back to back (torch's dispatch hidden, as the harness's own is negligible) where timed.
                if rec.get("fwd_b2b_ms") and rec.get("bwd_b2b_ms"):
                    fwd, bwd = fwd * rec["fwd_ms"] / rec["fwd_b2b_ms"], bwd * rec["bwd_ms"] / rec["bwd_b2b_ms"]
                c["peers"][case], c["peer_rank"][case] = (fwd, bwd), rank
                c["peer_impl"][case] = impl
            elif line.startswith("# peers on") and c["peer_info"] is None:
                c["peer_info"] = line[2:].split(", D=")[0]
            elif line.startswith("NOTE") or line.startswith("SKIPPED") or line.startswith("TIMEOUT"):
                c["notes"].append(line)
    return c


def fmt_pair(passes, i):
    vals = [passes.get(p) for p in (1, 2)]
    return "/".join("-" if x is None else f"{x[i]:.0f}" for x in vals)


def mean(passes, i):
    vals = [x[i] for x in passes.values() if x is not None]
    return sum(vals) / len(vals) if vals else None


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    out_dir, names = argv[0], argv[1:]
    variants = {n: parse_variant(os.path.join(out_dir, f"{n}.log")) for n in names}
    common = parse_common(os.path.join(out_dir, "fa2_steps.log"))
    order = []
    for n in names:
        order += [c for c in variants[n]["order"] if c not in order]
    # Marks in the table's header: a failed check, or none.
    marks = {n: {"ok": "", "NOT": " (unchecked)"}.get(check_status(variants[n]).split()[0], " (FAILED)")
             for n in names}

    md = ["# FA2-class steps (fa2_steps.sh)", ""]
    md.append("## Variants and --check-fa2")
    for n in names:
        v = variants[n]
        rcs = ", ".join(f"pass {p} exit {rc}" for p, rc in sorted(v["time_rc"].items())) or "not timed"
        md.append(f"- **{n}**: check {check_status(v)}; --time-fa2 {rcs}; {v['desc']}")
    md += ["", "## mma.sync peak (--mma-peak)"]
    md.append(common["mma_line"] or "mma_peak: (missing)")
    if common["mma"]:
        md += [""] + common["mma"]
    md += ["", "## nvidia-smi (name, clocks.sm, clocks.max.sm, temperature.gpu, power.draw)"]
    md += [f"- {s}" for s in common["smi"]] or ["- (missing)"]
    impls = sorted(set(common["peer_impl"].values()))
    md += ["", "## TFLOP/s (bf16, 32:8 heads; pass 1/pass 2; FA2 = torch's FlashAttention-2 on causal only, "
           f"{', '.join(impls) or 'none'}; back to back where timed)"]
    if common["peer_info"]:
        md.append(f"FA2 peer: {common['peer_info']}")
    md.append("")
    head = ["case"]
    for n in names:
        head.append(f"{n}{marks[n]} fwd")
    head.append("FA2 fwd")
    for n in names:
        head.append(f"{n} bwd")
    head.append("FA2 bwd")
    md.append("| " + " | ".join(head) + " |")
    md.append("|" + "---|" * len(head))
    for case in order:
        row = [case]
        for i in (0, 1):
            for n in names:
                row.append(fmt_pair(variants[n]["rows"].get(case, {}), i))
            peer = common["peers"].get(case)
            row.append("-" if peer is None else f"{peer[i]:.0f}")
        md.append("| " + " | ".join(row) + " |")
    if len(names) > 1:
        base = names[0]
        md += ["", f"## Ratio to {base} (mean of the passes), and to FA2 where it has the case", ""]
        head = ["case"] + [f"{n}/{base} fwd, bwd" for n in names[1:]] + [f"{n}/FA2 fwd, bwd" for n in names]
        md.append("| " + " | ".join(head) + " |")
        md.append("|" + "---|" * len(head))
        for case in order:
            b = variants[base]["rows"].get(case, {})
            peer = common["peers"].get(case)
            row = [case]
            for n in names[1:]:
                r = variants[n]["rows"].get(case, {})
                cells = []
                for i in (0, 1):
                    x, y = mean(r, i), mean(b, i)
                    cells.append("-" if x is None or not y else f"{x / y:.2f}")
                row.append(", ".join(cells))
            for n in names:
                r = variants[n]["rows"].get(case, {})
                cells = []
                for i in (0, 1):
                    x = mean(r, i)
                    cells.append("-" if x is None or peer is None else f"{x / peer[i]:.2f}")
                row.append(", ".join(cells))
            md.append("| " + " | ".join(row) + " |")
    if common["peer_errors"] or common["notes"]:
        md += ["", "## Notes"] + [f"- FA2 peer {e}" for e in common["peer_errors"]]
        md += [f"- {n}" for n in common["notes"]]
    text = "\n".join(md) + "\n"
    with open(os.path.join(out_dir, "fa2_steps_summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
