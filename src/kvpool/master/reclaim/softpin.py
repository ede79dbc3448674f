"""Soft pins: resolving a put's soft-pin request, and the deadline index that expires them.

A soft pin is a fixed deadline set when the object becomes readable (reads do not extend it).
While it is live the object is evicted last (cache mode, and only with
`--allow-evict-soft-pinned-objects`) or moved rather than dropped (pool mode). Seed 000 fixes
the request rules, implemented by `resolve_soft_pin_ttl`:

* PRESERVE or DISABLE with a TTL → INVALID_PARAMS; without one they resolve to TTL 0;
* ENABLE takes the given TTL, or `--default-kv-soft-pin-ttl`; above `--max-kv-soft-pin-ttl`
  → INVALID_PARAMS.

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

from kvpool.errors import InvalidParams
from kvpool.master.reclaim.config import ReclaimConfig
from kvpool.master.reclaim.records import K
from kvpool.protocol.messages import SoftPinAction

__all__ = ["SoftPinIndex", "resolve_soft_pin_ttl"]


def resolve_soft_pin_ttl(
    action: SoftPinAction, ttl_s: float | None, config: ReclaimConfig
) -> float:
    """The soft-pin TTL (seconds) a put asks for; 0.0 means "no new pin".

    Raises `InvalidParams` (INVALID_PARAMS) for a TTL with PRESERVE/DISABLE, a negative TTL,
    or one above `config.max_soft_pin_ttl_s`.
    """
    if action is not SoftPinAction.ENABLE:
        if ttl_s is not None:
            raise InvalidParams(f"soft_pin_ttl given with {action.name}; only ENABLE takes one")
        return 0.0
    ttl = config.default_soft_pin_ttl_s if ttl_s is None else float(ttl_s)
    if ttl < 0:
        raise InvalidParams(f"soft_pin_ttl must be >= 0, got {ttl} s")
    if ttl > config.max_soft_pin_ttl_s:
        raise InvalidParams(
            f"soft_pin_ttl {ttl} s exceeds max_kv_soft_pin_ttl {config.max_soft_pin_ttl_s} s"
        )
    return ttl


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

    def next_deadline(self) -> float | None:
        """The earliest heap deadline (possibly stale), for sleeping until the next expiry."""
        heads = [h[0][0] for h in self._heaps if h]
        return min(heads) if heads else None

    def _maybe_compact(self, shard: int) -> None:
        heap = self._heaps[shard]
        live = self._live[shard]
        if len(heap) > 64 and len(heap) > 2 * len(live):
            self._heaps[shard] = [(d, next(self._seq), k) for k, d in live.items()]
            heapq.heapify(self._heaps[shard])
