"""Summarise masks_ab.sh's log: one table row per (kernel family, mask, length), each variant's
backward ms, its prep + finish ms and backward TFLOP/s over the passes (pass 1/pass 2), the forward
ms, and each later variant's backward speedup over the first (best pass against best pass).

    python3 benchmarks/device/masks_ab_summary.py masks_ab.log
"""

import sys

# A row: "variant | pass | kernel | mask | S | H:Hk | D/Dv | heads/CTA | fwd ms | fwd TFLOP/s |
# bwd ms | bwd TFLOP/s | fwd+bwd TFLOP/s | bwd prep+finish ms |" (the harness's time table).
FIELDS = ("variant", "pass", "kernel", "mask", "s", "heads", "dims", "groups", "fwd_ms", "fwd_tflops",
          "bwd_ms", "bwd_tflops", "fwdbwd_tflops", "prep_ms")


def parse(lines):
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(FIELDS) or not cells[1].isdigit():
            continue
        row = dict(zip(FIELDS, cells))
        try:
            for key in ("fwd_ms", "fwd_tflops", "bwd_ms", "bwd_tflops", "prep_ms"):
                row[key] = float(row[key])
        except ValueError:
            continue
        rows.append(row)
    return rows


def summarise(rows):
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    cases = {}
    for r in rows:
        cases.setdefault((r["kernel"], r["mask"], int(r["s"])), {}).setdefault(r["variant"], []).append(r)
    head = ["kernel", "mask", "S"]
    for v in variants:
        head += [f"{v} bwd ms", f"{v} prep+finish ms", f"{v} bwd TFLOP/s", f"{v} fwd ms"]
    head += [f"bwd {v} / {variants[0]}" for v in variants[1:]]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def joined(rs, key, fmt):
        return "/".join(fmt.format(r[key]) for r in rs)

    for (kernel, mask, s), by_variant in cases.items():
        cells = [kernel, mask, f"{s // 1024}K"]
        for v in variants:
            rs = by_variant.get(v, [])
            cells += [joined(rs, "bwd_ms", "{:.3f}"), joined(rs, "prep_ms", "{:.3f}"),
                      joined(rs, "bwd_tflops", "{:.1f}"), joined(rs, "fwd_ms", "{:.3f}")]
        base = by_variant.get(variants[0], [])
        for v in variants[1:]:
            rs = by_variant.get(v, [])
            cells.append(f"{min(r['bwd_ms'] for r in base) / min(r['bwd_ms'] for r in rs):.3f}"
                         if base and rs else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv):
    if len(argv) != 1:
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        rows = parse(f)
    if not rows:
        print("no rows")
        return 1
    print(summarise(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
