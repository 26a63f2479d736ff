"""Packing of tokenized records into rows of at most ``max_length`` tokens (zero padding).

Same conventions as PaddleNLP's ``ZeroPaddingMapDataset``: a record carries its own relative
``attn_mask_startend_row_indices`` and ``response_indexs``; packing concatenates the token-level
fields and shifts those two by the record's offset in the row. Position ids restart at 0 in every
record (SFT records get ``range(L)``; preference records bring their own). Rows are not padded
here; the collators pad each batch.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

CONCAT_KEYS = ("input_ids", "labels", "position_ids", "chosen_labels", "rejected_labels")
OFFSET_KEYS = ("attn_mask_startend_row_indices",)


def pack_groups(lengths: Sequence[int], max_length: int, greedy: bool = True,
                buffer_size: int = 500) -> List[List[int]]:
    """Groups of record indices whose lengths sum to at most ``max_length``.

    ``greedy=False``: fill rows in data order, opening a new row when the next record does not
    fit. ``greedy=True``: first-fit decreasing inside consecutive windows of ``buffer_size``
    records (PaddleNLP's ``greedy_zero_padding`` also packs within a 500-record buffer), which
    leaves fewer padding tokens. Deterministic; rows keep data order inside a window.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    for i, n in enumerate(lengths):
        if n < 1 or n > max_length:
            raise ValueError(f"record {i} has {n} tokens; every record must have 1..{max_length} tokens")
    groups: List[List[int]] = []
    if not greedy:
        cur, used = [], 0
        for i, n in enumerate(lengths):
            if used + n > max_length:
                groups.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += n
        if cur:
            groups.append(cur)
        return groups
    for start in range(0, len(lengths), buffer_size):
        idx = list(range(start, min(start + buffer_size, len(lengths))))
        idx.sort(key=lambda i: -lengths[i])
        bins: List[List[int]] = []
        room: List[int] = []
        for i in idx:
            for b, r in enumerate(room):
                if lengths[i] <= r:
                    bins[b].append(i)
                    room[b] -= lengths[i]
                    break
            else:
                bins.append([i])
                room.append(max_length - lengths[i])
        groups.extend(sorted(b) for b in bins)
    return groups


def concat_records(records: Sequence[Dict[str, list]]) -> Dict[str, list]:
    """One packed row from records (offsets applied, ``doc_lens`` recorded)."""
    row: Dict[str, list] = {"doc_lens": []}
    keys = [k for k in CONCAT_KEYS if k in records[0]]
    for k in keys + list(OFFSET_KEYS) + ["response_indexs"]:
        row[k] = []
    off = 0
    for rec in records:
        n = len(rec["input_ids"])
        for k in keys:
            if len(rec[k]) != n:
                raise ValueError(f"record field {k!r} has {len(rec[k])} entries, input_ids has {n}")
            row[k].extend(rec[k])
        if "position_ids" not in rec:
            row.setdefault("position_ids", []).extend(range(n))
        row["attn_mask_startend_row_indices"].extend(v + off for v in rec["attn_mask_startend_row_indices"])
        row["response_indexs"].extend([v + off for v in ri] for ri in rec.get("response_indexs", []))
        row["doc_lens"].append(n)
        off += n
    return row


def pack_records(records: Sequence[Dict[str, list]], max_length: int, zero_padding: bool = True,
                 greedy: bool = True) -> List[Dict[str, list]]:
    """Rows for a map-style dataset: packed (``zero_padding``) or one record per row."""
    if not zero_padding:
        return [concat_records([r]) for r in records]
    lengths = [len(r["input_ids"]) for r in records]
    return [concat_records([records[i] for i in g]) for g in pack_groups(lengths, max_length, greedy)]
