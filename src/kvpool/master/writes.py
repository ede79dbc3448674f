"""The write lifecycle of the master: PutStart, UpsertStart, PutEnd, PutRevoke and batch forms.

Rules (Mooncake's; the protocol module docstring has the whole lifecycle):

* PutStart validation, each INVALID_PARAMS: empty key; size <= 0; replica_num <= 0 or above
  `max_replicas`; a soft-pin TTL with PRESERVE or DISABLE; an ENABLE TTL that is negative or
  above `max_kv_soft_pin_ttl`; `group_ids` whose length is not the number of keys; an empty
  client id or tenant. Then OBJECT_ALREADY_EXISTS for a complete object or one whose PutStart
  is younger than `put_start_discard_timeout`; an older PutStart is preempted (its space is
  parked until `put_start_release_timeout` after it started). No room: NO_AVAILABLE_HANDLE,
  after one `reclaim_for` and one retry, then at most four `reclaim_range` calls, each
  followed by a retry (`MetadataCore.allocate`); in pool mode, when a segment has the bytes
  in pieces, the answer carries `retry_after_ms` while neighbours are moved out of one range
  (`reclaim/defrag.py`).
* UpsertStart: absent, a put; same size, the replicas are rewritten in place; another size,
  or the same size under a live read lease, new ranges first, then a new object record (the
  old ranges of a leased object stay parked until its lease ends: a reader may be copying).
* Batch handlers are tight loops over the keys with the per-request work (validation, clock,
  tenant's shards, the client's in-flight set) hoisted out into a `PutPlan` (`planner.py`,
  which also rules whether a held key may be taken); a batch of plain puts cuts its objects
  from one allocated region (`MetadataCore.carve`). Every change goes through the core.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool.codes import (
    ILLEGAL_CLIENT,
    INVALID_PARAMS,
    INVALID_WRITE,
    NO_AVAILABLE_HANDLE,
    OBJECT_ALREADY_EXISTS,
    OBJECT_HAS_REPLICATION_TASK,
    OBJECT_NOT_FOUND,
    OBJECT_REPLICA_BUSY,
    OK,
    TENANT_QUOTA_EXCEEDED,
)
from kvpool.master.core import MetadataCore
from kvpool.master.metadata import ObjectMeta, Replica, TenantShards
from kvpool.master.planner import Claim, PutPlan, PutPlanner
from kvpool.master.task_table import TaskTable
from kvpool.protocol.messages import (
    BatchPutEnd,
    BatchPutRevoke,
    BatchPutStart,
    BatchPutStartReply,
    BatchReply,
    BatchUpsertStart,
    ClientId,
    PutEnd,
    PutRevoke,
    PutStart,
    PutStartReply,
    ReplicaKind,
    ReplicaStatus,
    Reply,
    TenantId,
    UpsertStart,
)

__all__ = ["WritePath"]

_COMPLETE = ReplicaStatus.COMPLETE
_DFS = ReplicaKind.DFS
_EXISTS = Claim.EXISTS
_OK_REPLY = Reply(OK)


class WritePath:
    """PutStart / UpsertStart / PutEnd / PutRevoke and their batch forms."""

    def __init__(self, core: MetadataCore, planner: PutPlanner, tasks: TaskTable) -> None:
        self._core = core
        self._planner = planner
        self._tasks = tasks
        self._config = core.config
        self._clock = core.clock
        self._index = core.index
        # The core's operations of the per-key paths, bound once.
        self._allocate = core.allocate
        self.dfs_replica: Callable[[int], Replica | None] | None = None
        """A put's DFS replica (the tier manager's), when the master has a DFS tier."""
        self._create = core.create_object
        self._complete = core.complete_object
        self._may_claim = planner.claim

    def put_start(self, req: PutStart) -> PutStartReply:
        plan = self._planner.plan(req.client_id, req.tenant, req.config, 1)
        if plan.code != OK:
            return PutStartReply(plan.code)
        group = req.config.group_ids[0] if req.config.group_ids else ""
        dfs = req.config.dfs_replica_num > 0  # tiers: a copy in the DFS directory too
        reply = self._put_one(plan, req.key, req.size, group, self._clock(), dfs)
        if plan.fresh_tenant:
            self._planner.finish(plan)
        return reply

    def _batch_plan(self, req: BatchPutStart | BatchUpsertStart) -> PutPlan:
        """The plan of a batch start, with one size per key."""
        plan = self._planner.plan(req.client_id, req.tenant, req.config, len(req.keys))
        if plan.code == OK and len(req.sizes) != len(req.keys):
            plan.code = INVALID_PARAMS
        return plan

    def batch_put_start(self, req: BatchPutStart) -> BatchPutStartReply:
        keys, sizes = req.keys, req.sizes
        n = len(keys)
        plan = self._batch_plan(req)
        if plan.code != OK:
            return BatchPutStartReply([PutStartReply(plan.code) for _ in keys])
        groups = req.config.group_ids
        now = self._clock()
        put_one = self._put_one
        if plan.simple and n > 1:
            a = self._config.alignment
            plan.region_left = sum((s + a - 1) // a * a for s in sizes if s > 0)
        try:
            if req.config.dfs_replica_num > 0:  # tiers: each key's DFS copy too
                return BatchPutStartReply(
                    [
                        put_one(plan, keys[i], sizes[i], groups[i] if groups else "", now, True)
                        for i in range(n)
                    ]
                )
            if groups:
                return BatchPutStartReply(
                    [put_one(plan, keys[i], sizes[i], groups[i], now) for i in range(n)]
                )
            return BatchPutStartReply([put_one(plan, keys[i], sizes[i], "", now) for i in range(n)])
        finally:
            self._core.release_region(plan)
            if plan.fresh_tenant:
                self._planner.finish(plan)

    def _put_one(  # noqa: PLR0917
        self, plan: PutPlan, key: str, size: int, group: str, now: float, dfs: bool = False
    ) -> PutStartReply:
        if not key or size <= 0:
            return PutStartReply(INVALID_PARAMS)
        t = plan.shards
        assert t is not None
        shard = t.shard_of(key)
        d = t.shards[shard]
        old = d.get(key)
        if old is not None:
            verdict = self._may_claim(old, now)
            if verdict is _EXISTS:
                return PutStartReply(OBJECT_ALREADY_EXISTS)
        # Decide, claim, then take the key: a full pool leaves a stale write (or a dead
        # object) of the key as it was. Clearing it frees nothing that allocating could use:
        # a preempted write's ranges stay parked, a dead object's sit on unmounted segments.
        if plan.quota is not None and not self._planner.admits(
            plan, size, old.size if old is not None else 0, old
        ):
            return PutStartReply(TENANT_QUOTA_EXCEEDED)
        replicas = self._allocate(size, plan)
        if not replicas:
            return PutStartReply(NO_AVAILABLE_HANDLE, [], plan.retry_after_ms or 0)
        short = len(replicas) < plan.replica_num
        if dfs and self.dfs_replica is not None:  # tiers (docs/parts/tiers.md, the DFS tier)
            extra = self.dfs_replica(size)
            if extra is not None:
                replicas = (*replicas, extra)
        if old is not None:
            self._core.clear_holder(old, verdict)
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
            plan.replica_num,
        )
        self._create(d, obj, plan.in_flight)
        if short:
            self._core.note_short(obj)  # best effort: repair copies it up later
        return PutStartReply(OK, [r.desc(size) for r in replicas])

    def upsert_start(self, req: UpsertStart) -> PutStartReply:
        plan = self._planner.plan(req.client_id, req.tenant, req.config, 1)
        if plan.code != OK:
            return PutStartReply(plan.code)
        group = req.config.group_ids[0] if req.config.group_ids else None
        dfs = req.config.dfs_replica_num > 0
        reply = self._upsert_one(plan, req.key, req.size, group, self._clock(), dfs)
        if plan.fresh_tenant:
            self._planner.finish(plan)
        return reply

    def batch_upsert_start(self, req: BatchUpsertStart) -> BatchPutStartReply:
        keys, sizes = req.keys, req.sizes
        n = len(keys)
        plan = self._batch_plan(req)
        if plan.code != OK:
            return BatchPutStartReply([PutStartReply(plan.code) for _ in keys])
        groups = req.config.group_ids
        now = self._clock()
        upsert = self._upsert_one
        dfs = req.config.dfs_replica_num > 0
        reply = BatchPutStartReply(
            [
                upsert(plan, keys[i], sizes[i], groups[i] if groups else None, now, dfs)
                for i in range(n)
            ]
        )
        if plan.fresh_tenant:
            self._planner.finish(plan)
        return reply

    def _upsert_one(  # noqa: PLR0917
        self, plan: PutPlan, key: str, size: int, group: str | None, now: float, dfs: bool = False
    ) -> PutStartReply:
        if not key or size <= 0:
            return PutStartReply(INVALID_PARAMS)
        core = self._core
        obj = core.lookup(plan.tenant, key)
        if obj is None:
            return self._put_one(plan, key, size, group or "", now, dfs)
        if group is not None and group != obj.group_id:
            # group_membership_is_immutable: a group is fixed for the object's lifetime.
            return PutStartReply(INVALID_PARAMS)
        if self._tasks.blocks(obj):
            return PutStartReply(OBJECT_HAS_REPLICATION_TASK)  # a copy or move is running
        self._tasks.cancel_repair(obj)  # a repair copies bytes the rewrite replaces
        if not obj.complete:
            if self._planner.claim(obj, now) is _EXISTS:
                return PutStartReply(OBJECT_REPLICA_BUSY)  # another write of it is in progress
            # `_put_one` claims the key again (the same verdict) and preempts only once it
            # holds new ranges.
            return self._put_one(plan, key, size, obj.group_id, now, dfs)
        # A DFS copy asked of an object without one takes new ranges (case C) and its file.
        want_dfs = dfs and self.dfs_replica is not None and not _has_dfs(obj)
        if size == obj.size and now >= obj.lease_deadline and not _on_silent(obj) and not want_dfs:
            # Case B: rewrite in place; unreadable until PutEnd. (Not onto a silent segment:
            # its owner cannot be written now, and the old bytes there must not come back
            # under the new checksum.)
            fresh = None
        elif plan.quota is not None and not self._planner.admits(plan, size, obj.size, obj):
            return PutStartReply(TENANT_QUOTA_EXCEEDED)
        else:
            # Case C (and a same-size rewrite under a live read lease, which must not write
            # under the reader): new ranges first, so a full pool leaves the old value intact.
            fresh = core.allocate(size, plan)
            if not fresh:
                return PutStartReply(NO_AVAILABLE_HANDLE, [], plan.retry_after_ms or 0)
        short = fresh is not None and len(fresh) < plan.replica_num
        if fresh is not None and (dfs or _has_dfs(obj)) and self.dfs_replica is not None:
            # tiers: the new value's file (the old one goes with the old replicas); a copy
            # the old value had is kept for the new one.
            extra = self.dfs_replica(size)
            if extra is not None:
                fresh = (*fresh, extra)
        obj = core.rewrite_object(
            obj, size, fresh, plan.client_id, now, plan.action, plan.soft_pin, plan.replica_num
        )
        if short:
            core.note_short(obj)
        return PutStartReply(OK, [r.desc(obj.size) for r in obj.replicas])

    def put_end(self, req: PutEnd) -> Reply:
        t = self._index.tenant(req.tenant)
        code = self._end_one(
            req.client_id, t, req.key, req.checksum, self._clock(), replica_id=req.replica_id
        )
        return _OK_REPLY if code == OK else Reply(code)

    def batch_put_end(self, req: BatchPutEnd) -> BatchReply:
        keys, sums, ids = req.keys, req.checksums, req.replica_ids
        if (sums and len(sums) != len(keys)) or (ids and len(ids) != len(keys)):
            return BatchReply([INVALID_PARAMS] * len(keys))
        t = self._index.tenant(req.tenant)
        if t is None:
            return BatchReply([OBJECT_NOT_FOUND] * len(keys))
        now = self._clock()
        end = self._end_one
        cid = req.client_id
        if ids:
            return BatchReply(
                [
                    end(cid, t, k, sums[i] if sums else None, now, replica_id=ids[i])
                    for i, k in enumerate(keys)
                ]
            )
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
        *,
        replica_id: int | None = None,
    ) -> int:
        obj = t.shards[t.shard_of(key)].get(key) if t is not None else None
        if obj is None:
            return OBJECT_NOT_FOUND
        if obj.client_id != client_id or not _same_put(obj, replica_id):
            return ILLEGAL_CLIENT
        if obj.complete:
            # A repeated PutEnd of a finished write is a no-op; anything else is a misuse.
            return OK if all(r.status is _COMPLETE for r in obj.replicas) else INVALID_WRITE
        self._complete(obj, checksum, now)
        return OK

    def put_revoke(self, req: PutRevoke) -> Reply:
        code = self._revoke_one(req.client_id, req.tenant, req.key, req.replica_id, req.park)
        return _OK_REPLY if code == OK else Reply(code)

    def batch_put_revoke(self, req: BatchPutRevoke) -> BatchReply:
        cid, tenant, ids, park = req.client_id, req.tenant, req.replica_ids, req.park
        if ids and len(ids) != len(req.keys):
            return BatchReply([INVALID_PARAMS] * len(req.keys))
        return BatchReply(
            [
                self._revoke_one(cid, tenant, k, ids[i] if ids else None, park)
                for i, k in enumerate(req.keys)
            ]
        )

    def _revoke_one(
        self,
        client_id: ClientId,
        tenant: TenantId,
        key: str,
        replica_id: int | None = None,
        park: bool = False,
    ) -> int:
        obj = self._index.get(tenant, key)
        if obj is None:
            return OBJECT_NOT_FOUND
        if obj.client_id != client_id or not _same_put(obj, replica_id):
            return ILLEGAL_CLIENT
        if obj.complete:
            return INVALID_WRITE  # nothing in flight to revoke
        if park:
            self._core.preempt(obj)  # a frozen node may still write its ranges: parked
        else:
            self._core.revoke(obj)
        return OK


def _same_put(obj: ObjectMeta, replica_id: int | None) -> bool:
    """Whether a PutEnd / PutRevoke naming `replica_id` (the first replica its PutStart got)
    is about the put that holds the key now (None: the request does not say; accepted)."""
    if replica_id is None:
        return True
    reps = obj.replicas
    return bool(reps) and reps[0].replica_id == replica_id


def _has_dfs(obj: ObjectMeta) -> bool:
    """Whether `obj` has a DFS replica (docs/parts/tiers.md, the DFS tier)."""
    return any(r.kind is _DFS for r in obj.replicas)


def _on_silent(obj: ObjectMeta) -> bool:
    """Whether a replica of `obj` sits on a silent segment (mounted, not serving)."""
    return any(r.segment.alive and not r.segment.serving for r in obj.replicas)
