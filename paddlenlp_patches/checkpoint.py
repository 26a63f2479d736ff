"""Resuming a fine-tune: find the checkpoint and check it is whole before training starts.

PaddleNLP's and PaddleFormers' Trainers read a checkpoint piece by piece and, for a missing
piece, may start part of the state from scratch (PaddleFormers 1.2.0 without its
trainer_state.bin restarts at step 1 with no word) or fail deep inside, with a message about
a pickle or a tensor. A run resumed from a partial or corrupt checkpoint must stop with an
error that names the checkpoint and the piece, before any step runs.
"""

from __future__ import annotations

import json
import os
import re

# What a checkpoint of this runner holds (PaddleNLP 3.0.0b4 Trainer.save_model/_save_checkpoint):
# the trainer state, the optimizer and LR schedule, and one of the model weight files.
STATE_FILE = "trainer_state.json"
REQUIRED = ("optimizer.pdopt", "scheduler.pdparams")
WEIGHTS = ("model_state.pdparams", "lora_model_state.pdparams", "model.safetensors", "lora_model.safetensors")
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(output_dir: str):
    """The checkpoint-N directory with the largest N in output_dir, or None."""
    if not output_dir or not os.path.isdir(output_dir):
        return None
    steps = [(int(m.group(1)), name) for name in os.listdir(output_dir)
             if (m := _CHECKPOINT_DIR.match(name)) and os.path.isdir(os.path.join(output_dir, name))]
    return os.path.join(output_dir, max(steps)[1]) if steps else None


# What a checkpoint of PaddleFormers 1.2.0's Trainer holds in its default flex format: the pickled
# trainer state, the LR schedule, and model, optimizer and fp32 master weights each as a folder
# of one .metadata and .distcp shards; saved_signal_{rank} is written once a rank's save is done.
FLEX_STATE_FILE = "trainer_state.bin"
FLEX_REQUIRED = ("scheduler.pdparams",)
FLEX_STATE_DIRS = ("model_state", "optimizer_state", "master_weight")


def _load(path):
    import paddle

    return paddle.load(path)


def _check_loads(what, path, name):
    try:
        return _load(os.path.join(path, name))
    except Exception as e:  # a truncated or foreign file: Paddle's own errors vary
        raise ValueError(f"{what} is corrupt: {name} does not load ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None


def check_checkpoint(path: str) -> int:
    """Raise ValueError unless ``path`` is a whole checkpoint; returns its global step."""
    what = f"resume_from_checkpoint: {path}"
    if not os.path.isdir(path):
        raise ValueError(f"{what} is not a directory")
    state_path = os.path.join(path, STATE_FILE)
    if not os.path.isfile(state_path):
        raise ValueError(f"{what} is not a complete checkpoint: {STATE_FILE} is missing")
    try:
        with open(state_path, encoding="utf-8") as f:
            step = int(json.load(f)["global_step"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{what} is corrupt: {STATE_FILE} does not parse ({e})") from None
    weights = [w for w in WEIGHTS if os.path.isfile(os.path.join(path, w))]
    if not weights:
        raise ValueError(f"{what} is not a complete checkpoint: no model weights (one of {', '.join(WEIGHTS)})")
    missing = [r for r in REQUIRED if not os.path.isfile(os.path.join(path, r))]
    if missing:
        raise ValueError(f"{what} is not a complete checkpoint: {', '.join(missing)} missing")
    for name in [w for w in weights if w.endswith(".pdparams")] + list(REQUIRED):
        _check_loads(what, path, name)
    return step


def check_flex_checkpoint(path: str, world_size: int = 1) -> int:
    """Raise ValueError unless ``path`` is a whole PaddleFormers flex checkpoint written by
    ``world_size`` ranks; returns its global step."""
    what = f"resume_from_checkpoint: {path}"
    if not os.path.isdir(path):
        raise ValueError(f"{what} is not a directory")
    unfinished = [f"saved_signal_{r}" for r in range(world_size)
                  if not os.path.isfile(os.path.join(path, f"saved_signal_{r}"))]
    if unfinished:
        raise ValueError(f"{what} is not a complete checkpoint: its save did not finish "
                         f"({', '.join(unfinished)} missing)")
    missing = [n for n in (FLEX_STATE_FILE,) + FLEX_REQUIRED if not os.path.isfile(os.path.join(path, n))]
    missing += [d + "/" for d in FLEX_STATE_DIRS if not os.path.isdir(os.path.join(path, d))]
    if missing:
        raise ValueError(f"{what} is not a complete checkpoint: {', '.join(missing)} missing")
    state = _check_loads(what, path, FLEX_STATE_FILE)
    step = getattr(state, "global_step", None)
    if not isinstance(step, int):
        raise ValueError(f"{what} is corrupt: {FLEX_STATE_FILE} holds no trainer state with a global_step")
    for name in FLEX_REQUIRED:
        _check_loads(what, path, name)
    for folder in FLEX_STATE_DIRS:
        files = sorted(os.listdir(os.path.join(path, folder)))
        metadata = [f for f in files if f.endswith(".metadata")]
        shards = [f for f in files if f.endswith(".distcp")]
        if len(metadata) != 1 or not shards:
            raise ValueError(f"{what} is not a complete checkpoint: {folder}/ must hold one .metadata and its "
                             f".distcp shards, it holds {files}")
        for name in metadata + shards:
            _check_loads(what, path, os.path.join(folder, name))
    return step


def resolve_resume(resume_from_checkpoint, output_dir: str, check=check_checkpoint):
    """The checkpoint directory to resume from (checked by ``check``), or None to start fresh.

    ``True`` (or "true"/"last") takes the latest ``checkpoint-N`` in ``output_dir``.
    """
    value = resume_from_checkpoint
    if value in (None, False, "", "false", "False"):
        return None
    if value is True or (isinstance(value, str) and value.lower() in ("true", "last")):
        found = last_checkpoint(output_dir)
        if found is None:
            raise ValueError(f"resume_from_checkpoint: no checkpoint-N directory in output_dir {output_dir!r}")
        value = found
    if not isinstance(value, str):
        raise ValueError(f"resume_from_checkpoint must be a checkpoint directory or true, got {value!r}")
    check(value)
    return value


# The runner's stage and LoRA flag, written into each checkpoint it saves: PaddleNLP's own
# files do not say which stage wrote them, and a DPO run resumed from an SFT checkpoint of the
# same model "continued" from its step with no word.
RUN_FILE = "pfm_run.json"


def write_run_marker(path: str, stage: str, lora: bool) -> None:
    with open(os.path.join(path, RUN_FILE), "w", encoding="utf-8") as f:
        json.dump({"stage": stage, "lora": bool(lora)}, f)


def check_same_run(path: str, stage: str, lora: bool) -> None:
    """A checkpoint written by another stage (or with/without LoRA) is an error; one without a
    marker (written before markers, or by another tool) is taken as it is."""
    marker = os.path.join(path, RUN_FILE)
    if not os.path.isfile(marker):
        return
    try:
        with open(marker, encoding="utf-8") as f:
            wrote = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"checkpoint {path}: unreadable {RUN_FILE} ({e})") from None
    if (wrote.get("stage"), bool(wrote.get("lora"))) != (stage, bool(lora)):
        raise ValueError(f"checkpoint {path} was written by a {wrote.get('stage')} run"
                         f"{' with LoRA' if wrote.get('lora') else ''}; this run is {stage}"
                         f"{' with LoRA' if lora else ''}: resume a checkpoint of the same stage, or start "
                         "from its saved model with model_name_or_path")
