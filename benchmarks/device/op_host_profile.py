"""Where the host time of one op call goes (issue 16: a synchronized 8K forward pays ~70 us of host
dispatch before its first kernel, which back-to-back calls hide). Runs one call kind of
op_probe_case.py in a loop at a short length, so that the host, not the GPU, sets the pace, for
py-spy to sample with native frames (Paddle's dispatch, our C++ host code, the CUDA driver):

    py-spy record --native -r 997 -f raw -o prof.txt -- \
        python3 benchmarks/device/op_host_profile.py "fwd" 3
    python3 benchmarks/device/host_profile_summary.py prof.txt   (anywhere: text only)

argv: the call kind (a key of op_calls(): "fwd", "fwd op alone", "bwd paddle.grad", "bwd op alone"),
seconds to loop. OP_BWD_SEQLEN defaults to 1024 here. Prints the loop's calls and host us a call
(the sampler's pauses included), which the summary turns the sampled shares into.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("OP_BWD_SEQLEN", "1024")
from op_probe_case import op_calls  # noqa: E402


def profiled_loop(fn, seconds):
    """Calls fn until `seconds` have passed, draining the stream every 64 calls (the queue stays
    short, so no launch waits for a full queue). Returns the number of calls."""
    import paddle

    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            fn()
        calls += 64
        paddle.device.cuda.synchronize()
    return calls


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "fwd"
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    described, calls = op_calls()
    if label not in calls:
        raise SystemExit(f"op_host_profile.py: call kind must be one of {sorted(calls)}, got {label!r}")
    fn = calls[label]
    profiled_loop(fn, 0.3)  # warm: the wrapper's checked-call cache, Paddle's allocator pools
    t0 = time.perf_counter()
    n = profiled_loop(fn, seconds)
    wall = time.perf_counter() - t0
    print(f"# {described}; {label}: {n} calls in {wall:.3f} s, {wall / n * 1e6:.1f} us a call (host-paced loop)")
    print(f"LOOP calls={n} seconds={wall:.6f}")


if __name__ == "__main__":
    main()
