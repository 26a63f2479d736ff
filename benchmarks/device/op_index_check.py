"""What the op's index check costs a model's layers (the Paddle GPU runtime; a probe, not a test).

flashmask_attention checks an indices tensor's values once: a small kernel and one flag read back
to the host, which waits for everything queued before it. A model whose layers each hand the op a
new tensor of the same indices (PaddleNLP's patch did until f09c58c: every layer normalized the
batch's indices anew) pays that read in every layer, and the host cannot run ahead of the GPU.

    python3 benchmarks/device/op_index_check.py      (gpu_suite.sh STAGES=indexcheck)

Times LAYERS forwards queued without a sync (a model's attention calls; causal documents of 8K,
bf16, 32:8, D=128, the Hopper kernels), with the indices tensor
- checked once: the same tensor every layer (the wrapper's per-tensor cache hits);
- checked every layer: the cache emptied before each call (a new tensor per layer);
- not checked: set_index_validation(False).
Prints host ms until the last call returned and GPU ms per layer (CUDA events around the burst),
medians of REPEATS bursts.
"""

import os
import sys
import time

import numpy as np
import paddle

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), os.path.dirname(HERE)]  # the repo root, benchmarks/
import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask import attention as attention_module  # noqa: E402
from paddle_flashmask import masks  # noqa: E402
from bench_gpu import StreamEvents  # noqa: E402
from op_probe_case import device_normal  # noqa: E402

SEQLEN = int(os.environ.get("OP_INDEX_SEQLEN", "8192"))
LAYERS = int(os.environ.get("OP_INDEX_LAYERS", "12"))
REPEATS = 5
HEADS, HEADS_K, DIM = 32, 8, 128


def main():
    gpu = paddle.CUDAPlace(0)
    rng = np.random.default_rng(0)

    def dev(shape):
        return device_normal(rng, shape)

    pfm.build()
    pfm.set_gpu_kernel("sm90")
    q, k, v = dev((1, SEQLEN, HEADS, DIM)), dev((1, SEQLEN, HEADS_K, DIM)), dev((1, SEQLEN, HEADS_K, DIM))
    docs = [SEQLEN // 8] * 4 + [SEQLEN // 4] * 2  # 6 documents filling the row
    indices = masks.causal_document_mask(docs, SEQLEN, place=paddle.CPUPlace())._copy_to(gpu, True)
    events = StreamEvents()

    def layers(before_each):
        for _ in range(LAYERS):
            before_each()
            pfm.flashmask_attention(q, k, v, indices, causal=True)

    def nothing():
        pass

    def forget():
        attention_module._checked_indices.clear()

    def burst(before_each):
        t0 = time.perf_counter()
        host = []
        gpu_ms = events.time_ms(lambda: (layers(before_each), host.append(time.perf_counter() - t0)))
        return host[0] * 1e3, gpu_ms / LAYERS

    cases = [("checked once", nothing, True), ("checked every layer", forget, True), ("not checked", nothing, False)]
    print(f"# {paddle.device.cuda.get_device_name(0)}, causal documents {docs} ({SEQLEN}), bf16, "
          f"{HEADS}:{HEADS_K}, D={DIM}, sm90, {LAYERS} layers queued")
    print("| indices | host ms until the last layer returned | GPU ms a layer (events) |")
    print("|---|---|---|")
    rows = {label: [] for label, _, _ in cases}
    for _ in range(REPEATS):  # the cases interleaved, so that clocks drift alike
        for label, before_each, validate in cases:
            pfm.set_index_validation(validate)
            pfm.flashmask_attention(q, k, v, indices, causal=True)  # 'checked once' starts checked
            paddle.device.cuda.synchronize()
            rows[label].append(burst(before_each))
    pfm.set_index_validation(True)
    for label, samples in rows.items():
        host, per_layer = np.median(np.array(samples), axis=0)
        print(f"| {label} | {host:.3f} | {per_layer:.3f} |", flush=True)


if __name__ == "__main__":
    main()
