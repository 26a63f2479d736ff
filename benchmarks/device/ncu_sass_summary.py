"""Summarise an Nsight Compute source page (`ncu -i R --page source --csv --print-source sass`):
the instructions with the most warp-stall samples, each with the SASS just before it (a stall
is charged to the instruction waiting to issue, so its cause is usually an instruction above),
and the samples per stall reason over the whole kernel.

    python3 ncu_sass_summary.py SRC.csv [TOP] [FULL.tsv] > summary.txt
    python3 ncu_sass_summary.py --opcodes OURS.csv PEER.csv > opcodes.txt
    python3 ncu_sass_summary.py --counts SRC.csv [SRC.csv ...] > counts.txt

FULL.tsv, if given, gets every SASS line: samples, the three largest stall reasons, the text.
--opcodes sets two kernels' executed instructions and stall samples side by side, summed by
opcode (the mnemonic before its first dot): where one kernel runs more instructions than the other.
--counts groups a kernel's SASS lines by how many times each ran (warp instructions): lines that
run once a warp and CTA (prologue, epilogue), once a step, once a step with a next block, once a
partial step... fall into groups of their own, and their stall samples are the time each part
takes (NOTES.md, forty-eighth session: the sliding window's backward against FA2's).
"""

import collections
import csv
import sys


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def read_rows(path):
    """The source page's SASS rows (dicts by column name), the CSV's preamble skipped."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if "Source" in ln and "Address" in ln)
    return list(csv.DictReader(lines[start:]))


def sample_column(rows):
    return next(c for c in rows[0] if c.startswith("Warp Stall Sampling (All"))


def by_opcode(rows):
    """{opcode: [executed warp instructions, stall samples]} (a predicate guard is not the opcode)."""
    sums = collections.defaultdict(lambda: [0.0, 0.0])
    sample_col = sample_column(rows)
    for r in rows:
        words = r["Source"].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            entry = sums[words[0].split(".")[0]]
            entry[0] += num(r.get("Instructions Executed", 0))
            entry[1] += num(r[sample_col])
    return sums


def print_opcodes(path_a, path_b, top=40):
    a, b = by_opcode(read_rows(path_a)), by_opcode(read_rows(path_b))
    print(f"# executed warp instructions and stall samples by opcode: A = {path_a}, B = {path_b}")
    print(f"{'opcode':10s} {'A':>14s} {'B':>14s} {'A - B':>14s}  samples A / B")
    for op in sorted(set(a) | set(b), key=lambda o: -(a[o][0] + b[o][0]))[:top]:
        print(f"{op:10s} {a[op][0]:14,.0f} {b[op][0]:14,.0f} {a[op][0] - b[op][0]:14,.0f}  "
              f"{a[op][1]:.0f} / {b[op][1]:.0f}")
    print(f"{'total':10s} {sum(v[0] for v in a.values()):14,.0f} {sum(v[0] for v in b.values()):14,.0f}")


def print_counts(paths, top=12):
    """Per kernel, the largest groups of SASS lines by execution count: lines, samples (share and
    count), executed warp instructions."""
    for path in paths:
        rows = read_rows(path)
        sample_col = sample_column(rows)
        lines, samples, executed = collections.Counter(), collections.Counter(), collections.Counter()
        for r in rows:
            n = num(r.get("Instructions Executed", 0))
            lines[n] += 1
            samples[n] += num(r[sample_col])
            executed[n] += n
        total = max(sum(samples.values()), 1)
        print(f"# {path}: {len(rows)} SASS lines, {total:.0f} samples, {sum(executed.values()):,.0f} warp instructions")
        print(f"{'runs a line':>14s} {'lines':>6s} {'samples':>8s} {'count':>9s} {'instructions':>15s}")
        for n in sorted(samples, key=lambda k: -samples[k])[:top]:
            print(f"{n:14,.0f} {lines[n]:6d} {samples[n] / total:8.3f} {samples[n]:9.0f} {executed[n]:15,.0f}")


def main():
    if sys.argv[1] == "--opcodes":
        print_opcodes(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "--counts":
        print_counts(sys.argv[2:])
        return
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rows = read_rows(path)
    cols = list(rows[0].keys())
    sample_col = sample_column(rows)
    reason_cols = [c for c in cols if c.startswith("stall_") or "Stall Reason" in c]

    total = sum(num(r[sample_col]) for r in rows)
    print(f"# {path}: {len(rows)} SASS lines, {total:.0f} samples; columns: {cols}")
    if reason_cols:
        sums = sorted(((sum(num(r[c]) for r in rows), c) for c in reason_cols), reverse=True)
        print("## samples by reason")
        for v, c in sums[:16]:
            print(f"{v / max(total, 1):6.1%}  {c}")
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as out:
            for r in rows:
                why = sorted(((num(r[c]), c) for c in reason_cols if "Not Issued" not in c), reverse=True)[:3]
                out.write(f"{num(r[sample_col]):.0f}\t{' '.join(f'{c[6:]}={v:.0f}' for v, c in why if v)}\t"
                          f"{r['Source'].strip()}\n")
    order = sorted(range(len(rows)), key=lambda i: -num(rows[i][sample_col]))[:top]
    print(f"## top {top} instructions by samples (with the 4 before each)")
    for i in order:
        r = rows[i]
        why = ", ".join(f"{c}={num(r[c]):.0f}" for c in reason_cols if num(r[c]) >= 0.1 * num(r[sample_col]))
        print(f"{num(r[sample_col]) / max(total, 1):6.2%}  {r.get('Address', r.get('# Address', ''))}  "
              f"{r['Source'].strip()}   [{why}]")
        for j in range(max(0, i - 4), i):
            print(f"          {rows[j]['Source'].strip()}")


if __name__ == "__main__":
    main()
