"""Context parallel by all-to-all between sequence and heads ("ulysses").

Each rank trades its rows of all heads for all rows of its share of the heads (H / W
query heads, Hk / W key/value heads, Hm / W mask heads when the mask has one per KV
or query head), runs the single-device op on the whole sequence in global order with the global
mask (beyond 2^19 tokens on Hopper: in exact pieces, ``paddle_flashmask.long_sequence``), and
trades back. Needs the head counts divisible by the group size.
"""

from __future__ import annotations

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


def _in_pieces(spec, qh):
    # The whole sequence in one call: beyond what one Hopper kernel call takes (2^19 tokens)
    # it runs in exact pieces on the Hopper kernels (paddle_flashmask.long_sequence) rather
    # than on the FA2-class kernels one call would fall back to.
    from .. import long_sequence, validation

    return long_sequence.splits(qh, spec.gpu_kernel == 1, int(qh.shape[3]), validation.SM90_HEAD_DIMS)


class UlyssesAttention(PyLayer):
    @staticmethod
    def forward(ctx, q, k, v, spec):
        from .. import long_sequence

        # no zero gradient made for the LSE output: Paddle would fill it with its own GPU kernel
        ctx.set_materialize_grads(False)
        jobs = [seq_to_heads(spec, x) for x in (q, k, v)]
        qh, kh, vh = [j.wait() for j in jobs]
        mask = spec.mask()
        ctx.pieces = None
        if _in_pieces(spec, qh):
            out_h, lse_h, ctx.pieces = long_sequence.pieces_forward(qh, kh, vh, mask, spec.causal, spec.scale,
                                                                    spec.gpu_kernel, spec.deterministic)
        else:
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
        from .. import long_sequence

        spec = ctx.spec
        qh, kh, vh, out_h, lse_h = ctx.saved_tensor()
        dout_h = seq_to_heads(spec, dout).wait()
        if ctx.pieces is not None:
            dqh, dkh, dvh = long_sequence.pieces_backward(ctx.pieces, qh, kh, vh, out_h, dout_h, spec.scale,
                                                          spec.gpu_kernel, spec.deterministic)
        else:
            dqh, dkh, dvh = tensor_ops.attention_bwd(qh, kh, vh, spec.mask(), out_h, lse_h, dout_h, spec.scale,
                                                     spec.causal, spec.gpu_kernel, spec.deterministic)
        jobs = [heads_to_seq(spec, g) for g in (dqh, dkh, dvh)]
        return tuple(j.wait() for j in jobs)
