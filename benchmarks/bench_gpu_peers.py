"""Peers for bench_gpu.py, measured by a second process in the same device call
(plain python3 with PyTorch; no Paddle): FlexAttention (torch.compile'd, block
mask built from the same FlashMask indices, build time reported apart), SDPA
with a dense boolean mask, and FlashAttention-2 on plain causal: SDPA's flash backend
(sdpa_flash_causal, K/V repeated to the query heads inside the timed call, as SDPA's flash backend
takes one head count) or FA2 with its native GQA (fa2_gqa_causal,
torch.ops.aten._flash_attention_forward, differentiated by autograd; the fair FA2 figure at
32:8, which the repeat costs 2-11%: benchmarks/results/h200/fa2_native_masks/). On plain causal
and full attention, sdpa_cudnn: SDPA's cuDNN backend, whose Hopper kernels are FA3-class (TMA,
wgmma), the anchor for issue 16's "FA3 level" measured the way ours is (per call and back to back).

Same masks (paddle_flashmask/masks.py loaded without paddle), same shapes,
same TFLOP/s convention (benchmarks/mask_area.py). --dim / --dim-v as in bench_gpu.py:
FlexAttention and SDPA with a mask take a value head dim of their own (e.g. 192/128); SDPA's
flash backend does not, and is left out there.
"""

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mask_area import BENCH_MASKS, attention_flops, bench_mask, column_bounds, gpu_value_head_dim  # noqa: E402
from bench_fa2_masks import fa2_call, sdpa_repeat_call  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "pfm_masks", os.path.join(os.path.dirname(HERE), "paddle_flashmask", "masks.py"))
masks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(masks)

# Timing repeats the backward on one graph (retain_graph=True), which compiled
# backward functions with donated buffers refuse; donation only saves memory.
try:
    import torch._functorch.config as _functorch_config

    _functorch_config.donated_buffer = False
except (ImportError, AttributeError):
    pass
flex = torch.compile(flex_attention, dynamic=False)


# FlashAttention-2 on plain causal only (it has no column mask).
FA2_CAUSAL_IMPLS = ("sdpa_flash_causal", "fa2_gqa_causal")
# Peers without any mask: plain causal and full attention only.
UNMASKED_IMPLS = ("sdpa_cudnn",)


def sdpa_cudnn_inputs(q, k, v, causal):
    """(run, grad inputs, how GQA is done) for SDPA's cuDNN backend on [B, H, S, D] leaves.
    Native GQA (enable_gqa) where this torch's cuDNN backend takes it; else K/V repeated to the
    query heads once, outside the timed calls, as leaves of their own (the kernel's own speed: it
    reads 4x the K/V bytes of a compute-bound problem, and no repeat or head-sum is timed)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call(kk, vv, gqa):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=gqa)

    if k.shape[1] == q.shape[1]:
        return (lambda: call(k, v, False)), (q, k, v), "none"
    try:
        call(k, v, True)
        return (lambda: call(k, v, True)), (q, k, v), "native"
    except RuntimeError:
        rep = q.shape[1] // k.shape[1]
        kk = k.detach().repeat_interleave(rep, 1).requires_grad_()
        vv = v.detach().repeat_interleave(rep, 1).requires_grad_()
        return (lambda: call(kk, vv, False)), (q, kk, vv), "K/V repeated before the timed calls"


def mask_mod_from_indices(idx, causal, seqlen, heads, device):
    """One mask_mod body for every form (bounds as tensors), so torch.compile
    compiles flex_attention once per shape rather than once per mask."""
    if idx is None:  # plain full/causal: a mask that hides nothing
        idx = np.full((1, 1, seqlen, 1), seqlen, dtype=np.int32)
    lts, lte, uts, ute = (torch.as_tensor(b[0].astype(np.int32), device=device)
                          for b in column_bounds(idx, causal, seqlen))
    mask_heads = lts.shape[0]
    head_map = torch.arange(heads, device=device) // (heads // mask_heads)
    causal_flag = torch.tensor(1 if causal else 0, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        hm = head_map[h]
        lower = (q_idx >= lts[hm, kv_idx]) & (q_idx < lte[hm, kv_idx])
        upper = (q_idx >= uts[hm, kv_idx]) & (q_idx < ute[hm, kv_idx])
        hidden = (causal_flag > 0) & (kv_idx > q_idx)
        return ~(lower | upper | hidden)

    return mask_mod, mask_heads


def timed(fn, repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def back_to_back_ms(fn, calls):
    """ms per call of `calls` calls queued without a sync in between (bench_gpu.py's twin)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def fwd_bwd_times(run, q, k, v, dout, repeats, calls):
    """(fwd ms, bwd ms) per call with events around each, and (fwd, bwd) ms per call of
    `calls` queued back to back (None for calls == 0); the backward's gradients are of q, k, v."""
    run()  # warm-up / compile
    t_fwd = timed(run, repeats)
    b2b_fwd = back_to_back_ms(run, calls) if calls else None
    out = run()

    def bwd():
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    bwd()
    t_bwd = timed(bwd, repeats)
    b2b_bwd = back_to_back_ms(bwd, calls) if calls else None
    return t_fwd, t_bwd, b2b_fwd, b2b_bwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--dim", type=int, default=128, help="query/key head dim")
    ap.add_argument("--dim-v", type=int, default=None,
                    help="value head dim (default: the GPU kernels' for --dim: 128 with 192, else --dim)")
    ap.add_argument("--masks", nargs="+", default=BENCH_MASKS)
    ap.add_argument("--impls", nargs="+", default=["flex_attention", "sdpa_dense_mask", "sdpa_flash_causal"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--back-to-back", type=int, default=8,
                    help="calls queued without a sync for the *_b2b_ms figures (0: none)")
    ap.add_argument("--dense-max-gib", type=float, default=24.0)
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--out", default="gpu_results.jsonl")
    ap.add_argument("--round", type=int, default=None,
                    help="which round of a multi-round call this sweep is (recorded; benchmarks/rounds_summary.py)")
    args = ap.parse_args()
    dim_v = gpu_value_head_dim(args.dim) if args.dim_v is None else args.dim_v

    dev = "cuda"
    device = torch.cuda.get_device_name(0)
    dtype = torch.bfloat16
    start = time.time()
    out = open(args.out, "a")
    print(f"# peers on {device}, torch {torch.__version__}, bf16, D={args.dim}, Dv={dim_v}, B=1")
    print("| impl | mask | S | H:Hk | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | mask build ms | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seqlen in args.lengths:
        for heads_k in args.kv_heads:
            if time.time() - start > args.budget_s:
                break
            g = torch.Generator(device=dev).manual_seed(0)
            q = torch.randn(1, args.heads, seqlen, args.dim, device=dev, dtype=dtype, generator=g, requires_grad=True)
            k = torch.randn(1, heads_k, seqlen, args.dim, device=dev, dtype=dtype, generator=g, requires_grad=True)
            v = torch.randn(1, heads_k, seqlen, dim_v, device=dev, dtype=dtype, generator=g, requires_grad=True)
            dout = torch.randn(1, args.heads, seqlen, dim_v, device=dev, dtype=dtype, generator=g)
            for name in args.masks:
                if time.time() - start > args.budget_s:
                    print(f"(budget reached, skipping the rest at S={seqlen})")
                    break
                idx, causal = bench_mask(masks, name, seqlen, heads_k)
                fwd_flops, bwd_flops = attention_flops(idx, causal, seqlen, seqlen, args.heads, args.dim,
                                                       head_dim_v=dim_v)
                for impl in args.impls:
                    if impl in FA2_CAUSAL_IMPLS and name != "causal":
                        continue
                    if impl in UNMASKED_IMPLS and idx is not None:
                        continue
                    if impl in FA2_CAUSAL_IMPLS and dim_v != args.dim:
                        print(f"| {impl} | {name} | {seqlen} | {args.heads}:{heads_k} | skipped: the flash "
                              f"backend takes one head dim for q, k and v, not {args.dim}/{dim_v} |", flush=True)
                        continue
                    build_ms = None
                    grad_inputs, gqa = (q, k, v), None
                    torch.cuda.reset_peak_memory_stats()
                    try:
                        if impl == "flex_attention":
                            mask_mod, mask_heads = mask_mod_from_indices(idx, causal, seqlen, args.heads, dev)
                            torch.cuda.synchronize()
                            t0 = time.perf_counter()
                            block_mask = create_block_mask(mask_mod, 1, args.heads if mask_heads > 1 else None,
                                                           seqlen, seqlen, device=dev, _compile=True)
                            torch.cuda.synchronize()
                            t0 = time.perf_counter()  # second build: compile excluded
                            block_mask = create_block_mask(mask_mod, 1, args.heads if mask_heads > 1 else None,
                                                           seqlen, seqlen, device=dev, _compile=True)
                            torch.cuda.synchronize()
                            build_ms = (time.perf_counter() - t0) * 1e3

                            def run():
                                return flex(q, k, v, block_mask=block_mask, enable_gqa=heads_k != args.heads)
                        elif impl == "sdpa_dense_mask":
                            dense_gib = seqlen * seqlen / 2**30 * (1 if idx is None else idx.shape[1])
                            if dense_gib > args.dense_max_gib:
                                raise MemoryError(f"dense mask would take {dense_gib:.0f} GiB")
                            if idx is None:
                                keep = np.ones((1, 1, seqlen, seqlen), dtype=bool)
                                if causal:
                                    keep = np.tril(keep)
                            else:
                                keep = masks.to_dense(idx, causal)
                            keep_t = torch.from_numpy(keep).to(dev)
                            rep = args.heads // heads_k
                            if keep_t.shape[1] > 1:
                                keep_t = keep_t.repeat_interleave(args.heads // keep_t.shape[1], dim=1)

                            def run():
                                return F.scaled_dot_product_attention(
                                    q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=keep_t)
                        elif impl in FA2_CAUSAL_IMPLS:
                            # bench_fa2_masks.py's FA2 calls take [B, S, H, D]: views of ours (last dim
                            # contiguous), as SDPA hands them over
                            call = sdpa_repeat_call if impl == "sdpa_flash_causal" else fa2_call

                            def run():
                                return call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
                        elif impl == "sdpa_cudnn":
                            run, grad_inputs, gqa = sdpa_cudnn_inputs(q, k, v, causal)
                        else:
                            raise ValueError(f"unknown --impls entry {impl!r}")
                        t_start = time.time()  # the timed window, for the GPU's clock log (clock_summary.py)
                        t_fwd, t_bwd, b2b_fwd, b2b_bwd = fwd_bwd_times(run, *grad_inputs, dout, args.repeats,
                                                                       args.back_to_back)
                        t_end = time.time()
                    except Exception as e:
                        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                        print(f"| {impl} | {name} | {seqlen} | {args.heads}:{heads_k} | {msg} |", flush=True)
                        out.write(json.dumps(dict(impl=impl, mask=name, seqlen=seqlen, heads=args.heads,
                                                  heads_k=heads_k, dim=args.dim, dim_v=dim_v, error=msg,
                                                  device=device)) + "\n")
                        torch.cuda.empty_cache()
                        continue
                    peak = torch.cuda.max_memory_allocated() / 2**30
                    rec = dict(impl=impl, mask=name, seqlen=seqlen, heads=args.heads, heads_k=heads_k,
                               dim=args.dim, dim_v=dim_v, dtype="bfloat16", device=device, fwd_ms=t_fwd,
                               bwd_ms=t_bwd,
                               fwd_b2b_ms=b2b_fwd, bwd_b2b_ms=b2b_bwd,
                               fwd_tflops=fwd_flops / t_fwd / 1e9, bwd_tflops=bwd_flops / t_bwd / 1e9,
                               mask_build_ms=build_ms, peak_gib=peak, t_start=t_start, t_end=t_end)
                    if gqa is not None:
                        rec["gqa"] = gqa
                    if args.round is not None:
                        rec["round"] = args.round
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    bm = "" if build_ms is None else f"{build_ms:.1f}"
                    print(f"| {impl} | {name} | {seqlen} | {args.heads}:{heads_k} | {t_fwd:.2f} | "
                          f"{rec['fwd_tflops']:.1f} | {t_bwd:.2f} | {rec['bwd_tflops']:.1f} | {bm} | {peak:.2f} |",
                          flush=True)
                    torch.cuda.empty_cache()
            q = k = v = dout = None  # free this config before the next allocates


if __name__ == "__main__":
    main()
