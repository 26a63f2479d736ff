"""Collators: pad packed rows into a batch of numpy arrays the PaddleNLP Trainer feeds the model.

Every collator emits ``input_ids``, ``position_ids`` (int64 ``[B, S]``) and either
``attn_mask_startend_row_indices`` (int32 ``[B, 1, S]``, causal LTS form; the layout PaddleNLP's
own flashmask path also takes) when ``flash_mask=True``, or the equivalent dense ``attention_mask``
(bool ``[B, 1, S, S]``, True = attend; what PaddleNLP's zero padding builds without flashmask).

Padding: rows are padded to the longest row of the batch (rounded up to ``pad_to_multiple_of``).
The padding tokens form one extra causal document of their own (LTS = S), so no query row is
left without keys (no NaN even in attention kernels that lack a fully-masked-row guard), and no
real token sees a padding token. Padding labels are ignored (-100 for SFT, 0 for DPO as in
PaddleNLP).

``count_tokens=True`` adds ``_num_real_tokens`` (int64 ``[1]``, real tokens in the batch) for the
runner's tokens/s; :class:`paddlenlp_patches.trainer.FlashmaskTrainerMixin` pops it.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from .config_checks import check_positive_int

NUM_TOKENS_KEY = "_num_real_tokens"


def lts_to_dense(lts: np.ndarray) -> np.ndarray:
    """Dense causal keep mask ``[S, S]`` (row i attends column j iff ``j <= i < lts[j]``)."""
    S = lts.shape[0]
    i = np.arange(S)[:, None]
    j = np.arange(S)[None, :]
    return (j <= i) & (i < lts[None, :])


class _PackedCollator:
    label_keys: Sequence[str] = ()
    label_pad = -100

    def __init__(self, pad_token_id: int = 0, flash_mask: bool = True, pad_to_multiple_of: int = 1,
                 count_tokens: bool = False):
        self.pad_token_id = int(pad_token_id)
        self.flash_mask = bool(flash_mask)
        self.pad_to_multiple_of = check_positive_int("pad_to_multiple_of", pad_to_multiple_of)
        self.count_tokens = bool(count_tokens)

    def _seq_len(self, rows) -> int:
        S = max(len(r["input_ids"]) for r in rows)
        m = self.pad_to_multiple_of
        return -(-S // m) * m

    def __call__(self, rows: List[Dict[str, list]]) -> Dict[str, np.ndarray]:
        if not rows:
            raise ValueError("empty batch")
        B, S = len(rows), self._seq_len(rows)
        ids = np.full((B, S), self.pad_token_id, dtype=np.int64)
        pos = np.zeros((B, S), dtype=np.int64)
        lts = np.full((B, S), S, dtype=np.int32)
        labels = {k: np.full((B, S), self.label_pad, dtype=np.int64) for k in self.label_keys}
        for b, r in enumerate(rows):
            n = self._check_row(b, r)
            ids[b, :n] = r["input_ids"]
            pos[b, :n] = r["position_ids"]
            pos[b, n:] = np.arange(S - n)
            lts[b, :n] = r["attn_mask_startend_row_indices"]
            for k in self.label_keys:
                labels[k][b, :n] = r[k]
        batch: Dict[str, np.ndarray] = {"input_ids": ids, "position_ids": pos}
        batch.update(labels)
        if self.flash_mask:
            batch["attn_mask_startend_row_indices"] = lts[:, None, :]
        else:
            batch["attention_mask"] = np.stack([lts_to_dense(lts[b]) for b in range(B)])[:, None]
        batch.update(self._extra(rows))
        if self.count_tokens:
            batch[NUM_TOKENS_KEY] = np.array([sum(len(r["input_ids"]) for r in rows)], dtype=np.int64)
        return batch

    def _check_row(self, b: int, r) -> int:
        """Row b's length, its per-token fields all of it: numpy would broadcast a 1-entry labels
        list over the row, or fail naming no field."""
        fields = ("input_ids", "position_ids", "attn_mask_startend_row_indices") + tuple(self.label_keys)
        missing = [k for k in fields if k not in r]
        if missing:
            raise ValueError(f"row {b}: missing field(s) {missing} (a packed row has {list(fields)})")
        n = len(r["input_ids"])
        if n == 0:
            raise ValueError(f"row {b}: input_ids is empty")
        wrong = {k: len(r[k]) for k in fields[1:] if len(r[k]) != n}
        if wrong:
            raise ValueError(f"row {b}: per-token fields must be as long as input_ids ({n}), got {wrong}")
        return n

    def _extra(self, rows) -> Dict[str, np.ndarray]:
        return {}


class SFTCollator(_PackedCollator):
    """Packed (or one-example-per-row) SFT/LoRA batches: adds pre-shifted ``labels`` (-100 = ignored)."""

    label_keys = ("labels",)
    label_pad = -100


class DPOCollator(_PackedCollator):
    """DPO batches in ``paddlenlp.trl.DPOTrainer``'s format: ``chosen_labels``, ``rejected_labels``
    (0 = ignored) and ``response_indexs`` int64 ``[N, 4]`` = (row, chosen_start, rejected_start,
    rejected_end), one line per packed prompt/chosen/rejected triple."""

    label_keys = ("chosen_labels", "rejected_labels")
    label_pad = 0

    def _extra(self, rows):
        ri = [[b] + list(x) for b, r in enumerate(rows) for x in r["response_indexs"]]
        return {"response_indexs": np.asarray(ri, dtype=np.int64).reshape(-1, 4)}


class RMCollator(_PackedCollator):
    """Reward-model batches: ``response_indexs`` int64 ``[N, 3]`` = (row, chosen_last,
    rejected_last), the positions whose hidden states are scored."""

    def _extra(self, rows):
        ri = [[b] + list(x) for b, r in enumerate(rows) for x in r["response_indexs"]]
        return {"response_indexs": np.asarray(ri, dtype=np.int64).reshape(-1, 3)}


COLLATORS = {"sft": SFTCollator, "lora": SFTCollator, "dpo": DPOCollator, "rm": RMCollator}
