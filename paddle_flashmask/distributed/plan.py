"""ContextParallelPlan: which query rows each rank of a context-parallel group holds.

The sequence is cut into chunks of ``chunk_size`` tokens; every rank gets about the same
number of tokens (at most 8% over the mean, for memory and the rest of the model) chosen
so that the attention work is balanced too: chunks go heaviest first to the least-loaded
rank that still has token room, then chunk moves and swaps from the busiest rank take
the remaining imbalance down. Work is counted in live 128 x 128 tiles (what the kernels
pay; ``workload.live_tiles_per_row``) and reported also as unmasked area. This is the scheme of Paddle's own
FlashMask context parallel, with the workload read exactly from the column intervals
(``workload.py``) instead of estimated from block summaries. All O(S); no dense mask.

A rank's rows are whole chunks in ascending order, so the map from a global row bound
to the rank's local rows is monotone; the kernels then see each column's masked rows as
intervals of local rows (``remap`` in ``attention``), exactly.
"""

from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np

from . import assignment, workload

METHODS = ("allgather", "ulysses")
LAYOUTS = ("auto", "chunks", "local")

# Chunk sizes tried, largest (best for the kernels' tiles) first; the plan takes the first
# that balances both counts within BALANCE_GOAL.
_CHUNK_SIZES = (2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)
BALANCE_GOAL = 1.05
TOKEN_SLACK = 0.08
TILE = 128  # the kernels' query/key tile edge, for the work model
# No rank above this many rows where the sequence allows it: the Hopper kernels take at
# most 2^19 query rows or keys per call (1M tokens on 2 ranks: exactly 2^19 each).
MAX_ROWS_PER_RANK = 1 << 19
# Chunks no smaller than this when the sequence allows 8 chunks a rank of it.
MIN_CHUNK = 128
# allgather: the "local" layout (stretches of rows per rank, cut at TILE rows) is taken
# instead of the spread chunks when its worst balance (tiles, area or tokens: the model's
# other layers pay per token) and its tiles are each at most this much worse than theirs. Masks whose keys lie near
# their rows (documents, answers, windows) then send peers few keys (keys_needed); chunks
# spread for balance reach every document and window.
LOCALITY_SLACK = 0.01


def _indices_numpy(startend_row_indices):
    if startend_row_indices is None:
        return None
    if hasattr(startend_row_indices, "numpy"):
        return np.asarray(startend_row_indices.numpy())
    return np.asarray(startend_row_indices)


def _is_positive_int(x) -> bool:
    """An int >= 1, not a bool (True would count as 1), a float or a string."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x >= 1


def mask_fingerprint(indices_np: Optional[np.ndarray], causal: bool, seqlen: int) -> str:
    """Short hash of a mask (shape, values, causal) to tell plans of different masks apart."""
    h = hashlib.sha256(f"{bool(causal)}:{int(seqlen)}".encode())
    if indices_np is not None:
        a = np.ascontiguousarray(indices_np, dtype=np.int32)
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _imbalance(per_rank):
    """Busiest rank over the mean; 1.0 (balanced) where every rank has none."""
    mean = per_rank.mean()
    return float(per_rank.max() / mean) if mean > 0 else 1.0


class ContextParallelPlan:
    """Which global query rows each rank of a context-parallel group holds.

    Args:
        startend_row_indices: the GLOBAL FlashMask indices ``[B, Hm, S, C]`` (paddle tensor
            or numpy; ``None`` for plain causal / full attention, then ``seqlen`` is needed).
        causal (bool): the ``causal`` flag of the attention calls.
        world_size (int): ranks of the context-parallel group.
        method (str): ``"allgather"`` (K/V exchanged, query rows stay) or ``"ulysses"``
            (all-to-all between sequence and heads).
        chunk_size (int, optional): tokens per chunk; default: the largest of 2048, 1024,
            ..., 1 that balances attention work and tokens within 5%.
        seqlen (int, optional): S, required when ``startend_row_indices`` is None.
        layout (str): ``"chunks"``: chunks spread over the ranks for balance; ``"local"``: one
            stretch of consecutive rows per rank, cut (at ``chunk_size``, default 128 rows) for
            equal tiles, then the lightest chunks (documents' first rows, padding) moved to even
            out the tokens and equal-length chunks swapped to even out the tiles again: the keys
            of a document, an answer or a window mostly stay on the rank of its rows, so the
            allgather method sends peers few keys; ``"auto"`` (default): local for allgather
            when its worst balance is within LOCALITY_SLACK of the chunks', else chunks (with
            an explicit ``chunk_size``: chunks).

    Attributes: ``seqlen``, ``world_size``, ``method``, ``causal``, ``chunk_size``,
    ``num_chunks``, ``chunk_owner`` (rank of every chunk; ranks hold at most 8% or one
    chunk over the mean token count), ``layout`` (``"chunks"`` or ``"local"``, as built), ``rank_tiles`` / ``tile_imbalance`` (live tiles), ``rank_work`` and
    ``rank_tokens`` (per rank), ``work_imbalance`` / ``token_imbalance`` (busiest rank
    over the mean), ``fingerprint`` (of the mask the plan was built for).
    """

    def __init__(self, startend_row_indices, causal, world_size, method="allgather", chunk_size=None,
                 seqlen=None, layout="auto"):
        from .. import validation

        self.causal = validation.check_flag("causal", causal)
        if not _is_positive_int(world_size):
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if seqlen is not None and not _is_positive_int(seqlen):
            raise ValueError(f"seqlen must be a positive int or None, got {seqlen!r}")
        self.world_size = int(world_size)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.method = method
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        idx = _indices_numpy(startend_row_indices)
        if idx is None:
            if seqlen is None:
                raise ValueError("seqlen is required when startend_row_indices is None")
            S = int(seqlen)
        else:
            if idx.ndim != 4:
                raise ValueError(f"startend_row_indices must be 4-D [B, Hm, S, C], got shape {idx.shape}")
            allowed = (1, 2) if self.causal else (2, 4)
            if idx.shape[3] not in allowed:
                raise ValueError(f"startend_row_indices last dim must be in {allowed} for causal={self.causal}, "
                                 f"got {idx.shape[3]}")
            if idx.dtype not in (np.int32, np.int64):
                raise TypeError(f"startend_row_indices must be int32 (or int64), got {idx.dtype}")
            S = int(idx.shape[2])
            if seqlen is not None and int(seqlen) != S:
                raise ValueError(f"seqlen {seqlen} disagrees with startend_row_indices' S = {S}")
            if idx.size == 0:
                raise ValueError(f"startend_row_indices must not be empty, got shape {idx.shape}")
            if idx.min() < 0 or idx.max() > S:
                raise ValueError(f"startend_row_indices values must lie in [0, {S}]")
            # start <= end where a column has both, as the op checks (a plan must not accept
            # what every rank's op call would then refuse)
            if (idx.shape[3] == 4 or (self.causal and idx.shape[3] == 2)) and np.any(idx[..., 0] > idx[..., 1]):
                raise ValueError("startend_row_indices: a lower band's start (LTS) lies after its end (LTE)")
            if idx.shape[3] == 4 and np.any(idx[..., 2] > idx[..., 3]):
                raise ValueError("startend_row_indices: an upper band's start (UTS) lies after its end (UTE)")
        if S < 1:
            raise ValueError(f"the sequence must hold at least one token, got S = {S}")
        if S < self.world_size:
            raise ValueError(f"cannot split S = {S} tokens over {self.world_size} ranks")
        self.seqlen = S
        self.indices_shape = None if idx is None else tuple(int(d) for d in idx.shape)
        self._indices_host = idx  # for keys_needed (allgather's exchange), read lazily
        self.fingerprint = mask_fingerprint(idx, self.causal, S)
        self.row_work = workload.unmasked_per_row(idx, self.causal, S)
        # what the kernels pay: live 128 x 128 tiles (a row block with a few global rows
        # visits every key block); the assignment balances this, and reports both
        self.row_tiles = workload.live_tiles_per_row(idx, self.causal, S, TILE)
        if chunk_size is not None:
            if not _is_positive_int(chunk_size):
                raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
            if -(-S // int(chunk_size)) < self.world_size:
                raise ValueError(f"chunk_size {chunk_size} leaves fewer than {self.world_size} chunks of "
                                 f"S = {S}: some rank would hold no rows")
            if layout != "local":
                self._build(int(chunk_size))
            elif not self._build(int(chunk_size), local=True):
                raise ValueError(f"layout='local' cannot cut S = {S} into {self.world_size} stretches of "
                                 f"whole {chunk_size}-row chunks within the token cap")
        elif layout == "chunks":
            self._choose_chunk_size()
        elif layout == "local":
            if not self._build(min(TILE, max(1, S // self.world_size)), local=True) and \
                    not self._build(1, local=True):  # single rows: W stretches of <= cap rows exist
                raise ValueError(f"layout='local' cannot cut S = {S} into {self.world_size} stretches")
        else:
            self._choose_layout()
        self._rows = [self._rows_of(r) for r in range(self.world_size)]
        self._device_cache = {}
        self._host_cache = {}  # per-rank layouts the methods derive from the mask (allgather's part slots)
        self._seen = {}  # rank -> bool [S]: key columns its rows attend to
        self._needed = {}  # (src, dst) -> keys_needed
        self._intervals = None  # workload.masked_intervals, computed at the first keys_needed

    # ---- construction -------------------------------------------------------
    def _build(self, chunk_size, local=False):
        """Spread chunks, or (``local``) stretches refined by moves and swaps; False when no
        stretch cut is possible."""
        S, W = self.seqlen, self.world_size
        self.chunk_size = chunk_size
        self.num_chunks = -(-S // chunk_size)
        starts = np.arange(self.num_chunks, dtype=np.int64) * chunk_size
        self.chunk_len = np.minimum(starts + chunk_size, S) - starts
        chunk_work = np.add.reduceat(self.row_work, starts).astype(np.float64)
        chunk_tiles = np.add.reduceat(self.row_tiles, starts)
        # Tokens a rank may hold: the mean plus TOKEN_SLACK (or one chunk, if more), so a
        # rank with a heavy chunk (global tokens) can hold fewer tokens than the others.
        # A token's non-attention cost (small against long rows) breaks ties between
        # empty chunks, so fully masked stretches spread too.
        fair = int(np.ceil(S / W / chunk_size)) * chunk_size  # the least a cap can be
        cap = max(min(int(np.ceil(S / W * (1 + TOKEN_SLACK))), MAX_ROWS_PER_RANK), fair)
        if local:
            # tiles balanced, tokens under the same cap as the chunks' (as assignment.spread does), then
            # the lightest chunks moved to even out the tokens and equal-length chunks swapped
            # to even out the tiles again: a few chunks leave their stretch
            weight = chunk_tiles + 1e-3 * self.chunk_len
            owner = assignment.stretches(weight, self.chunk_len, W, cap)
            if owner is None:
                return False
            owner = assignment.even_tokens(owner, weight, self.chunk_len, W)
            self.chunk_owner = assignment.swap_even_work(owner, weight, self.chunk_len, W)
        else:
            self.chunk_owner = assignment.spread(chunk_tiles + 1e-3 * self.chunk_len, self.chunk_len, W, cap)
        self.layout = "local" if local else "chunks"
        self.rank_work = np.bincount(self.chunk_owner, weights=chunk_work, minlength=W)
        self.rank_tiles = np.bincount(self.chunk_owner, weights=chunk_tiles, minlength=W)
        self.rank_tokens = np.bincount(self.chunk_owner, weights=self.chunk_len, minlength=W).astype(np.int64)
        self.work_imbalance = _imbalance(self.rank_work)
        self.token_imbalance = _imbalance(self.rank_tokens)
        # a mask that hides everything has no live tile: balanced in tiles, the tokens decide
        self.tile_imbalance = _imbalance(self.rank_tiles)
        return True

    def _score(self):
        return max(self.tile_imbalance, self.work_imbalance, self.token_imbalance)

    def _choose_layout(self):
        """Spread chunks (``_choose_chunk_size``); for allgather, the local layout instead
        when its worst count (tiles, area or tokens) and its tiles (what the attention
        kernels pay) are each within LOCALITY_SLACK of the chunks'."""
        self._choose_chunk_size()
        if self.method != "allgather":
            return
        chunk_size, worst, tiles = self.chunk_size, self._score(), self.tile_imbalance
        if self._build(min(TILE, max(1, self.seqlen // self.world_size)), local=True) and \
                self._score() <= worst + LOCALITY_SLACK and self.tile_imbalance <= tiles + LOCALITY_SLACK:
            return
        self._build(chunk_size)

    def _choose_chunk_size(self):
        best = None
        floor = min(MIN_CHUNK, max(1, self.seqlen // (8 * self.world_size)))
        for cs in _CHUNK_SIZES:
            if cs < floor or -(-self.seqlen // cs) < self.world_size:
                continue
            self._build(cs)
            score = max(self.tile_imbalance, self.work_imbalance, self.token_imbalance)
            if best is None or score < best[0] - 1e-9:
                best = (score, cs)
            if score <= BALANCE_GOAL:
                return
        self._build(best[1])

    def _rows_of(self, rank):
        chunks = np.flatnonzero(self.chunk_owner == rank)
        if chunks.size == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(c * self.chunk_size, c * self.chunk_size + self.chunk_len[c],
                                         dtype=np.int64) for c in chunks])

    # ---- queries --------------------------------------------------------------
    def _check_rank(self, rank):
        if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")
        return int(rank)

    def local_rows(self, rank) -> np.ndarray:
        """Sorted global token positions (int64) that ``rank`` holds."""
        return self._rows[self._check_rank(rank)].copy()

    def num_local_rows(self, rank) -> int:
        return int(self._rows[self._check_rank(rank)].size)

    def row_table(self, rank) -> np.ndarray:
        """int32 ``[num_chunks + 1]``: the rank's rows before each global chunk (last: all of them).

        ``row_table[c+1] - row_table[c]`` is chunk c's length when the rank holds it, else 0;
        the remap op turns a global row bound into a local one with it in O(1).
        """
        rank = self._check_rank(rank)
        held = np.where(self.chunk_owner == rank, self.chunk_len, 0)
        return np.concatenate([[0], np.cumsum(held)]).astype(np.int32)

    def owner_of_rows(self) -> np.ndarray:
        """Rank of every global row, int64 ``[S]``."""
        return np.repeat(self.chunk_owner, self.chunk_len)

    def position_in_rank(self) -> np.ndarray:
        """Position of every global row among its rank's rows, int64 ``[S]``."""
        pos = np.empty(self.seqlen, dtype=np.int64)
        for rows in self._rows:
            pos[rows] = np.arange(rows.size)
        return pos

    def _agreement_hash(self) -> int:
        """26 bits naming the mask, method and the rows of every rank (ranks compare sums)."""
        h = getattr(self, "_hash", None)
        if h is None:
            import zlib

            h = zlib.crc32(f"{self.fingerprint}:{self.chunk_size}:{self.method}".encode())
            h = zlib.crc32(np.ascontiguousarray(self.chunk_owner, dtype=np.int64).tobytes(), h) & 0x3FFFFFF
            self._hash = h
        return h

    def keys_needed(self, src, dst) -> np.ndarray:
        """Positions among ``src``'s rows (sorted int64) of the keys that ``dst``'s query rows
        attend to in some batch row and mask head: what the allgather method sends from src
        to dst (a key nobody there sees would be skipped by every tile anyway)."""
        return self._keys_needed(self._check_rank(src), self._check_rank(dst)).copy()

    def _keys_needed(self, src, dst):
        # cached, not copied: the exchange reads it at every call
        keys = self._needed.get((src, dst))
        if keys is None:
            seen = self._seen.get(dst)
            if seen is None:
                if self._intervals is None:  # shared by every destination
                    self._intervals = workload.masked_intervals(self._indices_host, self.causal, self.seqlen)
                seen = workload.columns_seen_by(self._indices_host, self.causal, self.seqlen, self._rows[dst],
                                                self._intervals)
                self._seen[dst] = seen
            keys = np.flatnonzero(seen[self._rows[src]]).astype(np.int64)
            self._needed[(src, dst)] = keys
        return keys

    def summary(self) -> str:
        return (f"ContextParallelPlan(S={self.seqlen}, world_size={self.world_size}, method={self.method}, "
                f"chunk_size={self.chunk_size}, chunks={self.num_chunks}"
                f", layout={self.layout}, busiest/mean: area "
                f"{self.work_imbalance:.3f}, tiles {self.tile_imbalance:.3f}, tokens {self.token_imbalance:.3f})")

    __repr__ = summary

    # ---- rows of [B, S, ...] tensors ---------------------------------------------
    def shard(self, x, rank):
        """``rank``'s rows of a ``[B, S, ...]`` numpy array or paddle tensor (axis 1)."""
        rows = self._rows[self._check_rank(rank)]
        _check_seq_axis(x, self.seqlen, "x")
        if isinstance(x, np.ndarray):
            return x[:, rows]
        from . import tensor_ops

        return tensor_ops.take_rows(x, rows)

    def unshard(self, parts: Sequence):
        """The ``[B, S, ...]`` whole from every rank's ``[B, L_r, ...]`` rows (list in rank order)."""
        parts = list(parts)
        if len(parts) != self.world_size:
            raise ValueError(f"unshard needs one part per rank ({self.world_size}), got {len(parts)}")
        for r, p in enumerate(parts):
            if len(p.shape) < 2 or int(p.shape[1]) != self._rows[r].size:
                raise ValueError(f"part {r} must be [B, {self._rows[r].size}, ...], got {list(p.shape)}")
            # the batch and trailing dims and the dtype of part 0: a float part cast into int32
            # rows, or parts of other batch sizes, would be truncated or fail inside numpy
            if list(p.shape[:1]) + list(p.shape[2:]) != list(parts[0].shape[:1]) + list(parts[0].shape[2:]):
                raise ValueError(f"part {r} has shape {list(p.shape)}: every part must be [B, L_r, ...] with "
                                 f"part 0's B and trailing dims ({list(parts[0].shape)})")
            if p.dtype != parts[0].dtype:
                raise ValueError(f"part {r} has dtype {p.dtype}, part 0 {parts[0].dtype}: the parts must share one")
        if all(isinstance(p, np.ndarray) for p in parts):
            out = np.empty((parts[0].shape[0], self.seqlen) + tuple(parts[0].shape[2:]), dtype=parts[0].dtype)
            for r, p in enumerate(parts):
                out[:, self._rows[r]] = p
            return out
        from . import tensor_ops

        return tensor_ops.merge_rows(parts, self._rows, self.seqlen)

    def _cached_index(self, key, build, place):
        # Index tensors reused by every call with this plan, uploaded once per place; ``build``
        # (returning the numpy array) runs only the first time.
        import paddle

        full_key = (key, str(place))
        t = self._device_cache.get(full_key)
        if t is None:
            array = build()
            t = paddle.to_tensor(np.ascontiguousarray(array), dtype=str(array.dtype), place=place)
            self._device_cache[full_key] = t
        return t


def _check_seq_axis(x, seqlen, name):
    shape = list(x.shape)
    if len(shape) < 2 or int(shape[1]) != seqlen:
        raise ValueError(f"{name} must be [B, S={seqlen}, ...] (the global sequence on axis 1), got {shape}")


def plan_for(startend_row_indices, causal, world_size, method="allgather", **kwargs) -> ContextParallelPlan:
    """Same as ``ContextParallelPlan(...)``; reads better at call sites that build one per batch."""
    return ContextParallelPlan(startend_row_indices, causal, world_size, method=method, **kwargs)
