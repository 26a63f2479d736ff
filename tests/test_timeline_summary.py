"""benchmarks/device/timeline_summary.py: the per-CTA timeline of the harness's --timeline summed up,
with several CTAs resident on an SM (the FA2-class forward runs two) as well as one (the backwards)."""

import gzip
import lzma

import numpy as np
import pytest
from script_loader import load_script


def _summary():
    return load_script("benchmarks/device/timeline_summary.py")


def _timeline(sms, per_sm, ctas_per_slot, gap=50):
    """Rows (cta, sm, global_entry_ns, entry, first_step, loop_end, exit, steps, head, block) of SMs
    running `per_sm` CTAs at once at 1 GHz (globaltimer = clock64): a 100-cycle prologue, 9-11
    steps of 100 cycles, a 100-cycle epilogue, `gap` cycles before the slot's next CTA."""
    rows, cta = [], 0
    for sm in range(sms):
        for slot in range(per_sm):
            t = 300 * slot  # slots out of phase, as on the GPU
            for _ in range(ctas_per_slot):
                steps = 9 + cta % 3
                loop_end = t + 100 + 100 * steps
                rows.append([cta, sm, t, t, t + 100, loop_end, loop_end + 100, steps, 0, cta])
                cta += 1
                t = loop_end + 100 + gap
    return np.array(rows, dtype=np.int64)


def test_resident_ctas_counts_the_most_an_sm_ran_at_once():
    summary = _summary()
    for per_sm in (1, 2, 3):
        a = _timeline(sms=4, per_sm=per_sm, ctas_per_slot=5)
        assert summary.resident_ctas(a[:, 1], a[:, 3], a[:, 6]) == per_sm


def test_slot_gaps_measure_from_the_exit_that_freed_the_slot():
    summary = _summary()
    a = _timeline(sms=1, per_sm=2, ctas_per_slot=4, gap=70)
    gaps = summary.slot_gaps(a[:, 3], a[:, 6], 2)
    # 8 CTAs, the first two take the slots: 6 gaps, each the slot's own 70 cycles (taken from
    # the previous CTA on the SM, overlapping, they would read negative)
    assert gaps == [70] * 6


@pytest.mark.parametrize("suffix, opener", [(".gz", gzip.open), (".xz", lzma.open)])
def test_read_and_summarize_a_two_per_sm_timeline(tmp_path, capsys, suffix, opener):
    summary = _summary()
    a = _timeline(sms=3, per_sm=2, ctas_per_slot=6)
    path = tmp_path / ("tl.txt" + suffix)
    with opener(path, "wt") as f:
        f.write("# header\n")
        for r in a:
            f.write("tl,fa2fwd_causal," + ",".join(str(x) for x in r) + "\n")
    cases = summary.read_timeline(str(path))
    assert list(cases) == ["fa2fwd_causal"] and cases["fa2fwd_causal"].shape == a.shape
    summary.summarize("fa2fwd_causal", cases["fa2fwd_causal"])
    out = capsys.readouterr().out
    assert "2 at once" in out
    assert "gap between CTAs on an SM: median 0.05 us" in out  # 50 cycles at 1 GHz
    assert "prologue median 0.1 us" in out and "epilogue median 0.1 us" in out
    assert "loop fit: 0.0 us + 0.10 us a step" in out
