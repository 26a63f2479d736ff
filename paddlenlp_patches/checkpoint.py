"""Resuming a fine-tune: find the checkpoint and check it is whole before training starts.

PaddleNLP's Trainer reads a checkpoint piece by piece and, for a missing piece, may start
part of the state from scratch (or fail deep inside, with a message about a tensor).
A run resumed from a partial or corrupt checkpoint must stop with an error that names
the checkpoint and the piece, before any step runs.
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


def _load(path):
    import paddle

    return paddle.load(path)


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
        try:
            _load(os.path.join(path, name))
        except Exception as e:  # a truncated or foreign file: Paddle's own errors vary
            raise ValueError(f"{what} is corrupt: {name} does not load ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    return step


def resolve_resume(resume_from_checkpoint, output_dir: str):
    """The checkpoint directory to resume from (checked), or None to start fresh.

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
    check_checkpoint(value)
    return value
