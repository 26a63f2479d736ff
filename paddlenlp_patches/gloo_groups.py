"""Gloo sub-groups that work when several are created at once (fleet's dp x sep groups on CPU).

Why: in Paddle 3.3.1 ``paddle.distributed.new_group`` with the gloo backend calls
``core.ProcessGroupGloo.create(_default_store, rank, size, gid)`` (``collective.py``
``_new_process_group_impl``), i.e. C++ ``ProcessGroupGloo::CreateProcessGroupGloo``, which
rendezvouses TWICE over the one global TCP store:

1. ``CommContextManager::CreateGlooCommContext``: ``gloo::rendezvous::PrefixStore(gid, store)``,
   keys ``"<gid>/<rank>"`` -- distinct per group, fine (this context does the collectives);
2. the ``ProcessGroupGloo`` constructor: ``_context->connectFullMesh(*_store, ...)`` on the raw
   store, keys ``"<rank in the group>"`` -- the SAME keys ``"0"``, ``"1"``, ... for every group
   (the global group wrote them first; each value holds that rank's pair addresses).

Fleet's ``HybridCommunicateGroup`` creates the groups of an axis one after the other
(``topology.py`` ``_set_comm_group``: ``for group in parallel_groups: new_group(ranks=group)``)
and a rank only blocks in the groups it belongs to, so with 4 ranks as dp 2 x sep 2 the data
groups ``[0, 2]`` and ``[1, 3]`` rendezvous at the same time on the keys ``"0"`` / ``"1"``, and
the keys may still hold an earlier group's addresses (``wait`` returns at once for a key that
exists). Seen on 4 CPU ranks: ranks 0 and 3 "finish" the data groups together (paired with each
other) while ranks 1 and 2 fail with ``gloo/transport/tcp/pair.cc:914 TIMEOUT`` or
``pair.cc:784 connect ...: Connection refused`` (a stale address), then the others with
``TCP connection reset by peer``; a bare ``new_group([0, 2]); new_group([1, 3])`` fails the
same way. One group of 2 (2 ranks, pure context parallel) meets the same stale keys; that it
worked there is timing.

Fix (no change to Paddle): :func:`install` wraps ``collective._new_process_group_impl`` so that
a gloo sub-group (gid != 0) rendezvouses over a TCP store of its own, hosted by the group's
first rank (its address is published in the global store under a gid-keyed name). Both
rendezvous then see only that group's keys. Collectives are unchanged (same process group
class, same comm context).
"""

from __future__ import annotations

import functools
import os
import socket

_MARK = "__pfm_gloo_group_store__"
_STORES = {}  # gid -> TCPStore: kept alive for the life of the process (the groups use them)
_KEY = "pfm_gloo_group_store/{}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _host() -> str:
    ep = os.environ.get("PADDLE_CURRENT_ENDPOINT", "")
    return ep.rsplit(":", 1)[0] if ":" in ep else "127.0.0.1"


def group_store(default_store, rank: int, size: int, gid: int, timeout: int = 900):
    """A fresh TCP store for the group ``gid`` (``size`` members, this one ``rank`` in it): its rank
    0 starts it (listening before its address is published, so no member can read a wrong one) and
    publishes ``host:port`` in the global store; the others read it there and connect."""
    from paddle.base import core

    key = _KEY.format(gid)
    if rank == 0:
        host, port = _host(), _free_port()
        # num_workers=0: no start-up barrier in the constructor (the gloo rendezvous waits anyway)
        store = core.TCPStore(host, port, True, 0, timeout)
        default_store.set(key, f"{host}:{port}")
    else:
        host, port = default_store.get(key).decode().rsplit(":", 1)
        store = core.TCPStore(host, int(port), False, 0, timeout)
    _STORES[gid] = store
    return store


def install() -> bool:
    """Make every later gloo ``new_group`` rendezvous on a store of its own. Idempotent; a no-op
    for other backends (the wrapper only acts on ``backend == "gloo"`` and gid != 0). Returns
    True when the wrapper is in place."""
    from paddle.distributed import collective

    orig = getattr(collective, "_new_process_group_impl", None)
    if orig is None:
        return False
    if getattr(orig, _MARK, False):
        return True

    @functools.wraps(orig)
    def _new_process_group_impl(backend, store, rank, world_size, group_name, pg_options, group_id=0,
                                *args, **kwargs):
        if backend == "gloo" and group_id and store is not None and world_size > 1:
            store = group_store(store, rank, world_size, group_id)
        return orig(backend, store, rank, world_size, group_name, pg_options, group_id, *args, **kwargs)

    setattr(_new_process_group_impl, _MARK, True)
    collective._new_process_group_impl = _new_process_group_impl
    return True
