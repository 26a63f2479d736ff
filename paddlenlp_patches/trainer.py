"""PaddleNLP Trainer subclasses used by the runner: SFT/LoRA, DPO and reward model.

All of them log, next to PaddleNLP's ``loss``, ``tokens_per_second`` (real, non-padding tokens of
all ranks since the previous log, from the collators' ``_num_real_tokens``) and
``peak_memory_MB`` (peak device memory allocated on GPU, peak process RSS on CPU; rank 0).
"""

from __future__ import annotations

import resource
import sys
import time

import paddle
from paddlenlp.trainer import Trainer, TrainerCallback
from paddlenlp.trl import DPOTrainer

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
    """Counts real tokens per batch and adds tokens/s and peak memory to every training log."""

    def _prepare_inputs(self, inputs):
        n = inputs.pop(NUM_TOKENS_KEY, None)
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

    def _wrap_ref_model(self, model):
        model.eval()
        return model


class RewardTrainer(FlashmaskTrainerMixin, Trainer):
    """Pairwise reward-model training; logs the pairwise accuracy next to the loss."""

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, r_c, r_r = model(**inputs)
        acc = float((r_c > r_r).astype("float32").mean())
        key = "train" if model.training else "eval"
        self._pfm_acc = getattr(self, "_pfm_acc", {"train": [], "eval": []})
        self._pfm_acc[key].append(acc)
        return (loss, (r_c, r_r)) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only=False, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with paddle.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs, **kwargs):
        accs = getattr(self, "_pfm_acc", {"train": [], "eval": []})
        key = "train" if "loss" in logs else "eval"
        if accs[key]:
            logs[("" if key == "train" else "eval_") + "accuracy"] = round(sum(accs[key]) / len(accs[key]), 4)
            accs[key].clear()
        return super().log(logs, **kwargs)


class LossHistory(TrainerCallback):
    """Collects every logged dict (PaddleNLP's ``Trainer.log`` empties ``state.log_history``)."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.logs.append(dict(logs, step=state.global_step))

    def losses(self):
        return [(d["step"], d["loss"]) for d in self.logs if "loss" in d]
