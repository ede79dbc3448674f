"""The master service: every rule about objects, replicas, segments and clients, as a plain class.

`MasterService` is driven by request Structs (`kvpool.protocol.messages`) and answers reply
Structs; it does no I/O and reads time only from the injected `clock`, so unit tests call it
directly and move time by hand. `kvpool.master.server` puts it behind an `RpcServer` and runs its
background work (`expire_clients`, `release_stale`, `sweep_dead`, the reclaim tick). One event
loop owns it: nothing here locks, and nothing here may block.

Rules (Mooncake's, see the protocol module docstring for the lifecycle):

* PutStart validation, each INVALID_PARAMS: empty key; size <= 0; replica_num <= 0 or above
  `max_replicas`; a soft-pin TTL with PRESERVE or DISABLE; an ENABLE TTL that is negative or
  above `max_kv_soft_pin_ttl`; `group_ids` whose length is not the number of keys; an empty
  client id or tenant. Then OBJECT_ALREADY_EXISTS for a complete object or one whose PutStart
  is younger than `put_start_discard_timeout`; an older PutStart is preempted (its space is
  parked until `put_start_release_timeout` after it started). No room: NO_AVAILABLE_HANDLE,
  after one `reclaim_for` and one retry.
* Objects whose replicas all sit on unmounted segments are gone: every lookup drops such an
  object on sight (O(replicas)), and `sweep_dead` clears the rest in the background.
* Batch handlers are tight loops over the keys with the per-request work (validation, clock,
  tenant's shards) hoisted out; they answer one result per key.
"""

from __future__ import annotations

import heapq
import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import xxhash

from kvpool.errors import ErrorCode
from kvpool.master.config import AllocationStrategy, MasterConfig
from kvpool.master.hooks import NoopReclaimHooks, ReclaimHooks
from kvpool.master.lease import resolve_soft_pin
from kvpool.master.liveness import ClientRecord, ClientTable
from kvpool.master.metadata import (
    REPLICA_ID_SHIFT,
    ObjectIndex,
    ObjectMeta,
    Replica,
    TenantShards,
)
from kvpool.master.placement import Placement
from kvpool.master.segments import Segment, SegmentTable
from kvpool.protocol.messages import (
    BatchExistKey,
    BatchExistReply,
    BatchGetReplicaList,
    BatchPutEnd,
    BatchPutRevoke,
    BatchPutStart,
    BatchPutStartReply,
    BatchRemove,
    BatchReplicaListReply,
    BatchReply,
    BatchUpsertStart,
    ClientId,
    ClientStatus,
    CountReply,
    Echo,
    EchoReply,
    ExistKey,
    ExistReply,
    GetReplicaList,
    GetSegment,
    GetSize,
    HostId,
    Message,
    MountSegment,
    Ping,
    PingReply,
    PutEnd,
    PutRevoke,
    PutStart,
    PutStartReply,
    ReMountSegment,
    Remove,
    RemoveAll,
    RemoveByRegex,
    ReplicaDesc,
    ReplicaListReply,
    ReplicaStatus,
    ReplicateConfigMsg,
    Reply,
    SegmentInfo,
    SegmentReply,
    SizeReply,
    SoftPinAction,
    Stats,
    StatsReply,
    TenantId,
    UnmountSegment,
    UpsertStart,
)

__all__ = ["MasterService"]

log = logging.getLogger(__name__)

# Codes as plain ints: replies carry ints, and the hot loops should not convert enums.
_OK = 0
_INVALID_PARAMS = int(ErrorCode.INVALID_PARAMS)
_ILLEGAL_CLIENT = int(ErrorCode.ILLEGAL_CLIENT)
_NO_SPACE = int(ErrorCode.NO_AVAILABLE_HANDLE)
_NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
_EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
_HAS_LEASE = int(ErrorCode.OBJECT_HAS_LEASE)
_NOT_READY = int(ErrorCode.REPLICA_IS_NOT_READY)
_INVALID_WRITE = int(ErrorCode.INVALID_WRITE)
_BUSY = int(ErrorCode.OBJECT_REPLICA_BUSY)
_SEG_NOT_FOUND = int(ErrorCode.SEGMENT_NOT_FOUND)
_SEG_EXISTS = int(ErrorCode.SEGMENT_ALREADY_EXISTS)

_PROCESSING = ReplicaStatus.PROCESSING
_COMPLETE = ReplicaStatus.COMPLETE
_REMOVE_CHUNK = 5_000

# Replies that carry nothing but a code are shared: the server only encodes them.
_OK_REPLY = Reply(_OK)
_NOT_FOUND_LIST = ReplicaListReply(_NOT_FOUND)
_NOT_READY_LIST = ReplicaListReply(_NOT_READY)


class _PutPlan:
    """What a put request's config resolves to, computed once per request (batch: once)."""

    __slots__ = (
        "action",
        "client_id",
        "code",
        "hard_pin",
        "in_flight",
        "preferred",
        "region_end",
        "region_left",
        "region_next",
        "region_seg",
        "replica_num",
        "same_node",
        "shards",
        "simple",
        "soft_pin",
        "tenant",
    )

    def __init__(
        self,
        code: int,
        client_id: ClientId,
        tenant: TenantId,
        cfg: ReplicateConfigMsg,
        soft_pin: float | None,
    ) -> None:
        self.code = code
        self.client_id = client_id
        self.tenant = tenant
        self.action = cfg.soft_pin_action
        self.replica_num = cfg.replica_num
        self.soft_pin = soft_pin
        self.hard_pin = cfg.with_hard_pin
        self.preferred = cfg.preferred_segments
        self.same_node = cfg.prefer_alloc_in_same_node
        self.shards: TenantShards | None = None  # set by _plan once the request is valid
        #: The client's in-flight set (ClientTable.in_flight_bucket), also set by _plan.
        self.in_flight: dict[ObjectMeta, None] | None = None
        # A batch's bump region: one range taken for many objects, carved in order (see
        # MasterService._carve); `region_left` is what the batch may still need (0: off).
        self.region_seg: Segment | None = None
        self.region_next = 0
        self.region_end = 0
        self.region_left = 0
        #: One replica, nothing preferred, nothing local: the placement fast path.
        self.simple = cfg.replica_num == 1 and not cfg.preferred_segments and not self.same_node


class MasterService:
    """All metadata of one pool and the rules that change it (one event loop owns it).

    Implements `ReclaimTarget` for the reclaim hooks.
    """

    def __init__(
        self,
        config: MasterConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        hooks: ReclaimHooks | None = None,
    ) -> None:
        self._config = config if config is not None else MasterConfig()
        self._clock = clock
        self._hooks: ReclaimHooks = hooks if hooks is not None else NoopReclaimHooks()
        self._index = ObjectIndex(self._config.num_shards)
        self.segments = SegmentTable(self._config.alignment)
        self.clients = ClientTable(self._config.client_ttl)
        self._placement = Placement(
            self._config.allocation_strategy, random.Random(self._config.seed)
        )
        self._lease_ttl = self._config.default_kv_lease_ttl
        self._lease_ttl_ms = round(self._lease_ttl * 1000)
        self._discard_timeout = self._config.put_start_discard_timeout
        # Replicas of preempted or force-removed PutStarts: (release_at, seq, size, replicas).
        self._parked: list[tuple[float, int, int, tuple[Replica, ...]]] = []
        self._park_seq = 0
        self._started = clock()
        self.view_version = 1
        #: Set when a segment went away; the server then runs `sweep_dead`.
        self.sweep_needed = False
        self._handlers: dict[type[Any], Callable[[Any], Message]] = {
            Echo: self.echo,
            Ping: self.ping,
            MountSegment: self.mount_segment,
            ReMountSegment: self.remount_segment,
            UnmountSegment: self.unmount_segment,
            GetSegment: self.get_segment,
            PutStart: self.put_start,
            UpsertStart: self.upsert_start,
            BatchPutStart: self.batch_put_start,
            BatchUpsertStart: self.batch_upsert_start,
            PutEnd: self.put_end,
            BatchPutEnd: self.batch_put_end,
            PutRevoke: self.put_revoke,
            BatchPutRevoke: self.batch_put_revoke,
            GetReplicaList: self.get_replica_list,
            BatchGetReplicaList: self.batch_get_replica_list,
            ExistKey: self.exist_key,
            BatchExistKey: self.batch_exist_key,
            GetSize: self.get_size,
            Remove: self.remove,
            BatchRemove: self.batch_remove,
            RemoveAll: self.remove_all,
            RemoveByRegex: self.remove_by_regex,
            Stats: self.stats,
        }
        self._hooks.attach(self)

    # ------------------------------------------------------------------ dispatch

    def handle(self, request: Any) -> Message:
        """The reply to `request` (any member of `messages.Request`)."""
        return self._handlers[type(request)](request)

    @property
    def handlers(self) -> dict[type[Any], Callable[[Any], Message]]:
        return self._handlers

    # ------------------------------------------------------------------ ReclaimTarget

    @property
    def config(self) -> MasterConfig:
        return self._config

    @property
    def index(self) -> ObjectIndex:
        return self._index

    @property
    def hooks(self) -> ReclaimHooks:
        return self._hooks

    def now(self) -> float:
        return self._clock()

    def memory_usage(self) -> tuple[int, int]:
        return self.segments.capacity()

    def evictable(self, obj: ObjectMeta, now: float) -> bool:
        return (
            obj.complete
            and not obj.hard_pin
            and now >= obj.lease_deadline
            and self._index.get(obj.tenant, obj.key) is obj
        )

    def evict(self, obj: ObjectMeta) -> int:
        freed = 0
        aligned = self._aligned(obj.size)
        for r in obj.replicas:
            if self._free_replica(r, obj.size):
                freed += aligned
        obj.replicas = ()
        self._drop(obj)
        return freed

    # ------------------------------------------------------------------ small requests

    def echo(self, req: Echo) -> EchoReply:
        return EchoReply(req.payload)

    def ping(self, req: Ping) -> PingReply:
        if not req.client_id:
            return PingReply(_INVALID_PARAMS, ClientStatus.UNDEFINED, self.view_version)
        if self.clients.ping(req.client_id, self._clock()):
            return PingReply(_OK, ClientStatus.OK, self.view_version)
        return PingReply(_OK, ClientStatus.NEED_REMOUNT, self.view_version)

    def get_segment(self, req: GetSegment) -> SegmentReply:
        seg = self.segments.get(req.name)
        if seg is None:
            return SegmentReply(_SEG_NOT_FOUND)
        return SegmentReply(_OK, seg.info())

    def stats(self, req: Stats) -> StatsReply:
        now = self._clock()
        cap, used = self.segments.capacity()
        return StatsReply(
            _OK,
            [s.stats() for s in self.segments.live],
            self.clients.stats(now),
            len(self._index),
            sum(len(v) for v in self.clients.in_flight.values()),
            cap,
            used,
            now - self._started,
        )

    # ------------------------------------------------------------------ segments

    def mount_segment(self, req: MountSegment) -> Reply:
        if not req.client_id:
            return Reply(_INVALID_PARAMS)
        rec = self.clients.register(req.client_id, req.host_id, self._clock())
        return Reply(self._mount(rec, req.segment))

    def remount_segment(self, req: ReMountSegment) -> Reply:
        if not req.client_id:
            return Reply(_INVALID_PARAMS)
        rec = self.clients.register(req.client_id, req.host_id, self._clock())
        code = _OK
        for info in req.segments:
            c = self._mount(rec, info)
            if c != _OK and code == _OK:
                code = c  # the first failure is the answer; the others still get mounted
        return Reply(code)

    def _mount(self, rec: ClientRecord, info: SegmentInfo) -> int:
        if not info.name or info.size < self._config.alignment:
            return _INVALID_PARAMS
        seg = self.segments.get(info.name)
        if seg is not None:
            if seg.same_mount(info, rec.client_id, rec.host_id):
                return _OK  # idempotent: the same segment mounted again
            return _SEG_EXISTS
        self.segments.mount(info, rec.client_id, rec.host_id)
        rec.segments[info.name] = None
        log.info("mounted segment %s (%d bytes) of client %s", info.name, info.size, rec.client_id)
        return _OK

    def unmount_segment(self, req: UnmountSegment) -> Reply:
        seg = self.segments.get(req.name)
        if seg is None:
            return _OK_REPLY  # idempotent, as Mooncake: unmounting what is gone succeeds
        if seg.client_id != req.client_id:
            return Reply(_ILLEGAL_CLIENT)
        self._unmount(seg)
        return _OK_REPLY

    def _unmount(self, seg: Segment) -> None:
        self.segments.unmount(seg)
        rec = self.clients.get(seg.client_id)
        if rec is not None:
            rec.segments.pop(seg.name, None)
        self.sweep_needed = True
        log.info("unmounted segment %s of client %s", seg.name, seg.client_id)

    # ------------------------------------------------------------------ liveness

    def expire_clients(self) -> list[ClientId]:
        """Expire every client silent for `client_ttl`; answers their ids."""
        now = self._clock()
        gone: list[ClientId] = []
        for rec in self.clients.expired(now):
            self.expire_client(rec.client_id)
            gone.append(rec.client_id)
        return gone

    def expire_client(self, client_id: ClientId) -> None:
        """Unmount the client's segments, revoke its in-flight PutStarts, forget it."""
        rec = self.clients.get(client_id)
        if rec is not None:
            for name in list(rec.segments):
                seg = self.segments.get(name)
                if seg is not None and seg.client_id == client_id:
                    self._unmount(seg)
        for obj in self.clients.in_flight_of(client_id):
            self._revoke(obj)
        self.clients.forget(client_id)
        log.warning("client %s expired: segments unmounted, in-flight puts revoked", client_id)

    def release_stale(self) -> int:
        """Revoke PutStarts older than `put_start_release_timeout` and free parked replicas
        whose time has come; answers how many objects or parked sets were released."""
        now = self._clock()
        limit = now - self._config.put_start_release_timeout
        released = 0
        stale = [
            obj
            for bucket in self.clients.in_flight.values()
            for obj in bucket
            if obj.put_start_time <= limit
        ]
        for obj in stale:
            log.info("releasing stale PutStart of %r", obj.key)
            self._revoke(obj)
            released += 1
        self.clients.prune()
        parked = self._parked
        while parked and parked[0][0] <= now:
            _, _, size, replicas = heapq.heappop(parked)
            for r in replicas:
                self._free_replica(r, size)
            released += 1
        return released

    def parked(self) -> list[tuple[Replica, int]]:
        """Replicas (with their object size) of preempted or force-removed PutStarts, whose
        ranges stay allocated until their release time."""
        return [(r, size) for _, _, size, reps in self._parked for r in reps]

    def sweep_dead(self) -> Iterator[int]:
        """Drop replicas on unmounted segments from the metadata, and the objects left with
        none, `sweep_batch` objects per step (the server yields to the loop between steps);
        each step yields the number of objects removed so far."""
        self.sweep_needed = False
        removed = 0
        batch = self._config.sweep_batch
        objs = self._index.snapshot()
        for i in range(0, len(objs), batch):
            for obj in objs[i : i + batch]:
                reps = obj.replicas
                if all(r.segment.alive for r in reps):
                    continue
                live = tuple(r for r in reps if r.segment.alive)
                if live:
                    obj.replicas = live
                elif self._index.get(obj.tenant, obj.key) is obj:
                    obj.replicas = ()
                    self._drop(obj)
                    removed += 1
            yield removed

    # ------------------------------------------------------------------ put

    def _plan(
        self, client_id: ClientId, tenant: TenantId, cfg: ReplicateConfigMsg, n: int
    ) -> _PutPlan:
        """Validate the parts of a put shared by all its keys."""
        code, ttl = resolve_soft_pin(cfg, self._config)
        if (
            not client_id
            or not tenant
            or cfg.replica_num <= 0
            or cfg.replica_num > self._config.max_replicas
            or (cfg.group_ids is not None and len(cfg.group_ids) != n)
        ):
            code = ErrorCode.INVALID_PARAMS
        plan = _PutPlan(int(code), client_id, tenant, cfg, ttl)
        if plan.code == _OK:
            plan.shards = self._index.tenant_for_insert(tenant)
            plan.in_flight = self.clients.in_flight_bucket(client_id)
            plan.simple = plan.simple and self._placement.strategy is AllocationStrategy.RANDOM
        return plan

    def put_start(self, req: PutStart) -> PutStartReply:
        plan = self._plan(req.client_id, req.tenant, req.config, 1)
        if plan.code != _OK:
            return PutStartReply(plan.code)
        group = req.config.group_ids[0] if req.config.group_ids else ""
        return self._put_one(plan, req.key, req.size, group, self._clock())

    def batch_put_start(self, req: BatchPutStart) -> BatchPutStartReply:
        keys, sizes = req.keys, req.sizes
        n = len(keys)
        plan = self._plan(req.client_id, req.tenant, req.config, n)
        if plan.code == _OK and len(sizes) != n:
            plan.code = _INVALID_PARAMS
        if plan.code != _OK:
            return BatchPutStartReply([PutStartReply(plan.code) for _ in keys])
        groups = req.config.group_ids
        now = self._clock()
        put_one = self._put_one
        if plan.simple and n > 1:
            a = self._config.alignment
            plan.region_left = sum((s + a - 1) // a * a for s in sizes if s > 0)
        try:
            if groups:
                return BatchPutStartReply(
                    [put_one(plan, keys[i], sizes[i], groups[i], now) for i in range(n)]
                )
            return BatchPutStartReply([put_one(plan, keys[i], sizes[i], "", now) for i in range(n)])
        finally:
            self._release_region(plan)

    def _put_one(
        self, plan: _PutPlan, key: str, size: int, group: str, now: float
    ) -> PutStartReply:
        if not key or size <= 0:
            return PutStartReply(_INVALID_PARAMS)
        t = plan.shards
        assert t is not None
        shard = t.shard_of(key)
        d = t.shards[shard]
        old = d.get(key)
        if old is not None:
            if not old.has_live_replica():
                self._forget_dead(old)
            elif old.complete or now - old.put_start_time < self._discard_timeout:
                return PutStartReply(_EXISTS)
            else:
                self._preempt(old)
        replicas = self._allocate(size, plan)
        if not replicas:
            return PutStartReply(_NO_SPACE)
        obj = ObjectMeta(
            key,
            plan.tenant,
            shard,
            size,
            plan.client_id,
            replicas,
            now,
            plan.soft_pin,
            plan.hard_pin,
            group,
        )
        d[key] = obj  # ObjectIndex.add, inlined on the hottest write path
        self._index.count += 1
        assert plan.in_flight is not None
        plan.in_flight[obj] = None
        return PutStartReply(_OK, [r.desc(size) for r in replicas])

    def _allocate(self, size: int, plan: _PutPlan) -> tuple[Replica, ...]:
        if plan.simple:
            one = self._carve(size, plan) if plan.region_left else None
            if one is None:
                one = self._placement.one_random(self.segments.live, size)
            if one is not None:
                return (Replica(one[0], one[1], _PROCESSING),)
        host: HostId | None = None
        if plan.same_node or self._placement.strategy is AllocationStrategy.LOCAL_FIRST:
            rec = self.clients.get(plan.client_id)
            host = rec.host_id if rec is not None else None
        got = self._placement.allocate(
            self.segments,
            size,
            plan.replica_num,
            preferred=plan.preferred,
            local_host=host,
            local_first=plan.same_node,
        )
        if not got:
            # Direct reclaim: once, then one more try (as the kernel's allocation slow path);
            # not for an object no segment could hold even empty: evicting would be for nothing.
            aligned = self._aligned(size)
            if not any(s.allocator.capacity >= aligned for s in self.segments.live):
                return ()
            if self._hooks.reclaim_for(aligned * plan.replica_num) <= 0:
                return ()
            got = self._placement.allocate(
                self.segments,
                size,
                plan.replica_num,
                preferred=plan.preferred,
                local_host=host,
                local_first=plan.same_node,
            )
        return tuple(Replica(seg, off, _PROCESSING) for seg, off in got)

    def _carve(self, size: int, plan: _PutPlan) -> tuple[Segment, int] | None:
        """A range for one object of a batch, cut from the batch's region.

        A batch of one-replica random puts takes one range on one random segment for all of
        its objects (what the batch may still need) and cuts it in order: one allocator call
        per batch instead of one per key. Each object's range is later freed on its own,
        which the allocator allows (a free of any sub-range coalesces with free neighbours);
        what the batch did not use goes back at its end (`_release_region`). When no segment
        has room for the rest of the batch, the batch falls back to one allocation per key.
        """
        a = self._config.alignment
        need = (size + a - 1) // a * a
        seg = plan.region_seg
        if seg is None or plan.region_next + need > plan.region_end:
            self._release_region(plan)
            want = max(need, plan.region_left)
            block = self._placement.one_random(self.segments.live, want, count=False)
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

    def _release_region(self, plan: _PutPlan) -> None:
        seg = plan.region_seg
        if seg is not None:
            if seg.alive and plan.region_next < plan.region_end:
                seg.allocator.free(plan.region_next, plan.region_end - plan.region_next)
            plan.region_seg = None

    def _preempt(self, old: ObjectMeta) -> None:
        """Take a stale PutStart's key away from it; its writer may still be writing, so its
        space stays parked until `put_start_release_timeout` after it started."""
        log.info("preempting stale PutStart of %r by client %s", old.key, old.client_id)
        self._park(old)
        self.clients.drop_in_flight(old)
        self._drop(old)

    def _park(self, obj: ObjectMeta) -> None:
        if obj.replicas:
            release_at = obj.put_start_time + self._config.put_start_release_timeout
            self._park_seq += 1
            heapq.heappush(self._parked, (release_at, self._park_seq, obj.size, obj.replicas))
            obj.replicas = ()

    # ------------------------------------------------------------------ upsert

    def upsert_start(self, req: UpsertStart) -> PutStartReply:
        plan = self._plan(req.client_id, req.tenant, req.config, 1)
        if plan.code != _OK:
            return PutStartReply(plan.code)
        group = req.config.group_ids[0] if req.config.group_ids else None
        return self._upsert_one(plan, req.key, req.size, group, self._clock())

    def batch_upsert_start(self, req: BatchUpsertStart) -> BatchPutStartReply:
        keys, sizes = req.keys, req.sizes
        n = len(keys)
        plan = self._plan(req.client_id, req.tenant, req.config, n)
        if plan.code == _OK and len(sizes) != n:
            plan.code = _INVALID_PARAMS
        if plan.code != _OK:
            return BatchPutStartReply([PutStartReply(plan.code) for _ in keys])
        groups = req.config.group_ids
        now = self._clock()
        upsert = self._upsert_one
        return BatchPutStartReply(
            [upsert(plan, keys[i], sizes[i], groups[i] if groups else None, now) for i in range(n)]
        )

    def _upsert_one(
        self, plan: _PutPlan, key: str, size: int, group: str | None, now: float
    ) -> PutStartReply:
        if not key or size <= 0:
            return PutStartReply(_INVALID_PARAMS)
        obj = self._lookup(plan.tenant, key)
        if obj is None:
            return self._put_one(plan, key, size, group or "", now)
        if group is not None and group != obj.group_id:
            # group_membership_is_immutable: a group is fixed for the object's lifetime.
            return PutStartReply(_INVALID_PARAMS)
        if not obj.complete:
            if now - obj.put_start_time < self._config.put_start_discard_timeout:
                return PutStartReply(_BUSY)  # another write of this key is in progress
            self._preempt(obj)
            return self._put_one(plan, key, size, obj.group_id, now)
        if size == obj.size:
            # Case B: rewrite in place; unreadable until PutEnd.
            live = tuple(r for r in obj.replicas if r.segment.alive)
            for r in live:
                r.status = _PROCESSING
            obj.replicas = live
        else:
            # Case C: new ranges first, so a full pool leaves the old value intact. The result
            # is a new object record (a new generation for the reclaim hooks, which see the
            # old one removed), carrying over what outlives a rewrite: group, hard pin, pin.
            fresh = self._allocate(size, plan)
            if not fresh:
                return PutStartReply(_NO_SPACE)
            for r in obj.replicas:
                self._free_replica(r, obj.size)
            old, obj = (
                obj,
                ObjectMeta(
                    key,
                    obj.tenant,
                    obj.shard,
                    size,
                    plan.client_id,
                    fresh,
                    now,
                    obj.soft_pin_ttl,
                    obj.hard_pin,
                    obj.group_id,
                ),
            )
            obj.soft_pin_deadline = old.soft_pin_deadline
            old.replicas = ()
            self._drop(old)
            self._index.insert(obj)
        obj.complete = False
        obj.client_id = plan.client_id
        obj.put_start_time = now
        obj.checksum = None
        action = plan.action
        if action is SoftPinAction.ENABLE:
            obj.soft_pin_ttl = plan.soft_pin
            obj.soft_pin_deadline = None
        elif action is SoftPinAction.DISABLE:
            obj.soft_pin_ttl = None
            obj.soft_pin_deadline = None
        self.clients.add_in_flight(obj)
        return PutStartReply(_OK, [r.desc(obj.size) for r in obj.replicas])

    # ------------------------------------------------------------------ put end / revoke

    def put_end(self, req: PutEnd) -> Reply:
        t = self._index.tenant(req.tenant)
        code = self._end_one(req.client_id, t, req.key, req.checksum, self._clock())
        return _OK_REPLY if code == _OK else Reply(code)

    def batch_put_end(self, req: BatchPutEnd) -> BatchReply:
        keys, sums = req.keys, req.checksums
        if sums and len(sums) != len(keys):
            return BatchReply([_INVALID_PARAMS] * len(keys))
        t = self._index.tenant(req.tenant)
        if t is None:
            return BatchReply([_NOT_FOUND] * len(keys))
        now = self._clock()
        end = self._end_one
        cid = req.client_id
        if sums:
            return BatchReply([end(cid, t, k, s, now) for k, s in zip(keys, sums, strict=True)])
        return BatchReply([end(cid, t, k, None, now) for k in keys])

    def _end_one(
        self,
        client_id: ClientId,
        t: TenantShards | None,
        key: str,
        checksum: int | None,
        now: float,
    ) -> int:
        obj = t.shards[t.shard_of(key)].get(key) if t is not None else None
        if obj is None:
            return _NOT_FOUND
        if obj.client_id != client_id:
            return _ILLEGAL_CLIENT
        if obj.complete:
            # A repeated PutEnd of a finished write is a no-op; anything else is a misuse.
            return _OK if all(r.status is _COMPLETE for r in obj.replicas) else _INVALID_WRITE
        on_complete = self._hooks.on_replica_complete
        for r in obj.replicas:
            r.status = _COMPLETE
            on_complete(obj, r)
        obj.complete = True
        obj.checksum = checksum
        obj.lease_deadline = max(obj.lease_deadline, now)
        if obj.soft_pin_ttl is not None and obj.soft_pin_deadline is None:
            obj.soft_pin_deadline = now + obj.soft_pin_ttl
        self.clients.drop_in_flight(obj)
        return _OK

    def put_revoke(self, req: PutRevoke) -> Reply:
        code = self._revoke_one(req.client_id, req.tenant, req.key)
        return _OK_REPLY if code == _OK else Reply(code)

    def batch_put_revoke(self, req: BatchPutRevoke) -> BatchReply:
        cid, tenant = req.client_id, req.tenant
        return BatchReply([self._revoke_one(cid, tenant, k) for k in req.keys])

    def _revoke_one(self, client_id: ClientId, tenant: TenantId, key: str) -> int:
        obj = self._index.get(tenant, key)
        if obj is None:
            return _NOT_FOUND
        if obj.client_id != client_id:
            return _ILLEGAL_CLIENT
        if obj.complete:
            return _INVALID_WRITE  # nothing in flight to revoke
        self._revoke(obj)
        return _OK

    def _revoke(self, obj: ObjectMeta) -> None:
        """Free everything a PutStart (or in-place UpsertStart) took and forget the object."""
        for r in obj.replicas:
            self._free_replica(r, obj.size)
        obj.replicas = ()
        self.clients.drop_in_flight(obj)
        self._drop(obj)

    # ------------------------------------------------------------------ reads

    def get_replica_list(self, req: GetReplicaList) -> ReplicaListReply:
        obj = self._index.get(req.tenant, req.key)
        if obj is None:
            return _NOT_FOUND_LIST
        return self._read_obj(obj, self._clock() + self._lease_ttl)

    def batch_get_replica_list(self, req: BatchGetReplicaList) -> BatchReplicaListReply:
        keys = req.keys
        t = self._index.tenant(req.tenant)
        if t is None:
            return BatchReplicaListReply([_NOT_FOUND_LIST] * len(keys))
        # Per request: the clock, the lease deadline (one float shared by the whole batch),
        # the tenant's shards; per key: one hash, one dict lookup, the reply.
        deadline = self._clock() + self._lease_ttl
        seed, shards = t.seed, t.shards
        n = len(shards)
        h = xxhash.xxh3_64_intdigest
        read = self._read_obj
        out: list[ReplicaListReply] = []
        append = out.append
        for key in keys:
            obj = shards[h(key.encode(), seed) % n].get(key)
            append(_NOT_FOUND_LIST if obj is None else read(obj, deadline))
        return BatchReplicaListReply(out)

    def _read_obj(self, obj: ObjectMeta, deadline: float) -> ReplicaListReply:
        """The readable replicas of `obj`, granting a lease until `deadline` (now + ttl)."""
        size = obj.size
        descs: list[ReplicaDesc] = []
        for r in obj.replicas:
            seg = r.segment
            if r.status is _COMPLETE and seg.alive:
                descs.append(
                    ReplicaDesc(
                        (seg.number << REPLICA_ID_SHIFT) | r.offset,
                        r.kind,
                        _COMPLETE,
                        seg.name,
                        r.offset,
                        size,
                        seg.endpoint,
                    )
                )
        if not descs:
            if not obj.complete and obj.has_live_replica():
                return _NOT_READY_LIST
            self._forget_dead(obj)
            return _NOT_FOUND_LIST
        obj.lease_deadline = max(obj.lease_deadline, deadline)
        self._hooks.on_access(obj)
        return ReplicaListReply(_OK, descs, size, obj.checksum, self._lease_ttl_ms)

    def exist_key(self, req: ExistKey) -> ExistReply:
        return ExistReply(
            _OK, self._exists_one(req.tenant, req.key, self._clock() + self._lease_ttl)
        )

    def batch_exist_key(self, req: BatchExistKey) -> BatchExistReply:
        deadline = self._clock() + self._lease_ttl
        exists = self._exists_one
        tenant = req.tenant
        return BatchExistReply([ExistReply(_OK, exists(tenant, k, deadline)) for k in req.keys])

    def _exists_one(self, tenant: TenantId, key: str, deadline: float) -> bool:
        obj = self._lookup(tenant, key)
        if obj is None or not obj.complete or not obj.readable_replicas():
            return False
        obj.lease_deadline = max(obj.lease_deadline, deadline)
        self._hooks.on_access(obj)
        return True

    def get_size(self, req: GetSize) -> SizeReply:
        # Mooncake answers GetSize through a replica-list query: same codes, same lease.
        r = self.get_replica_list(GetReplicaList(req.key, req.tenant))
        return SizeReply(r.code, r.size)

    # ------------------------------------------------------------------ removal

    def remove(self, req: Remove) -> Reply:
        code = self._remove_one(req.tenant, req.key, req.force, self._clock())
        return _OK_REPLY if code == _OK else Reply(code)

    def batch_remove(self, req: BatchRemove) -> BatchReply:
        now = self._clock()
        rm = self._remove_one
        tenant, force = req.tenant, req.force
        return BatchReply([rm(tenant, k, force, now) for k in req.keys])

    def _remove_one(self, tenant: TenantId, key: str, force: bool, now: float) -> int:
        obj = self._lookup(tenant, key)
        if obj is None:
            return _NOT_FOUND
        if not force:
            if now < obj.lease_deadline:
                return _HAS_LEASE
            if not obj.complete:
                return _NOT_READY
        self._remove_obj(obj)
        return _OK

    def _remove_obj(self, obj: ObjectMeta) -> None:
        if obj.complete:
            for r in obj.replicas:
                self._free_replica(r, obj.size)
            obj.replicas = ()
        else:
            # Forced removal of a write in progress: its writer may still be writing.
            self._park(obj)
            self.clients.drop_in_flight(obj)
        self._drop(obj)

    def remove_all(self, req: RemoveAll) -> Message:
        return _drain(self.remove_matching(req.tenant, None, req.force))

    def remove_by_regex(self, req: RemoveByRegex) -> Message:
        try:
            rx = re.compile(req.pattern)
        except re.error:
            return _count_reply(_INVALID_PARAMS, 0)
        return _drain(self.remove_matching(req.tenant, rx, req.force))

    def remove_matching(
        self, tenant: TenantId, rx: re.Pattern[str] | None, force: bool
    ) -> Iterator[Message | None]:
        """Remove the tenant's objects whose key `rx` finds (all with None), skipping leased
        and in-flight ones unless `force`; yields None between chunks of work (the server
        gives the loop a turn there) and the `CountReply` last."""
        if not tenant:
            yield _count_reply(_INVALID_PARAMS, 0)
            return
        objs = self._index.snapshot(tenant)
        count = 0
        for i in range(0, len(objs), _REMOVE_CHUNK):
            now = self._clock()
            for obj in objs[i : i + _REMOVE_CHUNK]:
                if rx is not None and rx.search(obj.key) is None:
                    continue
                if self._index.get(obj.tenant, obj.key) is not obj:
                    continue  # removed or replaced meanwhile
                if not obj.has_live_replica():
                    # Already gone with its segments (the sweep had not reached it yet): not
                    # a removal of this request, as in Mooncake after ClearInvalidHandles.
                    self._forget_dead(obj)
                    continue
                if not force and (now < obj.lease_deadline or not obj.complete):
                    continue
                self._remove_obj(obj)
                count += 1
            yield None
        yield _count_reply(_OK, count)

    # ------------------------------------------------------------------ helpers

    def _lookup(self, tenant: str, key: str) -> ObjectMeta | None:
        """The object, unless all of its replicas sit on unmounted segments (then it is
        dropped here and None answered)."""
        obj = self._index.get(tenant, key)
        if obj is None or obj.has_live_replica():
            return obj
        self._forget_dead(obj)
        return None

    def _forget_dead(self, obj: ObjectMeta) -> None:
        self.clients.drop_in_flight(obj)
        obj.replicas = ()
        self._drop(obj)

    def _drop(self, obj: ObjectMeta) -> None:
        if self._index.discard(obj):
            self._hooks.on_object_removed(obj)

    def _free_replica(self, r: Replica, size: int) -> bool:
        seg = r.segment
        if not seg.alive:
            return False  # its allocator went with the segment
        seg.allocator.free(r.offset, size)
        seg.objects -= 1
        return True

    def _aligned(self, size: int) -> int:
        a = self._config.alignment
        return (size + a - 1) // a * a

    def shard_hash(self, tenant: str, key: str) -> int:
        """The raw 64-bit hash behind `shard_of` (exposed for tests of its stability)."""
        seed = xxhash.xxh3_64_intdigest(tenant.encode())
        return int(xxhash.xxh3_64_intdigest(key.encode(), seed))


def _count_reply(code: int, count: int) -> Message:
    return CountReply(code, count)


def _drain(steps: Iterator[Message | None]) -> Message:
    """Run a chunked operation to its end in one go (the plain, synchronous path)."""
    last: Message | None = None
    for step in steps:
        if step is not None:
            last = step
    assert last is not None
    return last
