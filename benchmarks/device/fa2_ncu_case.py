"""One FlashAttention-2 case of bench_fa2_masks.py for Nsight Compute (torch only, no Paddle):

    ncu --kernel-name regex:flash_fwd_kernel --launch-skip 1 --launch-count 1 ... \
        python3 benchmarks/device/fa2_ncu_case.py causal 16384

runs FA2's forward and backward (native GQA, bf16, 32:8 heads, D=128 or env FLASHMASK_HARNESS_DIM)
twice on the named mask (causal, causal_document, short_documents or sliding_window; the instances of
bench_fa2_masks.py).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_fa2_masks import DIM, fa2_call, instance, random_inputs  # noqa: E402


def main(argv):
    if len(argv) != 2 or not argv[1].isdigit():
        print(__doc__)
        return 2
    name, s = argv[0], int(argv[1])
    lens, window, _ = instance(name, s)
    dim = int(os.environ.get("FLASHMASK_HARNESS_DIM") or DIM)  # the harness's head dim, same variable
    q, k, v, dout = random_inputs(s, "cuda", dim=dim)
    for _ in range(2):  # the first pass is skipped by --launch-skip
        out = fa2_call(q, k, v, lens, window)
        torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
