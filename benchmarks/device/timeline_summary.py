"""Where a CTA of the main backward spends its time, from the per-CTA timeline that
`flashmask_harness --timeline` prints (a build with -DFLASHMASK_EXP_TIMELINE:
EXTRA_NVCC_FLAGS="-DFLASHMASK_EXP_TIMELINE" EXTRA_SM90_NVCC_FLAGS="-DFLASHMASK_EXP_TIMELINE"
benchmarks/device/harness/build_variant.sh NAME; cuda/exp_timeline.h).

Per case: prologue (entry to the first step), the loop's cost a step, epilogue, the gaps between
CTAs on an SM, the SMs' idle tail, and the kernel's span list-scheduled from the measured CTA
durations in grid order (which reproduces the measured span) and longest first (what ordering
the CTAs by their work would give). Usage: timeline_summary.py timeline.txt[.gz]
"""
import argparse
import collections
import gzip
import heapq

import numpy as np


def read_timeline(path):
    """{case: int64 array of rows (cta, sm, global_entry_ns, entry, first_step, loop_end, exit,
    steps, head, n_block)}, clocks in SM cycles."""
    cases = collections.defaultdict(list)
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        for line in f:
            if line.startswith("tl,"):
                fields = line.strip().split(",")
                cases[fields[1]].append([int(x) for x in fields[2:]])
    return {name: np.array(rows, dtype=np.int64) for name, rows in cases.items()}


def ns_per_cycle(sm, global_entry, entry):
    """clock64 runs per SM: its rate from each SM's CTAs (globaltimer against clock64)."""
    rates = [np.polyfit(entry[sm == s], global_entry[sm == s], 1)[0] for s in np.unique(sm) if (sm == s).sum() > 3]
    return float(np.median(rates))


def list_schedule(durations_us, sms, gap_us):
    """Span of handing the CTAs, in this order, to whichever SM frees first."""
    free = [(0.0, i) for i in range(sms)]
    heapq.heapify(free)
    end = 0.0
    for d in durations_us:
        t, i = heapq.heappop(free)
        t += d + gap_us
        end = max(end, t)
        heapq.heappush(free, (t, i))
    return end


def summarize(name, a):
    cta, sm, global_entry, entry, first_step, loop_end, exit_, steps = a.T[:8]
    ns = ns_per_cycle(sm, global_entry, entry)
    us = lambda cycles: cycles * ns / 1000  # noqa: E731
    live = first_step > 0
    prologue, loop, epilogue = (us(first_step - entry)[live], us(loop_end - first_step)[live],
                                us(exit_ - loop_end)[live])
    live_steps = steps[live]
    global_exit = global_entry + (exit_ - entry) * ns
    t0, t1 = global_entry.min(), global_exit.max()
    span = (t1 - t0) / 1000
    gaps, idle_tail, busy = [], [], 0.0
    sms = np.unique(sm)
    for s in sms:
        on = np.where(sm == s)[0]
        on = on[np.argsort(entry[on])]
        gaps += [us(entry[on[i]] - exit_[on[i - 1]]) for i in range(1, len(on))]
        busy += us((exit_[on] - entry[on]).sum())
        idle_tail.append((t1 - global_exit[on[-1]]) / 1000)
    slope, intercept = np.polyfit(live_steps, loop, 1)
    durations = us(exit_ - entry)
    gap = float(np.median(gaps))
    grid_order = list_schedule(durations[np.argsort(cta)], len(sms), gap)
    longest_first = list_schedule(np.sort(durations)[::-1], len(sms), gap)
    total = prologue.sum() + loop.sum() + epilogue.sum() + sum(gaps)
    print(f"== {name}: {len(a)} CTAs ({live.sum()} with steps) on {len(sms)} SMs, {1 / ns:.2f} GHz, span {span:.0f} us, "
          f"busy {busy / len(sms) / span:.3f} of SM time")
    print(f"   steps mean {live_steps.mean():.1f}; a step {np.median(loop / np.maximum(live_steps, 1)):.2f} us (median), "
          f"prologue median {np.median(prologue):.1f} us (p90 {np.percentile(prologue, 90):.1f}), "
          f"epilogue median {np.median(epilogue):.1f} us (p90 {np.percentile(epilogue, 90):.1f})")
    print(f"   gap between CTAs on an SM: median {gap:.2f} us, mean {np.mean(gaps):.2f}; "
          f"idle at the end, mean over SMs {np.mean(idle_tail):.1f} us")
    print(f"   loop fit: {intercept:.1f} us + {slope:.2f} us a step")
    print(f"   share: prologue {prologue.sum() / total:.3f} loop {loop.sum() / total:.3f} "
          f"epilogue {epilogue.sum() / total:.3f} gaps {sum(gaps) / total:.3f}")
    print(f"   list-scheduled from these durations: grid order {grid_order:.0f} us, longest first "
          f"{longest_first:.0f} us, no tail (sum / SMs) {durations.sum() / len(sms):.0f} us; longest CTA "
          f"{durations.max():.0f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline", help="the harness output (tl, lines), plain or gzip")
    args = ap.parse_args()
    for name, rows in read_timeline(args.timeline).items():
        summarize(name, rows)


if __name__ == "__main__":
    main()
