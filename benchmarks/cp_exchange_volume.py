"""How much K/V the allgather method moves: keys sent to peers with the sparse exchange
(only what a destination's rows attend to, ``ContextParallelPlan.keys_needed``) over the
keys a full all-gather sends, for the long-context masks of bench_cp_gpu.py, with each
plan layout (``auto`` picks ``local`` where it balances as well). Host only.

    python benchmarks/cp_exchange_volume.py [--lengths 131072 262144] [--worlds 2 4 8]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_cp_gpu import long_context_mask  # noqa: E402
from paddle_flashmask.distributed import ContextParallelPlan  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[131072, 262144, 1048576])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--masks", nargs="+", default=["causal_document", "share_question", "global_sliding_window",
                                                   "causal"])
    ap.add_argument("--layouts", nargs="+", default=["chunks", "local", "auto"])
    args = ap.parse_args()
    print("| mask | S | W | layout | keys sent / all-gather | busiest/mean tiles, area, tokens | plan ms | "
          "keys_needed ms (all pairs) |\n|---|---|---|---|---|---|---|---|")
    for S in args.lengths:
        for name in args.masks:
            idx, causal = long_context_mask(name, S)
            for W in args.worlds:
                for layout in args.layouts:
                    t0 = time.perf_counter()
                    plan = ContextParallelPlan(idx, causal, W, seqlen=S, layout=layout)
                    t1 = time.perf_counter()
                    sent = sum(plan.keys_needed(s, d).size for s in range(W) for d in range(W) if s != d)
                    t2 = time.perf_counter()
                    full = sum(plan.num_local_rows(s) * (W - 1) for s in range(W))
                    got = plan.layout
                    print(f"| {name} | {S} | {W} | {layout}{' -> ' + got if layout == 'auto' else ''} | "
                          f"{sent / full:.3f} | {plan.tile_imbalance:.3f}, {plan.work_imbalance:.3f}, "
                          f"{plan.token_imbalance:.3f} | {(t1 - t0) * 1e3:.0f} | {(t2 - t1) * 1e3:.0f} |", flush=True)


if __name__ == "__main__":
    main()
