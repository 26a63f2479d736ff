"""Where a CTA of the main backward or the FA2-class forward spends its time, from the per-CTA
timeline that `flashmask_harness --timeline` prints (a build with -DFLASHMASK_EXP_TIMELINE:
EXTRA_NVCC_FLAGS="-DFLASHMASK_EXP_TIMELINE" EXTRA_SM90_NVCC_FLAGS="-DFLASHMASK_EXP_TIMELINE"
benchmarks/device/harness/build_variant.sh NAME; cuda/exp_timeline.h).

Per case: prologue (entry to the first step), the loop's cost a step, epilogue, the gaps between
CTAs on an SM (between a CTA's exit and the next entry on the slot it freed, where an SM runs
several at once: the FA2-class forward, two), the SMs' idle tail, and the kernel's span
list-scheduled from the measured CTA durations in grid order (which reproduces the measured span)
and longest first (what ordering the CTAs by their work would give). Usage: timeline_summary.py
timeline.txt[.gz|.xz]
"""
import argparse
import collections
import gzip
import heapq
import lzma

import numpy as np


def read_timeline(path):
    """{case: int64 array of rows (cta, sm, global_entry_ns, entry, first_step, loop_end, exit,
    steps, head, n_block)}, clocks in SM cycles."""
    cases = collections.defaultdict(list)
    # The results keep large timelines xz-compressed (a device call carries the tracked tree).
    opener = gzip.open if path.endswith(".gz") else lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
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


def resident_ctas(sm, entry, exit_):
    """The most CTAs an SM ran at once (the FA2-class forward: 2; the backwards: 1)."""
    most = 1
    for s in np.unique(sm):
        on = sm == s
        events = sorted([(t, 1) for t in entry[on]] + [(t, -1) for t in exit_[on]], key=lambda e: (e[0], e[1]))
        now = 0
        for _, step in events:
            now += step
            most = max(most, now)
    return most


def slot_gaps(entries, exits, slots):
    """On one SM with `slots` CTAs resident at once: for each CTA past the first `slots`, the time
    from the earliest exit that freed a slot to its entry (CTAs by entry)."""
    order = np.argsort(entries)
    free = sorted(exits[order[:slots]])
    gaps = []
    for i in order[slots:]:
        t = heapq.heappop(free)
        gaps.append(entries[i] - t)
        heapq.heappush(free, exits[i])
    return gaps


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
    per_sm = resident_ctas(sm, entry, exit_)
    for s in sms:
        on = np.where(sm == s)[0]
        gaps += [us(g) for g in slot_gaps(entry[on], exit_[on], per_sm)]
        busy += us((exit_[on] - entry[on]).sum())
        idle_tail.append((t1 - global_exit[on].max()) / 1000)
    slope, intercept = np.polyfit(live_steps, loop, 1)
    durations = us(exit_ - entry)
    gap = float(np.median(gaps))
    slots = len(sms) * per_sm
    grid_order = list_schedule(durations[np.argsort(cta)], slots, gap)
    longest_first = list_schedule(np.sort(durations)[::-1], slots, gap)
    total = prologue.sum() + loop.sum() + epilogue.sum() + sum(gaps)
    print(f"== {name}: {len(a)} CTAs ({live.sum()} with steps) on {len(sms)} SMs, {per_sm} at once, {1 / ns:.2f} GHz, "
          f"span {span:.0f} us, busy {busy / slots / span:.3f} of slot time")
    print(f"   steps mean {live_steps.mean():.1f}; a step {np.median(loop / np.maximum(live_steps, 1)):.2f} us (median), "
          f"prologue median {np.median(prologue):.1f} us (p90 {np.percentile(prologue, 90):.1f}), "
          f"epilogue median {np.median(epilogue):.1f} us (p90 {np.percentile(epilogue, 90):.1f})")
    print(f"   gap between CTAs on an SM: median {gap:.2f} us, mean {np.mean(gaps):.2f}; "
          f"idle at the end, mean over SMs {np.mean(idle_tail):.1f} us")
    print(f"   loop fit: {intercept:.1f} us + {slope:.2f} us a step")
    print(f"   share: prologue {prologue.sum() / total:.3f} loop {loop.sum() / total:.3f} "
          f"epilogue {epilogue.sum() / total:.3f} gaps {sum(gaps) / total:.3f}")
    print(f"   list-scheduled from these durations: grid order {grid_order:.0f} us, longest first "
          f"{longest_first:.0f} us, no tail (sum / slots) {durations.sum() / slots:.0f} us; longest CTA "
          f"{durations.max():.0f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline", help="the harness output (tl, lines), plain, gzip or xz")
    args = ap.parse_args()
    for name, rows in read_timeline(args.timeline).items():
        summarize(name, rows)


if __name__ == "__main__":
    main()
