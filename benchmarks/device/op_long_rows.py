"""Few live query rows against many keys in one Hopper forward call (the Paddle GPU runtime; a probe).

A context-parallel rank that holds a global+sliding-window mask's global rows runs a part forward
of all its 512K rows against 512K received keys where the 16 global rows see every key and 4063
of the 4096 query blocks none (bench_cp_gpu.py --parts: 51 ms on one H200 before the row and
coarse summaries of the mask prep, 16 ms after). This times the pieces of such a call apart, bf16,
32:8, D=128, forward only, CUDA events, median of 3:
- dense: 128 query rows x N keys, no mask (the 32 long rows alone: 32 tiles of N/128 steps);
- 16 live rows of 128: the same with rows 16-127 masked by the column mask (partial tiles);
- 16 live rows of L: L query rows, rows >= 16 masked (L / 128 - 1 dead query blocks a head);
- the same, each 8192-key run of columns hiding rows >= 16 by its lower interval or by its upper
  one in turn (C = 4), as the context-parallel part does: no whole-row aggregate shows the dead
  blocks there, the 2048-key coarse summaries do.
    python3 benchmarks/device/op_long_rows.py
"""

import os
import sys

import numpy as np
import paddle

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), os.path.dirname(HERE)]
import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask.attention import GPU_KERNELS  # noqa: E402
from paddle_flashmask.distributed import tensor_ops  # noqa: E402
from bench_gpu import StreamEvents  # noqa: E402
from op_probe_case import device_normal  # noqa: E402

HEADS, HEADS_K, DIM, LIVE = 32, 8, 128, 16


def main():
    gpu = paddle.CUDAPlace(0)
    rng = np.random.default_rng(0)

    def dev(shape):
        return device_normal(rng, shape)

    pfm.build()
    kernel = GPU_KERNELS["sm90"]
    events = StreamEvents()
    scale = DIM ** -0.5
    print(f"# {paddle.device.cuda.get_device_name(0)}, bf16, {HEADS}:{HEADS_K}, D={DIM}, sm90 forward, {LIVE} live rows")
    print("| keys | query rows | mask | ms | ms a key block of the long rows |")
    print("|---|---|---|---|---|")
    for keys in (65536, 524288):
        k, v = dev((1, keys, HEADS_K, DIM)), dev((1, keys, HEADS_K, DIM))
        for rows, masked in ((128, None), (128, "rows >= 16 masked"), (keys, "rows >= 16 masked"),
                             (keys, "rows >= 16 masked, two intervals")):
            q = dev((1, rows, HEADS, DIM))
            idx = None
            if masked == "rows >= 16 masked":  # non-causal C=2: rows i >= LTS_j or i < UTE_j masked; LTS = 16, UTE = 0
                cols = np.zeros((1, 1, keys, 2), dtype=np.int32)
                cols[..., 0] = LIVE
            elif masked:  # C=4 [LTS, LTE, UTS, UTE]: [16, L, 0, 0], every other 8192 keys [L, L, 16, L]
                cols = np.tile(np.array([LIVE, rows, 0, 0], dtype=np.int32), (1, 1, keys, 1))
                runs = (np.arange(keys) // 8192) % 2 == 1
                cols[0, 0, runs] = [rows, rows, LIVE, rows]
            if masked:
                idx = paddle.to_tensor(cols, place=paddle.CPUPlace())._copy_to(gpu, True)
            call = lambda: tensor_ops.attention_fwd(q, k, v, idx, scale, False, kernel, False)  # noqa: E731
            call()
            ms = float(np.median([events.time_ms(call) for _ in range(3)]))
            print(f"| {keys} | {rows} | {masked or 'none'} | {ms:.3f} | "
                  f"{ms / (keys // 128) * 1e3:.2f} us |", flush=True)
            q = idx = None


if __name__ == "__main__":
    main()
