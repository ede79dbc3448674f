"""The reclaim engine plugged into the master service: `MasterReclaimHooks`.

`MasterService` calls `kvpool.master.hooks.ReclaimHooks` (on_replica_complete, on_access,
on_object_removed, reclaim_for, reclaim_range, tick) and offers `kvpool.master.hooks.ReclaimTarget` back
(index, clock, memory usage, evictable, evict). This module turns those into the engine's
terms, so that neither side knows the other's internals:

* records are keyed by the `ObjectMeta` itself. A re-put of a key builds a new `ObjectMeta`,
  so an object identity *is* a generation: a record whose object is no longer the one indexed
  under its key is stale, and the engine drops it on the next pass that meets it;
* an object's head record lives in `ObjectMeta.reclaim` (`_ObjectSlotIndex`), a record's
  replica id is the `Replica` object itself, and an aligned size reuses the object's size int:
  reclaim costs one 96-byte record per memory replica and nothing per object beside it;
* a record's size is the replica's aligned allocation, the unit of `memory_usage()`;
* the engine's shards are the service's metadata shards (`ObjectMeta.shard`);
* `reclaim_range` is range reclaim (`fit.py`: evict the neighbours that make one free block
  of a put's size when the bytes `reclaim_for` freed lie in smaller pieces); `_SegmentLayout`
  tells it where a record's replica lies (its segment's allocator and offset);
* `defragment` (pool mode only) is defragmentation (`defrag.py`: when range reclaim could drop
  nothing, MOVE tasks for the neighbours that make one free block, and a retry hint for the
  put); `_ServiceTarget` is its `RangeMover`;
* `reclaim_for` is direct reclaim (inactive lists only, group commit); kswapd runs one bounded
  step per event-loop callback (see `MasterReclaimHooks`), and `tick` expires soft pins and
  restarts kswapd when it is wanted.

Eviction modes on the master:

* cache: the primary replica (the first readable memory replica) goes with the whole object,
  as Mooncake's BatchEvict; any other replica is dropped alone (`evict_replica`);
* pool: non-primary replicas of objects without a live soft pin are dropped alone; a primary
  or soft-pinned replica is swapped out (`swap_out`: a MOVE replica task to a segment that
  stays at or below the low watermark with it, allocated without reclaim) and freed only when
  the move succeeded; nothing can take it: it stays, and the put that needed the room fails
  with NO_AVAILABLE_HANDLE. A replica that would have to move while its own segment is at or
  below the low watermark is kept (BUSY): moving it would relieve nothing. Direct reclaim
  never starts a move (`direct_swap_out=False`): a put cannot wait for one, so kswapd runs
  ahead between the watermarks;
* both: objects with a replica task are kept (BUSY); readers are protected by their lease,
  and a replica being written is not COMPLETE.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from kvpool.master import hooks
from kvpool.master.config import EvictionMode
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.reclaim.base import ReclaimTarget, Verdict
from kvpool.master.reclaim.config import ReclaimConfig
from kvpool.master.reclaim.defrag import Defragmenter
from kvpool.master.reclaim.engine import ReclaimEngine
from kvpool.master.reclaim.fit import FreeMap, RangeReclaimer
from kvpool.master.reclaim.records import ACTIVE_BITS, REF, STATE_MASK, EvictInfo
from kvpool.master.reclaim.softpin import SoftPinIndex
from kvpool.master.reclaim.tenants import TenantReclaim
from kvpool.protocol.messages import ReplicaKind, ReplicaStatus

__all__ = ["MasterReclaimHooks"]

log = logging.getLogger(__name__)

_COMPLETE = ReplicaStatus.COMPLETE
# Read per commit: a module constant (`ReplicaKind.MEMORY` is an EnumType.__getattr__ call on
# Python 3.11).
_MEMORY = ReplicaKind.MEMORY
# What `_verdict` answers, per record a reclaim pass looks at: module constants, as above.
_V_STALE = Verdict.STALE
_V_BUSY = Verdict.BUSY
_V_HARD_PINNED = Verdict.HARD_PINNED
_V_LEASED = Verdict.LEASED
_V_DROPPABLE = Verdict.DROPPABLE
_V_SOFT_PINNED = Verdict.SOFT_PINNED
_V_PRIMARY = Verdict.PRIMARY


class _ServiceTarget(ReclaimTarget[ObjectMeta]):
    """The engine's `ReclaimTarget` over the service's `hooks.ReclaimTarget`."""

    def __init__(self, service: hooks.ReclaimTarget, config: ReclaimConfig) -> None:
        self._svc = service
        self._pool_mode = config.mode is EvictionMode.POOL
        self._low = config.low_watermark_ratio
        self.engine: ReclaimEngine[ObjectMeta] | None = None
        #: Fair share between tenants (cache mode; None: plain LRU).
        self.tenants: TenantReclaim | None = None

    def memory_usage(self) -> tuple[int, int]:
        # Cache mode watches the whole pool (Mooncake); pool mode a node's memory: the fullest
        # segment. Moving a replica between segments frees nothing in the pool as a whole, so
        # pool-mode kswapd wakes when one segment passes the high watermark and stops when it
        # is back at the low one.
        if self._pool_mode:
            return self._svc.memory_pressure()
        return self._svc.memory_usage()

    def inspect(self, rec: EvictInfo[ObjectMeta], now: float) -> Verdict:
        tenants = self.tenants
        if tenants is not None and tenants.protected(rec.key.tenant):
            return Verdict.BUSY  # at or below its fair share while another is above its own
        return self._verdict(rec, now, pressure=self._pool_mode)

    def movable(self, rec: EvictInfo[ObjectMeta], now: float) -> Verdict:
        # Defragmentation moves a replica to make a range, not to relieve its segment: the
        # pressure rule does not apply (`defrag.RangeMover`).
        return self._verdict(rec, now, pressure=False)

    def room(self) -> int:
        return self._svc.largest_free()

    def move_away(
        self,
        moves: Sequence[tuple[EvictInfo[ObjectMeta], Callable[[bool], None]]],
        keep_free: Sequence[tuple[int, int]],
    ) -> bool:
        return self._svc.move_away(
            [(rec.key, rec.replica_id, done) for rec, done in moves], keep_free
        )

    def _verdict(self, rec: EvictInfo[ObjectMeta], now: float, *, pressure: bool) -> Verdict:
        obj = rec.key
        if self._svc.index.get(obj.tenant, obj.key) is not obj:
            return _V_STALE
        primary: Replica | None = None
        mine: Replica | None = None
        on_disk = False
        for r in obj.replicas:
            if r.kind is _MEMORY:
                if r.readable():
                    primary = primary or r
                    if r is rec.replica_id:
                        mine = r
            elif r.readable():
                on_disk = True
        if mine is None:
            rid = rec.replica_id
            if rid.status is _COMPLETE and rid.segment.alive and rid in obj.replicas:
                # On a mounted segment whose owner is silent: neither evicted nor moved while
                # it may come back with its objects, and kept on the lists for when it does.
                return _V_BUSY
            return _V_STALE  # freed, or its segment went away
        if obj.hard_pin:
            return _V_HARD_PINNED
        if now < obj.lease_deadline:
            return _V_LEASED
        if not obj.complete or self._svc.has_task(obj):
            return _V_BUSY  # an in-place upsert is rewriting it, or a task copies it
        pinned = obj.soft_pin_deadline is not None and now < obj.soft_pin_deadline
        if not pinned and (mine is not primary or on_disk):
            # Another memory replica, or a disk-tier copy, keeps the object: drop this one.
            return _V_DROPPABLE
        if pressure and not _under_pressure(mine, self._low):
            # It would have to move, and its segment is at or below the low watermark: a move
            # would relieve nothing (and could only shuttle replicas between segments).
            return _V_BUSY
        return _V_SOFT_PINNED if pinned else _V_PRIMARY

    def drop(self, rec: EvictInfo[ObjectMeta]) -> int:
        obj = rec.key
        if not self._svc.evictable(obj, self._svc.now()):
            return 0
        replica = rec.replica_id
        primary = next((r for r in obj.replicas if r.kind is _MEMORY and r.readable()), None)
        if replica is not primary:
            return self._svc.evict_replica(obj, replica)  # one cache replica of several
        # The primary (cache mode): every memory replica goes with the object, as Mooncake's
        # BatchEvict; on_object_removed retires all of its records (this one included).
        return self._svc.evict(obj)

    def swap_out(self, rec: EvictInfo[ObjectMeta]) -> bool:
        engine = self.engine
        assert engine is not None

        def done(moved: bool) -> None:
            engine.on_swap_out_done(rec, moved)

        return self._svc.swap_out(rec.key, rec.replica_id, self._low, done)


def _under_pressure(replica: Replica, low: float) -> bool:
    alloc = replica.segment.allocator
    return alloc.allocated > low * alloc.capacity


class MasterReclaimHooks:
    """`kvpool.master.hooks.ReclaimHooks` backed by a `ReclaimEngine` (seed 001 reclaim).

    Build it, pass it as `MasterService(config, hooks=...)` (or `MasterServer(..., hooks=...)`);
    the service calls `attach` from its constructor. `tunables` are extra `ReclaimConfig`
    fields (isolate_batch, inactive_ratio, kswapd_step_records); the rest comes from the
    service's `MasterConfig`.

    kswapd runs as a chain of event-loop callbacks, one bounded step each, so requests get the
    loop between steps: the chain starts as soon as a PutEnd crosses the high watermark or a
    PutStart fails to allocate (the engine's `wakeup`), and the tick restarts it if needed.
    Without a running loop (the service driven directly, as unit tests do) the tick runs up to
    `steps_per_tick` steps itself.
    """

    def __init__(self, *, steps_per_tick: int = 64, **tunables: int | float) -> None:
        self.steps_per_tick = steps_per_tick
        self._tunables = tunables
        self._engine: ReclaimEngine[ObjectMeta] | None = None
        self._pins: SoftPinIndex[ObjectMeta] | None = None
        self._alignment = 1
        self._scheduled = False
        self._ranges: RangeReclaimer[ObjectMeta] | None = None
        self._defrag: Defragmenter[ObjectMeta] | None = None
        #: Own eviction and fair share (cache mode only; `kvpool.master.reclaim.tenants`).
        self._tenants: TenantReclaim | None = None

    @property
    def engine(self) -> ReclaimEngine[ObjectMeta]:
        if self._engine is None:
            raise RuntimeError("MasterReclaimHooks is not attached to a service")
        return self._engine

    @property
    def soft_pins(self) -> SoftPinIndex[ObjectMeta]:
        if self._pins is None:
            raise RuntimeError("MasterReclaimHooks is not attached to a service")
        return self._pins

    def attach(self, target: hooks.ReclaimTarget) -> None:
        # A put cannot wait for a move: the master's direct reclaim only drops (pool mode).
        tunables: dict[str, int | float] = {"direct_swap_out": False, **self._tunables}
        config = ReclaimConfig.from_master(target.config, **tunables)
        self._alignment = target.config.alignment
        num_shards = target.index.num_shards
        service_target = _ServiceTarget(target, config)
        self._engine = ReclaimEngine(
            service_target,
            config,
            num_shards=num_shards,
            shard_of=_shard_of,
            clock=target.now,
            record_index=_ObjectSlotIndex(),
        )
        service_target.engine = self._engine
        self._engine.wakeup = self._wake
        self._pins = SoftPinIndex(num_shards, _shard_of)
        self._ranges = RangeReclaimer(self._engine, _SegmentLayout())
        if config.mode is EvictionMode.POOL:
            self._defrag = Defragmenter(self._engine, _SegmentLayout(), service_target)
        else:
            self._tenants = service_target.tenants = TenantReclaim(target)

    def on_replica_complete(self, obj: ObjectMeta, replica: Replica) -> None:
        if replica.kind is not _MEMORY:
            return
        engine = self._engine
        assert engine is not None, "MasterReclaimHooks is not attached to a service"
        a = self._alignment
        size = obj.size
        if size % a:
            size = (size + a - 1) // a * a
        # (An aligned size reuses the object's own int: no int per record. The replica object
        # itself identifies the replica: a replica id would be a fresh large int per record.)
        if obj.hard_pin:
            engine.on_complete(obj, replica, size, hard_pinned=True)
        else:  # every put's one replica: the record built in one call (the shard is the object's)
            engine.on_complete_first(obj, replica, size, obj.shard)
        if obj.soft_pin_ttl is not None and obj.soft_pin_deadline is None:
            # PutEnd sets the deadline to now + ttl right after this hook, on the same clock;
            # the index only orders expiry, the object's own field stays authoritative.
            self.soft_pins.pin(obj, engine.clock() + obj.soft_pin_ttl)

    def on_replicas_complete(self, done: Sequence[tuple[ObjectMeta, Replica]]) -> None:
        engine = self._engine
        assert engine is not None, "MasterReclaimHooks is not attached to a service"
        a = self._alignment
        memory = _MEMORY
        items: list[tuple[ObjectMeta, Replica, int, bool]] = []
        for obj, replica in done:
            if replica.kind is memory:
                size = obj.size
                if size % a:
                    size = (size + a - 1) // a * a
                items.append((obj, replica, size, obj.hard_pin))
        engine.on_complete_many(items)
        now = None
        for obj, _, _, _ in items:
            if obj.soft_pin_ttl is not None and obj.soft_pin_deadline is None:
                if now is None:
                    now = engine.clock()
                self.soft_pins.pin(obj, now + obj.soft_pin_ttl)

    def on_access(self, obj: ObjectMeta) -> None:
        rec = obj.reclaim
        if rec is None:
            return  # no memory replica completed (or all evicted)
        # The common case of a hot object (one replica, active, already referenced) changes
        # nothing: answer without the shard lookup and the lock.
        if rec.sibling is None and rec.flags & _STATE_REF == _ACTIVE_REF:  # type: ignore[attr-defined]
            return
        engine = self._engine
        assert engine is not None, "MasterReclaimHooks is not attached to a service"
        engine.on_access(obj)

    def on_replica_removed(self, obj: ObjectMeta, replica: Replica) -> None:
        self.engine.on_replica_removed(obj, replica)

    def on_object_removed(self, obj: ObjectMeta) -> None:
        self.engine.on_remove(obj)
        self.soft_pins.unpin(obj)

    def reclaim_for(self, bytes_needed: int) -> int:
        return self.engine.direct_reclaim(bytes_needed)

    def reclaim_tenant(self, tenant: str, bytes_needed: int, keep: ObjectMeta | None) -> int:
        tenants = self._tenants
        return tenants.evict_own(tenant, bytes_needed, keep) if tenants is not None else 0

    def reclaim_range(self, size: int) -> int:
        ranges = self._ranges
        assert ranges is not None, "MasterReclaimHooks is not attached to a service"
        return ranges.reclaim_range(size)

    def defragment(self, size: int) -> int:
        defrag = self._defrag
        return defrag.defragment(size) if defrag is not None else 0

    @property
    def defragmenter(self) -> Defragmenter[ObjectMeta] | None:
        """Pool mode's `Defragmenter` (None in cache mode: range reclaim evicts there)."""
        return self._defrag

    def tick(self, now: float) -> None:
        engine = self.engine
        self.soft_pins.expire(now, self._pin_expired)
        if not engine.kswapd_wanted() or self._scheduled:
            return
        if self._wake():
            return
        for _ in range(self.steps_per_tick):
            step = engine.kswapd_step()
            if step.freed + step.pending == 0 or not engine.kswapd_wanted():
                break

    def _pin_expired(self, obj: ObjectMeta, deadline: float) -> None:
        # Records parked as soft pinned rejoin the unpinned ones (the object's own deadline
        # stays the authority that `inspect` reads).
        self.engine.on_soft_pin_end(obj)

    def stats(self) -> dict[str, int]:
        """Reclaim counters plus gauges (resident records and bytes, live soft pins, bytes
        moving), for the master's Stats reply or metrics."""
        engine = self.engine
        out = engine.stats.as_dict()
        out["resident_records"] = engine.resident_count
        out["resident_bytes"] = engine.resident_bytes
        out["migrating_bytes"] = engine.migrating_bytes
        out["soft_pins"] = len(self.soft_pins)
        if self._ranges is not None:
            out.update(self._ranges.stats.as_dict())
        if self._defrag is not None:
            out.update(self._defrag.defrag.as_dict())
            out["defrag_in_flight"] = self._defrag.in_flight
        return out

    def _wake(self) -> bool:
        """Schedule one kswapd step on the running loop; False when there is no loop."""
        if self._scheduled:
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._scheduled = True
        loop.call_soon(self._step)
        return True

    def _step(self) -> None:
        self._scheduled = False
        engine = self.engine
        try:
            step = engine.kswapd_step()
        except Exception:
            # A bug in the metadata must not end background reclaim; the next tick retries.
            log.exception("kswapd step failed")
            return
        if step.freed + step.pending > 0 and engine.kswapd_wanted():
            self._wake()


def _shard_of(obj: ObjectMeta) -> int:
    return obj.shard


_STATE_REF = STATE_MASK | REF
_ACTIVE_REF = ACTIVE_BITS | REF


class _SegmentLayout:
    """`fit.RangeLayout` over the master's replicas: a record's replica is its `Replica`, the
    free map its segment's allocator."""

    __slots__ = ()

    def place(self, rec: EvictInfo[ObjectMeta]) -> tuple[FreeMap, int] | None:
        replica: Replica = rec.replica_id
        seg = replica.segment
        if not seg.alive:
            return None
        return seg.allocator, replica.offset


class _ObjectSlotIndex:
    """The engine's `RecordIndex` kept in `ObjectMeta.reclaim`: an object's head record lives
    on the object itself (one generation per `ObjectMeta`), so reclaim adds no dict entry per
    object."""

    __slots__ = ()

    def get(self, key: ObjectMeta) -> EvictInfo[ObjectMeta] | None:
        return key.reclaim  # type: ignore[return-value]

    def __setitem__(self, key: ObjectMeta, rec: EvictInfo[ObjectMeta]) -> None:
        key.reclaim = rec

    def __delitem__(self, key: ObjectMeta) -> None:
        key.reclaim = None
