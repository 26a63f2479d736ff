"""Writes the Paddle benchmark's mask instances (benchmarks/mask_area.py's bench_mask, the
indices bench_gpu.py passes to the op) as raw int32 [S, C] files, for the harness's
`--time-mask-file` (the bare kernel on the very mask the op's benchmark timed):

    python3 benchmarks/device/dump_bench_masks.py OUT_DIR S MASK [MASK ...]
    -> OUT_DIR/<MASK>_<S>.i32 and a line per mask: the harness arguments to time it
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))

from mask_area import bench_mask  # noqa: E402
from paddle_flashmask import masks  # noqa: E402


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    out_dir, seqlen, names = argv[0], int(argv[1]), argv[2:]
    for name in names:
        idx, causal = bench_mask(masks, name, seqlen, 8)  # the sweeps' 32:8 (kv heads matter to none taken)
        if idx is None or idx.shape[0] != 1 or idx.shape[1] != 1:
            raise SystemExit(f"{name}: the harness takes one mask head and batch 1 (indices {None if idx is None else idx.shape})")
        print(write_for_harness(out_dir, f"{name}_{seqlen}", idx[0, 0], causal, name))
    return 0


def write_for_harness(out_dir, stem, columns, causal, label):
    """Writes one mask's columns [S, C] as raw int32 OUT_DIR/<stem>.i32 and returns the harness
    arguments that time it under `label`."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{stem}.i32")
    np.ascontiguousarray(columns, dtype=np.int32).tofile(path)
    return f"--time-mask-file {path} {columns.shape[0]} {columns.shape[1]} {int(causal)} {label}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
