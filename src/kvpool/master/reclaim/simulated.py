"""An in-memory metadata table and byte allocator that drive the real `ReclaimEngine`.

`SimulatedPool` is a `ReclaimTarget` with just enough of the master's object model (generations,
replicas, leases, soft and hard pins, in-flight transfers, primary replicas) and a PutStart-like
path (allocate → on failure one direct reclaim → retry once → NO_AVAILABLE_HANDLE) for the
tests and for `kvpool bench reclaim` to exercise the engine without the master service, the
way SGLang's `create_simulated()` constructors do. The allocator counts bytes only (no
fragmentation). In pool mode, swap-outs go to a "remote" memory of `remote_capacity` bytes and
complete when the caller says so (`finish_swap_outs`), as the transfer engine's tasks would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpool.errors import ErrorCode
from kvpool.master.reclaim.base import ReclaimTarget, Verdict
from kvpool.master.reclaim.config import ReclaimConfig
from kvpool.master.reclaim.engine import ReclaimEngine
from kvpool.master.reclaim.records import EvictInfo
from kvpool.master.reclaim.softpin import SoftPinIndex

__all__ = ["ManualClock", "SimObject", "SimReplica", "SimulatedPool"]


class ManualClock:
    """A clock that moves only when told (tests and trace-driven benchmarks)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(slots=True)
class SimReplica:
    replica_id: int
    size: int
    complete: bool = False
    busy: int = 0
    """In-flight transfers reading or writing this replica."""
    remote: bool = False
    """Moved out of the watched memory by a swap-out (no longer uses local bytes)."""


@dataclass(slots=True)
class SimObject:
    generation: int
    size: int
    replicas: dict[int, SimReplica] = field(default_factory=dict)
    lease_deadline: float = 0.0
    soft_pin_deadline: float = 0.0
    hard_pinned: bool = False


class SimulatedPool(ReclaimTarget[str]):
    """Object metadata and a byte-counting allocator of `capacity` bytes, plus the engine."""

    def __init__(
        self,
        capacity: int,
        config: ReclaimConfig | None = None,
        *,
        num_shards: int = 8,
        clock: Callable[[], float] | None = None,
        lease_ttl_s: float = 0.0,
        remote_capacity: int = 0,
        shard_of: Callable[[str], int] | None = None,
    ) -> None:
        self.capacity = capacity
        self.clock: Callable[[], float] = clock or ManualClock()
        self.lease_ttl_s = lease_ttl_s
        self.remote_capacity = remote_capacity
        self.remote_used = 0
        self.used = 0
        self.objects: dict[str, SimObject] = {}
        self.engine: ReclaimEngine[str] = ReclaimEngine(
            self, config, num_shards=num_shards, shard_of=shard_of, clock=self.clock
        )
        self.soft_pins: SoftPinIndex[str] = SoftPinIndex(num_shards, self.engine.shard_of)
        self.pending_swaps: list[EvictInfo[str]] = []
        self._generations = itertools.count(1)
        self._replica_ids = itertools.count(1)

    # ------------------------------------------------------------------ the online path

    def put_start(
        self,
        key: str,
        size: int,
        *,
        replicas: int = 1,
        hard_pin: bool = False,
        allow_direct_reclaim: bool = True,
    ) -> ErrorCode:
        """Allocate PROCESSING replicas; on failure reclaim directly once and retry once."""
        if key in self.objects:
            return ErrorCode.OBJECT_ALREADY_EXISTS
        need = size * replicas
        if self.used + need > self.capacity:
            if allow_direct_reclaim:
                self.engine.direct_reclaim(self.used + need - self.capacity)
            if self.used + need > self.capacity:
                return ErrorCode.NO_AVAILABLE_HANDLE
        self.used += need
        obj = SimObject(next(self._generations), size, hard_pinned=hard_pin)
        for _ in range(replicas):
            rid = next(self._replica_ids)
            obj.replicas[rid] = SimReplica(rid, size)
        self.objects[key] = obj
        return ErrorCode.OK

    def put_end(self, key: str, *, soft_pin_ttl_s: float = 0.0) -> ErrorCode:
        """Mark the replicas COMPLETE (and start the soft pin): they enter the reclaim lists."""
        obj = self.objects.get(key)
        if obj is None:
            return ErrorCode.OBJECT_NOT_FOUND
        if soft_pin_ttl_s > 0:
            obj.soft_pin_deadline = self.clock() + soft_pin_ttl_s
            self.soft_pins.pin(key, obj.soft_pin_deadline)
        for rep in obj.replicas.values():
            if not rep.complete:
                rep.complete = True
                self.engine.on_complete(
                    key,
                    rep.replica_id,
                    rep.size,
                    generation=obj.generation,
                    hard_pinned=obj.hard_pinned,
                )
        return ErrorCode.OK

    def put(
        self,
        key: str,
        size: int,
        *,
        replicas: int = 1,
        hard_pin: bool = False,
        soft_pin_ttl_s: float = 0.0,
        allow_direct_reclaim: bool = True,
    ) -> ErrorCode:
        """PutStart + PutEnd."""
        code = self.put_start(
            key,
            size,
            replicas=replicas,
            hard_pin=hard_pin,
            allow_direct_reclaim=allow_direct_reclaim,
        )
        if code is ErrorCode.OK:
            code = self.put_end(key, soft_pin_ttl_s=soft_pin_ttl_s)
        return code

    def get(self, key: str) -> bool:
        """A read: on a hit grant a lease and tell the engine. True on a hit."""
        obj = self.objects.get(key)
        if obj is None or not any(r.complete for r in obj.replicas.values()):
            return False
        if self.lease_ttl_s > 0:
            obj.lease_deadline = max(obj.lease_deadline, self.clock() + self.lease_ttl_s)
        self.engine.on_access(key)
        return True

    def remove(self, key: str) -> bool:
        obj = self.objects.pop(key, None)
        if obj is None:
            return False
        for rep in obj.replicas.values():
            if rep.remote:
                self.remote_used -= rep.size
            else:
                self.used -= rep.size
        self.soft_pins.unpin(key)
        self.engine.on_remove(key, obj.generation)
        return True

    def expire_soft_pins(self) -> int:
        return self.soft_pins.expire(self.clock(), self._on_pin_expired)

    def _on_pin_expired(self, key: str, deadline: float) -> None:
        obj = self.objects.get(key)
        if obj is not None and obj.soft_pin_deadline == deadline:
            obj.soft_pin_deadline = 0.0
            self.engine.on_soft_pin_end(key)

    def finish_swap_outs(self, ok: bool = True) -> int:
        """Complete every started swap-out: switch metadata to the remote copy, free the source."""
        done = self.pending_swaps
        self.pending_swaps = []
        for rec in done:
            obj = self.objects.get(rec.key)
            rep = None if obj is None else obj.replicas.get(rec.replica_id)
            if ok and obj is not None and rep is not None and obj.generation == rec.generation:
                rep.remote = True
                self.used -= rep.size
                self.engine.on_swap_out_done(rec, moved=True)
            else:
                self.remote_used -= rec.size
                self.engine.on_swap_out_done(rec, moved=False)
        return len(done)

    # ------------------------------------------------------------------ ReclaimTarget

    def memory_usage(self) -> tuple[int, int]:
        return self.capacity, self.used

    def inspect(self, rec: EvictInfo[str], now: float) -> Verdict:
        obj = self.objects.get(rec.key)
        if obj is None or obj.generation != rec.generation:
            return Verdict.STALE
        rep = obj.replicas.get(rec.replica_id)
        if rep is None or not rep.complete or rep.remote:
            return Verdict.STALE
        if obj.hard_pinned:
            return Verdict.HARD_PINNED
        if obj.lease_deadline > now:
            return Verdict.LEASED
        if rep.busy:
            return Verdict.BUSY
        if obj.soft_pin_deadline > now:
            return Verdict.SOFT_PINNED
        local = [r for r in obj.replicas.values() if not r.remote]
        # The primary is the oldest replica still in this memory: losing it loses the object.
        if rec.replica_id == min(r.replica_id for r in local):
            return Verdict.PRIMARY
        return Verdict.DROPPABLE

    def drop(self, rec: EvictInfo[str]) -> int:
        obj = self.objects.get(rec.key)
        if obj is None or obj.generation != rec.generation:
            return 0
        rep = obj.replicas.pop(rec.replica_id, None)
        if rep is None or rep.remote:
            return 0
        self.used -= rep.size
        if not obj.replicas:
            # Last replica: the object is gone, as in Mooncake; the master's remove hook fires.
            del self.objects[rec.key]
            self.soft_pins.unpin(rec.key)
            self.engine.on_remove(rec.key, obj.generation)
        return rep.size

    def swap_out(self, rec: EvictInfo[str]) -> bool:
        if self.remote_used + rec.size > self.remote_capacity:
            return False
        self.remote_used += rec.size
        self.pending_swaps.append(rec)
        return True
