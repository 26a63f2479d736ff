"""Float64 dense-mask reference for FlashMask attention (numpy, test-only).

Builds the dense keep mask with paddle_flashmask.masks.to_dense and computes
the output, LSE and analytic gradients in float64.
"""

import numpy as np

from paddle_flashmask import masks


def keep_mask(indices, causal, batch, num_heads_k, seqlen_q, seqlen_k, window=None):
    """Dense bool keep mask [B, Hk, Sq, Sk] for indices (numpy), window or neither; [B, H, Sq, Sk]
    when the indices have a mask head per query head (H > Hk)."""
    if window is not None:
        left, right = window
        i = np.arange(seqlen_q)[:, None]
        j = np.arange(seqlen_k)[None, :]
        keep = i < np.minimum(j + left + 1, seqlen_q)
        if causal:
            keep &= j <= i + seqlen_k - seqlen_q
        else:
            keep &= i >= np.clip(j - right, 0, seqlen_q)
        return np.broadcast_to(keep, (batch, num_heads_k, seqlen_q, seqlen_k))
    if indices is None:
        keep = np.ones((seqlen_q, seqlen_k), dtype=bool)
        if causal:
            keep = np.tril(keep, k=seqlen_k - seqlen_q)
        return np.broadcast_to(keep, (batch, num_heads_k, seqlen_q, seqlen_k))
    keep = masks.to_dense(np.asarray(indices), causal, seqlen_q=seqlen_q)
    heads = max(num_heads_k, keep.shape[1])
    return np.broadcast_to(keep, (batch, heads, seqlen_q, seqlen_k))


def attention_fwd_bwd(q, k, v, keep, scale, dout=None):
    """q [B,Sq,H,D], k [B,Sk,Hk,D], v [B,Sk,Hk,Dv], keep [B,Hk|H|1,Sq,Sk]. Returns dict of float64 arrays."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, h, d = q.shape
    hk = k.shape[2]
    group = h // hk
    # Per query head: mask head and kv head.
    kh = np.repeat(k, group, axis=2).transpose(0, 2, 1, 3)  # [B,H,Sk,D]
    vh = np.repeat(v, group, axis=2).transpose(0, 2, 1, 3)
    qh = q.transpose(0, 2, 1, 3)  # [B,H,Sq,D]
    keep_h = np.repeat(keep, h // keep.shape[1], axis=1)  # [B,H,Sq,Sk]
    s = scale * qh @ kh.transpose(0, 1, 3, 2)
    s = np.where(keep_h, s, -np.inf)
    row_max = s.max(-1, keepdims=True)
    empty = ~np.isfinite(row_max)
    p = np.exp(s - np.where(empty, 0.0, row_max))
    p = np.where(keep_h, p, 0.0)
    denom = p.sum(-1, keepdims=True)
    p = p / np.where(empty, 1.0, denom)
    out = p @ vh  # [B,H,Sq,D]
    with np.errstate(divide="ignore"):
        lse = np.where(empty[..., 0], -np.inf, row_max[..., 0] + np.log(np.where(empty, 1.0, denom))[..., 0])
    res = {"out": out.transpose(0, 2, 1, 3), "lse": lse}
    if dout is not None:
        do = np.asarray(dout, dtype=np.float64).transpose(0, 2, 1, 3)
        dv = p.transpose(0, 1, 3, 2) @ do
        dp = do @ vh.transpose(0, 1, 3, 2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True))
        dq = scale * ds @ kh
        dk = scale * ds.transpose(0, 1, 3, 2) @ qh
        # The same sums without cancellation, for rel_err's floor: dP itself is a dot product
        # whose terms can cancel (dO . v small against |dO| . |v|), so its magnitude is taken
        # from the absolute terms too.
        dp_mag = np.abs(do) @ np.abs(vh).transpose(0, 1, 3, 2)
        ds_mag = p * (dp_mag + (dp_mag * p).sum(-1, keepdims=True))
        dq_mag = scale * ds_mag @ np.abs(kh)
        dk_mag = scale * ds_mag.transpose(0, 1, 3, 2) @ np.abs(qh)
        # Sum the GQA group back onto the kv heads.
        res["dq"] = dq.transpose(0, 2, 1, 3)
        res["dk"] = dk.reshape(b, hk, group, -1, d).sum(2).transpose(0, 2, 1, 3)
        res["dv"] = dv.reshape(b, hk, group, -1, v.shape[3]).sum(2).transpose(0, 2, 1, 3)
        res["dq_mag"] = dq_mag.transpose(0, 2, 1, 3)
        res["dk_mag"] = dk_mag.reshape(b, hk, group, -1, d).sum(2).transpose(0, 2, 1, 3)
        res["dv_mag"] = res["dv"]
    return res


def rel_err(x, ref, magnitude=None):
    """||x - ref|| / ||ref||.

    `magnitude` is the same quantity computed from absolute values (no cancellation).
    A gradient that cancels to ~0 in exact arithmetic (dq with one visible key:
    dS = P (dP - rowsum(dO O)) = 0) has no meaningful relative error: its fp32
    rounding noise is relative to the size of the cancelling terms. The denominator
    is therefore floored at a tenth of ||magnitude||, i.e. the error is measured
    against the condition of the computation, as for any sum with cancellation.
    """
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    denom = np.linalg.norm(ref)
    if magnitude is not None:
        denom = max(denom, 0.1 * np.linalg.norm(magnitude))
    return np.linalg.norm(x - ref) / (denom if denom > 0 else 1.0)


def random_indices(rng, batch, mask_heads, seqlen_q, seqlen_k, causal, cols):
    """Random valid indices [B, Hm, Sk, C] int32: starts anywhere in [0, Sq], ends at or
    after them. Values cluster at 64-block edges and at 0 / Sq so that skipped, partial
    and unmasked tiles all occur."""
    shape = (batch, mask_heads, seqlen_k)
    anchors = np.clip(np.array([0, seqlen_q, seqlen_q // 2, 64, 63, 65, 128], dtype=np.int64), 0, seqlen_q)

    def draw():
        pick = rng.random(shape) < 0.3
        return np.where(pick, rng.choice(anchors, size=shape), rng.integers(0, seqlen_q + 1, size=shape))

    a, b = draw(), draw()
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    if cols == 1:
        out = [a]
    elif cols == 2 and causal:
        out = [lo, hi]
    elif cols == 2:
        out = [a, b]  # LTS, UTE: no order between them
    else:
        c, d = draw(), draw()
        out = [lo, hi, np.minimum(c, d), np.maximum(c, d)]
    return np.stack(out, axis=-1).astype(np.int32)


def round_to_dtype(a, dtype):
    """float32 values -> the nearest values of `dtype` ("float16", "bfloat16" or "float32"), round
    to nearest even, as float32. Done in numpy: Paddle 2.6's CPU cast to a 16-bit type truncates."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "float32":
        return a.copy()
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = a.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # finite inputs only
        return rounded.astype(np.uint32).view(np.float32)
    raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
