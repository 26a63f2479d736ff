"""Summarise an Nsight Compute source page (`ncu -i R --page source --csv --print-source sass`):
the instructions with the most warp-stall samples, each with the SASS just before it (a stall
is charged to the instruction waiting to issue, so its cause is usually an instruction above),
and the samples per stall reason over the whole kernel.

    python3 ncu_sass_summary.py SRC.csv [TOP] [FULL.tsv] > summary.txt

FULL.tsv, if given, gets every SASS line: samples, the three largest stall reasons, the text.
"""

import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if "Source" in ln and "Address" in ln)
    rows = list(csv.DictReader(lines[start:]))
    cols = list(rows[0].keys())
    sample_col = next(c for c in cols if c.startswith("Warp Stall Sampling (All"))
    reason_cols = [c for c in cols if c.startswith("stall_") or "Stall Reason" in c]

    def num(v):
        try:
            return float(str(v).replace(",", ""))
        except ValueError:
            return 0.0

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
