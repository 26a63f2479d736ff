"""Chunks to ranks: which rank of a context-parallel group holds each chunk of rows, so that
the ranks' attention work is even and none holds more tokens than a cap. Work comes as one
number a chunk (``plan.py`` counts live tiles); nothing here knows masks or tensors.

- ``spread``: chunks anywhere (heaviest first to the least-loaded rank with token room, then
  moves and swaps from the busiest rank), the scheme of Paddle's own FlashMask context
  parallel;
- ``stretches``, ``even_tokens``, ``swap_even_work``: one stretch of consecutive chunks a rank,
  then a few light chunks moved for tokens and equal-length chunks swapped for work (the
  "local" layout, which keeps a document's keys near its rows).
"""

from __future__ import annotations

import numpy as np

# A refinement stops once the busiest rank is within this of the mean.
REFINE_TOLERANCE = 0.005


def stretches(work: np.ndarray, lens: np.ndarray, world_size: int, token_cap: int):
    """Owner of each chunk when every rank takes one stretch of consecutive chunks, the cuts
    minimising the busiest rank's ``work`` (per chunk) over the mean; None when the token cap or
    the chunk count does not allow it. Binary search on that bound, each test a greedy
    left-to-right cut through prefix sums: O(W log n) a test."""
    n, W = lens.size, world_size
    if n < W:
        return None
    total = float(np.sum(work))
    # work over the mean per rank, summed: None when there is no work (tokens alone decide)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(work, np.float64) / (total / W))]) if total > 0 else None
    tok = np.concatenate([[0], np.cumsum(lens)])

    def cuts(bound):
        # greedy: each stretch as long as its work stays <= bound and its tokens <= the cap
        out, start = [], 0
        while start < n:
            end = np.searchsorted(tok, tok[start] + token_cap, side="right") - 1
            if prefix is not None:
                end = min(end, np.searchsorted(prefix, prefix[start] + bound * (1 + 1e-12), side="right") - 1)
            if end <= start:
                return None  # one chunk alone is over the bound
            out.append(end)
            start = end
            if len(out) > W:
                return None
        return out

    lo, hi = 1.0, float(W)
    if cuts(hi) is None:
        return None
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if cuts(mid) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-4:
            break
    ends = cuts(hi)
    while len(ends) < W:  # fewer stretches than ranks: split the longest (loads only drop)
        starts = [0] + ends[:-1]
        i = int(np.argmax([e - s for s, e in zip(starts, ends)]))
        if ends[i] - starts[i] < 2:
            return None
        ends.insert(i, (starts[i] + ends[i]) // 2)
    owner = np.empty(n, dtype=np.int64)
    start = 0
    for r, end in enumerate(ends):
        owner[start:end] = r
        start = end
    return owner


def even_tokens(owner: np.ndarray, work: np.ndarray, lens: np.ndarray, world_size: int,
                 tolerance: float = REFINE_TOLERANCE) -> np.ndarray:
    """Moves the lightest chunks (least work: the first rows of documents and answers, padding)
    from the rank with the most tokens to the one with the fewest until tokens are within
    ``tolerance`` of the mean: stretches cut for equal work hold unequal tokens, and a light
    chunk moves tokens without moving work (nor, at a document's start, many keys)."""
    owner = owner.copy()
    tokens = np.bincount(owner, weights=lens, minlength=world_size)
    target = tokens.mean() * (1 + tolerance)
    for _ in range(owner.size):
        hi, lo = int(np.argmax(tokens)), int(np.argmin(tokens))
        if tokens[hi] <= target:
            break
        mine = np.flatnonzero(owner == hi)
        fits = mine[tokens[lo] + lens[mine] <= tokens[hi] - lens[mine]]  # no overshoot
        if fits.size == 0 or mine.size == 1:
            break
        c = int(fits[np.argmin(work[fits])])
        owner[c] = lo
        tokens[hi] -= lens[c]
        tokens[lo] += lens[c]
    return owner


def swap_even_work(owner: np.ndarray, work: np.ndarray, lens: np.ndarray, world_size: int,
                    tolerance: float = REFINE_TOLERANCE) -> np.ndarray:
    """Swaps equal-length chunks between the busiest and the idlest rank (tokens unchanged)
    until the busiest rank is within ``tolerance`` of the mean work or no swap helps. Each
    step swaps, at once, every pair of a run of the busy rank's heaviest chunks against the idle
    rank's lightest whose summed difference stays within half the gap; where even one such pair
    is over half the gap, the one pair whose difference is nearest it. A step costs
    O(n log n), and the batches keep the steps few: one swap a step took thousands of steps
    (quadratic, 12 s at 16M tokens of plain causal) where every chunk is light."""
    owner = owner.copy()
    load = np.bincount(owner, weights=work, minlength=world_size)
    target = load.mean() * (1 + tolerance)
    full = lens == lens.max()  # the chunks of chunk_size rows (all but maybe the last)
    for _ in range(owner.size):
        hi, lo = int(np.argmax(load)), int(np.argmin(load))
        gap = load[hi] - load[lo]
        if load[hi] <= target or gap <= 0:
            break
        a = np.flatnonzero((owner == hi) & full)
        b = np.flatnonzero((owner == lo) & full)
        if a.size == 0 or b.size == 0:
            break
        pairs = _extreme_pairs_within(work, a, b, gap / 2) or _pair_nearest_half(work, a, b, gap)
        if pairs is None:
            break
        ca, cb, moved = pairs
        owner[ca], owner[cb] = lo, hi
        load[hi] -= moved
        load[lo] += moved
    return owner


def _extreme_pairs_within(work, a, b, limit):
    """The busy rank's heaviest chunks paired with the idle rank's lightest, in that order, as
    many pairs as keep the summed work moved within ``limit``: ``(chunks of a, chunks of b,
    work moved)``, or None when not even the first pair fits. The differences fall along the
    run, so the pairs that fit are a prefix of it."""
    a = a[np.argsort(-work[a], kind="stable")]
    b = b[np.argsort(work[b], kind="stable")]
    m = min(a.size, b.size)
    d = work[a[:m]] - work[b[:m]]
    k = int(np.searchsorted(np.cumsum(np.where(d > 0, d, np.inf)), limit, side="right"))
    if k == 0:
        return None
    return a[:k], b[:k], float(d[:k].sum())


def _pair_nearest_half(work, a, b, gap):
    """The one swap whose work difference d (0 < d < gap) is nearest half the gap, that is,
    leaves the two ranks' smallest new gap: ``(chunk of a, chunk of b, d)``, or None."""
    b = b[np.argsort(work[b], kind="stable")]
    wb = work[b]
    j = np.searchsorted(wb, work[a] - gap / 2)
    best = (gap, None)  # the new gap of the pair, the smaller the better
    for jj in (np.clip(j - 1, 0, b.size - 1), np.clip(j, 0, b.size - 1)):
        d = work[a] - wb[jj]
        new_gap = np.where((d > 0) & (d < gap), np.abs(gap - 2 * d), np.inf)
        k = int(np.argmin(new_gap))
        if new_gap[k] < best[0]:
            best = (float(new_gap[k]), (int(a[k]), int(b[jj[k]]), float(d[k])))
    return best[1]


def _best_swap(work, lens, a, b, load_hi, load_lo, tokens_hi, tokens_lo, token_cap):
    """The swap of chunk a[i] (busy rank) with b[j] (idle rank) that leaves the smaller maximum of
    the two ranks' work: ``(new max, i, j)``, or None. Within each pair of chunk lengths the token
    room allows, the best partner of a[i] is the b whose work is nearest work[a[i]] - gap / 2 (a
    sorted search: O((|a| + |b|) log |b|), where every pair would take |a| x |b| memory, 16M
    candidates for the 8192 chunks of 128 rows at 1M tokens); among equal maxima the first i, then j."""
    if a.size == 0 or b.size == 0:
        return None
    gap = load_hi - load_lo
    wa, la, wb, lb = work[a], lens[a], work[b], lens[b]
    best = None
    for len_b in np.unique(lb):
        in_b = np.flatnonzero(lb == len_b)
        in_b = in_b[np.argsort(wb[in_b], kind="stable")]  # by work, then position
        sorted_wb = wb[in_b]
        for len_a in np.unique(la):
            dtok = int(len_a) - int(len_b)
            if tokens_lo + dtok > token_cap or tokens_hi - dtok > token_cap:
                continue
            in_a = np.flatnonzero(la == len_a)
            pos = np.searchsorted(sorted_wb, wa[in_a] - gap / 2)
            for near in (pos - 1, pos):
                valid = (near >= 0) & (near < sorted_wb.size)
                near = np.clip(near, 0, sorted_wb.size - 1)
                # the first b of equal work (stable order): the leftmost of its run
                near = np.searchsorted(sorted_wb, sorted_wb[near], side="left")
                delta = wa[in_a] - sorted_wb[near]
                ok = valid & (delta > 0) & (delta < gap)
                new_max = np.where(ok, np.maximum(load_hi - delta, load_lo + delta), np.inf)
                k = int(np.argmin(new_max))  # in_a ascends: among equal maxima the first i
                cand = (float(new_max[k]), int(in_a[k]), int(in_b[near[k]]))
                if ok[k] and (best is None or cand < best):
                    best = cand
    return best


def spread(work: np.ndarray, lens: np.ndarray, world_size: int, token_cap: int) -> np.ndarray:
    """Owner rank of each chunk: heaviest first to the least-loaded rank with token room
    (at most ``token_cap`` tokens a rank), then moves and swaps from the busiest rank."""
    n = work.size
    owner = np.empty(n, dtype=np.int64)
    # Plain Python over a handful of ranks: numpy's per-call cost on arrays of W elements made
    # this loop 20 us a chunk (0.17 s for the 8192 chunks of 128 rows at 1M tokens).
    load_l, tokens_l = [0.0] * world_size, [0] * world_size
    work_l, lens_l = work.tolist(), [int(x) for x in lens]
    for c in np.argsort(-work, kind="stable").tolist():
        w, t = work_l[c], lens_l[c]
        r = -1  # the first least-loaded rank with token room
        for q in range(world_size):
            if tokens_l[q] + t <= token_cap and (r < 0 or load_l[q] < load_l[r]):
                r = q
        if r < 0:  # only when the cap is tighter than the chunks allow: the ranks with fewest tokens
            fewest = min(tokens_l)
            for q in range(world_size):
                if tokens_l[q] == fewest and (r < 0 or load_l[q] < load_l[r]):
                    r = q
        owner[c] = r
        load_l[r] += w
        tokens_l[r] += t
    load = np.array(load_l, dtype=np.float64)
    tokens = np.array(tokens_l, dtype=np.int64)
    target = load.mean() * (1 + REFINE_TOLERANCE)
    for _ in range(4 * n):
        hi = int(np.argmax(load))
        if load[hi] <= target:  # close enough to the mean: stop paying O(chunks^2) per move
            break
        gap = load[hi] - load  # per rank
        a = np.flatnonzero(owner == hi)
        best = (0.0, None)
        for lo in np.argsort(load):
            lo = int(lo)
            if gap[lo] <= 0:
                break
            b = np.flatnonzero(owner == lo)
            # move one chunk hi -> lo (token room permitting), or swap a pair: the candidate whose
            # new max of the pair is smallest (first in a, then b order among equals)
            ok = (work[a] > 0) & (work[a] < gap[lo]) & (tokens[lo] + lens[a] <= token_cap) & \
                (tokens[hi] - lens[a] <= token_cap)
            new_max = np.where(ok, np.maximum(load[hi] - work[a], load[lo] + work[a]), np.inf)
            k = int(np.argmin(new_max))
            choice = (float(new_max[k]), k, -1)
            swap = _best_swap(work, lens, a, b, load[hi], load[lo], tokens[hi], tokens[lo], token_cap)
            if swap is not None and swap[0] < choice[0]:
                choice = swap
            if not np.isfinite(choice[0]):
                continue
            gain = load[hi] - choice[0]
            if gain > best[0]:
                best = (gain, (lo, choice[1], choice[2]))
            break  # the idlest rank that can take work is the best partner
        if best[1] is None:
            break
        lo, i, j = best[1]
        if j < 0:  # a move
            c = a[i]
            owner[c] = lo
            moved, mtok = work[c], lens[c]
        else:
            ca, cb = a[i], np.flatnonzero(owner == lo)[j]
            owner[ca], owner[cb] = lo, hi
            moved, mtok = work[ca] - work[cb], lens[ca] - lens[cb]
        load[hi] -= moved
        load[lo] += moved
        tokens[hi] -= mtok
        tokens[lo] += mtok
    return owner
