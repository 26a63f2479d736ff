"""Unmasked area of a FlashMask (numpy only), for TFLOP/s on the unmasked area:
fwd FLOPs = 2 * area * H * (D + Dv) (Q K^T over the query/key head dim D, P V over value's
Dv: 4 * area * H * D where Dv = D), bwd = 2.5 x fwd (the LongCA-bench convention).

Imported by the Paddle benchmark and by the PyTorch peer benchmark alike.
"""

import numpy as np

# The FlashMask paper / LongCA-bench mask set, in table order.
BENCH_MASKS = ["full", "causal", "causal_document", "share_question", "sliding_window",
               "global_sliding_window", "causal_blockwise", "prefix_lm_document", "prefix_lm_causal",
               "qk_sparse", "random_eviction", "short_documents", "short_share_question"]


def _short_lengths(rng, total, lo=128, hi=512):
    """Lengths in [lo, hi] summing to `total` (the last one cut short)."""
    lens = []
    while sum(lens) < total:
        lens.append(min(int(rng.integers(lo, hi + 1)), total - sum(lens)))
    return lens


def _short_segments(rng, total):
    """share_question groups (prompt, [answer, answer]) of 128-512 tokens each filling `total`."""
    groups, used = [], 0
    while total - used >= 3 * 128:
        prompt, a, b = (int(x) for x in rng.integers(128, 513, size=3))
        if used + prompt + a + b > total:
            break
        groups.append((prompt, [a, b]))
        used += prompt + a + b
    return groups


def bench_mask(masks, name, seqlen, heads_k, seed=0):
    """(indices numpy or None, causal) for a BENCH_MASKS entry; `masks` is
    paddle_flashmask.masks (each benchmark process brings its own import of it)."""
    if name == "full":
        return None, False
    if name == "causal":
        return None, True
    rng = np.random.default_rng(seed)
    if name == "short_documents":  # packed SFT of short samples: documents of 128-512 tokens
        idx = masks.causal_document_mask(_short_lengths(rng, seqlen), seqlen, place="numpy")
        return idx, True
    if name == "short_share_question":  # DPO/RM rows of short prompts and answers (128-512 tokens)
        idx = masks.share_question_mask(_short_segments(rng, seqlen), seqlen, place="numpy")
        return idx, True
    return masks.example_mask(name, seqlen, batch_size=1, num_heads=heads_k, seed=seed, place="numpy")


def column_bounds(indices, causal, seqlen_q):
    """[B, Hm, Sk, C] -> four [B, Hm, Sk] arrays (LTS, LTE, UTS, UTE); unused = empty."""
    idx = np.asarray(indices, dtype=np.int64)
    c = idx.shape[-1]
    zeros = np.zeros(idx.shape[:-1], dtype=np.int64)
    full = np.full(idx.shape[:-1], seqlen_q, dtype=np.int64)
    if c == 1:
        return idx[..., 0], full, zeros, zeros
    if c == 2 and causal:
        return idx[..., 0], idx[..., 1], zeros, zeros
    if c == 2:
        return idx[..., 0], full, zeros, idx[..., 1]
    return idx[..., 0], idx[..., 1], idx[..., 2], idx[..., 3]


def _union_length(starts, ends):
    """Length of the union of intervals [starts[k], ends[k]) along axis 0."""
    starts = np.asarray(starts)
    ends = np.maximum(np.asarray(ends), starts)
    order = np.argsort(starts, axis=0)
    s = np.take_along_axis(starts, order, 0)
    e = np.take_along_axis(ends, order, 0)
    total = np.zeros(s.shape[1:], dtype=np.int64)
    cur_s, cur_e = s[0], e[0]
    for k in range(1, s.shape[0]):
        gap = s[k] > cur_e
        total += np.where(gap, cur_e - cur_s, 0)
        cur_s = np.where(gap, s[k], cur_s)
        cur_e = np.where(gap, e[k], np.maximum(cur_e, e[k]))
    return total + (cur_e - cur_s)


def unmasked_area(indices, causal, seqlen_q, seqlen_k, batch=1, mask_heads=1):
    """Visible (query, key) pairs per (batch, mask head): array [B, Hm]."""
    cols = np.arange(seqlen_k, dtype=np.int64)
    if indices is None:
        lts = np.full((batch, mask_heads, seqlen_k), seqlen_q, dtype=np.int64)
        lte = uts = ute = np.zeros_like(lts)
    else:
        lts, lte, uts, ute = column_bounds(indices, causal, seqlen_q)
    causal_end = np.clip(cols - (seqlen_k - seqlen_q), 0, seqlen_q) if causal else np.zeros_like(cols)
    causal_end = np.broadcast_to(causal_end, lts.shape)
    starts = np.stack([np.clip(lts, 0, seqlen_q), np.clip(uts, 0, seqlen_q), np.zeros_like(lts)])
    ends = np.stack([np.clip(lte, 0, seqlen_q), np.clip(ute, 0, seqlen_q), causal_end])
    masked = _union_length(starts, ends)
    return (seqlen_q - masked).sum(-1)


def gpu_value_head_dim(head_dim):
    """The value head dim the benchmarks pair with query/key ``head_dim`` by default: the one the
    GPU kernels take with it (paddle_flashmask.validation.GPU_VALUE_HEAD_DIMS, repeated here for
    the peers' process, which has no Paddle): 128 with 192 (MLA), ``head_dim`` otherwise."""
    return 128 if head_dim == 192 else head_dim


def attention_flops(indices, causal, seqlen_q, seqlen_k, num_heads, head_dim, batch=1, head_dim_v=None):
    """(fwd, bwd) FLOPs on the unmasked area; ``head_dim_v`` value's head dim (None: ``head_dim``)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    mask_heads = 1 if indices is None else np.asarray(indices).shape[1]
    area = unmasked_area(indices, causal, seqlen_q, seqlen_k, batch, mask_heads)
    # Each mask head serves num_heads / mask_heads query heads.
    total = float(area.sum()) * (num_heads / mask_heads)
    fwd = 2.0 * total * (head_dim + head_dim_v)  # S = Q K^T (2 D per pair) and O = P V (2 Dv)
    return fwd, 2.5 * fwd
