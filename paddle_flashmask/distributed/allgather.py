"""Context parallel by K/V exchange ("allgather"): query rows stay, keys travel.

Forward on rank r: its K/V go to the other ranks by ring shifts (rank r sends to r + d and
receives from r - d), the distances taken in groups, one all-to-all per group, all
started at once. Only the keys a destination's rows attend to travel
(``ContextParallelPlan.keys_needed``): with documents, answers or windows most keys stay
home. A group holds consecutive distances while the keys they bring fit one kernel call
(2^19 keys, the Hopper kernels' longest sequence), so few, large calls do the work. Where
group 0's keys fit beside the rank's own, one call takes both (``Spec.fused``: a part
costs a merge, a dQ sum and its own pass over the rows' O(L) work, which at 256K rows
outweigh a short transfer waited for); the other groups' parts follow as their keys arrive,
and the partial softmaxes merge exactly by their LSE. Backward: each group part's backward
(with the merged out/LSE), its dK/dV sent back to their owners at once, then the first
call's while they travel; every rank sums what it receives for its keys in a fixed order.
Each part reads the global mask through the remap op (local query rows, that part's key
columns), so tiles are skipped exactly as on one device. A group's keys are spaced out in
their call where neighbours see far-apart rows (``spacing``: zero padding slots that hide
every row), so no key block's summary spans rows none of its keys see. Any mask form, head
count, GQA.
"""

from __future__ import annotations

import os
import weakref

import numpy as np
from paddle.autograd import PyLayer

from ..long_sequence import sm90_max_seqlen
from . import comm, spacing, tensor_ops
from .spec import CallSpec

# Keys of one kernel call at most, on top of what the Hopper kernels take at the call's head
# dim (Spec.keys_per_part); tests and benchmarks set 1 for one ring distance per group.
KEYS_PER_PART = 1 << 19
# PADDLE_FLASHMASK_CP_SPARSE=0 sends every key to every rank (for comparisons).
SPARSE_EXCHANGE = os.environ.get("PADDLE_FLASHMASK_CP_SPARSE", "1") != "0"
# PADDLE_FLASHMASK_CP_SPACING=0 keeps a part's keys back to back (for comparisons).
SPACED_PARTS = os.environ.get("PADDLE_FLASHMASK_CP_SPACING", "1") != "0"
# PADDLE_FLASHMASK_CP_FUSE=0 keeps the own keys' call apart from group 0's (for comparisons).
FUSE_OWN = os.environ.get("PADDLE_FLASHMASK_CP_FUSE", "1") != "0"


class Spec(CallSpec):
    method = "allgather"

    def keys_per_part(self):
        """Keys of one kernel call at most: what the Hopper kernels take at this head dim."""
        return min(KEYS_PER_PART, sm90_max_seqlen(self.head_dim))

    def index(self, name, build):
        # the grouping (groups()) follows the head dim: cached per part size
        return super().index((self.keys_per_part(), name), build)

    def groups(self):
        """Ring distances in groups, the same on every rank: consecutive distances while the
        keys they bring the busiest receiver fit one kernel call (group 0 beside the rank's own
        keys when ``fused()``)."""
        return self._grouping()[0]

    def fused(self):
        """Whether group 0's keys join the rank's own in one kernel call (no merge, no dQ sum,
        one pass over the rows' O(L) work instead of two): when they fit beside the largest
        rank's own keys on every rank. Group 0's transfer is then waited for before the
        first forward instead of hidden under it."""
        return self._grouping()[1]

    def _grouping(self):
        key = ("groups", SPARSE_EXCHANGE, FUSE_OWN, self.keys_per_part())
        cache = self.plan._host_cache
        if key not in cache:
            W, cap = self.W, self.keys_per_part()
            # keys distance d brings its busiest receiver (every rank computes the same)
            need = [0] + [max(self.num_sent((r - d) % W, r) for r in range(W)) for d in range(1, W)]
            own = max(self.own_width(self.plan.num_local_rows(x)) for x in range(W))
            fused = FUSE_OWN and W > 1 and own + need[1] <= cap
            groups, room = [], cap - own if fused else cap
            for d in range(1, W):
                if groups and need[d] <= room:
                    groups[-1].append(d)
                else:
                    if groups:
                        room = cap
                    groups.append([d])
                room -= need[d]
            cache[key] = (groups, fused)
        return cache[key]

    def lead(self, gi):
        """Zero slots before group gi's keys in its buffer: where fused, group 0's keys start
        a key block after the rank's own keys."""
        return self.own_width(self.L) - self.L if gi == 0 and self.fused() else 0

    def own_width(self, rows):
        """Slots a rank's own keys take in a fused call: up to a whole key block, so that group 0's
        start one (zero slots between, hidden from every row; none without a mask, which could
        not hide them)."""
        if self.plan._indices_host is None and not self.causal:
            return rows
        return -(-rows // spacing.BLOCK_KEYS) * spacing.BLOCK_KEYS

    def sources(self, group):
        """Ranks whose keys a group brings to this rank, ascending (the all-to-all's order)."""
        return sorted((self.rank - d) % self.W for d in group)

    def destinations(self, group):
        """Ranks this rank's keys go to in a group, ascending."""
        return sorted((self.rank + d) % self.W for d in group)

    def sent(self, src, dst):
        """Positions among ``src``'s rows of the keys it sends ``dst`` (int64, sorted)."""
        if not SPARSE_EXCHANGE:
            return np.arange(self.plan.num_local_rows(src), dtype=np.int64)
        return self.plan._keys_needed(src, dst)

    def num_sent(self, src, dst):
        return int(self.sent(src, dst).size)

    def part_keys(self, group):
        """Global key positions of a group's part on this rank, in arrival order."""
        return np.concatenate([self.plan.local_rows(s)[self.sent(s, self.rank)] for s in self.sources(group)])

    def part_slots(self, gi):
        """(slots, length) of group gi's part in its kernel call (``spacing.key_slots``: where
        each arriving key sits, and the call's keys with the padding slots), or None when the
        keys sit back to back; the same for every mask tensor of this plan."""
        if not SPACED_PARTS:
            return None
        key = ("slots", self.rank, gi, SPARSE_EXCHANGE, FUSE_OWN, self.keys_per_part())
        cache = self.plan._host_cache
        if key not in cache:
            room = self.keys_per_part() - (self.own_width(self.L) if gi == 0 and self.fused() else 0)
            cache[key] = self._spaced_slots(self.part_keys(self.groups()[gi]), room)
        return cache[key]

    def _spaced_slots(self, keys, room):
        if keys.size < 2 or (self.plan._indices_host is None and not self.causal):
            return None  # a lone key, or no mask: nothing to space out
        import paddle

        # the part's columns as its kernel call gets them, remapped on the host by the same op
        cpu = paddle.CPUPlace()
        idx = self.plan._indices_host
        idx_t = None if idx is None else paddle.to_tensor(np.ascontiguousarray(idx, dtype=np.int32), place=cpu)
        columns = tensor_ops.remap_indices(idx_t, paddle.to_tensor(keys, place=cpu),
                                           paddle.to_tensor(self.plan.row_table(self.rank), place=cpu),
                                           self.causal, self.plan.chunk_size, self.plan.seqlen).numpy()
        return spacing.key_slots(columns, self.L, room)

    def num_arriving(self, group):
        """Keys a group brings this rank (their count in ``part_keys``)."""
        return sum(self.num_sent(s, self.rank) for s in self.sources(group))

    def part_length(self, gi, group):
        """Keys of group gi's buffer: its lead, its keys and their padding slots."""
        slots = self.part_slots(gi)
        return self.lead(gi) + (self.num_arriving(group) if slots is None else slots[1])

    def spaced_units(self, gi, units, width=None, offset=0):
        """``units`` (positions in ``[B, part keys]``, batch-major) as positions in
        ``[B, width]`` (default: the buffer's ``part_length``) with the buffer at ``offset`` (the
        fused call's keys): where the keys sit after the lead, among the padding slots."""
        group = self.groups()[gi]
        slots, n = self.part_slots(gi), self.num_arriving(group)
        width = self.part_length(gi, group) if width is None else width
        at = units % n if n else units
        place = self.lead(gi) + (at if slots is None else slots[0][at])
        return units // max(n, 1) * width + offset + place

    def trivial_layout(self, gi):
        """Whether group gi's buffer holds its keys as they arrive (B = 1, no lead, no slots)."""
        return self.batch == 1 and self.lead(gi) == 0 and self.part_slots(gi) is None

    def part_masks(self):
        """[mask of the first call's keys (the own ones, then group 0's buffer where fused), mask
        of each group's keys (None for group 0 where fused, or a group that brings no key)] for
        this rank's rows; cached per indices tensor (every layer of a model passes the same one)."""
        groups = self.groups()
        if self.indices is None and not self.causal:
            return [None] * (1 + len(groups))  # full attention: nothing to mask
        key = ("masks", self.rank, id(self.indices) if self.indices is not None else None, str(self.place),
               SPARSE_EXCHANGE, SPACED_PARTS, FUSE_OWN, self.keys_per_part())
        hit = self.plan._device_cache.get(key)
        if hit is not None and (self.indices is None or hit[0]() is self.indices):
            return hit[1]
        table = self.plan._cached_index(("row_table", self.rank), lambda: self.plan.row_table(self.rank),
                                        self.place)
        masks = []
        for gi in range(-1, len(groups)):  # this rank's own keys, then each group's
            if gi == 0 and self.fused():  # in the first call, after the own keys
                masks.append(None)
                continue
            keys = self.plan.local_rows(self.rank) if gi < 0 else self.buffer_keys(gi)
            if gi < 0 and self.fused():
                keys = np.concatenate([keys, self.buffer_keys(0)])
            if keys.size == 0:  # nothing of this group reaches this rank's rows
                masks.append(None)
                continue
            keys_t = self.index(("part_keys", gi, SPARSE_EXCHANGE, SPACED_PARTS, FUSE_OWN), lambda: keys)
            masks.append(tensor_ops.remap_indices(self.indices, keys_t, table, self.causal, self.plan.chunk_size,
                                                  self.plan.seqlen))
        ref = weakref.ref(self.indices) if self.indices is not None else None
        self.plan._device_cache[key] = (ref, masks)
        return masks

    def buffer_keys(self, gi):
        """Global key of every slot of group gi's buffer (-1: a lead or padding slot, which the
        remap op makes a column hiding every row)."""
        keys = self.part_keys(self.groups()[gi])
        out = np.full(self.part_length(gi, self.groups()[gi]), -1, dtype=np.int64)
        out[self.spaced_units(gi, np.arange(keys.size, dtype=np.int64))] = keys
        return out


def _group_splits(spec, group, back):
    """Units rank s sends rank t: its keys that s + d needs (forward), or the dK/dV of the
    keys s got from s - d back to their owner (backward), for d in the group."""
    W, B = spec.W, spec.batch
    m = np.zeros((W, W), dtype=np.int64)
    for s in range(W):
        for d in group:
            if back:
                m[s, (s - d) % W] = B * spec.num_sent((s - d) % W, s)
            else:
                m[s, (s + d) % W] = B * spec.num_sent(s, (s + d) % W)
    return m


def _batch_major(spec, lens):
    """Units of ``[B, sum lens]`` (the pieces' keys in order) from the pieces ``[i][B, lens[i]]``."""
    base = np.concatenate([[0], np.cumsum([spec.batch * n for n in lens])[:-1]]).astype(np.int64)
    return np.concatenate([base[i] + b * n + np.arange(n, dtype=np.int64)
                           for b in range(spec.batch) for i, n in enumerate(lens)] + [np.zeros(0, np.int64)])


def _sends_everything(spec, pairs):
    return all(spec.num_sent(s, t) == spec.plan.num_local_rows(s) for s, t in pairs)


def _send_kv(spec, x, gi, group):
    B, L, Hk, D = [int(d) for d in x.shape]
    srcs, dsts = spec.sources(group), spec.destinations(group)
    lens = [spec.num_sent(s, spec.rank) for s in srcs]
    # pieces arrive rank by rank; with B > 1 they are regrouped batch-major, and spaced out
    # among padding slots (zero units) where the part has them (a copy)
    length = spec.part_length(gi, group)
    if spec.trivial_layout(gi):
        unpack = None
    else:
        def spread():
            arrived = _batch_major(spec, lens) if B > 1 else np.arange(sum(lens), dtype=np.int64)
            out = np.full(B * length, -1, dtype=np.int64)
            out[spec.spaced_units(gi, np.arange(arrived.size, dtype=np.int64), length)] = arrived
            return out
        unpack = spec.index(("kv_unpack", gi, SPARSE_EXCHANGE, SPACED_PARTS, FUSE_OWN), spread)
    return comm.exchange(x, _kv_pack(spec, L, dsts, gi), Hk * D, _group_splits(spec, group, False), unpack,
                         [B, length, Hk, D], spec.group, spec.rank)


def _kv_pack(spec, L, dsts, gi):
    # per destination (ascending), batch-major, the local keys it needs; none for one
    # destination that needs them all (the tensor is the piece as it is)
    if len(dsts) == 1 and _sends_everything(spec, [(spec.rank, dsts[0])]):
        return None
    return spec.index(("kv_pack", gi, SPARSE_EXCHANGE), lambda: np.concatenate(
        [b * L + spec.sent(spec.rank, t) for t in dsts for b in range(spec.batch)]))


def _send_back(spec, dx, gi, group, offset=None):
    """dK or dV of group gi's keys back to their owners; ``dx`` is the group's buffer, or with
    ``offset`` the fused call's ``[B, keys, ...]`` that holds it from that key on."""
    B, width, Hk, D = [int(d) for d in dx.shape]
    srcs, dsts = spec.sources(group), spec.destinations(group)
    # dK/dV of each source's keys back to it: pieces [source][B, keys from it] in rank order,
    # read from among the padding slots where the part has them
    if offset is None and spec.trivial_layout(gi):
        pack = None
    else:
        def inverse():
            order = _batch_major(spec, [spec.num_sent(s, spec.rank) for s in srcs])
            inv = np.empty_like(order)
            inv[order] = np.arange(order.size, dtype=np.int64)
            return spec.spaced_units(gi, inv, width, offset or 0)  # width: the buffer's, or the fused call's
        pack = spec.index(("dkv_pack", gi, SPARSE_EXCHANGE, SPACED_PARTS, FUSE_OWN, offset is not None), inverse)
    # arriving: from each destination (ascending) [B, keys it needed]; spread over
    # [destination, B, L] with zeros for the keys a destination did not get
    if _sends_everything(spec, [(spec.rank, t) for t in dsts]):
        unpack = None
    else:
        unpack = spec.index(("dkv_unpack", gi, SPARSE_EXCHANGE), lambda: _spread_back(spec, dsts))
    return comm.exchange(dx, pack, Hk * D, _group_splits(spec, group, True), unpack,
                         [len(group), B, spec.L, Hk, D], spec.group, spec.rank)


def _spread_back(spec, dsts):
    """Source unit of every ``[destination, B, L]`` unit in the received dK/dV (-1: a zero unit)."""
    B, L = spec.batch, spec.L
    out = np.full((len(dsts), B, L), -1, dtype=np.int64)
    off = 0
    for p, t in enumerate(dsts):
        keys = spec.sent(spec.rank, t)
        n = keys.size
        out[p][:, keys] = off + np.arange(B * n, dtype=np.int64).reshape(B, n)
        off += B * n
    return out.ravel()


def part_forward(spec, q, k, v, mask):
    """(out, lse) of this rank's queries over one part's keys (the part's own mask)."""
    return tensor_ops.attention_fwd(q, k, v, mask, spec.scale, False, spec.gpu_kernel, spec.deterministic)


def part_backward(spec, q, k, v, mask, out, lse, dout):
    """(dq, dk, dv) of one part, from the merged out/lse: P = exp(S - LSE) and
    delta = rowsum(dO * O) are those of all keys, so the parts' dq add up exactly."""
    return tensor_ops.attention_bwd(q, k, v, mask, out, lse, dout, spec.scale, False, spec.gpu_kernel,
                                    spec.deterministic)


class AllGatherAttention(PyLayer):
    @staticmethod
    def forward(ctx, q, k, v, spec):
        # no zero gradient made for the LSE output: Paddle would fill it with its own GPU kernel
        ctx.set_materialize_grads(False)
        masks, groups = spec.part_masks(), spec.groups()
        jobs = [(_send_kv(spec, k, gi, g), _send_kv(spec, v, gi, g)) for gi, g in enumerate(groups)]
        first = 1 if spec.fused() else 0
        if first:  # the own keys and group 0's in one call
            k_main, v_main = (tensor_ops.concat([x, job.wait()], 1) for x, job in ((k, jobs[0][0]), (v, jobs[0][1])))
        else:
            k_main, v_main = k, v
        out, lse = part_forward(spec, q, k_main, v_main, masks[0])  # overlaps the other transfers on NCCL
        remote = []
        for gi in range(first, len(groups)):
            k_g, v_g = jobs[gi][0].wait(), jobs[gi][1].wait()
            if int(k_g.shape[1]):  # else no key of this group is seen here
                out_g, lse_g = part_forward(spec, q, k_g, v_g, masks[1 + gi])
                out, lse = tensor_ops.merge_partial(out, lse, out_g, lse_g)
            remote += [k_g, v_g]
        ctx.spec = spec
        ctx.save_for_backward(q, k_main, v_main, out, lse, *remote)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        spec = ctx.spec
        q, k_main, v_main, out, lse, *remote = ctx.saved_tensor()
        masks, groups = spec.part_masks(), spec.groups()
        first = 1 if spec.fused() else 0
        dq, back = None, []
        for gi in range(first, len(groups)):
            g = groups[gi]
            k_g, v_g = remote[2 * (gi - first)], remote[2 * (gi - first) + 1]
            if int(k_g.shape[1]) == 0:  # an empty part: nothing to compute, empty pieces to send
                back.append((_send_back(spec, k_g, gi, g), _send_back(spec, v_g, gi, g)))
                continue
            dq_g, dk_g, dv_g = part_backward(spec, q, k_g, v_g, masks[1 + gi], out, lse, dout)
            back.append((_send_back(spec, dk_g, gi, g), _send_back(spec, dv_g, gi, g)))
            dq = dq_g if dq is None else tensor_ops.accumulate(dq, dq_g)
        dq_l, dk, dv = part_backward(spec, q, k_main, v_main, masks[0], out, lse, dout)  # overlaps the transfers
        dq = dq_l if dq is None else tensor_ops.accumulate(dq_l, dq)
        if first:  # group 0's dK/dV go home from the fused call's keys past the own ones
            back.insert(0, tuple(_send_back(spec, x, 0, groups[0], offset=spec.L) for x in (dk, dv)))
            dk, dv = (_own_keys(spec, x) for x in (dk, dv))
        for kj, vj in back:  # fixed order (group, then source rank): deterministic sums
            dk = tensor_ops.accumulate(dk, kj.wait())
            dv = tensor_ops.accumulate(dv, vj.wait())
        return dq, dk, dv


def _own_keys(spec, x):
    """The own keys' ``[B, L, ...]`` of a fused call's ``[B, keys, ...]`` (its first L keys)."""
    B, width, Hk, D = [int(d) for d in x.shape]
    index = spec.index(("own_keys", width), lambda: tensor_ops.rows_index(B, width, np.arange(spec.L)))
    return tensor_ops.gather_units(x, index, Hk * D, [B, spec.L, Hk, D])
