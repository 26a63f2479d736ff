"""jsonl readers, validation and tokenization into per-example records (PaddleNLP's formats).

Formats (one JSON object per line; PaddleNLP names its files ``train.json``/``dev.json``):

- SFT / LoRA: ``{"src": str | [str, ...], "tgt": str | [str, ...]}``. Lists are rounds of one
  conversation (same length); every ``tgt`` is trained on, every ``src`` is masked out.
- DPO / RM: PaddleNLP's ``{"src": str | [...], "tgt": str | [...], "response": [a, b],
  "sort": [sa, sb]}`` (``len(src) == len(tgt) + 1``; the response with the larger ``sort`` is
  chosen), or ``{"prompt": str, "chosen": str, "rejected": str}``.

Every error names ``file:line``. An answer that is empty after ``strip()`` is an error (it would
give a document with no loss tokens / no reward token).

Lengths are counted in tokens including BOS/EOS. An example longer than the limit
(``max_length`` for SFT, ``max_seq_len`` for DPO/RM) follows ``on_overflow``:

- ``"truncate"`` (default, PaddleNLP's behaviour): drop the oldest rounds of a conversation
  first; then keep the last ``src_length`` / ``max_prompt_len`` prompt tokens (left
  truncation); then cut the answer(s) on the right (DPO/RM: in proportion to their lengths,
  at least one token each). A cut answer loses its EOS; its labels stay the true next tokens.
- ``"error"``: raise :class:`DataFormatError`.
- ``"skip"``: drop the example (the caller logs how many).

Records (plain lists; positions, indices and response indexes are relative to the record):

- SFT: ``input_ids``, ``labels`` (pre-shifted: ``labels[t]`` is the target of ``input_ids[t]``,
  -100 on prompt tokens), ``attn_mask_startend_row_indices`` (``[L] * L``).
- DPO (PaddleNLP ``preprocess_preference_data`` layout): prompt without its last token, then
  chosen and rejected, each starting with that last prompt token; ``position_ids`` restart at the
  prompt length for rejected; ``chosen_labels``/``rejected_labels`` (0 = ignored);
  ``response_indexs = [[chosen_start, rejected_start, rejected_end]]``; share-question indices.
- RM (PaddleNLP ``llm/alignment/rm/flashmask`` layout): prompt, chosen + EOS, rejected + EOS;
  ``response_indexs = [[chosen_last, rejected_last]]``; share-question indices.
"""

from __future__ import annotations

import json
import math
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

from .config_checks import check_positive_int

logger = logging.getLogger("paddlenlp_patches")

OVERFLOW_POLICIES = ("truncate", "error", "skip")


class DataFormatError(ValueError):
    """A data file or example does not match the expected format."""


# --------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------


def resolve_data_file(path: str, split: str = "train") -> str:
    """A file path as is; a directory -> ``{split}.json`` or ``{split}.jsonl`` inside it."""
    if os.path.isdir(path):
        for name in (f"{split}.json", f"{split}.jsonl"):
            cand = os.path.join(path, name)
            if os.path.isfile(cand):
                return cand
        raise FileNotFoundError(f"no {split}.json or {split}.jsonl in directory {path}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    return path


def read_jsonl(path: str) -> List[Tuple[str, dict]]:
    """``[(where, example), ...]`` with ``where = "file:line"``; blank lines are skipped."""
    out = []
    with open(path, "rb") as f:  # decoded line by line, so a bad byte is reported with its line
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{where}: invalid JSON ({e.msg})") from None
            if not isinstance(ex, dict):
                raise DataFormatError(f"{where}: each line must be a JSON object, got {type(ex).__name__}")
            out.append((where, ex))
    if not out:
        raise DataFormatError(f"{path}: no examples")
    return out


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------


def _str_list(ex: dict, key: str, where: str) -> List[str]:
    if key not in ex:
        raise DataFormatError(f"{where}: missing field {key!r} (got fields {sorted(ex)})")
    v = ex[key]
    vals = [v] if isinstance(v, str) else v
    if not isinstance(vals, list) or not all(isinstance(s, str) for s in vals):
        raise DataFormatError(f"{where}: field {key!r} must be a string or a list of strings")
    return vals


def _nonempty(text: str, what: str, where: str) -> str:
    if not text.strip():
        raise DataFormatError(f"{where}: empty {what}")
    return text


def validate_sft(ex: dict, where: str) -> List[Tuple[str, str]]:
    """-> rounds ``[(src, tgt), ...]``."""
    srcs, tgts = _str_list(ex, "src", where), _str_list(ex, "tgt", where)
    if len(srcs) != len(tgts) or not srcs:
        raise DataFormatError(f"{where}: 'src' and 'tgt' must have the same non-zero number of rounds, "
                              f"got {len(srcs)} and {len(tgts)}")
    for t in tgts:
        _nonempty(t, "answer ('tgt')", where)
    return list(zip(srcs, tgts))


def validate_preference(ex: dict, where: str) -> Tuple[List[Tuple[str, str]], str, str, str]:
    """-> ``(history_rounds, prompt, chosen, rejected)``."""
    if "prompt" in ex or "chosen" in ex or "rejected" in ex:
        for key in ("prompt", "chosen", "rejected"):
            if key not in ex:
                raise DataFormatError(f"{where}: missing field {key!r} (format prompt/chosen/rejected)")
            if not isinstance(ex[key], str):
                raise DataFormatError(f"{where}: field {key!r} must be a string")
        return ([], ex["prompt"], _nonempty(ex["chosen"], "chosen answer", where),
                _nonempty(ex["rejected"], "rejected answer", where))
    if not all(k in ex for k in ("src", "response", "sort")):
        missing = [k for k in ("src", "tgt", "response", "sort") if k not in ex]
        raise DataFormatError(f"{where}: missing field(s) {missing}: expected PaddleNLP's "
                              "src/tgt/response/sort or prompt/chosen/rejected")
    srcs = _str_list(ex, "src", where)
    tgts = _str_list(ex, "tgt", where) if "tgt" in ex else []
    if len(srcs) != len(tgts) + 1:
        raise DataFormatError(f"{where}: len(src) must be len(tgt) + 1, got {len(srcs)} and {len(tgts)}")
    resp, sort = ex["response"], ex["sort"]
    if (not isinstance(resp, list) or len(resp) != 2 or not all(isinstance(r, str) for r in resp)):
        raise DataFormatError(f"{where}: 'response' must be a list of 2 strings")
    if (not isinstance(sort, list) or len(sort) != 2
            or not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in sort)):
        # (json reads NaN and Infinity; a NaN compares false both ways and ordered the pair at random)
        raise DataFormatError(f"{where}: 'sort' must be a list of 2 finite numbers, got {sort!r}")
    if sort[0] == sort[1]:
        raise DataFormatError(f"{where}: the two 'sort' values must differ")
    chosen, rejected = (resp[0], resp[1]) if sort[0] > sort[1] else (resp[1], resp[0])
    return (list(zip(srcs[:-1], tgts)), srcs[-1], _nonempty(chosen, "chosen answer", where),
            _nonempty(rejected, "rejected answer", where))


# --------------------------------------------------------------------------------------
# tokenization
# --------------------------------------------------------------------------------------


class _Encoder:
    """``tokenizer.encode(text, add_special_tokens=...)["input_ids"]`` plus the special prefix
    (BOS for LLaMA-style tokenizers, nothing for others) that ``add_special_tokens`` adds."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.eos = int(tokenizer.eos_token_id)
        with_sp = self.ids("", True)
        self.prefix = with_sp if with_sp != self.ids("", False) else []

    def ids(self, text: str, special: bool) -> List[int]:
        out = self.tok.encode(text, add_special_tokens=special)
        out = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
        return [int(i) for i in out]

    def src(self, text: str) -> List[int]:
        return self.prefix + self.ids(text.strip(), False)

    def answer(self, text: str) -> List[int]:
        return self.ids(text.strip(), False)


def _check_policy(on_overflow: str):
    if on_overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"on_overflow must be one of {OVERFLOW_POLICIES}, got {on_overflow!r}")


def _overflow(on_overflow: str, where: str, n: int, limit: int, name: str) -> bool:
    """True -> truncate; False -> skip; raises for 'error'."""
    if on_overflow == "error":
        raise DataFormatError(f"{where}: example has {n} tokens, more than {name}={limit} "
                              "(set on_overflow to 'truncate' or 'skip')")
    return on_overflow == "truncate"


def _left_truncate(ids: List[int], n: int, prefix: List[int]) -> List[int]:
    """Keep the last ``n`` tokens of ``ids``, but keep its special prefix (BOS) in front."""
    if n >= len(ids):
        return ids
    if prefix and ids[: len(prefix)] == prefix and n > len(prefix):
        return prefix + ids[len(ids) - (n - len(prefix)):]
    return ids[len(ids) - n:]


def tokenize_sft(ex: dict, enc: _Encoder, max_length: int, src_length: int,
                 on_overflow: str = "truncate", where: str = "<example>") -> Optional[Dict[str, list]]:
    """One SFT record, or None when skipped (``on_overflow="skip"``)."""
    _check_policy(on_overflow)
    rounds = [(enc.src(s), enc.answer(t) + [enc.eos]) for s, t in validate_sft(ex, where)]
    total = sum(len(s) + len(t) for s, t in rounds)
    truncated = total > max_length
    if truncated:
        if not _overflow(on_overflow, where, total, max_length, "max_length"):
            return None
        while len(rounds) > 1 and total > max_length:
            total -= len(rounds[0][0]) + len(rounds[0][1])
            rounds = rounds[1:]
        if total > max_length:
            s, t = rounds[-1]
            s = _left_truncate(s, min(src_length, max_length - 1), enc.prefix)
            rounds[-1] = (s, t[: max_length - len(s)])
    ids: List[int] = []
    tgt_mask: List[int] = []
    for s, t in rounds:
        ids += s + t
        tgt_mask += [-100] * len(s) + t
    input_ids, labels = ids[:-1], tgt_mask[1:]
    if all(lab == -100 for lab in labels):
        raise DataFormatError(f"{where}: no answer token left to train on")
    L = len(input_ids)
    rec = {"input_ids": input_ids, "labels": labels, "attn_mask_startend_row_indices": [L] * L}
    if truncated:
        rec["_truncated"] = True
    return rec


def share_question_lts(prompt_len: int, chosen_len: int, rejected_len: int) -> List[int]:
    """Relative LTS of one prompt + two answers (rejected sees the prompt, not chosen)."""
    P, C, R = prompt_len, chosen_len, rejected_len
    return [P + C + R] * P + [P + C] * C + [P + C + R] * R


def _with_history(enc: _Encoder, history, prompt_ids: List[int], budget: int) -> List[int]:
    """Prepend earlier rounds (newest first) while the whole example stays within ``budget``."""
    for s, t in reversed(history):
        block = enc.src(s) + enc.answer(t) + [enc.eos]
        if len(prompt_ids) + len(block) > budget:
            break
        prompt_ids = block + prompt_ids
    return prompt_ids


def _fit_pair(enc: _Encoder, prompt: List[int], a: List[int], b: List[int], max_seq_len: int,
              max_prompt_len: int, where: str):
    """PaddleNLP's truncation: the prompt to its last ``max_prompt_len`` tokens, then both answers
    in proportion to their lengths (at least one token each)."""
    prompt = _left_truncate(prompt, max_prompt_len, enc.prefix)
    room = max_seq_len - len(prompt)
    la, lb = len(a), len(b)
    if la + lb > room:
        if room < 2:
            raise DataFormatError(f"{where}: max_seq_len={max_seq_len} leaves no room for the answers "
                                  f"after a {len(prompt)}-token prompt (lower max_prompt_len)")
        na = min(la, max(1, int(la / (la + lb) * room)))
        nb = min(lb, room - na)
        na = min(la, room - nb)
        a, b = a[:na], b[:nb]
    return prompt, a, b


def tokenize_dpo(ex: dict, enc: _Encoder, max_seq_len: int, max_prompt_len: int,
                 on_overflow: str = "truncate", where: str = "<example>") -> Optional[Dict[str, list]]:
    """One DPO record (PaddleNLP ``preprocess_preference_data`` layout), or None when skipped."""
    _check_policy(on_overflow)
    history, prompt, chosen, rejected = validate_preference(ex, where)
    p_full = enc.src(prompt)
    if not p_full:
        raise DataFormatError(f"{where}: empty prompt and the tokenizer adds no BOS: DPO needs a "
                              "prompt token to predict the first answer token from")
    # each answer starts with the last prompt token; its labels are the next tokens, then EOS
    c_full = p_full[-1:] + enc.answer(chosen)
    r_full = p_full[-1:] + enc.answer(rejected)
    c_lab = c_full[1:] + [enc.eos]
    r_lab = r_full[1:] + [enc.eos]
    prompt_ids = _with_history(enc, history, p_full, max_seq_len - len(c_full) - len(r_full) + 1)[:-1]
    n = len(prompt_ids) + len(c_full) + len(r_full)
    truncated = n > max_seq_len
    if truncated:
        if not _overflow(on_overflow, where, n, max_seq_len, "max_seq_len"):
            return None
        prompt_ids, c_full, r_full = _fit_pair(enc, prompt_ids, c_full, r_full, max_seq_len,
                                               max_prompt_len, where)
    P, C, R = len(prompt_ids), len(c_full), len(r_full)
    rec = {
        "input_ids": prompt_ids + c_full + r_full,
        "position_ids": list(range(P + C)) + list(range(P, P + R)),
        "chosen_labels": [0] * P + c_lab[:C] + [0] * R,
        "rejected_labels": [0] * (P + C) + r_lab[:R],
        "response_indexs": [[P, P + C, P + C + R]],
        "attn_mask_startend_row_indices": share_question_lts(P, C, R),
    }
    if truncated:
        rec["_truncated"] = True
    return rec


def tokenize_rm(ex: dict, enc: _Encoder, max_seq_len: int, max_prompt_len: int,
                on_overflow: str = "truncate", where: str = "<example>") -> Optional[Dict[str, list]]:
    """One reward-model record (PaddleNLP ``rm/flashmask`` layout), or None when skipped."""
    _check_policy(on_overflow)
    history, prompt, chosen, rejected = validate_preference(ex, where)
    c = enc.answer(chosen) + [enc.eos]
    r = enc.answer(rejected) + [enc.eos]
    prompt_ids = _with_history(enc, history, enc.src(prompt), max_seq_len - len(c) - len(r))
    n = len(prompt_ids) + len(c) + len(r)
    truncated = n > max_seq_len
    if truncated:
        if not _overflow(on_overflow, where, n, max_seq_len, "max_seq_len"):
            return None
        prompt_ids, c, r = _fit_pair(enc, prompt_ids, c, r, max_seq_len, max_prompt_len, where)
    P, C, R = len(prompt_ids), len(c), len(r)
    rec = {
        "input_ids": prompt_ids + c + r,
        "position_ids": list(range(P + C)) + list(range(P, P + R)),
        "response_indexs": [[P + C - 1, P + C + R - 1]],
        "attn_mask_startend_row_indices": share_question_lts(P, C, R),
    }
    if truncated:
        rec["_truncated"] = True
    return rec


_TOKENIZERS = {"sft": tokenize_sft, "lora": tokenize_sft, "dpo": tokenize_dpo, "rm": tokenize_rm}


def load_records(path: str, tokenizer, task: str, max_length: int, prompt_length: int,
                 on_overflow: str = "truncate", split: str = "train") -> List[Dict[str, list]]:
    """Read, validate and tokenize a jsonl file (or a directory's ``{split}.json``) for ``task``
    (sft/lora/dpo/rm). ``max_length``/``prompt_length`` are ``max_length``/``src_length`` for
    SFT and ``max_seq_len``/``max_prompt_len`` for DPO/RM."""
    if task not in _TOKENIZERS:
        raise ValueError(f"task must be one of {sorted(_TOKENIZERS)}, got {task!r}")
    check_positive_int("max_length", max_length)
    check_positive_int("prompt_length", prompt_length)
    if prompt_length >= max_length:
        raise ValueError(f"the prompt length limit ({prompt_length}) must be smaller than the total "
                         f"length limit ({max_length})")
    path = resolve_data_file(path, split)
    enc = _Encoder(tokenizer)
    fn = _TOKENIZERS[task]
    records, skipped, truncated = [], 0, 0
    for where, ex in read_jsonl(path):
        rec = fn(ex, enc, max_length, prompt_length, on_overflow, where)
        if rec is None:
            skipped += 1
        else:
            truncated += int(rec.pop("_truncated", False))
            records.append(rec)
    if truncated:
        logger.warning("%s: truncated %d example(s) longer than %d tokens (on_overflow='truncate')",
                       path, truncated, max_length)
    if skipped:
        logger.warning("%s: skipped %d example(s) longer than %d tokens (on_overflow='skip')",
                       path, skipped, max_length)
    if not records:
        raise DataFormatError(f"{path}: no usable examples")
    return records


def sequence_lengths(records: Sequence[Dict[str, list]]) -> List[int]:
    return [len(r["input_ids"]) for r in records]
