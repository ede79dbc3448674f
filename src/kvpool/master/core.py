"""`MetadataCore`: the master's metadata, and the only code that changes it.

The core owns the object index, the mounted segments (and their allocators), the client table,
placement, the parked ranges and the clock. Everything else in the master reads the metadata
and asks the core to change it through the named operations below. Each operation is described
by plain values (ids, names, offsets, sizes, times; the records it takes are the ones the
caller looked up by such values, or a new record whose fields are such values), changes
nothing but what its name says, and tells the reclaim hooks and the observers what left; with
a data directory the durable ones also tell `journal` (`oplog.Journal`, which logs the state
they leave as one record, docs/parts/ha.md "Durable metadata"):

    objects   create_object, create_committed, complete_object, commit_objects,
              rewrite_object, add_replicas, move_replica, release_moved_source,
              retire_replica, drop_replica, free_object, remove_object, revoke, preempt,
              forget_dead, clear_holder, sweep_dead
    ranges    allocate, carve, release_region, allocate_on, reserve_range, free_range,
              free_replicas, park, park_range, take_range, release_parked
    segments  mount_segment, unmount_segment, restore_segment
    clients   register_client, ping_client, postpone_clients, silence_client, revive_client,
              expire_client, prune_clients

Allocation (`allocate`, `carve`, `allocate_on`, `reserve_range`) is a decision as well as a
change (placement draws random numbers, and a batch's region lives in its `PutPlan`): a log
would record its result, the ranges, with the operation that uses them.

Two things change outside the core on purpose: a read's lease (`ObjectMeta.lease_deadline`
pushed forward by the read path, `reads.py`, with `hooks.on_access`), a promise to one reader
granted millions of times a second and not state a standby needs; and `ObjectMeta.reclaim`,
which belongs to the reclaim hooks.

Objects whose replicas all sit on unmounted segments are gone: every lookup drops such an
object on sight (O(replicas)), and `sweep_dead` clears the rest in the background.

Objects with a replica on a *silent* segment (its owner missed `client_ttl`) are kept: the
segment is still mounted, only not serving (`Segment.serving`), until its owner remounts it
(`revive_client`) or is dropped (`expire_client`, past `client_dead_ttl`).

Observers (`MetadataObserver`, `kvpool.master.observer`: the task table, the arena table, the
repair queue, the invalidation hub) are told when an object leaves the index or loses replicas
to a dropped segment, a segment is mounted, restored or unmounted, and a client falls silent or
expires, in the order they were added; they may call back into the core.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from kvpool.codes import INVALID_PARAMS, OK, SEGMENT_ALREADY_EXISTS
from kvpool.master.config import AllocationStrategy, MasterConfig
from kvpool.master.hooks import ReclaimHooks
from kvpool.master.liveness import ClientRecord, ClientTable
from kvpool.master.metadata import ObjectIndex, ObjectMeta, Replica
from kvpool.master.observer import MetadataObserver
from kvpool.master.parking import ParkedRanges
from kvpool.master.placement import Placement
from kvpool.master.planner import Claim, PutPlan
from kvpool.master.segments import Segment, SegmentTable
from kvpool.protocol.messages import (
    ClientId,
    HostId,
    ReplicaKind,
    ReplicaStatus,
    SegmentInfo,
    SegmentName,
    SoftPinAction,
)

if TYPE_CHECKING:
    from kvpool.master.oplog import Journal

__all__ = ["MetadataCore", "MetadataObserver"]

log = logging.getLogger(__name__)

_PROCESSING = ReplicaStatus.PROCESSING
_COMPLETE = ReplicaStatus.COMPLETE
_MEMORY_KIND = ReplicaKind.MEMORY
_PREEMPT = Claim.PREEMPT
_FORGET_DEAD = Claim.FORGET_DEAD
# Enum members read on the request paths are module constants: `Enum.MEMBER` goes through
# EnumType.__getattr__ on Python 3.11 (about 900 instructions each; perf-master.md).
_LOCAL_FIRST = AllocationStrategy.LOCAL_FIRST
_PIN_ENABLE = SoftPinAction.ENABLE
_PIN_DISABLE = SoftPinAction.DISABLE


class MetadataCore:
    """The metadata of one pool and its operations (one event loop owns it; nothing locks)."""

    def __init__(
        self,
        config: MasterConfig,
        clock: Callable[[], float],
        hooks: ReclaimHooks,
        parked: ParkedRanges,
    ) -> None:
        self.config = config
        self.clock = clock
        self.hooks = hooks
        self.parked = parked
        self.index = ObjectIndex(config.num_shards)
        self.segments = SegmentTable(config.alignment)
        self.clients = ClientTable(config.client_ttl, config.dead_ttl)
        self.placement = Placement(config.allocation_strategy, random.Random(config.seed))
        self.started = clock()
        self.view_version = 1
        #: Set when a segment went away; the server then runs `sweep_dead`.
        self.sweep_needed = False
        #: Told of each object created with fewer replicas than its put asked for (fewer
        #: segments had room; `note_short`): the repair queue, which copies it up later.
        self.on_short: Callable[[ObjectMeta], None] | None = None
        #: Called with each object that became readable (PutEnd, PutCommit): the tier manager
        #: queues it for an eager offload.
        self.on_complete: Callable[[ObjectMeta], None] | None = None
        #: Milliseconds a refused put should wait before asking again while memory is being
        #: freed by moves to a disk tier (0: none are running).
        self.retry_hint: Callable[[], int] | None = None
        #: Called with (segment, offset) of every disk-tier range freed: its node journals it
        #: as given up, so the object does not come back after a restart.
        self.on_disk_free: Callable[[Segment, int], None] | None = None
        self._observers: tuple[MetadataObserver, ...] = ()
        self._alignment = config.alignment
        self._release_timeout = config.put_start_release_timeout
        #: Told of every durable change (`durable.py`); None without a data directory.
        self.journal: Journal | None = None
        #: (deadline on this clock, grace in seconds) of each segment being drained
        #: (`drain.py`), logged, so a restarted or promoted master resumes it (`durable.py`).
        self.draining: dict[SegmentName, tuple[float, float]] = {}

    def observe(self, observer: MetadataObserver) -> None:
        """Tell `observer` of removals, mounts, unmounts and expiries from now on."""
        self._observers = (*self._observers, observer)

    # ------------------------------------------------------------------ reading

    def aligned(self, size: int) -> int:
        a = self._alignment
        return (size + a - 1) // a * a

    def lookup(self, tenant: str, key: str) -> ObjectMeta | None:
        """The object, unless all of its replicas sit on unmounted segments (then it is
        forgotten here and None answered)."""
        obj = self.index.get(tenant, key)
        if obj is None or obj.has_live_replica():
            return obj
        self.forget_dead(obj)
        return None

    # ------------------------------------------------------------------ objects

    def create_object(
        self,
        shard: dict[str, ObjectMeta],
        obj: ObjectMeta,
        in_flight: dict[ObjectMeta, None] | None,
    ) -> None:
        """Index the new record `obj` (its key absent) in `shard`, its tenant's dict of
        `obj.shard`; a write in progress also joins its client's in-flight set `in_flight`."""
        shard[obj.key] = obj  # ObjectIndex.add, inlined on the hottest write path
        index = self.index
        index.count += 1
        tb = index.tenant_bytes  # quota: the size once per replica (ObjectIndex.charge)
        tb[obj.tenant] = tb.get(obj.tenant, 0) + obj.size * len(obj.replicas)
        if in_flight is not None:
            in_flight[obj] = None
            if self.journal is not None:  # its writer may write there after a restart
                self.journal.flight(obj, obj.put_start_time + self._release_timeout)

    def create_committed(self, shard: dict[str, ObjectMeta], obj: ObjectMeta) -> None:
        """Index the new COMPLETE record `obj` (a PutCommit: its one replica is a range the
        client committed from an arena, counted on its segment from now on)."""
        obj.replicas[0].segment.objects += 1
        shard[obj.key] = obj
        index = self.index
        index.count += 1
        tb = index.tenant_bytes
        tb[obj.tenant] = tb.get(obj.tenant, 0) + obj.size

    def complete_object(self, obj: ObjectMeta, checksum: int | None, now: float) -> None:
        """PutEnd: every replica COMPLETE, the checksum recorded, lease = max(lease, now), the
        soft pin started; the write is no longer in flight."""
        on_complete = self.hooks.on_replica_complete
        for r in obj.replicas:
            r.status = _COMPLETE
            on_complete(obj, r)
        obj.complete = True
        obj.checksum = checksum
        obj.lease_deadline = max(obj.lease_deadline, now)
        if obj.soft_pin_ttl is not None and obj.soft_pin_deadline is None:
            obj.soft_pin_deadline = now + obj.soft_pin_ttl
        self.clients.drop_in_flight(obj)
        if self.journal is not None:
            self.journal.obj(obj)
        if self.on_complete is not None:
            self.on_complete(obj)

    def note_short(self, obj: ObjectMeta) -> None:
        """`obj` was just created with fewer replicas than its put asked for: tell `on_short`
        (the write path calls this only then, so a put that got its count pays nothing)."""
        if self.on_short is not None:
            self.on_short(obj)

    def commit_objects(
        self, done: list[tuple[ObjectMeta, Replica]], pin_deadline: float | None
    ) -> None:
        """The objects of a commit (indexed COMPLETE by `create_committed`) are announced to
        the hooks in one call, then their soft pins start (as at PutEnd); they are logged here,
        pins set (a commit always ends with this call)."""
        if len(done) == 1:  # a PutCommit: the hooks' one-object form, no batch list
            obj, replica = done[0]
            self.hooks.on_replica_complete(obj, replica)
        else:
            self.hooks.on_replicas_complete(done)
        if pin_deadline is not None:
            for obj, _ in done:
                obj.soft_pin_deadline = pin_deadline
        if self.journal is not None:
            for obj, _ in done:
                self.journal.obj(obj)
        if self.on_complete is not None:
            for obj, _ in done:
                self.on_complete(obj)

    def rewrite_object(  # noqa: PLR0917
        self,
        obj: ObjectMeta,
        size: int,
        fresh: tuple[Replica, ...] | None,
        client_id: ClientId,
        now: float,
        action: SoftPinAction,
        soft_pin: float | None,
        replica_num: int = 0,
    ) -> ObjectMeta:
        """UpsertStart of the complete `obj`, as a write of `size` bytes by `client_id` from
        `now` with the put's soft-pin `action`: in place (`fresh` None: its live replicas go
        back to PROCESSING), or onto the `fresh` ranges as a new record (a new generation for
        the hooks, which see the old one removed) carrying over group, hard pin and pin; the
        old ranges are then freed, or parked until the lease ends while one is live. Answers
        the record being written (unreadable until PutEnd); a new record asks for
        `replica_num` replicas (0: as many as the old one asked for)."""
        for o in self._observers:  # observers that care (kvpool.master.invalidation)
            rewritten = getattr(o, "object_rewritten", None)
            if rewritten is not None:
                rewritten(obj)
        if fresh is None:
            live = tuple(r for r in obj.replicas if r.segment.alive)
            for r in live:
                r.status = _PROCESSING
            self._set_replicas(obj, live)
        else:
            if now < obj.lease_deadline:
                # A reader holding the lease may still be copying from the old ranges: freed
                # now, the next put could land there and the reader get another key's bytes.
                self.park(obj.lease_deadline, obj.size, obj.replicas)
            else:
                for r in obj.replicas:
                    self._free_replica(r, obj.size)
            old, obj = (
                obj,
                ObjectMeta(
                    obj.key,
                    obj.tenant,
                    obj.shard,
                    size,
                    client_id,
                    fresh,
                    now,
                    obj.soft_pin_ttl,
                    obj.hard_pin,
                    obj.group_id,
                    replica_num or obj.replica_num,
                ),
            )
            obj.soft_pin_deadline = old.soft_pin_deadline
            self._set_replicas(old, ())
            self._drop(old)
            self.index.insert(obj)
        obj.complete = False
        obj.client_id = client_id
        obj.put_start_time = now
        obj.checksum = None
        if action is _PIN_ENABLE:
            obj.soft_pin_ttl = soft_pin
            obj.soft_pin_deadline = None
        elif action is _PIN_DISABLE:
            obj.soft_pin_ttl = None
            obj.soft_pin_deadline = None
        self.clients.add_in_flight(obj)
        if self.journal is not None:
            self.journal.flight(obj, now + self._release_timeout)
        return obj

    def add_replicas(self, obj: ObjectMeta, targets: tuple[Replica, ...]) -> None:
        """A copy finished: `targets` become COMPLETE replicas of `obj`."""
        for t in targets:
            t.status = _COMPLETE
        promoted = any(r.kind is not _MEMORY_KIND for r in obj.replicas)
        self._set_replicas(obj, obj.replicas + targets)
        if promoted:
            self._tier_changed(obj)
        on_complete = self.hooks.on_replica_complete
        for t in targets:
            on_complete(obj, t)
        if self.journal is not None:
            self.journal.obj(obj)

    def move_replica(self, obj: ObjectMeta, source: Replica, target: Replica) -> None:
        """A move finished: `target` takes `source`'s place (a moved primary stays primary;
        `release_moved_source` then lets go of the source)."""
        target.status = _COMPLETE
        reps = tuple(target if r is source else r for r in obj.replicas)
        # The source left meanwhile: keep the copy anyway.
        self._set_replicas(obj, reps if target in reps else (*reps, target))
        self.hooks.on_replica_complete(obj, target)
        if self.journal is not None:
            self.journal.obj(obj)

    def release_moved_source(self, obj: ObjectMeta, source: Replica, now: float) -> None:
        """The source of a finished move leaves `obj`: freed, or parked until the read lease
        ends while one is live (a reader may still be copying from it)."""
        self.hooks.on_replica_removed(obj, source)
        if now < obj.lease_deadline:
            self.park(obj.lease_deadline, obj.size, (source,))
        else:
            self._free_replica(source, obj.size)
        if source.kind is not _MEMORY_KIND:
            self._tier_changed(obj)

    def retire_replica(self, obj: ObjectMeta, replica: Replica, now: float) -> None:
        """`replica` leaves `obj`, which keeps others (one found bad): freed, or parked until
        the read lease ends while one is live (a reader may still be copying from it)."""
        self._set_replicas(obj, tuple(r for r in obj.replicas if r is not replica))
        self.release_moved_source(obj, replica, now)  # (a disk or DFS one is told there)
        if self.journal is not None:
            self.journal.obj(obj)

    def drop_replica(self, obj: ObjectMeta, replica: Replica) -> int:
        """Drop one replica of `obj` (the object goes with its last one); bytes freed."""
        freed = self.aligned(obj.size) if self._free_replica(replica, obj.size) else 0
        self._set_replicas(obj, tuple(r for r in obj.replicas if r is not replica))
        self.hooks.on_replica_removed(obj, replica)
        if not obj.replicas:
            self._drop(obj)
            return freed
        if replica.kind is not _MEMORY_KIND:
            self._tier_changed(obj)
        if self.journal is not None:
            self.journal.obj(obj)
        return freed

    def _tier_changed(self, obj: ObjectMeta) -> None:
        """`obj` gained a memory replica beside a disk or DFS one (a promotion), or lost a
        disk or DFS replica and keeps others: observers that care are told
        (`kvpool.master.invalidation`: cached-mode clients remember such places)."""
        for o in self._observers:
            changed = getattr(o, "tier_changed", None)
            if changed is not None:
                changed(obj)

    def free_object(self, obj: ObjectMeta) -> int:
        """Free every replica of `obj` now and forget it; answers the bytes freed."""
        freed = 0
        aligned = self.aligned(obj.size)
        for r in obj.replicas:
            if self._free_replica(r, obj.size):
                freed += aligned
        self._set_replicas(obj, ())
        self._drop(obj)
        return freed

    def remove_object(self, obj: ObjectMeta) -> None:
        """Remove: a complete object is freed; a write in progress is forgotten with its
        ranges parked (its writer may still be writing)."""
        if obj.complete:
            self.free_object(obj)
            return
        self._park(obj)
        self.clients.drop_in_flight(obj)
        self._drop(obj)

    def revoke(self, obj: ObjectMeta) -> None:
        """Free everything a PutStart (or in-place UpsertStart) took and forget the object."""
        self.clients.drop_in_flight(obj)
        self.free_object(obj)

    def preempt(self, old: ObjectMeta) -> None:
        """Take an unfinished PutStart's key away from it (stale, or its client expired); its
        writer may still be writing, so its space stays parked until
        `put_start_release_timeout` after it started."""
        log.info("preempting unfinished PutStart of %r by client %s", old.key, old.client_id)
        self._park(old)
        self.clients.drop_in_flight(old)
        self._drop(old)

    def forget_dead(self, obj: ObjectMeta) -> None:
        """Forget `obj`, all of whose replicas sit on unmounted segments."""
        self.clients.drop_in_flight(obj)
        self._set_replicas(obj, ())
        self._drop(obj)

    def clear_holder(self, old: ObjectMeta, claim: Claim) -> None:
        """Apply the planner's verdict on the key `old` holds: forget it (FORGET_DEAD) or
        preempt it (PREEMPT); EXISTS changes nothing."""
        if claim is _PREEMPT:
            self.preempt(old)
        elif claim is _FORGET_DEAD:
            self.forget_dead(old)

    def sweep_dead(self) -> Iterator[int]:
        """Drop replicas on unmounted segments from the metadata, and the objects left with
        none, `sweep_batch` objects per step (the server yields to the loop between steps);
        each step yields the number of objects removed so far."""
        self.sweep_needed = False
        removed = 0
        batch = self.config.sweep_batch
        objs = self.index.snapshot()
        for i in range(0, len(objs), batch):
            for obj in objs[i : i + batch]:
                reps = obj.replicas
                if all(r.segment.alive for r in reps):
                    continue
                live = tuple(r for r in reps if r.segment.alive)
                if live:
                    self._set_replicas(obj, live)
                    if self.journal is not None:
                        self.journal.obj(obj)
                    for o in self._observers:
                        o.replicas_lost(obj)
                elif self.index.get(obj.tenant, obj.key) is obj:
                    self._set_replicas(obj, ())
                    self._drop(obj)
                    removed += 1
            yield removed

    def _park(self, obj: ObjectMeta) -> None:
        if obj.replicas:
            self.park(obj.put_start_time + self._release_timeout, obj.size, obj.replicas)
            self._set_replicas(obj, ())

    def _set_replicas(self, obj: ObjectMeta, replicas: tuple[Replica, ...]) -> None:
        """`obj`'s replicas become `replicas`; an indexed object's tenant is charged (or
        refunded) its size per replica gained (or lost): `kvpool.master.quota`."""
        delta = len(replicas) - len(obj.replicas)
        obj.replicas = replicas
        if delta and self.index.holds(obj):
            self.index.charge(obj.tenant, delta * obj.size)

    def _drop(self, obj: ObjectMeta) -> None:
        if self.index.discard(obj):
            self.hooks.on_object_removed(obj)
            if self.journal is not None:
                self.journal.gone(obj)
        for o in self._observers:
            o.object_removed(obj)

    # ------------------------------------------------------------------ ranges

    def allocate(self, size: int, plan: PutPlan) -> tuple[Replica, ...]:
        """PROCESSING replicas for a new object of `size` bytes, placed as `plan` says; when
        nothing fits, the parked ranges that are due are freed, then one `reclaim_for` and one
        retry, then up to four `reclaim_range` (one free range large enough, where byte reclaim
        left the room in pieces), each followed by a retry. () when there is no room, with the
        retry hint in `plan.retry_after_ms` (defragmentation, moves to disk, parked memory)."""
        if plan.simple:
            one = self.carve(size, plan) if plan.region_left else None
            if one is None:
                one = self.placement.one_random(self.segments.live, size)
            if one is not None:
                return (Replica(one[0], one[1], _PROCESSING),)
        host: HostId | None = None
        if plan.same_node or self.placement.strategy is _LOCAL_FIRST:
            rec = self.clients.get(plan.client_id)
            host = rec.host_id if rec is not None else None
        got = self.placement.allocate(
            self.segments,
            size,
            plan.replica_num,
            preferred=plan.preferred,
            exclude=plan.exclude,
            local_host=host,
            local_first=plan.same_node,
        )
        if not got and self.parked.due(now := self.clock()) and self.release_parked(now):
            got = self._allocate_again(size, plan, host)  # (due before the monitor's tick)
        if not got:
            # Direct reclaim: once, then one more try (as the kernel's allocation slow path);
            # not for an object no segment could hold even empty: evicting would be for nothing.
            aligned = self.aligned(size)
            if not any(s.allocator.capacity >= aligned for s in self.segments.live):
                return ()
            if self.hooks.reclaim_for(aligned * plan.replica_num) > 0:
                got = self._allocate_again(size, plan, host)
            # The bytes freed may lie in pieces smaller than the object (issue #13): free one
            # range large enough instead, a bounded number of times, within this request.
            rounds = 4
            while not got and rounds > 0 and self.hooks.reclaim_range(aligned) > 0:
                rounds -= 1
                got = self._allocate_again(size, plan, host)
            if not got:
                self._defragment(aligned, plan)
                if not plan.retry_after_ms and self.retry_hint is not None:
                    plan.retry_after_ms = self.retry_hint() or plan.retry_after_ms
                if not plan.retry_after_ms:  # memory parked a moment more (`parking.py`)
                    plan.retry_after_ms = self.parked.hint_ms(self.clock())
        return tuple(Replica(seg, off, _PROCESSING) for seg, off in got)

    def _defragment(self, aligned: int, plan: PutPlan) -> None:
        """No range after reclaim: when a serving segment has the bytes in pieces, ask the
        hooks (pool mode) to move neighbours out of one range, once per request; the answer
        is the put's retry hint (`plan.retry_after_ms`). A put that excludes segments (its
        retry after a node's death) is not one to move others for."""
        if plan.retry_after_ms is not None:
            return
        plan.retry_after_ms = 0
        if plan.exclude:
            return
        if any(s.allocator.capacity - s.allocator.allocated >= aligned for s in self.segments.live):
            plan.retry_after_ms = self.hooks.defragment(aligned)

    def _allocate_again(
        self, size: int, plan: PutPlan, host: HostId | None
    ) -> list[tuple[Segment, int]]:
        """`allocate`'s placement once more, after reclaim freed something."""
        return self.placement.allocate(
            self.segments,
            size,
            plan.replica_num,
            preferred=plan.preferred,
            exclude=plan.exclude,
            local_host=host,
            local_first=plan.same_node,
        )

    def carve(self, size: int, plan: PutPlan) -> tuple[Segment, int] | None:
        """A range for one object of a batch, cut from the batch's region.

        A batch of one-replica random puts takes one range on one random segment for all of
        its objects (what the batch may still need) and cuts it in order: one allocator call
        per batch instead of one per key. Each object's range is later freed on its own,
        which the allocator allows (a free of any sub-range coalesces with free neighbours);
        what the batch did not use goes back at its end (`release_region`). When no segment
        has room for the rest of the batch, the batch falls back to one allocation per key.
        """
        need = self.aligned(size)
        seg = plan.region_seg
        if seg is None or plan.region_next + need > plan.region_end:
            self.release_region(plan)
            want = max(need, plan.region_left)
            block = self.placement.one_random(self.segments.live, want, count=False)
            if block is None:
                plan.region_left = 0
                return None
            seg, off = block
            plan.region_seg, plan.region_next, plan.region_end = seg, off, off + want
        off = plan.region_next
        plan.region_next = off + need
        plan.region_left -= need
        seg.objects += 1
        return seg, off

    def release_region(self, plan: PutPlan) -> None:
        """Give back what a batch did not cut from its region."""
        seg = plan.region_seg
        if seg is not None:
            if seg.alive and plan.region_next < plan.region_end:
                seg.allocator.free(plan.region_next, plan.region_end - plan.region_next)
            plan.region_seg = None

    def allocate_on(
        self, seg: Segment, size: int, keep_free: Sequence[tuple[int, int]] = ()
    ) -> Replica | None:
        """A PROCESSING replica of `size` bytes on `seg` (a task's target), outside the free
        ranges `keep_free` ((offset, size) pairs: a range being made for a put); never
        reclaims."""
        alloc = seg.allocator
        held = [(o, n) for o, n in keep_free if alloc.alloc_at(o, n)]
        try:
            off = alloc.alloc(size)
        finally:
            for o, n in held:
                alloc.free(o, n)
        if off is None:
            return None
        seg.objects += 1
        return Replica(seg, off, _PROCESSING, seg.kind)

    def reserve_range(
        self, client_id: ClientId, size: int, need: int
    ) -> tuple[Segment, int, int] | None:
        """(segment, offset, size) of a range that is no replica (an arena): `size` bytes
        placed by the master's strategy, else the largest free block down to `need`; never
        evicts anything."""
        host = None
        if self.placement.strategy is _LOCAL_FIRST:
            rec = self.clients.get(client_id)
            host = rec.host_id if rec is not None else None
        got = self.placement.allocate(self.segments, size, 1, local_host=host)
        if got:
            seg, off = got[0]
            seg.objects -= 1  # placement counted a replica; an arena is not one
            self._lent(seg, off, size)
            return seg, off, size
        seg = max(self.segments.live, key=lambda x: x.allocator.largest_free())
        a = self._alignment
        size = min(size, seg.allocator.largest_free() // a * a)
        if size < need:
            return None
        found = seg.allocator.alloc(size)
        if found is None:
            return None
        self._lent(seg, found, size)
        return seg, found, size

    def _lent(self, seg: Segment, off: int, size: int) -> None:
        if self.journal is not None:  # a lent range may be written after a restart
            self.journal.park_range(seg, off, size, self.clock() + self._release_timeout)

    def free_range(self, seg: Segment, off: int, size: int) -> None:
        """Free [off, off + size) of `seg`, a range that is no replica (nothing once the
        segment is unmounted: its allocator went with it)."""
        if seg.alive:
            seg.allocator.free(off, size)

    def free_replicas(self, replicas: tuple[Replica, ...], size: int) -> None:
        """Free replicas that belong to no object (a failed task's targets)."""
        for r in replicas:
            self._free_replica(r, size)

    def park(self, release_at: float, size: int, replicas: tuple[Replica, ...]) -> None:
        """Keep `replicas` allocated until `release_at` (someone may still use their bytes)."""
        self.parked.add(release_at, size, replicas)
        if self.journal is not None:
            self.journal.park(release_at, size, replicas)

    def park_range(self, seg: Segment, off: int, size: int, until: float) -> None:
        """Keep [off, off + size) of `seg` allocated until `until` (a late writer may use it)."""
        self.park(until, size, (Replica(seg, off, _COMPLETE),))
        seg.objects += 1  # a parked range is freed as one replica

    def take_range(self, seg: Segment, off: int, size: int, until: float) -> bool:
        """Allocate exactly [off, off + size) of `seg` and park it until `until`; False when
        that range is not free."""
        if not seg.allocator.alloc_at(off, size):
            return False
        self.park_range(seg, off, size, until)
        return True

    def release_parked(self, now: float) -> int:
        """Free the parked sets whose time has come; answers how many."""
        released = 0
        for size, replicas in self.parked.pop_due(now):
            for r in replicas:
                self._free_replica(r, size)
            released += 1
        return released

    def _free_replica(self, r: Replica, size: int) -> bool:
        seg = r.segment
        if not seg.alive:
            return False  # its allocator went with the segment
        seg.allocator.free(r.offset, size)
        seg.objects -= 1
        if seg.kind is not _MEMORY_KIND and self.on_disk_free is not None:
            self.on_disk_free(seg, r.offset)
        return True

    # ------------------------------------------------------------------ segments, clients

    def register_client(self, client_id: ClientId, host_id: HostId, now: float) -> ClientRecord:
        """Add the client, or refresh it (registration counts as a ping)."""
        return self.clients.register(client_id, host_id, now)

    def ping_client(self, client_id: ClientId, now: float) -> bool:
        """Push a known client's deadline; False when it is unknown."""
        return self.clients.ping(client_id, now)

    def postpone_clients(self, seconds: float) -> None:
        """Push every client's deadline `seconds` later (the master itself was not listening)."""
        self.clients.postpone(seconds)

    def prune_clients(self) -> None:
        """Forget the empty in-flight sets."""
        self.clients.prune()

    def mount_segment(self, rec: ClientRecord, info: SegmentInfo) -> int:
        """Mount `info` for the registered client `rec`: OK (also when exactly this segment is
        mounted already), SEGMENT_ALREADY_EXISTS or INVALID_PARAMS."""
        if not info.name or info.size < self._alignment:
            return INVALID_PARAMS
        seg = self.segments.get(info.name)
        if seg is not None:
            if seg.same_mount(info, rec.client_id, rec.host_id):
                return OK  # idempotent: the same segment mounted again
            if seg.client_id != rec.client_id or info.generation == seg.generation:
                return SEGMENT_ALREADY_EXISTS
            # Its owner made new memory under the old name: what the old one held is gone.
            self.unmount_segment(seg)
        new = self.segments.mount(info, rec.client_id, rec.host_id)
        if self.journal is not None:
            self.journal.mount(new)
        for o in self._observers:
            o.segment_mounted(new)
        rec.segments[info.name] = None
        log.info("mounted segment %s (%d bytes) of client %s", info.name, info.size, rec.client_id)
        return OK

    def unmount_segment(self, seg: Segment) -> None:
        """Take `seg` out of the pool (its replicas vanish from replies at once; the sweep
        clears them out of the metadata later)."""
        self.segments.unmount(seg)
        if self.journal is not None:
            self.journal.unmount(seg)
        rec = self.clients.get(seg.client_id)
        if rec is not None:
            rec.segments.pop(seg.name, None)
        self.sweep_needed = True
        for o in self._observers:
            o.segment_unmounted(seg)
        log.info("unmounted segment %s of client %s", seg.name, seg.client_id)

    def restore_segment(self, seg: Segment) -> None:
        """Serve the silent `seg` again, with its objects (its owner remounted the same
        memory: name and generation match)."""
        self.segments.restore(seg)
        for o in self._observers:
            o.segment_restored(seg)
        log.info("segment %s of client %s serves again with its objects", seg.name, seg.client_id)

    def silence_client(self, client_id: ClientId) -> None:
        """The client missed `client_ttl`: its segments stop serving (kept, with their
        objects), its in-flight PutStarts are preempted (their ranges parked until their
        release time: it may still be writing), it is kept for `client_dead_ttl`."""
        rec = self.clients.get(client_id)
        if rec is None or rec.silent:
            return
        rec.silent = True
        for name in rec.segments:
            seg = self.segments.get(name)
            if seg is not None and seg.client_id == client_id:
                self.segments.silence(seg)
        for obj in self.clients.in_flight_of(client_id):
            self.preempt(obj)
        for o in self._observers:
            o.client_silenced(client_id)
        log.warning(
            "client %s silent: %d segment(s) kept but not served, in-flight puts preempted",
            client_id,
            len(rec.segments),
        )

    def revive_client(self, rec: ClientRecord, infos: list[SegmentInfo]) -> list[SegmentName]:
        """The silent client `rec` remounts `infos`: each of its silent segments named there
        with the same generation (non-zero) serves again with its objects; the others are
        unmounted (their memory is gone or new). Answers the names restored; the caller then
        mounts `infos` as usual (restored ones are already mounted)."""
        rec.silent = False
        wanted = {info.name: info for info in infos}
        restored: list[SegmentName] = []
        for name in list(rec.segments):
            seg = self.segments.get(name)
            if seg is None or seg.client_id != rec.client_id or not seg.silent:
                continue
            info = wanted.get(name)
            if (
                info is not None
                and info.generation
                and seg.same_mount(info, rec.client_id, rec.host_id)
            ):
                self.restore_segment(seg)
                restored.append(name)
            else:
                self.unmount_segment(seg)
        log.info("client %s is back: %d segment(s) restored", rec.client_id, len(restored))
        return restored

    def expire_client(self, client_id: ClientId) -> None:
        """Unmount the client's segments, preempt its in-flight PutStarts, forget it.

        A client that fell silent may still be writing into other nodes' segments: the ranges
        of its unfinished puts are parked until their release time, as a stale PutStart's
        are, so no other object is placed where a late write could land."""
        rec = self.clients.get(client_id)
        if rec is not None:
            for name in list(rec.segments):
                seg = self.segments.get(name)
                if seg is not None and seg.client_id == client_id:
                    self.unmount_segment(seg)
        for obj in self.clients.in_flight_of(client_id):
            self.preempt(obj)
        for o in self._observers:
            o.client_expired(client_id)
        self.clients.forget(client_id)
        log.warning("client %s expired: segments unmounted, in-flight puts preempted", client_id)
