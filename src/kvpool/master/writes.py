"""The write lifecycle of the master: PutStart, UpsertStart, PutEnd, PutRevoke and batch forms.

Rules (Mooncake's; the protocol module docstring has the whole lifecycle):

* PutStart validation, each INVALID_PARAMS: empty key; size <= 0; replica_num <= 0 or above
  `max_replicas`; a soft-pin TTL with PRESERVE or DISABLE; an ENABLE TTL that is negative or
  above `max_kv_soft_pin_ttl`; `group_ids` whose length is not the number of keys; an empty
  client id or tenant. Then OBJECT_ALREADY_EXISTS for a complete object or one whose PutStart
  is younger than `put_start_discard_timeout`; an older PutStart is preempted (its space is
  parked until `put_start_release_timeout` after it started). No room: NO_AVAILABLE_HANDLE,
  after one `reclaim_for` and one retry.
* UpsertStart: absent, a put; same size, the replicas are rewritten in place; another size,
  or the same size under a live read lease, new ranges first, then a new object record (the
  old ranges of a leased object stay parked until its lease ends: a reader may be copying).
* Batch handlers are tight loops over the keys with the per-request work (validation, clock,
  tenant's shards, the client's in-flight set) hoisted out into a `_PutPlan`; a batch of plain
  puts cuts its objects from one allocated region.
"""

from __future__ import annotations

import logging

from kvpool.errors import ErrorCode
from kvpool.master.config import AllocationStrategy
from kvpool.master.lease import resolve_soft_pin
from kvpool.master.metadata import (
    ObjectMeta,
    Replica,
    TenantShards,
)
from kvpool.master.segments import Segment
from kvpool.master.state import (
    _BUSY,
    _COMPLETE,
    _EXISTS,
    _HAS_TASK,
    _ILLEGAL_CLIENT,
    _INVALID_PARAMS,
    _INVALID_WRITE,
    _NO_SPACE,
    _NOT_FOUND,
    _OK,
    _OK_REPLY,
    _PROCESSING,
    ServiceState,
)
from kvpool.protocol.messages import (
    BatchPutEnd,
    BatchPutRevoke,
    BatchPutStart,
    BatchPutStartReply,
    BatchReply,
    BatchUpsertStart,
    ClientId,
    HostId,
    PutEnd,
    PutRevoke,
    PutStart,
    PutStartReply,
    ReplicateConfigMsg,
    Reply,
    SoftPinAction,
    TenantId,
    UpsertStart,
)

__all__ = ["WritePath"]

log = logging.getLogger(__name__)


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
        # WritePath._carve); `region_left` is what the batch may still need (0: off).
        self.region_seg: Segment | None = None
        self.region_next = 0
        self.region_end = 0
        self.region_left = 0
        #: One replica, nothing preferred, nothing local: the placement fast path.
        self.simple = cfg.replica_num == 1 and not cfg.preferred_segments and not self.same_node


class WritePath(ServiceState):
    """PutStart / UpsertStart / PutEnd / PutRevoke and their batch forms."""

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

    def _batch_plan(self, req: BatchPutStart | BatchUpsertStart) -> _PutPlan:
        """`_plan` of a batch start, with one size per key."""
        plan = self._plan(req.client_id, req.tenant, req.config, len(req.keys))
        if plan.code == _OK and len(req.sizes) != len(req.keys):
            plan.code = _INVALID_PARAMS
        return plan

    def batch_put_start(self, req: BatchPutStart) -> BatchPutStartReply:
        keys, sizes = req.keys, req.sizes
        n = len(keys)
        plan = self._batch_plan(req)
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
        need = self._aligned(size)
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

    def upsert_start(self, req: UpsertStart) -> PutStartReply:
        plan = self._plan(req.client_id, req.tenant, req.config, 1)
        if plan.code != _OK:
            return PutStartReply(plan.code)
        group = req.config.group_ids[0] if req.config.group_ids else None
        return self._upsert_one(plan, req.key, req.size, group, self._clock())

    def batch_upsert_start(self, req: BatchUpsertStart) -> BatchPutStartReply:
        keys, sizes = req.keys, req.sizes
        n = len(keys)
        plan = self._batch_plan(req)
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
        if self._task_of and obj in self._task_of:
            return PutStartReply(_HAS_TASK)  # a copy or move of it is running (Mooncake)
        if not obj.complete:
            if now - obj.put_start_time < self._discard_timeout:
                return PutStartReply(_BUSY)  # another write of this key is in progress
            self._preempt(obj)
            return self._put_one(plan, key, size, obj.group_id, now)
        leased = now < obj.lease_deadline
        if size == obj.size and not leased:
            # Case B: rewrite in place; unreadable until PutEnd.
            live = tuple(r for r in obj.replicas if r.segment.alive)
            for r in live:
                r.status = _PROCESSING
            obj.replicas = live
        else:
            # Case C (and a same-size rewrite under a live read lease, which must not write
            # under the reader): new ranges first, so a full pool leaves the old value intact.
            # The result is a new object record (a new generation for the reclaim hooks, which
            # see the old one removed), carrying over what outlives a rewrite: group, hard
            # pin, pin.
            fresh = self._allocate(size, plan)
            if not fresh:
                return PutStartReply(_NO_SPACE)
            if leased:
                # A reader holding the lease may still be copying from the old ranges: freed
                # now, the next put could land there and the reader get another key's bytes.
                self._park_until(obj.lease_deadline, obj.size, obj.replicas)
            else:
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
