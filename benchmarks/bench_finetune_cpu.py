#!/usr/bin/env python3
"""Fine-tuning throughput on CPU: tiny PaddleNLP LLaMA, the same real tokens three ways.

    python benchmarks/bench_finetune_cpu.py              # S = 2048, ~24K real tokens per variant
    python benchmarks/bench_finetune_cpu.py --quick      # smoke run (S = 512)

Variants (one training step = forward + backward + AdamW update; identical weights and data):

- ``packed+flashmask``: examples greedily packed into rows of ``--seq`` tokens, position ids
  restarting per example, causal-document indices ``[B, 1, S]`` through
  ``paddlenlp_patches.enable_flashmask`` (``use_flash_attention=True``, GQA k/v not repeated);
- ``packed+dense``: the same rows with the equivalent dense block-diagonal bool mask
  ``[B, 1, S, S]`` through PaddleNLP's eager attention (what PaddleNLP's zero padding does
  without flashmask);
- ``padded+dense``: one example per row, ``--pad-batch`` rows per step padded to the longest,
  with a ``[B, S]`` padding mask that PaddleNLP expands to a dense causal ``[B, 1, S, S]`` mask
  (PaddleNLP's default without zero padding).

Each variant runs in a fresh process so its peak RSS (``ru_maxrss``) is its own; the table shows
real tokens/s (padding excluded), peak RSS and its growth over the process's RSS after building
the model, and the largest mask of one step (indices, or the additive fp32 ``[B, 1, S, S]`` mask
PaddleNLP's eager path builds from the bool/padding mask). Then it prints the mask memory of one row at 8K, 32K
and 128K tokens: FlashMask indices (int32, C = 1 and C = 4) vs a dense bool and an additive fp32
S x S mask (what PaddleNLP's eager path materialises per row).

Threads: OMP/MKL/OpenBLAS and PADDLE_FLASHMASK_NUM_THREADS are set to ``--threads`` before
paddle is imported (default: all cores).
"""

import argparse
import json
import os
import subprocess
import sys

VARIANTS = ("packed+flashmask", "packed+dense", "padded+dense")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=int, default=2048, help="packed row length / max example length")
    p.add_argument("--tokens", type=int, default=24576, help="real tokens trained per variant")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--min-len", type=int, default=32, help="shortest example")
    p.add_argument("--mean-len", type=int, default=256, help="mean example length (log-normal)")
    p.add_argument("--pad-batch", type=int, default=4, help="examples per step for padded+dense")
    p.add_argument("--rows", type=int, default=1, help="packed rows per step")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--quick", action="store_true", help="S=512, 4K tokens")
    p.add_argument("--_child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.seq, args.tokens, args.mean_len = 512, 4096, 96
    return args


def _set_threads(n):
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PADDLE_FLASHMASK_NUM_THREADS"):
        os.environ[k] = str(n)


def make_records(args):
    """Random-token SFT records with log-normal lengths (min..seq), ``args.tokens`` real tokens."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    sigma = 0.8
    mu = np.log(args.mean_len) - sigma**2 / 2
    recs, total = [], 0
    while total < args.tokens:
        L = int(np.clip(rng.lognormal(mu, sigma), args.min_len, args.seq))
        L = min(L, args.tokens - total) if args.tokens - total >= args.min_len else L
        ids = rng.integers(4, args.vocab, L + 1).tolist()
        p = L // 4
        recs.append({"input_ids": ids[:-1], "labels": [-100] * p + ids[p + 1:],
                     "attn_mask_startend_row_indices": [L] * L})
        total += L
    return recs


def batches(args, variant, recs):
    import numpy as np

    from paddlenlp_patches.collators import SFTCollator
    from paddlenlp_patches.packing import pack_records

    if variant.startswith("packed"):
        rows = pack_records(recs, args.seq, zero_padding=True, greedy=True)
        coll = SFTCollator(flash_mask=variant.endswith("flashmask"))
        for i in range(0, len(rows), args.rows):
            chunk = rows[i:i + args.rows]
            yield coll(chunk), sum(len(r["input_ids"]) for r in chunk)
        return
    rows = pack_records(recs, args.seq, zero_padding=False)
    coll = SFTCollator(flash_mask=True)
    for i in range(0, len(rows), args.pad_batch):
        chunk = rows[i:i + args.pad_batch]
        b = coll(chunk)
        del b["attn_mask_startend_row_indices"]
        n = np.array([len(r["input_ids"]) for r in chunk])
        b["attention_mask"] = (np.arange(b["input_ids"].shape[1])[None, :] < n[:, None]).astype("int64")
        yield b, int(n.sum())


def _rss_mb():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args):
    _set_threads(args.threads)
    import time

    import numpy as np
    import paddle

    import paddlenlp_patches as pp
    from paddlenlp.transformers import LlamaForCausalLM
    from paddlenlp_patches.modeling import build_config

    paddle.set_device("cpu")
    if hasattr(paddle.base.core, "set_num_threads"):
        paddle.base.core.set_num_threads(args.threads)
    variant = args._child
    flash = variant == "packed+flashmask"
    if flash:
        pp.enable_flashmask()
        import paddle_flashmask

        paddle_flashmask.build()
    paddle.seed(args.seed)
    cfg = build_config(None, {"hidden_size": args.hidden, "intermediate_size": 3 * args.hidden,
                              "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
                              "num_key_value_heads": args.kv_heads, "max_position_embeddings": args.seq,
                              "vocab_size": args.vocab}, args.vocab, use_flash_attention=flash)
    model = LlamaForCausalLM(cfg)
    opt = paddle.optimizer.AdamW(1e-4, parameters=model.parameters())
    recs = make_records(args)
    data = list(batches(args, variant, recs))
    base_rss = _rss_mb()

    def step(b):
        loss = model(**{k: paddle.to_tensor(v) for k, v in b.items()})[0]
        loss.backward()
        opt.step()
        opt.clear_grad()
        return float(loss)

    for b, _ in data[: args.warmup]:
        step(b)
    real = padded = 0
    mask_bytes = 0
    losses = []
    t0 = time.perf_counter()
    for b, n in data:
        losses.append(step(b))
        real += n
        padded += b["input_ids"].size
        if "attn_mask_startend_row_indices" in b:
            mask_bytes = max(mask_bytes, b["attn_mask_startend_row_indices"].nbytes)
        else:  # PaddleNLP's eager path materialises an additive fp32 [B, 1, S, S] mask
            Bn, Sn = b["input_ids"].shape
            mask_bytes = max(mask_bytes, Bn * Sn * Sn * 4)
    dt = time.perf_counter() - t0
    out = {"variant": variant, "tokens_per_s": real / dt, "seconds": dt, "real_tokens": real,
           "computed_tokens": padded, "steps": len(data), "peak_rss_mb": _rss_mb(),
           "rss_growth_mb": _rss_mb() - base_rss, "mask_bytes": mask_bytes,
           "first_loss": losses[0], "finite": bool(np.isfinite(losses).all())}
    print("RESULT " + json.dumps(out), flush=True)


def fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def mask_memory_table():
    import numpy as np

    from paddle_flashmask import masks

    lines = ["| S | indices C=1 (int32) | indices C=4 (int32) | dense bool S x S | dense fp32 S x S | dense fp32 / indices C=1 |",
             "|---|---|---|---|---|---|"]
    for S in (8192, 32768, 131072):
        idx = masks.causal_document_mask([S // 4] * 4, seqlen=S)  # really built: 4 documents
        ind1 = int(np.prod(idx.shape)) * 4
        ind4 = ind1 * 4
        lines.append(f"| {S // 1024}K | {fmt_bytes(ind1)} | {fmt_bytes(ind4)} | {fmt_bytes(S * S)} | "
                     f"{fmt_bytes(4 * S * S)} | {4 * S * S // ind1:,}x |")
    return "\n".join(lines)


def main():
    args = parse_args()
    if args._child:
        return child(args)
    results = []
    for v in args.variants:
        cmd = [sys.executable, os.path.abspath(__file__), "--_child", v] + [a for a in sys.argv[1:]
                                                                              if a != "--quick"]
        if args.quick:
            cmd += ["--seq", str(args.seq), "--tokens", str(args.tokens), "--mean-len", str(args.mean_len)]
        print(f"running {v} ...", file=sys.stderr, flush=True)
        res = subprocess.run(cmd, capture_output=True, text=True)
        line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
        if res.returncode != 0 or not line:
            print(res.stdout[-2000:], res.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"{v} failed")
        results.append(json.loads(line[0][7:]))
    print(f"Tiny LLaMA (hidden {args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} kv heads), "
          f"fp32, CPU threads {args.threads}; examples of {args.min_len}..{args.seq} tokens (mean ~{args.mean_len}), "
          f"S = {args.seq}; fwd+bwd+AdamW per step.\n")
    print("| variant | real tokens | computed tokens | steps | real tokens/s | peak RSS | RSS growth | mask bytes/step |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['variant']} | {r['real_tokens']} | {r['computed_tokens']} | {r['steps']} | "
              f"{r['tokens_per_s']:.0f} | {r['peak_rss_mb']:.0f} MB | {r['rss_growth_mb']:.0f} MB | "
              f"{fmt_bytes(r['mask_bytes'])} |")
    assert all(r["finite"] for r in results)
    print("\nMask memory of one row (B = 1, Hm = 1):\n")
    print(mask_memory_table())


if __name__ == "__main__":
    main()
