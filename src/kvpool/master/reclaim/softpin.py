"""The deadline index that expires soft pins in deadline order, shard by shard.

A soft pin is a fixed deadline set when the object becomes readable (reads do not extend it).
While it is live the object is evicted last (cache mode, and only with
`--allow-evict-soft-pinned-objects`) or moved rather than dropped (pool mode). The request
rules (PRESERVE/DISABLE with a TTL → INVALID_PARAMS, ENABLE's default and maximum) are the
master's, in `kvpool.master.lease.resolve_soft_pin`.

`SoftPinIndex` keeps every live pin in a per-shard min-heap of deadlines, so the background
task expires them in deadline order, shard by shard, touching only pins that are due (Mooncake
scans every object instead). Re-pinning or unpinning leaves the old heap entry behind; it is
recognised as stale (its deadline no longer matches) when it surfaces, and the heap is rebuilt
when stale entries outnumber live ones, so memory stays proportional to live pins.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Generic

from kvpool.master.reclaim.records import K

__all__ = ["SoftPinIndex"]


class SoftPinIndex(Generic[K]):
    """Live soft-pin deadlines by shard, expired in deadline order.

    Single-owner (the master's event loop); not thread-safe. All operations are O(log n) in
    the number of pins of one shard.
    """

    def __init__(self, num_shards: int, shard_of: Callable[[K], int]) -> None:
        self._shard_of = shard_of
        self._heaps: list[list[tuple[float, int, K]]] = [[] for _ in range(num_shards)]
        self._live: list[dict[K, float]] = [{} for _ in range(num_shards)]
        self._seq = itertools.count()

    def __len__(self) -> int:
        """Number of live pins (the active soft-pin metric)."""
        return sum(len(d) for d in self._live)

    def deadline(self, key: K) -> float | None:
        """The live pin deadline of `key`, or None."""
        return self._live[self._shard_of(key)].get(key)

    def pin(self, key: K, deadline: float) -> None:
        """Set (or move) `key`'s pin to `deadline`."""
        shard = self._shard_of(key)
        self._live[shard][key] = deadline
        heapq.heappush(self._heaps[shard], (deadline, next(self._seq), key))
        self._maybe_compact(shard)

    def unpin(self, key: K, deadline: float | None = None) -> bool:
        """Drop `key`'s pin (only if it is still `deadline`, when given); True if one was live."""
        live = self._live[self._shard_of(key)]
        current = live.get(key)
        if current is None or (deadline is not None and current != deadline):
            return False
        del live[key]
        self._maybe_compact(self._shard_of(key))
        return True

    def expire(self, now: float, on_expired: Callable[[K, float], object] | None = None) -> int:
        """Retire every pin with deadline <= `now`, shard by shard, each shard in deadline
        order; `on_expired(key, deadline)` lets the metadata owner clear its own field (it
        should check that the object's deadline still equals `deadline`). Returns the count."""
        expired = 0
        for shard, heap in enumerate(self._heaps):
            live = self._live[shard]
            while heap and heap[0][0] <= now:
                deadline, _seq, key = heapq.heappop(heap)
                if live.get(key) != deadline:
                    continue  # re-pinned or unpinned since; a stale heap entry
                del live[key]
                expired += 1
                if on_expired is not None:
                    on_expired(key, deadline)
        return expired

    def _maybe_compact(self, shard: int) -> None:
        heap = self._heaps[shard]
        live = self._live[shard]
        if len(heap) > 64 and len(heap) > 2 * len(live):
            self._heaps[shard] = [(d, next(self._seq), k) for k, d in live.items()]
            heapq.heapify(self._heaps[shard])
