"""The GPU's state while each benchmark record was timed: the SM clock, power and temperature that
`nvidia-smi -lms` logged (gpu_suite.sh's bench and peers stages, $OUT/gpu_clocks.csv) over each
record's [t_start, t_end] window (bench_gpu.py / bench_gpu_peers.py write them). Run it on the
device machine (nvidia-smi's timestamps are its local time):

    python3 benchmarks/device/clock_summary.py gpu_clocks.csv gpu_results.jsonl [peer_results.jsonl ...]

One markdown row per record: mean and lowest SM clock, mean power, highest temperature, and the
clock event (throttle) reasons seen, OR-ed (nvidia-smi's bit mask; 0x1 = idle, 0x4 = power cap,
0x20/0x40 = thermal slowdown).
"""

import csv
import datetime
import json
import sys


def load_clock_log(path):
    """[(epoch seconds, sm MHz, watts, deg C, reasons)] from nvidia-smi's csv (noheader, nounits)."""
    samples = []
    with open(path) as f:
        for row in csv.reader(f):
            if len(row) < 4:
                continue
            try:
                when = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                mhz, watts, temp = float(row[1]), float(row[2]), float(row[3])
            except ValueError:  # a header or a line cut off when the logger was stopped
                continue
            reasons = int(row[4].strip(), 16) if len(row) > 4 and row[4].strip().startswith("0x") else 0
            samples.append((when, mhz, watts, temp, reasons))
    return samples


def window(samples, t0, t1):
    return [s for s in samples if t0 <= s[0] <= t1]


def summarize(samples, records):
    rows = []
    for r in records:
        if "t_start" not in r or "error" in r:
            continue
        w = window(samples, r["t_start"], r["t_end"])
        if not w:
            rows.append((r, None))
            continue
        mhz = [s[1] for s in w]
        reasons = 0
        for s in w:
            reasons |= s[4]
        rows.append((r, dict(n=len(w), mean_mhz=sum(mhz) / len(mhz), min_mhz=min(mhz),
                             watts=sum(s[2] for s in w) / len(w), max_temp=max(s[3] for s in w),
                             reasons=reasons)))
    return rows


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    samples = load_clock_log(argv[0])
    records = [json.loads(line) for path in argv[1:] for line in open(path) if line.strip()]
    print("| impl | mask | S | fwd ms | bwd ms | samples | SM MHz mean (min) | W mean | max C | reasons |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r, s in summarize(samples, records):
        head = f"| {r['impl']} | {r['mask']} | {r['seqlen']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} |"
        if s is None:
            print(head + " 0 | - | - | - | - |")
        else:
            print(head + f" {s['n']} | {s['mean_mhz']:.0f} ({s['min_mhz']:.0f}) | {s['watts']:.0f} | "
                  f"{s['max_temp']:.0f} | {s['reasons']:#x} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
