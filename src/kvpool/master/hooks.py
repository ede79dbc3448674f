"""The seam between the master service and reclaim (eviction): two narrow protocols.

`ReclaimHooks` is what the service calls; `kvpool.master.reclaim` implements it (seed 001's
active/inactive lists, background and direct reclaim). `NoopReclaimHooks` is the default: the
pool then only ever frees space through Remove, PutRevoke and client expiry.

`ReclaimTarget` is what the hooks may call back into; `MasterService` implements it.

Threading and blocking: everything here runs on the master's event loop, inside the request
being served, so every hook must be quick (O(1) per call, no I/O, no awaiting). The hooks own
`ObjectMeta.reclaim` (a free slot for list links or flags); the service never reads it. The
service calls:

* `on_replica_complete(obj, replica)` for each replica PutEnd made readable;
* `on_access(obj)` on each read that found the object readable (GetReplicaList, ExistKey,
  GetSize and their batch forms);
* `on_replica_removed(obj, replica)` when one replica leaves an object that stays (evicted
  alone, the source of a finished move, BatchReplicaClear of one segment);
* `on_object_removed(obj)` exactly once when an object leaves the index for any reason (Remove,
  PutRevoke, expiry of its client or segment, eviction, preemption of a stale PutStart, and an
  UpsertStart of another size, which replaces the record by a new one: each `ObjectMeta` is
  one generation of its key). An UpsertStart of the same size keeps the record and its
  replicas (rewritten in place, `complete` False until PutEnd), so `on_replica_complete` comes
  again for the same replicas;
* `reclaim_for(bytes_needed)` once when PutStart (or UpsertStart) found no room; the hook frees
  what it can (through `ReclaimTarget.evict`) and answers the bytes it freed; PutStart then
  retries its allocation once;
* `reclaim_range(size)` when PutStart still finds no room after `reclaim_for` (the pool may
  have the bytes, but in pieces smaller than `size`): the hook evicts what makes one free
  range of `size` bytes on one segment, if it can, and answers the bytes freed (0: it could
  not, and freed nothing); PutStart retries after each call, for at most four calls, and
  stops at the first that freed nothing;
* `defragment(size)` (pool mode) when PutStart still finds no room after range reclaim
  although some serving segment has `size` free bytes in pieces: the hook starts MOVE tasks
  for the neighbours that make one free range (a put cannot wait for them) and answers the
  milliseconds after which the put may ask again (0: nothing under way); at most once per
  request;
* `tick(now)` from a background task every `MasterConfig`-defined interval (kswapd's chance to
  reclaim above the high watermark).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvpool.master.config import MasterConfig
    from kvpool.master.metadata import ObjectIndex, ObjectMeta, Replica
    from kvpool.master.quota import TenantQuotas

__all__ = ["NoopReclaimHooks", "ReclaimHooks", "ReclaimTarget"]


class ReclaimTarget(Protocol):
    """The service as seen by the reclaim hooks."""

    @property
    def config(self) -> MasterConfig: ...

    @property
    def index(self) -> ObjectIndex:
        """The sharded objects (read only: change them through `evict`)."""
        ...

    def now(self) -> float:
        """The master clock, in seconds (the same clock leases use)."""
        ...

    def memory_usage(self) -> tuple[int, int]:
        """(capacity, used) bytes over all mounted segments."""
        ...

    def memory_pressure(self) -> tuple[int, int]:
        """(capacity, used) bytes of the fullest mounted segment (by used fraction): what
        pool-mode reclaim watches, since there a node's memory fills, not the pool's."""
        ...

    def evictable(self, obj: ObjectMeta, now: float) -> bool:
        """Complete, not hard-pinned, lease expired, still indexed (soft pin is the hooks' call)."""
        ...

    def evict(self, obj: ObjectMeta) -> int:
        """Drop `obj`'s memory replicas (the object goes when none is left); bytes freed.

        Call only when `evictable(obj, now)` is true. Calls `on_object_removed` when the object
        leaves the index.
        """
        ...

    def evict_replica(self, obj: ObjectMeta, replica: Replica) -> int:
        """Drop one replica of `obj` (the object goes with its last one); bytes freed.

        Call only when `evictable(obj, now)` is true. Calls `on_replica_removed`, and
        `on_object_removed` when the object leaves the index.
        """
        ...

    def has_task(self, obj: ObjectMeta) -> bool:
        """A replica task (copy or move) is running on `obj`: keep it where it is."""
        ...

    def swap_out(
        self,
        obj: ObjectMeta,
        replica: Replica,
        low_watermark: float,
        on_done: Callable[[bool], None],
    ) -> bool:
        """Start moving `replica` to another segment that stays at or below `low_watermark`
        (fraction of its capacity) with it; False (nothing changed) when none can take it.

        Never triggers reclaim. On True, `on_done(moved)` is called once, later, when the move
        task ends: moved=True after the metadata switched to the destination (the source is
        freed then, or when the object's read lease runs out), False after it failed (the
        destination was freed, the source stays).
        """
        ...

    def move_away(
        self,
        moves: Sequence[tuple[ObjectMeta, Replica, Callable[[bool], None]]],
        keep_free: Sequence[tuple[int, int]],
    ) -> bool:
        """Pool-mode defragmentation: start moving each `(obj, replica, on_done)` of `moves`
        anywhere else, all or none: to another serving segment that stays at or below the
        low watermark with it, else to its own segment outside the free ranges `keep_free`
        ((offset, size) of that segment: the range being made). False (nothing changed) when
        one cannot move. Never triggers reclaim; each `on_done(moved)` as for `swap_out`."""
        ...

    def largest_free(self) -> int:
        """Bytes of the largest free block of any serving segment (what a move can take)."""
        ...

    @property
    def quotas(self) -> TenantQuotas | None:
        """The tenant quotas in force (None: none); fair share applies only with them."""
        ...


class ReclaimHooks(Protocol):
    """What the service tells reclaim; see the module docstring for when each is called."""

    def attach(self, target: ReclaimTarget) -> None:
        """Called once, when the service is built, before any other hook."""
        ...

    def on_replica_complete(self, obj: ObjectMeta, replica: Replica) -> None: ...

    def on_replicas_complete(self, done: Sequence[tuple[ObjectMeta, Replica]]) -> None:
        """`on_replica_complete` of each pair, in order (one batch commit): the same effect,
        with the per-call work paid once."""
        ...

    def on_access(self, obj: ObjectMeta) -> None: ...

    def on_object_removed(self, obj: ObjectMeta) -> None: ...

    def on_replica_removed(self, obj: ObjectMeta, replica: Replica) -> None:
        """One replica left an object that stays (a replica evicted alone, a move's source,
        BatchReplicaClear of one segment)."""
        ...

    def reclaim_for(self, bytes_needed: int) -> int:
        """Free at least `bytes_needed` if possible; answer the bytes actually freed."""
        ...

    def reclaim_tenant(self, tenant: str, bytes_needed: int, keep: ObjectMeta | None) -> int:
        """A put over its tenant's quota: evict that tenant's own unpinned objects (never
        `keep`) until `bytes_needed` of its usage is freed, if possible; answer the usage
        freed (`kvpool.master.reclaim.tenants`)."""
        ...

    def reclaim_range(self, size: int) -> int:
        """Free what makes one free range of at least `size` bytes on one segment, if
        possible; answer the bytes freed (0: nothing freed, the put stops asking)."""
        ...

    def defragment(self, size: int) -> int:
        """Pool mode: start the moves that make one free range of `size` bytes; answer the
        milliseconds after which a put may ask again (0: nothing is under way)."""
        ...

    def tick(self, now: float) -> None: ...


class NoopReclaimHooks:
    """No reclaim at all: the default, and the base class to override only what is needed."""

    def attach(self, target: ReclaimTarget) -> None:
        pass

    def on_replica_complete(self, obj: ObjectMeta, replica: Replica) -> None:
        pass

    def on_replicas_complete(self, done: Sequence[tuple[ObjectMeta, Replica]]) -> None:
        for obj, replica in done:
            self.on_replica_complete(obj, replica)

    def on_access(self, obj: ObjectMeta) -> None:
        pass

    def on_object_removed(self, obj: ObjectMeta) -> None:
        pass

    def on_replica_removed(self, obj: ObjectMeta, replica: Replica) -> None:
        pass

    def reclaim_for(self, bytes_needed: int) -> int:
        return 0

    def reclaim_tenant(self, tenant: str, bytes_needed: int, keep: ObjectMeta | None) -> int:
        return 0

    def reclaim_range(self, size: int) -> int:
        return 0

    def defragment(self, size: int) -> int:
        return 0

    def tick(self, now: float) -> None:
        pass
