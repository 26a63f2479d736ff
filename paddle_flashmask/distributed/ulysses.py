"""Context parallel by all-to-all between sequence and heads ("ulysses").

Each rank trades its rows of all heads for all rows of its share of the heads (H / W
query heads, Hk / W key/value heads, Hm / W mask heads when the mask has one per KV
or query head), runs the single-device op on the whole sequence in global order with the global
mask, and trades back. Needs the head counts divisible by the group size.
"""

from __future__ import annotations

import warnings

from paddle.autograd import PyLayer

from . import comm, layouts, tensor_ops
from .spec import CallSpec


class Spec(CallSpec):
    method = "ulysses"

    def mask(self):
        """The mask heads of this rank's head group (all of them when Hm == 1)."""
        ind = self.indices
        if ind is None or int(ind.shape[1]) == 1:
            return ind
        Bm, Hm, S, C = [int(d) for d in ind.shape]
        per = Hm // self.W
        src = self.index(("mask_heads", Bm, Hm), lambda: layouts.mask_head_slice(Bm, Hm, self.W, self.rank))
        return tensor_ops.gather_units(ind, src, S * C, [Bm, per, S, C])


def seq_to_heads(spec, x):
    """``[B, L, Hx, D]`` (local rows, all heads) -> ``[B, S, Hx / W, D]`` (all rows, global order)."""
    B, L, Hx, D = [int(d) for d in x.shape]
    W, plan = spec.W, spec.plan
    unit = (Hx // W) * D
    pack = spec.index("s2h_pack", lambda: layouts.seq_to_heads_pack(B, L, W))
    unpack = spec.index("s2h_unpack", lambda: layouts.seq_to_heads_unpack(plan, B))
    splits = layouts.seq_to_heads_splits(plan, B)  # rank s sends its B*L_s units to every rank
    return comm.exchange(x, pack, unit, splits, unpack, [B, plan.seqlen, Hx // W, D], spec.group, spec.rank)


def heads_to_seq(spec, y):
    """Inverse of seq_to_heads: ``[B, S, Hx / W, D]`` -> ``[B, L, Hx, D]``."""
    B, S, Hr, D = [int(d) for d in y.shape]
    W, plan, L = spec.W, spec.plan, spec.L
    pack = spec.index("h2s_pack", lambda: layouts.heads_to_seq_pack(plan, B))
    unpack = spec.index("h2s_unpack", lambda: layouts.heads_to_seq_unpack(B, L, W))
    splits = layouts.seq_to_heads_splits(plan, B).T.copy()  # rank s sends d its B*L_d units
    return comm.exchange(y, pack, Hr * D, splits, unpack, [B, L, Hr * W, D], spec.group, spec.rank)


def lse_to_seq(spec, lse):
    """LSE ``[B, H / W, S]`` -> ``[B, H, L]``."""
    B, Hr, S = [int(d) for d in lse.shape]
    W, plan, L = spec.W, spec.plan, spec.L
    pack = spec.index(("lse_pack", Hr), lambda: layouts.lse_heads_to_seq_pack(plan, B, Hr))
    unpack = spec.index(("lse_unpack", Hr), lambda: layouts.lse_heads_to_seq_unpack(B, Hr, L, W))
    splits = layouts.seq_to_heads_splits(plan, B).T * Hr
    return comm.exchange(lse, pack, 1, splits, unpack, [B, Hr * W, L], spec.group, spec.rank)


_warned_long = []


def _warn_long(spec):
    # The Hopper kernels take up to 2^19 tokens per call; ulysses runs the whole sequence in
    # one call, so longer ones fall back to the FA2-class kernels (about 5x slower there).
    if spec.plan.seqlen > (1 << 19) and "cpu" not in str(spec.place).lower() and not _warned_long:
        _warned_long.append(True)
        warnings.warn(f"method='ulysses' runs all {spec.plan.seqlen} tokens in one kernel call, beyond the Hopper "
                      "kernels' 2^19: the FA2-class kernels run it; method='allgather' splits the keys and stays "
                      "on the Hopper kernels", stacklevel=3)


class UlyssesAttention(PyLayer):
    @staticmethod
    def forward(ctx, q, k, v, spec):
        # no zero gradient made for the LSE output: Paddle would fill it with its own GPU kernel
        ctx.set_materialize_grads(False)
        _warn_long(spec)
        jobs = [seq_to_heads(spec, x) for x in (q, k, v)]
        qh, kh, vh = [j.wait() for j in jobs]
        mask = spec.mask()
        out_h, lse_h = tensor_ops.attention_fwd(qh, kh, vh, mask, spec.scale, spec.causal, spec.gpu_kernel,
                                                spec.deterministic)
        out = heads_to_seq(spec, out_h).wait()
        lse = lse_to_seq(spec, lse_h).wait()
        ctx.spec = spec
        ctx.save_for_backward(qh, kh, vh, out_h, lse_h)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        spec = ctx.spec
        qh, kh, vh, out_h, lse_h = ctx.saved_tensor()
        dout_h = seq_to_heads(spec, dout).wait()
        dqh, dkh, dvh = tensor_ops.attention_bwd(qh, kh, vh, spec.mask(), out_h, lse_h, dout_h, spec.scale,
                                                 spec.causal, spec.gpu_kernel, spec.deterministic)
        jobs = [heads_to_seq(spec, g) for g in (dqh, dkh, dvh)]
        return tuple(j.wait() for j in jobs)
