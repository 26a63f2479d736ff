"""Writes the mask of one context-parallel part (a rank's rows against its own keys, or against
one exchange group's keys, as the allgather method builds it: `allgather.Spec.part_masks()`) as
raw int32 [S, C], for the harness's `--time-mask-file`: the bare kernels on the very part that
`bench_cp_gpu.py --parts` times inside the op (and ncu on them, without Paddle on the device):

    python3 benchmarks/device/dump_cp_part_mask.py OUT_DIR S W MASK RANK PART [--pad-keys]
    -> OUT_DIR/<MASK>_<S>_w<W>_r<RANK>_p<PART>.i32 and the harness arguments to time it

PART 0 is the rank's own keys (and group 0's where they share its call, `allgather.Spec.fused`;
PADDLE_FLASHMASK_CP_FUSE=0 keeps them apart), PART g + 1 exchange group g's. The plan is bench_cp_gpu.py's
(`long_context_mask(MASK, S)`, the allgather method, its default layout); the harness takes one
length for rows and keys, so only a part with as many keys as rows can be written, or, with
--pad-keys, one with fewer keys than rows, its keys followed by columns that hide every row (the
kernels skip those key blocks whole: the part's own key blocks do the same work as in the op).
A part's keys are as its kernel call has them: spaced out among padding slots where the part has
them (`allgather.Spec.part_slots`; PADDLE_FLASHMASK_CP_SPACING=0 writes them back to back).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from bench_cp_gpu import long_context_mask  # noqa: E402
from dump_bench_masks import write_for_harness  # noqa: E402
from paddle_flashmask.distributed import ContextParallelPlan, allgather  # noqa: E402


def main(argv):
    pad_keys = "--pad-keys" in argv
    argv = [a for a in argv if a != "--pad-keys"]
    if len(argv) != 6:
        print(__doc__)
        return 2
    out_dir, seqlen, world_size, name, rank, part = argv[0], int(argv[1]), int(argv[2]), argv[3], int(argv[4]), int(argv[5])
    if not 0 <= rank < world_size:
        raise SystemExit(f"RANK must be in [0, {world_size}), got {rank}")
    idx, causal = long_context_mask(name, seqlen)
    if idx is None:
        raise SystemExit(f"{name}: no column mask to write (the harness times it with FILE '-')")
    plan = ContextParallelPlan(idx, causal, world_size, method="allgather", seqlen=seqlen)
    # head dim and kernel only shape the exchange's tensors, not the masks
    spec = allgather.Spec(plan, rank, None, paddle.to_tensor(idx), causal, 1.0, None, False, 1, paddle.CPUPlace(), 128)
    masks = spec.part_masks()
    if not 0 <= part < len(masks):
        raise SystemExit(f"PART must be in [0, {len(masks)}) for rank {rank} of this plan, got {part}")
    if part == 1 and spec.fused():
        raise SystemExit(f"part 1 of rank {rank} shares part 0's kernel call (PADDLE_FLASHMASK_CP_FUSE=0 keeps it "
                         "apart)")
    if masks[part] is None:
        raise SystemExit(f"part {part} of rank {rank} is empty or unmasked: nothing to write")
    m = masks[part].numpy()
    rows, keys = plan.num_local_rows(rank), m.shape[2]
    columns = m[0, 0]
    if keys < rows and pad_keys:
        columns = np.concatenate([columns, hiding_columns(rows - keys, columns.shape[1], rows)])
    elif rows != keys:
        raise SystemExit(f"part {part} of rank {rank} has {rows} rows and {keys} keys; the harness takes one "
                         "length" + ("" if keys > rows else " (--pad-keys pads the keys)"))
    tag = f"{name}_{seqlen}_w{world_size}_r{rank}_p{part}"
    # the parts are not causal themselves: the plan folds causality into their columns
    print(write_for_harness(out_dir, tag, columns, False, tag))
    return 0


def hiding_columns(count, num_cols, rows):
    """`count` columns of a non-causal mask with `num_cols` bounds that hide all `rows` rows, every
    band covering them all (as the remap op's padding slots: a block mixing them with real
    columns keeps those columns' min/max summary)."""
    return np.tile(np.asarray([0, rows] * (num_cols // 2), dtype=np.int32), (count, 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
