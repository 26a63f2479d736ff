"""Context parallel by K/V exchange ("allgather"): query rows stay, keys travel.

Forward on rank r: its K/V go to the other ranks by ring shifts (rank r sends to r + d and
receives from r - d), the distances taken in groups, one all-to-all per group, all
started at once. Only the keys a destination's rows attend to travel
(``ContextParallelPlan.keys_needed``): with documents, answers or windows most keys stay
home. While they travel r attends its queries to its own keys, then to each
arriving group's keys, and merges the partial softmaxes exactly by their LSE. A group
holds as many peers as fit in 2^19 keys (the Hopper kernels' longest sequence), so few,
large kernel calls do the work. Backward: each group part's backward (with the merged
out/LSE), its dK/dV sent back to their owners at once, then the local part while they
travel; every rank sums what it receives for its keys in a fixed order. Each part reads
the global mask through the remap op (local query rows, that part's key columns), so
tiles are skipped exactly as on one device. A group's keys are spaced out in its kernel call
where neighbours see far-apart rows (``spacing``: zero padding slots that hide every row), so
no key block's summary spans rows none of its keys see. Any mask form, head count, GQA.
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


class Spec(CallSpec):
    method = "allgather"

    def keys_per_part(self):
        """Keys of one kernel call at most: what the Hopper kernels take at this head dim."""
        return min(KEYS_PER_PART, sm90_max_seqlen(self.head_dim))

    def index(self, name, build):
        # the grouping (groups()) follows the head dim: cached per part size
        return super().index((self.keys_per_part(), name), build)

    def groups(self):
        """Ring distances in groups, the same on every rank (sized by the largest rank)."""
        most = max(self.plan.num_local_rows(x) for x in range(self.W))
        per = max(1, self.keys_per_part() // most)
        dists = list(range(1, self.W))
        return [dists[i:i + per] for i in range(0, len(dists), per)]

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
        key = ("slots", self.rank, gi, SPARSE_EXCHANGE, self.keys_per_part())
        cache = self.plan._host_cache
        if key not in cache:
            cache[key] = self._spaced_slots(self.part_keys(self.groups()[gi]))
        return cache[key]

    def _spaced_slots(self, keys):
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
        return spacing.key_slots(columns, self.L, self.keys_per_part())

    def part_length(self, gi, group):
        """Keys of group gi's kernel call, padding slots included."""
        slots = self.part_slots(gi)
        return sum(self.num_sent(s, self.rank) for s in self.sources(group)) if slots is None else slots[1]

    def spaced_units(self, gi, units):
        """``units`` (positions in ``[B, part keys]``, batch-major) as positions in
        ``[B, part_length]``: where the keys sit among the padding slots."""
        slots = self.part_slots(gi)
        if slots is None:
            return units
        n = slots[0].size
        return units // n * slots[1] + slots[0][units % n]

    def part_masks(self):
        """[mask of this rank's own keys, mask of each group's keys] for this rank's rows;
        cached per indices tensor (every layer of a model passes the same one)."""
        groups = self.groups()
        if self.indices is None and not self.causal:
            return [None] * (1 + len(groups))  # full attention: nothing to mask
        key = ("masks", self.rank, id(self.indices) if self.indices is not None else None, str(self.place),
               SPARSE_EXCHANGE, SPACED_PARTS, self.keys_per_part())
        hit = self.plan._device_cache.get(key)
        if hit is not None and (self.indices is None or hit[0]() is self.indices):
            return hit[1]
        table = self.plan._cached_index(("row_table", self.rank), lambda: self.plan.row_table(self.rank),
                                        self.place)
        masks = []
        for gi in range(-1, len(groups)):  # this rank's own keys, then each group's
            keys = self.plan.local_rows(self.rank) if gi < 0 else self.part_keys(groups[gi])
            if keys.size == 0:  # nothing of this group reaches this rank's rows
                masks.append(None)
                continue
            if gi >= 0 and self.part_slots(gi) is not None:  # padding slots: -1, a column hiding every row
                slots, length = self.part_slots(gi)
                spaced = np.full(length, -1, dtype=np.int64)
                spaced[slots] = keys
                keys = spaced
            keys_t = self.index(("part_keys", gi, SPARSE_EXCHANGE, SPACED_PARTS), lambda: keys)
            masks.append(tensor_ops.remap_indices(self.indices, keys_t, table, self.causal, self.plan.chunk_size,
                                                  self.plan.seqlen))
        ref = weakref.ref(self.indices) if self.indices is not None else None
        self.plan._device_cache[key] = (ref, masks)
        return masks


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
    if B == 1 and spec.part_slots(gi) is None:
        unpack = None
    else:
        def spread():
            arrived = _batch_major(spec, lens) if B > 1 else np.arange(sum(lens), dtype=np.int64)
            out = np.full(B * length, -1, dtype=np.int64)
            out[spec.spaced_units(gi, np.arange(arrived.size, dtype=np.int64))] = arrived
            return out
        unpack = spec.index(("kv_unpack", gi, SPARSE_EXCHANGE, SPACED_PARTS), spread)
    return comm.exchange(x, _kv_pack(spec, L, dsts, gi), Hk * D, _group_splits(spec, group, False), unpack,
                         [B, length, Hk, D], spec.group, spec.rank)


def _kv_pack(spec, L, dsts, gi):
    # per destination (ascending), batch-major, the local keys it needs; none for one
    # destination that needs them all (the tensor is the piece as it is)
    if len(dsts) == 1 and _sends_everything(spec, [(spec.rank, dsts[0])]):
        return None
    return spec.index(("kv_pack", gi, SPARSE_EXCHANGE), lambda: np.concatenate(
        [b * L + spec.sent(spec.rank, t) for t in dsts for b in range(spec.batch)]))


def _send_back(spec, dx, gi, group):
    B, keys, Hk, D = [int(d) for d in dx.shape]
    srcs, dsts = spec.sources(group), spec.destinations(group)
    # dK/dV of each source's keys back to it: pieces [source][B, keys from it] in rank order,
    # read from among the padding slots where the part has them
    if B == 1 and spec.part_slots(gi) is None:
        pack = None
    else:
        def inverse():
            order = _batch_major(spec, [spec.num_sent(s, spec.rank) for s in srcs])
            inv = np.empty_like(order)
            inv[order] = np.arange(order.size, dtype=np.int64)
            return spec.spaced_units(gi, inv)
        pack = spec.index(("dkv_pack", gi, SPARSE_EXCHANGE, SPACED_PARTS), inverse)
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
        out, lse = part_forward(spec, q, k, v, masks[0])  # overlaps the transfers on NCCL
        remote = []
        for gi, (kj, vj) in enumerate(jobs):
            k_g, v_g = kj.wait(), vj.wait()
            if int(k_g.shape[1]):  # else no key of this group is seen here
                out_g, lse_g = part_forward(spec, q, k_g, v_g, masks[1 + gi])
                out, lse = tensor_ops.merge_partial(out, lse, out_g, lse_g)
            remote += [k_g, v_g]
        ctx.spec = spec
        ctx.save_for_backward(q, k, v, out, lse, *remote)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        spec = ctx.spec
        q, k, v, out, lse, *remote = ctx.saved_tensor()
        masks, groups = spec.part_masks(), spec.groups()
        dq, back = None, []
        for gi, g in enumerate(groups):
            k_g, v_g = remote[2 * gi], remote[2 * gi + 1]
            if int(k_g.shape[1]) == 0:  # an empty part: nothing to compute, empty pieces to send
                back.append((_send_back(spec, k_g, gi, g), _send_back(spec, v_g, gi, g)))
                continue
            dq_g, dk_g, dv_g = part_backward(spec, q, k_g, v_g, masks[1 + gi], out, lse, dout)
            back.append((_send_back(spec, dk_g, gi, g), _send_back(spec, dv_g, gi, g)))
            dq = dq_g if dq is None else tensor_ops.accumulate(dq, dq_g)
        dq_l, dk, dv = part_backward(spec, q, k, v, masks[0], out, lse, dout)  # overlaps the transfers
        dq = dq_l if dq is None else tensor_ops.accumulate(dq_l, dq)
        for kj, vj in back:  # fixed order (group, then source rank): deterministic sums
            dk = tensor_ops.accumulate(dk, kj.wait())
            dv = tensor_ops.accumulate(dv, vj.wait())
        return dq, dk, dv
