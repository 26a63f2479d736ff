"""A character-level tokenizer with the slice of PaddleNLP's tokenizer API our data code uses.

PaddleNLP's own tokenizers need downloaded vocab files; the embedded configs use this one so a
fresh machine runs with no downloads. ``encode``/``__call__`` return ``{"input_ids": [...]}`` like
PaddleNLP (so PaddleNLP helpers such as ``paddlenlp.trl.preprocess_preference_data`` accept it),
``add_special_tokens=True`` prepends BOS, and ``chat_template`` is None.
"""

from __future__ import annotations

import json
import os
import string
from typing import Dict, Iterable, List

from .config_checks import check_local_dir

TOKENIZER_FILE = "char_tokenizer.json"
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
# printable ASCII without the whitespace other than space
DEFAULT_CHARS = "".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")


class CharTokenizer:
    """One id per character: ``<pad>=0, <s>=1, </s>=2, <unk>=3``, then the characters."""

    chat_template = None
    model_input_names = ["input_ids"]
    padding_side = "right"

    def __init__(self, chars: str = DEFAULT_CHARS):
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: chars must not repeat")
        self.chars = chars
        self._itos: List[str] = SPECIAL_TOKENS + list(chars)
        self._stoi: Dict[str, int] = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(chars)}
        self.pad_token, self.bos_token, self.eos_token, self.unk_token = SPECIAL_TOKENS
        self.pad_token_id, self.bos_token_id, self.eos_token_id, self.unk_token_id = 0, 1, 2, 3

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True, **_unused) -> Dict[str, List[int]]:
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer.encode expects a str, got {type(text).__name__}")
        ids = [self._stoi.get(c, self.unk_token_id) for c in text]
        if add_special_tokens:
            ids = [self.bos_token_id] + ids
        return {"input_ids": ids}

    __call__ = encode

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < len(SPECIAL_TOKENS):
                if not skip_special_tokens:
                    out.append(SPECIAL_TOKENS[i])
            elif i < self.vocab_size:
                out.append(self._itos[i])
        return "".join(out)

    def save_pretrained(self, save_directory: str) -> str:
        os.makedirs(save_directory, exist_ok=True)
        path = os.path.join(save_directory, TOKENIZER_FILE)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"type": "char", "chars": self.chars, "special_tokens": SPECIAL_TOKENS}, f)
        return path

    @classmethod
    def from_pretrained(cls, directory: str) -> "CharTokenizer":
        with open(os.path.join(directory, TOKENIZER_FILE), encoding="utf-8") as f:
            spec = json.load(f)
        if spec.get("type") != "char" or spec.get("special_tokens") != SPECIAL_TOKENS:
            raise ValueError(f"{directory}/{TOKENIZER_FILE} is not a CharTokenizer file")
        return cls(spec["chars"])


def load_tokenizer(name_or_path: str | None):
    """``None``/``"char"`` -> :class:`CharTokenizer`; a directory holding ``char_tokenizer.json``
    -> that CharTokenizer; another local directory -> ``paddlenlp.transformers.AutoTokenizer
    .from_pretrained`` (a PaddleNLP checkpoint). Anything else is refused (never downloads)."""
    if name_or_path in (None, "char"):
        return CharTokenizer()
    check_local_dir("tokenizer", name_or_path, "use 'char' or a local PaddleNLP checkpoint directory")
    if os.path.isfile(os.path.join(name_or_path, TOKENIZER_FILE)):
        return CharTokenizer.from_pretrained(name_or_path)
    from paddlenlp.transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path)
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer at {name_or_path} has no eos_token_id; the data layouts need one")
    return tok


def pad_token_id(tokenizer) -> int:
    """The id used for padding columns (their labels are always ignored): pad, else eos."""
    pid = getattr(tokenizer, "pad_token_id", None)
    return int(pid if pid is not None else tokenizer.eos_token_id)
