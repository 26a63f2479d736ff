"""benchmarks/bench_cp_gpu.py's dry run on CPU: every simulated rank of both context-parallel
methods against the single-device op. The script's GPU check (benchmarks/device/cp_suite.sh) runs
the same code, which had broken unseen when the distributed call specs gained head_dim (the
thirty-sixth session's device call found it)."""

import os
import re
import subprocess
import sys

import pytest

from script_loader import ROOT


def test_cpu_dry_run_checks_every_rank():
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_cp_gpu.py"), "--device", "cpu", "--check",
         "--dtypes", "float32", "--world-sizes", "2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    summary = re.search(r"^check: (\d+) cases, (\d+) failed$", run.stdout, re.MULTILINE)
    assert summary is not None, run.stdout[-2000:]
    cases, failed = map(int, summary.groups())
    assert cases >= 10 and failed == 0
    methods = set(re.findall(r"^\| float32 \| \S+ \| \d+ \| 2 \| (\w+) \|", run.stdout, re.MULTILINE))
    assert methods == {"allgather", "ulysses", "allgather_spaced", "allgather_apart"}
    spaced = re.findall(r"^\| float32 \| \S+ \| \d+ \| 2 \| allgather_spaced \| .* (\d+) parts spaced out \|$", run.stdout, re.MULTILINE)
    assert sum(map(int, spaced)) > 0, run.stdout[-2000:]  # the check has parts with padding slots


@pytest.mark.parametrize("fuse", ["1", "0"])
def test_cpu_parts_times_every_piece_of_each_rank(fuse):
    """--parts (allgather): each rank's pieces timed one by one, the part of received keys
    included, beside the rank's step time; group 0's keys in the own keys' call where they fit
    beside them (allgather.Spec.fused), or apart (PADDLE_FLASHMASK_CP_FUSE=0)."""
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_cp_gpu.py"), "--device", "cpu", "--bench",
         "--dtypes", "float32", "--world-sizes", "2", "--lengths", "1024", "--masks", "global_sliding_window",
         "--methods", "allgather", "--t1-max", "0", "--repeats", "1", "--parts"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=dict(os.environ, PADDLE_FLASHMASK_CP_FUSE=fuse))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    pieces = re.findall(r"^#   rank (\d) \(\d+ rows\), pieces synchronized one by one, ms: (.*)$", run.stdout,
                        re.MULTILINE)
    assert sorted(rank for rank, _ in pieces) == ["0", "1"], run.stdout[-2000:]
    labels = (r"own \+ group 0 fwd \(\d+ keys\)|own \+ group 0 bwd|concat" if fuse == "1" else
              r"own fwd \(\d+ keys\)|own bwd|group 0 fwd \(\d+ keys\)|group 0 bwd")
    for _, listing in pieces:
        times = dict(re.findall(f"({labels}) ([\\d.]+)", listing))
        assert len(times) == (3 if fuse == "1" else 4) and all(float(ms) > 0 for ms in times.values()), listing
