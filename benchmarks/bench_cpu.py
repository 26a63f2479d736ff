#!/usr/bin/env python3
"""CPU benchmark: paddle_flashmask's tiled, tile-skipping CPU kernel vs a dense-mask
Paddle attention, on packed causal-document and share-question masks.

Prints a markdown table (stdout; progress goes to stderr). See benchmarks/README.md.

    python benchmarks/bench_cpu.py                 # 4K..32K, 3 repeats (several minutes)
    python benchmarks/bench_cpu.py --quick         # smoke run: 1K, 2K, 1 repeat

Thread counts: the CPU math libraries Paddle links (MKL / OpenBLAS / OpenMP) read their
thread count from the environment when they are loaded, so this script parses its
arguments and sets OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS and
PADDLE_FLASHMASK_NUM_THREADS to ``--threads`` *before* importing paddle, then also calls
``paddle.base.core.set_num_threads`` (present in Paddle 3.3.1) when it exists.
"""

import argparse
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768],
                   help="sequence lengths S (default: 4096 8192 16384 32768)")
    p.add_argument("--heads", type=int, default=1, help="number of heads H (default 1)")
    p.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--head-dim", type=int, default=64, help="query/key head dim D (default 64)")
    p.add_argument("--head-dim-v", type=int, default=None,
                   help="value head dim Dv (default D; the CPU kernel takes any, e.g. MLA's 192/128)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--doc-len", type=int, default=512,
                   help="causal_document: tokens per packed document (default 512)")
    p.add_argument("--prompt-len", type=int, default=256,
                   help="share_question: prompt tokens per group (default 256)")
    p.add_argument("--answer-len", type=int, default=128,
                   help="share_question: tokens per answer (default 128)")
    p.add_argument("--num-answers", type=int, default=2,
                   help="share_question: answers per prompt (default 2)")
    p.add_argument("--masks", nargs="+", choices=["causal_document", "share_question"],
                   default=["causal_document", "share_question"])
    p.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed warmup runs (default 1)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="CPU threads for both implementations (default os.cpu_count())")
    p.add_argument("--dense-max-gib", type=float, default=8.0,
                   help="skip the dense baseline when its estimated S x S buffers exceed this")
    p.add_argument("--dense-buffers", type=int, default=6,
                   help="number of B*H*S*S float32 buffers assumed by the dense memory estimate "
                        "(additive mask, scores, scaled, masked, softmax; grad buffers in bwd)")
    p.add_argument("--no-dense", action="store_true", help="skip the dense baseline entirely")
    p.add_argument("--no-rss", action="store_true", help="skip the peak-RSS measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="fast smoke run: lengths 1024 2048, repeats 1")
    # Internal: measure peak RSS of one fwd+bwd of our op in a fresh process.
    p.add_argument("--_rss-child", nargs=2, metavar=("MASK", "S"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.head_dim_v is None:
        args.head_dim_v = args.head_dim
    if args.quick:
        args.lengths = [1024, 2048]
        args.repeats = 1
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


ARGS = parse_args()
# Must happen before `import paddle` (and before numpy loads its BLAS).
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
             "PADDLE_FLASHMASK_NUM_THREADS"):
    os.environ[_var] = str(ARGS.threads)
os.environ.setdefault("GLOG_minloglevel", "2")

import contextlib  # noqa: E402
import gc  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

warnings.filterwarnings("ignore", message=".*ccache.*")
import paddle  # noqa: E402

import paddle_flashmask as pfm  # noqa: E402
from paddle_flashmask import masks  # noqa: E402

import tile_geometry  # noqa: E402  (benchmarks/, this script's folder)
from mask_area import unmasked_area  # noqa: E402

logging.getLogger("paddle").setLevel(logging.WARNING)

BLOCK_M = 64  # kBlockM in custom_ops/flashmask/cpu/tile_ops.h
BLOCK_N = 64  # kBlockN
GIB = 1024.0**3


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def set_paddle_threads(n):
    core = getattr(getattr(paddle, "base", None), "core", None)
    fn = getattr(core, "set_num_threads", None)
    if fn is not None:
        fn(int(n))
        return "paddle.base.core.set_num_threads"
    return "env only"


# ----------------------------------------------------------------------------------------
# masks
# ----------------------------------------------------------------------------------------


def build_mask(name, S, B, args):
    """(startend_row_indices, causal, description) for a mask packed to length S."""
    if name == "causal_document":
        n_full, rest = divmod(S, args.doc_len)
        lens = [args.doc_len] * n_full + ([rest] if rest else [])
        return masks.causal_document_mask(lens, seqlen=S, batch_size=B), True
    group = args.prompt_len + args.num_answers * args.answer_len
    n_groups = S // group
    if n_groups < 1:
        raise ValueError(f"S={S} is shorter than one share_question group ({group} tokens)")
    groups = [(args.prompt_len, [args.answer_len] * args.num_answers)] * n_groups
    # Leftover tokens (S not a multiple of the group) become one padding causal document.
    return masks.share_question_mask(groups, seqlen=S, batch_size=B), True


def tile_stats(idx, causal, sq, sk):
    """(skip fraction, partial fraction) of the CPU kernel's tiles, over all (batch, mask head)."""
    kinds = tile_geometry.classify_tiles(idx, causal, sq, sk, BLOCK_M, BLOCK_N)
    return (kinds == tile_geometry.SKIP).mean(), (kinds == tile_geometry.PARTIAL).mean()


# ----------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------


def bench(fn, warmup, repeats):
    """Median seconds of `repeats` calls after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
        gc.collect()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        gc.collect()
    return statistics.median(times)


def make_inputs(B, S, H, D, dtype, seed, Dv=None):
    """q, k [B, S, H, D]; v, grad_output [B, S, H, Dv] (Dv default D)."""
    paddle.seed(seed)
    Dv = D if Dv is None else Dv
    q, k, v, gout = (paddle.randn([B, S, H, d], dtype="float32").astype(dtype) for d in (D, D, Dv, Dv))
    for t in (q, k, v):
        t.stop_gradient = False
    return q, k, v, gout


def ours_fns(q, k, v, gout, idx, causal):
    def fwd():
        with paddle.no_grad():
            out = pfm.flashmask_attention(q, k, v, idx, causal=causal)
        del out

    def fwd_bwd():
        out = pfm.flashmask_attention(q, k, v, idx, causal=causal)
        grads = paddle.grad([out], [q, k, v], [gout])
        del out, grads

    return fwd, fwd_bwd


def dense_fns(q, k, v, gout, idx, causal, sq, dtype):
    """Dense-mask reference in [B, H, S, D] layout (inputs transposed outside the timings),
    computed in `dtype`."""
    qh, kh, vh, gh = (t.astype(dtype).transpose([0, 2, 1, 3]).contiguous().detach()
                      for t in (q, k, v, gout))
    for t in (qh, kh, vh):
        t.stop_gradient = False
    keep = masks.to_dense(idx.numpy(), causal, sq)  # bool [B, Hm, Sq, Sk]
    add = np.where(keep, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
    del keep
    add_mask = paddle.to_tensor(add).astype(dtype)  # broadcasts over heads when Hm == 1
    del add
    scale = q.shape[-1] ** -0.5

    def attn():
        s = paddle.matmul(qh, kh, transpose_y=True) * scale
        p = paddle.nn.functional.softmax(s + add_mask, axis=-1)
        return paddle.matmul(p, vh)

    def fwd():
        with paddle.no_grad():
            out = attn()
        del out

    def fwd_bwd():
        out = attn()
        grads = paddle.grad([out], [qh, kh, vh], [gh])
        del out, grads

    return fwd, fwd_bwd, (qh, kh, vh, gh, add_mask)


# ----------------------------------------------------------------------------------------
# peak RSS (fresh subprocess)
# ----------------------------------------------------------------------------------------


def current_rss_kib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def peak_rss_kib():
    """This process's own peak RSS in KiB: VmHWM from /proc/self/status, falling back to
    ru_maxrss. (On Linux ru_maxrss also folds in the peak of the image the process exec'd
    from, i.e. the parent's memory when spawned by subprocess, and clear_refs does not reset
    that part; VmHWM is the address space's own counter.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def reset_peak_rss():
    """Resets the kernel's peak-RSS counter of this address space (VmHWM) via
    /proc/self/clear_refs (Linux >= 4.0). Returns False where that is not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_child(args):
    """Runs in a fresh process: peak RSS growth of a cold and of a warm fwd+bwd of our op."""
    mask, S = args._rss_child[0], int(args._rss_child[1])
    set_paddle_threads(args.threads)
    pfm.build()
    idx, causal = build_mask(mask, S, args.batch, args)
    q, k, v, gout = make_inputs(args.batch, S, args.heads, args.head_dim, args.dtype, args.seed, args.head_dim_v)
    for label in ("cold", "warm"):
        gc.collect()
        was_reset = reset_peak_rss()
        rss_before = current_rss_kib()
        max_before = peak_rss_kib()
        out = pfm.flashmask_attention(q, k, v, idx, causal=causal)
        grads = paddle.grad([out], [q, k, v], [gout])
        max_after = peak_rss_kib()
        del out, grads
        print(f"RSS {label} {int(was_reset)} {rss_before} {max_before} {max_after}", flush=True)


def measure_rss(args, mask, S):
    """{label: (growth KiB, resident before KiB, exact)} from a fresh subprocess."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_rss-child", mask, str(S),
           "--threads", str(args.threads), "--heads", str(args.heads), "--batch", str(args.batch),
           "--head-dim", str(args.head_dim), "--head-dim-v", str(args.head_dim_v), "--dtype", args.dtype,
           "--doc-len", str(args.doc_len),
           "--prompt-len", str(args.prompt_len), "--answer-len", str(args.answer_len),
           "--num-answers", str(args.num_answers), "--seed", str(args.seed)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RSS "):
            label, was_reset, before, max_before, max_after = line.split()[1:]
            before, max_before, max_after = int(before), int(max_before), int(max_after)
            # The peak is a high-water mark. With the reset it starts at the current RSS, so
            # the difference is the call's peak growth; without it, if the call never rose
            # above an earlier peak (e.g. a transient at import), it is only an upper bound.
            exact = was_reset == "1" or max_after > max_before
            out[label] = (max_after - before, before, exact)
    if not out:
        raise RuntimeError(f"RSS child failed (rc={res.returncode}):\n{res.stderr[-2000:]}")
    return out


# ----------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------


def fmt_ms(sec):
    return f"{sec * 1e3:,.1f}" if isinstance(sec, float) else sec


def main(args):
    how = set_paddle_threads(args.threads)
    log("building / loading the custom op ...")
    with contextlib.redirect_stdout(sys.stderr):
        pfm.build()
    B, H, D, Dv = args.batch, args.heads, args.head_dim, args.head_dim_v
    esize = 4  # the dense baseline always runs in float32 on the CPU (see below)
    # Paddle 3.3.1's CPU backend registers no bfloat16/float16 kernels for matmul, add or
    # softmax, so the only dense CPU baseline there is runs in float32.
    dense_dtype = "float32"
    dense_note = "" if args.dtype == "float32" else (
        f" Computed in float32 (inputs cast from {args.dtype}): Paddle {paddle.__version__} has "
        f"no {args.dtype} CPU kernels for matmul/add/softmax.")

    print("## paddle_flashmask CPU benchmark\n")
    print(f"- Paddle {paddle.__version__}, paddle_flashmask {pfm.__version__}; "
          f"B={B}, H={H}, D={D}, Dv={Dv}, dtype={args.dtype}")
    print(f"- threads: {args.threads} (OMP/MKL/OPENBLAS_NUM_THREADS and "
          f"PADDLE_FLASHMASK_NUM_THREADS set before importing paddle; {how}); "
          f"os.cpu_count()={os.cpu_count()}; load average at start "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} (other processes skew timings)")
    print(f"- masks: causal_document = documents of {args.doc_len} tokens; share_question = "
          f"groups of prompt {args.prompt_len} + {args.num_answers} answers of {args.answer_len}; "
          f"packed to S")
    print(f"- times: median of {args.repeats} after {args.warmup} warmup, time.perf_counter; "
          f"fwd under paddle.no_grad, fwd+bwd = forward + paddle.grad w.r.t. q, k, v with a "
          f"random grad_output")
    print(f"- dense baseline: matmul(q, k^T) * scale + additive 0/-inf mask (from to_dense), "
          f"softmax, matmul(p, v), [B, H, S, D] layout; skipped when "
          f"{args.dense_buffers} x B*H*S*S*4 bytes > {args.dense_max_gib:g} GiB.{dense_note}")
    print(f"- tiles: {BLOCK_M}x{BLOCK_N}, classified like classify_tile (skip = fully masked, "
          f"partial = needs elementwise masking); GFLOP/s count only the unmasked area "
          f"(fwd 2*area*H*(D+Dv)*B, i.e. 4*area*H*D*B where Dv = D; bwd 2.5x fwd)\n", flush=True)

    header = ["mask", "S", "tiles skipped %", "tiles partial %", "unmasked area",
              "ours fwd ms", "ours fwd+bwd ms", "dense fwd ms", "dense fwd+bwd ms",
              "speedup fwd", "speedup fwd+bwd", "ours fwd GFLOP/s", "ours fwd+bwd GFLOP/s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|", flush=True)

    for S in args.lengths:
        for mask in args.masks:
            idx, causal = build_mask(mask, S, B, args)
            idx_np = idx.numpy()
            skip_frac, partial_frac = tile_stats(idx_np, causal, S, S)
            area = unmasked_area(idx_np, causal, S, S)  # [B, Hm]
            area_frac = float(area.mean()) / (S * S)
            # Mask heads broadcast over H (Hm == 1) or equal H.
            area_total = float(area.sum()) * (H // idx_np.shape[1])
            flops_fwd = 2.0 * area_total * (D + Dv)  # Q K^T over D, P V over Dv
            flops_fb = flops_fwd * 3.5

            q, k, v, gout = make_inputs(B, S, H, D, args.dtype, args.seed, Dv)
            log(f"[{mask} S={S}] ours ...")
            f_fwd, f_fb = ours_fns(q, k, v, gout, idx, causal)
            o_fwd = bench(f_fwd, args.warmup, args.repeats)
            o_fb = bench(f_fb, args.warmup, args.repeats)

            dense_est = args.dense_buffers * B * H * S * S * esize / GIB
            d_fwd = d_fb = None
            if args.no_dense:
                d_fwd = d_fb = "not run"
            elif dense_est > args.dense_max_gib:
                d_fwd = d_fb = f"skipped (memory, ~{dense_est:.0f} GiB est.)"
            else:
                log(f"[{mask} S={S}] dense ... (~{dense_est:.1f} GiB est.)")
                try:
                    g_fwd, g_fb, keep_alive = dense_fns(q, k, v, gout, idx, causal, S,
                                                        dense_dtype)
                    d_fwd = bench(g_fwd, args.warmup, args.repeats)
                    d_fb = bench(g_fb, args.warmup, args.repeats)
                    del g_fwd, g_fb, keep_alive
                except (RuntimeError, MemoryError, ValueError, NotImplementedError) as e:
                    msg = str(e).strip().splitlines()
                    log(f"dense baseline failed: {msg[-1] if msg else e!r}")
                    d_fwd = d_fb = "failed (see stderr)"
            gc.collect()

            def speedup(d, o):
                return f"{d / o:,.1f}x" if isinstance(d, float) else "-"

            row = [mask, str(S), f"{100 * skip_frac:.1f}", f"{100 * partial_frac:.1f}",
                   f"{area_frac:.4f}", fmt_ms(o_fwd), fmt_ms(o_fb), fmt_ms(d_fwd), fmt_ms(d_fb),
                   speedup(d_fwd, o_fwd), speedup(d_fb, o_fb),
                   f"{flops_fwd / o_fwd / 1e9:,.1f}", f"{flops_fb / o_fb / 1e9:,.1f}"]
            print("| " + " | ".join(row) + " |", flush=True)
            del q, k, v, gout, f_fwd, f_fb
            gc.collect()

    print(f"\nLoad average at the end of the timings: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min).")

    if not args.no_rss:
        S = max(args.lengths)
        print(f"\nPeak RSS growth of our op's forward+backward at S={S}, measured in a fresh "
              f"subprocess per mask: the peak-RSS counter is reset through /proc/self/clear_refs, "
              f"then growth = peak RSS (VmHWM, the counter ru_maxrss reports, minus the part "
              f"ru_maxrss inherits from the parent across exec) after the call - RSS "
              f"(/proc/self/statm) just before it, "
              f"with the inputs and grad_output already allocated. 'cold' is the first call "
              f"(one-time allocations included), 'warm' the second:\n")
        for mask in args.masks:
            log(f"[{mask} S={S}] peak RSS subprocess ...")
            try:
                res = measure_rss(args, mask, S)
                parts = []
                for label, (growth, before, exact) in res.items():
                    note = "" if exact else " (upper bound)"
                    parts.append(f"{label} +{growth / 1024:,.1f} MiB{note}")
                before = next(iter(res.values()))[1]
                print(f"- {mask}: " + ", ".join(parts) + f" (over {before / 1024:,.1f} MiB resident)")
            except RuntimeError as e:
                print(f"- {mask}: measurement failed ({e})")
        inputs_mib = 2 * B * S * H * (D + Dv) * np.dtype("float32").itemsize / 2**20
        print(f"\n(For scale: q, k, v, grad_output together are {inputs_mib:,.1f} MiB in float32; "
              f"a single dense S x S float32 score matrix at S={S} is "
              f"{B * H * S * S * 4 / GIB:,.1f} GiB.)")


if __name__ == "__main__":
    if ARGS._rss_child:
        rss_child(ARGS)
    else:
        main(ARGS)
