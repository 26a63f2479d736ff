"""Type and range checks of the fine-tune runner's own keys and the DPO keys, before anything
is built: each raises a ValueError naming the key and what it takes. Without them a string
"false" read as true, a float truncated to an int (``lora_alpha`` 0.5 -> 0: nothing trained),
and a bad DPO value failed deep in Paddle after both models had run."""

from __future__ import annotations

import os
import re
from numbers import Real
from typing import Any, Dict

BOOL_KEYS = ("use_flash_attention", "flash_mask", "zero_padding", "greedy_zero_padding", "lora", "save_final_model")
PATH_KEYS = ("model_name_or_path", "tokenizer_name_or_path", "dataset_name_or_path", "train_dataset_path",
             "dev_dataset_path")
POSITIVE_INT_KEYS = ("max_length", "src_length", "max_seq_len", "max_prompt_len", "pad_to_multiple_of", "lora_rank")
DPO_NUMBER_KEYS = ("beta", "label_smoothing", "simpo_gamma", "dpop_lambda", "pref_loss_ratio", "sft_loss_ratio")
# PaddleNLP's DPOTrainer takes these; "or" and "simpo" use no reference model
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "kto_pair", "sppo_hard", "nca_pair", "dpop", "or", "simpo")
REFERENCE_FREE_LOSS_TYPES = ("or", "simpo")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def check_bool(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def check_positive_int(key: str, value) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{key} must be an int >= 1, got {value!r}")
    return value


def check_runner_options(opts: Dict[str, Any]) -> None:
    for key in BOOL_KEYS:
        check_bool(key, opts[key])
    for key in POSITIVE_INT_KEYS:
        check_positive_int(key, opts[key])
    alpha = opts["lora_alpha"]
    if alpha is not None and (not _is_number(alpha) or not alpha > 0):
        raise ValueError(f"lora_alpha must be a number > 0 (or null: 2 x lora_rank), got {alpha!r}")
    dropout = opts["lora_dropout"]
    if not _is_number(dropout) or not 0 <= dropout < 1:
        raise ValueError(f"lora_dropout must be a number in [0, 1), got {dropout!r}")
    for key in PATH_KEYS:
        if opts[key] is not None and (not isinstance(opts[key], str) or not opts[key]):
            raise ValueError(f"{key} must be a path string (or null), got {opts[key]!r}")
    targets = opts["lora_target_modules"]
    if targets is not None and (not isinstance(targets, (list, tuple)) or not targets
                                or not all(isinstance(t, str) and t for t in targets)):
        raise ValueError("lora_target_modules must be a non-empty list of regexes (or null: the attention "
                         f"projections), got {targets!r}")
    for pattern in targets or ():
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"lora_target_modules: {pattern!r} is not a regex ({e})") from None


def check_local_dir(what: str, path: str, instead: str) -> None:
    """``path`` is an existing local directory, else a FileNotFoundError naming ``what`` and what
    to pass ``instead``: the runners never download (a hub name went to the network)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{what} {path!r} is not a local directory (no downloads: {instead})")


def check_training_args(targs: Dict[str, Any]) -> None:
    """The TrainingArguments keys whose wrong types had failed deep inside PaddleNLP or Paddle with
    errors naming no key."""
    out = targs.get("output_dir")
    if not isinstance(out, str) or not out:
        raise ValueError(f"output_dir must be a path string, got {out!r}")
    if "seed" in targs and not _is_int(targs["seed"]):
        raise ValueError(f"seed must be an int, got {targs['seed']!r}")


def check_model_config(model_config, config_class) -> None:
    """``model_config`` (the random-init model's config dict) holds only ``config_class``'s own
    keys: LlamaConfig keeps any unknown keyword as an attribute nobody reads, so a typo
    (``num_hidden_layer``) silently built the default model (32 layers) instead."""
    if model_config is None:
        return
    if not isinstance(model_config, dict):
        raise ValueError(f"model_config must be a JSON object of {config_class.__name__} fields, got "
                         f"{model_config!r}")
    known = set(config_class().to_dict()) | set(getattr(config_class, "attribute_map", {}) or {})
    unknown = sorted(k for k in model_config if k not in known)
    if unknown:
        import difflib

        hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
        said = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
        raise ValueError(f"model_config: unknown {config_class.__name__} key(s) {said}")


def check_dpo_options(dpo: Dict[str, Any]) -> None:
    for key in DPO_NUMBER_KEYS:
        if not _is_number(dpo[key]):
            raise ValueError(f"{key} must be a number, got {dpo[key]!r}")
    check_dpo_ranges(dpo)
    if dpo["loss_type"] not in DPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {DPO_LOSS_TYPES}, got {dpo['loss_type']!r}")
    check_bool("reference_free", dpo["reference_free"])
    if not _is_int(dpo["ref_model_update_steps"]):
        raise ValueError(f"ref_model_update_steps must be an int (<= 0: never), got {dpo['ref_model_update_steps']!r}")


def check_training_length(max_steps, num_train_epochs) -> None:
    """Some training to do: ``max_steps`` an int (> 0, or < 0 to follow ``num_train_epochs``, a
    number > 0). Zero of both had "trained" nothing and saved the random model as a result, and
    ``max_steps: true`` ran one step."""
    if not _is_int(max_steps):
        raise ValueError(f"max_steps must be an int (> 0, or -1: num_train_epochs decides), got {max_steps!r}")
    if not _is_number(num_train_epochs):
        raise ValueError(f"num_train_epochs must be a number, got {num_train_epochs!r}")
    if max_steps == 0 or (max_steps < 0 and not num_train_epochs > 0):
        raise ValueError(f"nothing to train: max_steps={max_steps}, num_train_epochs={num_train_epochs} "
                         "(set max_steps > 0, or num_train_epochs > 0 with max_steps -1)")


def check_dpo_ranges(dpo: Dict[str, Any]) -> None:
    """The DPO numbers' ranges (both runners): values out of them trained without an error."""
    # beta scales the preference margin: 0 trains nothing, below 0 learns the reverse preference
    if not dpo["beta"] > 0:
        raise ValueError(f"beta must be > 0, got {dpo['beta']!r}")
    if not 0 <= dpo["label_smoothing"] <= 0.5:  # the share of preferences taken as flipped
        raise ValueError(f"label_smoothing must be in [0, 0.5], got {dpo['label_smoothing']!r}")
    for key in ("pref_loss_ratio", "sft_loss_ratio", "dpop_lambda"):
        if not dpo[key] >= 0:
            raise ValueError(f"{key} must be >= 0, got {dpo[key]!r}")


def check_padded_length(max_length: int, pad_to_multiple_of: int, max_positions) -> None:
    """Rows are padded up to a multiple of ``pad_to_multiple_of``: the padded length, not only
    ``max_length``, must fit the model's positions (past them the rotary table is read out of
    range, and the padding rows' NaN reached every weight while the logged loss looked fine)."""
    padded = -(-max_length // pad_to_multiple_of) * pad_to_multiple_of
    if max_positions is not None and padded > max_positions:
        raise ValueError(f"rows of max length {max_length} padded to a multiple of pad_to_multiple_of="
                         f"{pad_to_multiple_of} reach {padded} tokens, past the model's "
                         f"max_position_embeddings {max_positions}")
