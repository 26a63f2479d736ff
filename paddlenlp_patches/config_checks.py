"""Type and range checks of the fine-tune runner's own keys and the DPO keys, before anything
is built: each raises a ValueError naming the key and what it takes. Without them a string
"false" read as true, a float truncated to an int (``lora_alpha`` 0.5 -> 0: nothing trained),
and a bad DPO value failed deep in Paddle after both models had run."""

from __future__ import annotations

from numbers import Real
from typing import Any, Dict

BOOL_KEYS = ("use_flash_attention", "flash_mask", "zero_padding", "greedy_zero_padding", "lora", "save_final_model")
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
    targets = opts["lora_target_modules"]
    if targets is not None and (not isinstance(targets, (list, tuple)) or not targets
                                or not all(isinstance(t, str) and t for t in targets)):
        raise ValueError("lora_target_modules must be a non-empty list of regexes (or null: the attention "
                         f"projections), got {targets!r}")


def check_dpo_options(dpo: Dict[str, Any]) -> None:
    for key in DPO_NUMBER_KEYS:
        if not _is_number(dpo[key]):
            raise ValueError(f"{key} must be a number, got {dpo[key]!r}")
    if dpo["loss_type"] not in DPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {DPO_LOSS_TYPES}, got {dpo['loss_type']!r}")
    check_bool("reference_free", dpo["reference_free"])
    if not _is_int(dpo["ref_model_update_steps"]):
        raise ValueError(f"ref_model_update_steps must be an int (<= 0: never), got {dpo['ref_model_update_steps']!r}")


def check_padded_length(max_length: int, pad_to_multiple_of: int, max_positions) -> None:
    """Rows are padded up to a multiple of ``pad_to_multiple_of``: the padded length, not only
    ``max_length``, must fit the model's positions (past them the rotary table is read out of
    range, and the padding rows' NaN reached every weight while the logged loss looked fine)."""
    padded = -(-max_length // pad_to_multiple_of) * pad_to_multiple_of
    if max_positions is not None and padded > max_positions:
        raise ValueError(f"rows of max length {max_length} padded to a multiple of pad_to_multiple_of="
                         f"{pad_to_multiple_of} reach {padded} tokens, past the model's "
                         f"max_position_embeddings {max_positions}")
