"""PaddleNLP Trainer subclasses used by the runner: SFT/LoRA, DPO and reward model.

All of them log, next to PaddleNLP's ``loss`` (the mean over all ranks), ``tokens_per_second``
(real, non-padding tokens of all ranks since the previous log, from the collators'
``_num_real_tokens``) and ``peak_memory_MB`` (peak device memory allocated on GPU, peak process
RSS on CPU; rank 0). Each rank also keeps its own per-micro-batch losses (``local_losses()``).

``context_parallel=ContextParallel(...)`` (:mod:`paddlenlp_patches.context_parallel`) makes each
training/eval step run under that batch's plan (forward and backward); the ranks of a group see
the same batches (the one-process sampler when there is no data parallel, so the loss curve is the
one-process one; with data parallel, PaddleNLP's distributed sampler over the data-parallel ranks
only, ``dataset_rank`` / ``dataset_world_size``, so each replica gets the batches it would get in
a data-parallel run without context parallel) and count their tokens once. Gradients are summed
over the group by fleet's hybrid optimizer (``fused_allreduce_gradients``: one all-reduce sum
over the dp x sep group, scaled by 1 / dp degree, i.e. sum over ``sep``, mean over data parallel).
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time

import paddle
from paddlenlp.trainer import Trainer, TrainerCallback
from paddlenlp.trl import DPOCriterion, DPOTrainer

from . import checkpoint, context_parallel
from .collators import NUM_TOKENS_KEY


def peak_memory_mb() -> float:
    """Peak device memory allocated (GPU) or peak resident set size of this process (CPU)."""
    if paddle.device.is_compiled_with_cuda() and paddle.device.get_device().startswith("gpu"):
        return paddle.device.cuda.max_memory_allocated() / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def _world_sum(x: float) -> float:
    if paddle.distributed.get_world_size() <= 1:
        return x
    t = paddle.to_tensor([x], dtype="float64")
    paddle.distributed.all_reduce(t)
    return float(t.numpy()[0])


class FlashmaskTrainerMixin:
    """Counts real tokens per batch and adds tokens/s and peak memory to every training log;
    runs each step under its context-parallel plan when ``context_parallel`` is given."""

    def __init__(self, *args, context_parallel=None, **kwargs):
        self.pfm_context_parallel = context_parallel
        super().__init__(*args, **kwargs)

    def _pfm_cp_batch(self, inputs):
        cp = getattr(self, "pfm_context_parallel", None)
        if cp is None:
            return contextlib.nullcontext()
        return cp.batch(inputs.get("attn_mask_startend_row_indices"), config=getattr(self.model, "config", None),
                        input_ids=inputs.get("input_ids"))

    def training_step(self, model, inputs, *args, **kwargs):
        # the plan stays active through the backward (recompute re-runs attention there)
        with self._pfm_cp_batch(inputs):
            loss = super().training_step(model, inputs, *args, **kwargs)
        # this rank's own loss (PaddleNLP logs the mean over all ranks), kept as a tensor (no
        # device sync per step): see local_losses()
        if isinstance(loss, paddle.Tensor):
            self._pfm_local_losses = getattr(self, "_pfm_local_losses", [])
            self._pfm_local_losses.append((self.state.global_step + 1, loss))
        return loss

    def local_losses(self):
        """This rank's loss of every micro-batch of the last ``train()``: ``[(step, loss)]`` (with
        gradient accumulation each is already divided by the number of micro-batches)."""
        return [(step, float(loss.astype("float64"))) for step, loss in getattr(self, "_pfm_local_losses", [])]

    def prediction_step(self, model, inputs, *args, **kwargs):
        with self._pfm_cp_batch(inputs):
            return super().prediction_step(model, inputs, *args, **kwargs)

    def _get_train_sampler(self):
        cp = getattr(self, "pfm_context_parallel", None)
        if cp is not None and self.args.dataset_world_size <= 1 and self.train_dataset is not None:
            # context parallel only: the one-process sampler (np.random is seeded alike on every
            # rank of the group; ContextParallel.batch checks that they agree), so the batches and
            # the loss curve are those of one process
            return paddle.io.BatchSampler(dataset=self.train_dataset, shuffle=True,
                                          batch_size=self.args.per_device_train_batch_size,
                                          drop_last=self.args.dataloader_drop_last)
        return super()._get_train_sampler()

    def _prepare_inputs(self, inputs):
        n = inputs.pop(NUM_TOKENS_KEY, None)
        cp = getattr(self, "pfm_context_parallel", None)
        if cp is not None and cp.rank != 0:
            n = None  # every rank of a context-parallel group holds the same batch: count it once
        if n is not None and self.model.training:
            n = int(n.sum()) if hasattr(n, "sum") else int(sum(n))
            self._pfm_tokens = getattr(self, "_pfm_tokens", 0) + n
            self._pfm_total_tokens = getattr(self, "_pfm_total_tokens", 0) + n
        return super()._prepare_inputs(inputs)

    def log(self, logs, **kwargs):
        if "loss" in logs:
            now = time.time()
            last = getattr(self, "_pfm_last_log", None) or getattr(self, "_pfm_train_start", now)
            tokens = _world_sum(float(getattr(self, "_pfm_tokens", 0)))
            if tokens and now > last:
                logs["tokens_per_second"] = round(tokens / (now - last), 1)
            logs["peak_memory_MB"] = round(peak_memory_mb(), 1)
            self._pfm_tokens = 0
            self._pfm_last_log = now
        return super().log(logs, **kwargs)

    def train(self, *args, **kwargs):
        self._pfm_train_start = time.time()
        self._pfm_last_log = None
        self._pfm_local_losses = []
        out = super().train(*args, **kwargs)
        self.pfm_train_seconds = time.time() - self._pfm_train_start
        self.pfm_train_tokens = _world_sum(float(getattr(self, "_pfm_total_tokens", 0)))
        return out


class FlashmaskTrainer(FlashmaskTrainerMixin, Trainer):
    """SFT / LoRA: the model computes the loss from pre-shifted ``labels``."""


class FlashmaskDPOTrainer(FlashmaskTrainerMixin, DPOTrainer):
    """``paddlenlp.trl.DPOTrainer`` without its reference-model wrapping.

    ``DPOTrainer._wrap_ref_model`` calls ``paddle.amp.decorate`` + ``fleet.distributed_model``,
    which fails without ``fleet.init`` (CPU, single process) and, after ``fleet.init`` on one
    process, wraps in a pipeline container that asserts. The reference model only runs under
    ``no_grad`` (each rank on its own shard), so it needs no distributed wrapper.
    """

    def __init__(self, *args, dpo_criterion=None, **kwargs):
        if dpo_criterion is None:
            model = kwargs.get("model", args[0] if args else None)
            dpo_config = kwargs.get("dpo_config")
            dpo_criterion = ContextParallelDPOCriterion(model.config, dpo_config=dpo_config,
                                                        ignore_eos_token=kwargs.get("ignore_eos_token", False))
        super().__init__(*args, dpo_criterion=dpo_criterion, **kwargs)

    def _wrap_ref_model(self, model):
        model.eval()
        return model


class ContextParallelDPOCriterion(DPOCriterion):
    """PaddleNLP's DPO criterion; under an active context-parallel plan the local logits' token
    log-probs are gathered over the group first (identical DPO loss on every rank)."""

    def dpo_logps(self, logits, chosen_labels, rejected_labels, response_indexs, average_log_prob=False):
        batch = context_parallel.active()
        if batch is None:
            return super().dpo_logps(logits, chosen_labels, rejected_labels, response_indexs, average_log_prob)
        return context_parallel.dpo_logps(self, logits, chosen_labels, rejected_labels, response_indexs,
                                          average_log_prob, batch)


class RewardTrainer(FlashmaskTrainerMixin, Trainer):
    """Pairwise reward-model training; logs the pairwise accuracy next to the loss: correct pairs
    over pairs (batches hold different numbers of pairs, so a mean of the batches' figures would
    weigh a pair by its batch). Training logs count this rank's pairs since the last log; an
    evaluation counts every rank's, and its loss is the mean over pairs too (PaddleNLP's loop
    weighs each batch by its rows)."""

    def _pair_counts(self):
        """``{"train" | "eval": [correct pairs, pairs, loss summed over pairs]}`` since the last
        log (the loss is summed in evaluation only: no extra read-back a training step)."""
        if not hasattr(self, "_pfm_pairs"):
            self._pfm_pairs = {"train": [0, 0, 0.0], "eval": [0, 0, 0.0]}
        return self._pfm_pairs

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, r_c, r_r = model(**inputs)
        counts = self._pair_counts()["train" if model.training else "eval"]
        pairs = int(r_c.size)
        counts[0] += int((r_c > r_r).astype("int64").sum())
        counts[1] += pairs
        if not model.training:
            counts[2] += float(loss) * pairs
        return (loss, (r_c, r_r)) if return_outputs else loss

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval", max_eval_iters=-1):
        counts = self._pair_counts()
        counts["eval"] = [0, 0, 0.0]
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                         metric_key_prefix, max_eval_iters)
        correct, pairs, loss_sum = counts["eval"]
        mine = paddle.to_tensor([[loss_sum, float(pairs), float(correct)]], dtype="float64")
        # every rank runs the loop, so every rank gathers (context-parallel ranks repeat the same
        # pairs, which scales both sums alike)
        loss_sum, pairs, correct = (float(x) for x in self._nested_gather(mine).numpy().sum(axis=0))
        if pairs:
            output.metrics[f"{metric_key_prefix}_loss"] = loss_sum / pairs
            output.metrics[f"{metric_key_prefix}_accuracy"] = round(correct / pairs, 4)
        counts["eval"] = [0, 0, 0.0]  # counted: log() adds nothing
        return output

    def prediction_step(self, model, inputs, prediction_loss_only=False, ignore_keys=None):
        with self._pfm_cp_batch(inputs), paddle.no_grad():
            loss = self.compute_loss(model, self._prepare_inputs(inputs))
        return loss.detach(), None, None

    def log(self, logs, **kwargs):
        counts = self._pair_counts()
        key = "train" if "loss" in logs else "eval"
        correct, pairs, _ = counts[key]
        if pairs:
            logs[("" if key == "train" else "eval_") + "accuracy"] = round(correct / pairs, 4)
            counts[key] = [0, 0, 0.0]
        return super().log(logs, **kwargs)


class RunMarker(TrainerCallback):
    """Writes the run's stage and LoRA flag into each checkpoint it saves (checkpoint.RUN_FILE),
    so that resuming it from another stage is an error."""

    def __init__(self, stage: str, lora: bool):
        self.stage, self.lora = stage, lora

    def on_save(self, args, state, control, **kwargs):
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if state.is_world_process_zero and os.path.isdir(path):
            checkpoint.write_run_marker(path, self.stage, self.lora)


class LossHistory(TrainerCallback):
    """Collects every logged dict (PaddleNLP's ``Trainer.log`` empties ``state.log_history``)."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.logs.append(dict(logs, step=state.global_step))

    def losses(self):
        return [(d["step"], d["loss"]) for d in self.logs if "loss" in d]
