"""FlashAttention-2 on the masks it can express, for issue 15's mask targets (a script, not a test).

FA2 has no column-wise mask, but three masks of our benchmark are exactly what it runs natively:
causal documents and 128-512-token documents (varlen: ``cu_seqlens``, causal inside each
document) and a causal sliding window (``window_size_left``). On those the issue's question, "does
tile skipping waste the time it saves?", has a reference answer: FA2's own TFLOP/s on the unmasked
area against its own plain causal. This script times FA2 on such instances and writes each one as
raw int32 ``LTS`` columns ``[S]`` (C = 1, causal), so that ``flashmask_harness --time-mask-file FILE
S 1 1 NAME fa2`` times our kernels on the very same mask (``benchmarks/device/fa2_masks.sh`` runs
both in one device call; ``benchmarks/device/fa2_masks_summary.py`` sets them side by side).

Torch only (the device's plain python3, no Paddle). FA2 is called through
``torch.ops.aten._flash_attention_forward``, with its native GQA (K/V heads 8, query heads 32), and
differentiated by autograd (``_flash_attention_backward``). ``bench_gpu_peers.py``'s SDPA flash peer
repeats K/V to 32 heads inside the timed call (SDPA's flash backend takes one head count); that
figure is printed too, on plain causal, so the two methods can be compared.

Before timing, every mask form is checked at 2K tokens against a float32 dense-mask attention built
from the same columns (output and the three gradients), so a wrong ``cu_seqlens`` or window cannot
pass silently.
"""

import argparse
import json
import os
import time

import numpy as np

try:  # the mask instances below need numpy alone (tests/test_bench_fa2_masks.py imports them)
    import torch
except ImportError:  # pragma: no cover - the device's python3 has torch
    torch = None

HEADS, KV_HEADS, DIM = 32, 8, 128
WINDOW = 1024


# --------------------------------------------------------------------------------------------
# mask instances: document lengths or a window, and the same mask as FlashMask columns
# --------------------------------------------------------------------------------------------

def doc_lengths(seqlen, lo, hi, rng):
    """Random document lengths in [lo, hi] (the last one cut to fit) summing to seqlen."""
    lens, start = [], 0
    while start < seqlen:
        n = min(seqlen - start, int(rng.integers(lo, hi + 1)))
        lens.append(n)
        start += n
    return lens


def instance(name, seqlen):
    """(document lengths or None, window or None, LTS columns int32 [S] or None for plain causal).

    causal_document: lengths uniform in [256, S / 3] (the harness's timing_docs);
    short_documents: [128, 512]; sliding_window: row i sees keys i - 1024 .. i."""
    rng = np.random.default_rng(seqlen)
    if name == "causal":
        return None, None, None
    if name == "sliding_window":
        cols = np.minimum(seqlen, np.arange(seqlen) + WINDOW + 1).astype(np.int32)
        return None, WINDOW, cols
    lo, hi = {"causal_document": (256, max(257, seqlen // 3)), "short_documents": (128, 512)}[name]
    lens = doc_lengths(seqlen, lo, hi, rng)
    ends = np.cumsum(lens)
    cols = np.repeat(ends, lens).astype(np.int32)  # key j is masked from its document's end on
    return lens, None, cols


def unmasked_area(seqlen, cols):
    """Unmasked (query, key) pairs of a causal C = 1 mask: rows [j, LTS_j) see key j."""
    if cols is None:
        return seqlen * (seqlen + 1) / 2
    return float(np.sum(cols.astype(np.int64) - np.arange(seqlen)))


# --------------------------------------------------------------------------------------------
# FlashAttention-2 calls
# --------------------------------------------------------------------------------------------

def fa2_call(q, k, v, lens=None, window=None):
    """FA2 forward on [1, S, H, D] tensors, causal; documents run varlen ([S, H, D] with cu_seqlens).
    bench_gpu_peers.py's fa2_gqa_causal peer is this call without documents or window."""
    if lens is not None:
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=q.device)
        longest = int(max(lens))
        out = torch.ops.aten._flash_attention_forward(q[0], k[0], v[0], cu, cu, longest, longest, 0.0, True, False)[0]
        return out.unsqueeze(0)
    s = q.shape[1]
    kwargs = {} if window is None else {"window_size_left": window, "window_size_right": 0}
    return torch.ops.aten._flash_attention_forward(q, k, v, None, None, s, s, 0.0, True, False, **kwargs)[0]


def sdpa_repeat_call(q, k, v):
    """SDPA flash on plain causal, K/V repeated to the query heads ([1, S, H, D] tensors): bench_gpu_peers.py's
    sdpa_flash_causal peer."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rep = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            qt, kt.repeat_interleave(rep, 1), vt.repeat_interleave(rep, 1), is_causal=True)
    return out.transpose(1, 2)


def dense_reference(q, k, v, cols):
    """float32 attention with the dense mask of causal LTS columns (None: plain causal)."""
    s = q.shape[1]
    rows = torch.arange(s, device=q.device)[:, None]
    keys = torch.arange(s, device=q.device)[None, :]
    keep = keys <= rows
    if cols is not None:
        lts = torch.as_tensor(cols, device=q.device)[None, :]
        keep = keep & (rows < lts)
    rep = q.shape[2] // k.shape[2]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    scores = qf @ kf.transpose(-1, -2) / DIM**0.5
    scores = scores.masked_fill(~keep, float("-inf"))
    return (torch.softmax(scores, -1) @ vf).transpose(1, 2)


def random_inputs(s, device, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, seed=0):
    """q, k, v (requiring grad) and dout, bf16 [1, s, heads, dim], drawn in that order from one seeded generator."""
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(1, s, h, dim, device=device, dtype=torch.bfloat16, generator=g, requires_grad=True)
               for h in (heads, kv_heads, kv_heads))
    dout = torch.randn(1, s, heads, dim, device=device, dtype=torch.bfloat16, generator=g)
    return q, k, v, dout


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def check_forms(device):
    """Each form at 2K, small heads, FA2 against the dense reference: forward and gradients."""
    worst = 0.0
    for name in ("causal", "causal_document", "short_documents", "sliding_window"):
        s = 2048
        lens, window, cols = instance(name, s)
        if name == "sliding_window":  # a window narrower than the length, so it masks something
            window = 300
            cols = np.minimum(s, np.arange(s) + window + 1).astype(np.int32)
        q, k, v, dout = random_inputs(s, device, heads=4, kv_heads=2, seed=1)
        out = fa2_call(q, k, v, lens, window)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        ref = dense_reference(q, k, v, cols)
        ref_grads = torch.autograd.grad(ref, (q, k, v), dout.float())
        errs = [rel_err(out, ref)] + [rel_err(a, b) for a, b in zip(grads, ref_grads)]
        worst = max(worst, *errs)
        print(f"# check {name} S={s}: out {errs[0]:.1e} dq {errs[1]:.1e} dk {errs[2]:.1e} dv {errs[3]:.1e}",
              flush=True)
    if worst > 2e-2:
        raise SystemExit(f"FA2 against the dense reference: relative error {worst:.2e} > 2e-2")


def write_masks(cases, mask_dir):
    """Each case's LTS columns as raw int32 (none for plain causal: "-"), listed in index.txt as
    "NAME S FILE" lines, the harness's --time-mask-file arguments."""
    os.makedirs(mask_dir, exist_ok=True)
    with open(os.path.join(mask_dir, "index.txt"), "w") as index:
        for name, s in cases:
            cols = instance(name, s)[2]
            path = "-"
            if cols is not None:
                path = os.path.join(mask_dir, f"{name}_{s}.i32")
                cols.tofile(path)
            index.write(f"{name} {s} {path}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+",
                    default=["causal:8192", "causal:16384", "causal:32768", "causal_document:8192",
                             "causal_document:32768", "short_documents:8192", "short_documents:32768",
                             "sliding_window:8192", "sliding_window:32768"],
                    help="NAME:S (causal, causal_document, short_documents, sliding_window)")
    ap.add_argument("--mask-dir", required=True, help="where the LTS files and index.txt go")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--back-to-back", type=int, default=8)
    ap.add_argument("--out", help="jsonl of the FA2 timings (required unless --masks-only)")
    ap.add_argument("--masks-only", action="store_true",
                    help="write the mask files and index.txt, time nothing (no GPU needed)")
    args = ap.parse_args()
    if not args.masks_only and not args.out:
        ap.error("--out is required unless --masks-only")
    cases = []
    for spec in args.cases:
        name, _, s = spec.partition(":")
        if name not in ("causal", "causal_document", "short_documents", "sliding_window") or not s.isdigit():
            ap.error(f"--cases: NAME:S with NAME causal, causal_document, short_documents or sliding_window, "
                     f"got {spec!r}")
        cases.append((name, int(s)))

    write_masks(cases, args.mask_dir)
    if args.masks_only:
        return
    if torch is None:
        raise SystemExit("bench_fa2_masks.py: timing FA2 needs torch (only --masks-only runs without it)")
    # bench_gpu_peers.py's timing (CUDA events around each call, and calls queued back to back);
    # imported here, as it needs torch and this module's mask instances do not.
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_gpu_peers import fwd_bwd_times
    device = "cuda"
    gpu = torch.cuda.get_device_name(0)
    print(f"# FA2 (aten._flash_attention_forward, native GQA) on {gpu}, torch {torch.__version__}, bf16, "
          f"{HEADS}:{KV_HEADS} heads, D={DIM}", flush=True)
    check_forms(device)

    print("| impl | mask | S | documents | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd b2b ms | bwd b2b ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with open(args.out, "a") as out:
        for name, s in cases:
            lens, window, cols = instance(name, s)
            fwd_flops = 4.0 * unmasked_area(s, cols) * HEADS * DIM
            q, k, v, dout = random_inputs(s, device)
            impls = [("fa2_native_gqa", lambda: fa2_call(q, k, v, lens, window))]
            if name == "causal":
                impls.append(("fa2_sdpa_repeat_kv", lambda: sdpa_repeat_call(q, k, v)))
            for impl, run in impls:
                fwd, bwd, fwd_b2b, bwd_b2b = fwd_bwd_times(run, q, k, v, dout, args.repeats, args.back_to_back)
                rec = dict(impl=impl, mask=name, seqlen=s, heads=HEADS, heads_k=KV_HEADS, dim=DIM, device=gpu,
                           documents=None if lens is None else len(lens), window=window, fwd_ms=fwd, bwd_ms=bwd,
                           fwd_b2b_ms=fwd_b2b, bwd_b2b_ms=bwd_b2b, fwd_tflops=fwd_flops / fwd / 1e9,
                           bwd_tflops=2.5 * fwd_flops / bwd / 1e9, fwd_b2b_tflops=fwd_flops / fwd_b2b / 1e9,
                           bwd_b2b_tflops=2.5 * fwd_flops / bwd_b2b / 1e9, t=time.time())
                out.write(json.dumps(rec) + "\n")
                out.flush()
                docs = "-" if lens is None else str(len(lens))
                print(f"| {impl} | {name} | {s} | {docs} | {fwd:.3f} | {rec['fwd_tflops']:.1f} | {bwd:.3f} | "
                      f"{rec['bwd_tflops']:.1f} | {fwd_b2b:.3f} | {bwd_b2b:.3f} |", flush=True)
            del q, k, v, dout
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
