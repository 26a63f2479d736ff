"""Reads py-spy's raw (collapsed) output of op_host_profile.py and prints where a call's host time
goes: each function's inclusive and self share of the samples inside profiled_loop, and, given
the loop's microseconds a call without the profiler (--us-per-call), those shares in microseconds.

    python3 benchmarks/device/host_profile_summary.py prof.txt [--us-per-call 74] [--min-share 0.01]

Python frames are named without their line numbers (one row per function); native frames that
py-spy could not name are grouped by their library ("[libcuda.so.1]").
"""

import argparse
import re
from collections import Counter

LOOP_FRAME = "profiled_loop"
_LINE = re.compile(r"^(?P<name>.*) \((?P<where>[^()]*)\)$")


def frame_name(frame):
    """'check_qkv (paddle_flashmask/_checks.py:120)' -> 'check_qkv (paddle_flashmask/_checks.py)';
    '0x7f12 (libcuda.so.1)' -> '[libcuda.so.1]'."""
    m = _LINE.match(frame.strip())
    if not m:
        return frame.strip()
    name, where = m.group("name"), m.group("where")
    if name.startswith("0x"):
        return f"[{where}]"
    return f"{name} ({where.rsplit(':', 1)[0] if ':' in where else where})"


def read_stacks(path):
    """(stack frames outermost first, samples) for every line of the raw file."""
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            yield stack.split(";"), int(count)


def summarize(path, us_per_call=None, min_share=0.01):
    inclusive, self_time, total = Counter(), Counter(), 0
    for frames, count in read_stacks(path):
        names = [frame_name(f) for f in frames]
        loop = next((i for i, n in enumerate(names) if n.startswith(LOOP_FRAME + " ")), None)
        if loop is None:
            continue
        below = names[loop + 1:]
        total += count
        for name in set(below):
            inclusive[name] += count
        if below:
            self_time[below[-1]] += count
    if total == 0:
        raise SystemExit(f"{path}: no samples inside {LOOP_FRAME}()")
    unit = "us a call" if us_per_call else "share"
    print(f"{total} samples inside {LOOP_FRAME}()" + (f", {us_per_call} us a call" if us_per_call else ""))
    print(f"| function | inclusive {unit} | self {unit} |")
    print("|---|---|---|")

    def fmt(n):
        share = n / total
        return f"{share * us_per_call:.1f}" if us_per_call else f"{share:.3f}"

    for name, n in inclusive.most_common():
        if n / total < min_share:
            break
        print(f"| {name.replace('|', '/')} | {fmt(n)} | {fmt(self_time[name])} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", help="py-spy record -f raw output")
    ap.add_argument("--us-per-call", type=float, default=None,
                    help="host microseconds a call measured without the profiler")
    ap.add_argument("--min-share", type=float, default=0.01, help="leave out functions below this inclusive share")
    args = ap.parse_args()
    summarize(args.raw, args.us_per_call, args.min_share)


if __name__ == "__main__":
    main()
