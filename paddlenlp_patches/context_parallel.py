"""Context parallel for the PaddleNLP LLaMA models: one packed sequence split over the ranks of a group.

Every rank of the group gets the same collated batch (global ``input_ids``, ``position_ids``,
labels and ``attn_mask_startend_row_indices``). Per batch, :meth:`ContextParallel.batch` builds one
``paddle_flashmask.distributed.ContextParallelPlan`` from the global indices (every rank builds the
same one) and makes it the active plan while the forward *and* the backward run (recompute
re-runs attention inside the backward). While a plan is active, in a model prepared with
:func:`enable_context_parallel`:

- ``LlamaModel.forward`` keeps this rank's rows of ``input_ids`` / ``position_ids``
  (``plan.shard``), so RoPE sees the true global positions;
- the rotary embedding serves the cos/sin table up to the global length (PaddleNLP slices it to
  the local length, which the global position ids would overrun);
- the attention patch (``llama_attention.flashmask_attn_func``) calls
  ``paddle_flashmask.distributed.flashmask_attention`` with the global indices;
- losses are computed on the global token axis: the per-token quantity (token loss, token
  log-prob, reward score) of the local rows is placed into a ``[B, S]`` tensor and summed over the
  group (``ActiveBatch.gather_tokens``: forward all-reduce, backward = this rank's rows of the
  incoming gradient). Every rank then computes the single-device loss; each rank's parameter gradient is
  the part that flows through its own rows (plus the dK/dV the attention op returns), so the SUM
  of the gradients over the group (what fleet's sep all-reduce does) is the exact gradient.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Optional

import numpy as np
import paddle
from paddle.autograd import PyLayer

_ACTIVE = {"batch": None}
_PATCHED = "__pfm_context_parallel__"


def active() -> Optional["ActiveBatch"]:
    """The plan of the batch being trained/evaluated, or None outside context parallel."""
    return _ACTIVE["batch"]


def _group_size(group):
    return group.nranks if group is not None else paddle.distributed.get_world_size()


class _GatherTokens(PyLayer):
    """``[B, L, ...]`` local rows -> ``[B, S, ...]`` of every rank (zeros + all-reduce sum);
    backward: this rank's rows of the gradient (each rank's loss is computed on the full tensor,
    so the gradient reaching the local rows is already complete)."""

    @staticmethod
    def forward(ctx, x, rows, seq_len, group):
        full = paddle.zeros([x.shape[0], seq_len] + list(x.shape[2:]), dtype=x.dtype)
        idx = paddle.to_tensor(rows, dtype="int64", place=x.place)
        full[:, idx] = x
        if _group_size(group) > 1:
            paddle.distributed.all_reduce(full, group=group)
        ctx.idx = idx
        return full

    @staticmethod
    def backward(ctx, grad):
        return paddle.index_select(grad, ctx.idx, axis=1)


class ActiveBatch:
    """One batch's plan and this rank's place in it."""

    def __init__(self, plan, rank, group, indices, causal, seq_len):
        self.plan, self.rank, self.group = plan, rank, group
        self.indices, self.causal, self.seq_len = indices, causal, seq_len
        self.rows = np.asarray(plan.local_rows(rank), dtype=np.int64)
        self.local_len = int(self.rows.shape[0])

    def shard(self, x):
        """This rank's rows of a global ``[B, S, ...]`` tensor."""
        return self.plan.shard(x, self.rank)

    def gather_tokens(self, x):
        """Differentiable ``[B, L, ...]`` (this rank's rows) -> ``[B, S, ...]`` (all rows)."""
        return _GatherTokens.apply(x, self.rows, self.seq_len, self.group)

    def attention(self, q, k, v):
        from paddle_flashmask.distributed import flashmask_attention

        if str(self.indices.place) != str(q.place):  # the batch may arrive on the host: move it once
            self.indices = self.indices._copy_to(q.place, False)
        return flashmask_attention(q, k, v, self.indices, causal=self.causal, plan=self.plan, group=self.group)


class ContextParallel:
    """Context-parallel settings of a run: ``degree`` ranks per group, ``method`` ``"allgather"``
    (``context_parallel_degree``) or ``"ulysses"`` (``sep_parallel_degree``), the group (None = the
    global group; the runner passes fleet's sep group)."""

    def __init__(self, degree: int, method: str = "allgather", group=None):
        if method not in ("allgather", "ulysses"):
            raise ValueError(f"context parallel method must be allgather or ulysses, got {method!r}")
        self.degree, self.method, self.group = int(degree), method, group
        self.rank = group.rank if group is not None else paddle.distributed.get_rank()
        nranks = _group_size(group)
        if nranks != self.degree:
            raise ValueError(f"context parallel degree {self.degree} != {nranks} ranks in its group")

    def __repr__(self):
        return f"ContextParallel(degree={self.degree}, method={self.method!r}, rank={self.rank})"

    def _check_same_batch(self, input_ids, indices):
        """The ranks of a group must train on the same batch (a wrong sampler would silently train
        on garbage): compare a small signature of it over the group."""
        ids = np.asarray(input_ids.numpy() if hasattr(input_ids, "numpy") else input_ids, dtype=np.int64)
        ind = np.asarray(indices.numpy() if hasattr(indices, "numpy") else indices, dtype=np.int64)
        weights = np.arange(1, ids.shape[-1] + 1, dtype=np.int64)
        sig = np.array([ids.shape[0], ids.shape[-1], ids.sum(), (ids * weights).sum() % (1 << 40),
                        ind.sum() % (1 << 40)], dtype=np.int64)
        sigs = []
        paddle.distributed.all_gather(sigs, paddle.to_tensor(sig), group=self.group)
        if any(not np.array_equal(s.numpy(), sig) for s in sigs):
            raise RuntimeError("context parallel: the ranks of one group got different batches "
                               f"(signatures {[s.numpy().tolist() for s in sigs]})")

    @contextlib.contextmanager
    def batch(self, attn_mask_startend_row_indices, config=None, input_ids=None):
        """Make the plan of this batch's GLOBAL indices active for the block (forward and backward)."""
        from paddle_flashmask.distributed import ContextParallelPlan

        from .llama_attention import normalize_indices

        if attn_mask_startend_row_indices is None:
            raise ValueError("context parallel needs attn_mask_startend_row_indices in the batch (flash_mask=true)")
        ind = attn_mask_startend_row_indices
        if not isinstance(ind, paddle.Tensor):
            ind = paddle.to_tensor(ind)
        ind, causal = normalize_indices(ind, config)
        if input_ids is not None and self.degree > 1:
            self._check_same_batch(input_ids, ind)
        seq_len = int(ind.shape[2])
        plan = ContextParallelPlan(ind, causal, self.degree, method=self.method)
        prev = _ACTIVE["batch"]
        _ACTIVE["batch"] = ActiveBatch(plan, self.rank, self.group, ind, causal, seq_len)
        try:
            yield _ACTIVE["batch"]
        finally:
            _ACTIVE["batch"] = prev


# ---------------------------------------------------------------------------------------------
# model side


def _local_inputs(batch: ActiveBatch, input_ids, position_ids):
    """This rank's rows of input_ids / position_ids (global position ids made if none given)."""
    if input_ids is None or input_ids.shape[1] != batch.seq_len:
        raise ValueError(f"context parallel: expected the global input_ids [B, {batch.seq_len}], got "
                         f"{None if input_ids is None else list(input_ids.shape)}")
    if position_ids is None:
        B = input_ids.shape[0]
        position_ids = paddle.arange(batch.seq_len, dtype="int64").expand([B, batch.seq_len])
    return batch.shard(input_ids), batch.shard(position_ids)


def _set_forward(layer, forward):
    # object.__setattr__: PaddleNLP's PretrainedModel.__setattr__ would treat a function set as
    # ``forward`` as an unbound patch (and call it with self)
    setattr(forward, _PATCHED, True)
    object.__setattr__(layer, "forward", forward)


def _wrap_backbone_forward(layer):
    orig = layer.forward
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def forward(*args, **kwargs):
        batch = active()
        if batch is None:
            return orig(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        a = bound.arguments
        if a.get("inputs_embeds") is not None:
            raise NotImplementedError("context parallel: pass input_ids, not inputs_embeds")
        if a.get("attention_mask") is not None:
            raise NotImplementedError("context parallel: dense attention masks are not supported; "
                                      "pass attn_mask_startend_row_indices (flash_mask=true)")
        a["input_ids"], a["position_ids"] = _local_inputs(batch, a.get("input_ids"), a.get("position_ids"))
        return orig(*bound.args, **bound.kwargs)

    _set_forward(layer, forward)


def _wrap_rotary_forward(rot):
    orig = rot.forward

    @functools.wraps(orig)
    def forward(x=None, seq_len=None, *args, **kwargs):
        batch = active()
        # PaddleNLP slices the table to the local length; the sharded position ids go up to S - 1
        if batch is not None and seq_len is not None:
            seq_len = max(int(seq_len), batch.seq_len)
        if x is None:
            return orig(seq_len=seq_len, *args, **kwargs)
        return orig(x, seq_len, *args, **kwargs)

    _set_forward(rot, forward)


def _wrap_criterion_forward(crit):
    """``LlamaPretrainingCriterion`` on local logits and GLOBAL labels: token losses of all rows,
    then PaddleNLP's reduction (mean over tokens with loss > 0)."""
    orig = crit.forward

    @functools.wraps(orig)
    def forward(prediction_scores, masked_lm_labels):
        batch = active()
        if batch is None or prediction_scores.shape[1] == masked_lm_labels.shape[1]:
            return orig(prediction_scores, masked_lm_labels)
        if getattr(crit, "enable_parallel_cross_entropy", False):
            raise NotImplementedError("context parallel with tensor-parallel cross entropy")
        with paddle.amp.auto_cast(False):
            local = crit.loss_func(prediction_scores.astype("float32"), batch.shard(masked_lm_labels).unsqueeze(2))
            masked_lm_loss = batch.gather_tokens(local)
            binary_sequence = paddle.where(masked_lm_loss > 0, paddle.ones_like(masked_lm_loss),
                                           paddle.zeros_like(masked_lm_loss))
            count = paddle.sum(binary_sequence)
            if count == 0:
                return paddle.sum(masked_lm_loss * binary_sequence)
            return paddle.sum(masked_lm_loss * binary_sequence) / count

    _set_forward(crit, forward)


def enable_context_parallel(model):
    """Prepare a (possibly wrapped: LoRA, fleet) LLaMA model for :meth:`ContextParallel.batch`.
    Idempotent; outside an active batch the model behaves as before. Returns ``model``."""
    from paddlenlp.transformers.llama import modeling as llama_modeling

    if getattr(model.config if hasattr(model, "config") else None, "use_fused_linear_cross_entropy", False):
        raise NotImplementedError("context parallel: use_fused_linear_cross_entropy is not supported")
    found = False
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, llama_modeling.LlamaModel) and not getattr(layer.forward, _PATCHED, False):
            _wrap_backbone_forward(layer)
        if isinstance(layer, llama_modeling.LlamaModel):
            found = True
        if isinstance(layer, llama_modeling.LlamaAttention):
            rot = getattr(layer, "rotary_emb", None)
            if rot is not None and not getattr(rot.forward, _PATCHED, False):
                _wrap_rotary_forward(rot)
        if isinstance(layer, llama_modeling.LlamaPretrainingCriterion) and not getattr(layer.forward, _PATCHED, False):
            _wrap_criterion_forward(layer)
    if not found:
        raise TypeError("enable_context_parallel: no paddlenlp LlamaModel inside this model")
    return model


# ---------------------------------------------------------------------------------------------
# DPO


def dpo_logps(criterion, logits, chosen_labels, rejected_labels, response_indexs, average_log_prob, batch):
    """``DPOCriterion.dpo_logps`` (its plain-logits path) on local logits: the token log-probs of
    all rows are gathered first, then the per-answer sums are PaddleNLP's, on every rank."""
    cfg = criterion.config
    if getattr(cfg, "use_fused_head_and_loss_fn", False) or getattr(cfg, "use_sparse_head_and_loss_fn", False):
        raise NotImplementedError("context parallel: fused/sparse DPO heads are not supported")
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    elif hasattr(logits, "logits"):
        logits = logits.logits
    labels = batch.shard(chosen_labels + rejected_labels)
    local = -criterion.logprobs(logits.astype("float32"), labels.unsqueeze(2)).squeeze(2)
    per_token_logps = batch.gather_tokens(local)  # [B, S]
    if len(response_indexs.shape) == 3:
        response_indexs = response_indexs[0]
    offset = 1 if criterion.ignore_eos_token else 0

    def span(ri, start, end):
        row = paddle.gather(per_token_logps, ri[0], axis=0)
        return paddle.gather(row, paddle.arange(start, end, dtype=paddle.int32), axis=0).sum()

    chosen_logps = paddle.stack([span(ri, ri[1], ri[2]) for ri in response_indexs], axis=0)
    rejected_logps = paddle.stack([span(ri, ri[2] + offset, ri[3]) for ri in response_indexs], axis=0)
    sft_loss = -chosen_logps.sum() / (chosen_labels != 0).sum()
    if average_log_prob:
        chosen_logps /= (response_indexs[:, 2] - response_indexs[:, 1] - offset).astype("float32")
        rejected_logps /= (response_indexs[:, 3] - response_indexs[:, 2]).astype("float32")
    return chosen_logps, rejected_logps, sft_loss * criterion.dpo_config.sft_loss_ratio
