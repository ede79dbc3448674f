"""The read path of the master: GetReplicaList, ExistKey, GetSize and their batch forms.

A read answers the readable replicas (COMPLETE, on a serving segment: mounted and its owner
not silent) and grants a read lease: lease = max(lease, now + `default_kv_lease_ttl`), with one
deadline float per request (shared by every key of a batch). REPLICA_IS_NOT_READY while only
PROCESSING replicas exist, or only replicas on silent segments (the reader may retry: they
come back if their owner does; docs/parts/reliability.md), OBJECT_NOT_FOUND otherwise. Each
read that finds the object readable calls `hooks.on_access(obj)`. The batch loop does one
xxh3 and one dict lookup per key.

A read changes no metadata but the lease it grants (`core.py` says why that one is set here);
an object found with no live replica is forgotten through the core.
"""

from __future__ import annotations

from collections.abc import Callable

import xxhash

from kvpool.codes import OBJECT_NOT_FOUND, OK, REPLICA_IS_NOT_READY
from kvpool.master.core import MetadataCore
from kvpool.master.metadata import (
    REPLICA_ID_SHIFT,
    ObjectMeta,
    Replica,
)
from kvpool.protocol.messages import (
    BatchExistKey,
    BatchExistReply,
    BatchGetLocations,
    BatchGetReplicaList,
    BatchReplicaListReply,
    ExistKey,
    ExistReply,
    GetReplicaList,
    GetSize,
    LocationsReply,
    ReplicaDesc,
    ReplicaKind,
    ReplicaListReply,
    ReplicaStatus,
    SegmentName,
    SizeReply,
    TenantId,
)

__all__ = ["ReadPath"]

_MEMORY = ReplicaKind.MEMORY
_COMPLETE = ReplicaStatus.COMPLETE
# Replies that carry nothing but a code are shared: the server only encodes them.
_NOT_FOUND_LIST = ReplicaListReply(OBJECT_NOT_FOUND)
_NOT_READY_LIST = ReplicaListReply(REPLICA_IS_NOT_READY)


class ReadPath:
    """GetReplicaList / ExistKey / GetSize and their batch forms."""

    def __init__(self, core: MetadataCore) -> None:
        self._core = core
        self._index = core.index
        self._clock = core.clock
        #: Called with an object read while no memory replica of it is readable (served
        #: from a disk tier): the tier manager counts it for promotion on hit.
        self.on_disk_read: Callable[[ObjectMeta], None] | None = None
        self._hooks = core.hooks
        self._lease_ttl = core.config.default_kv_lease_ttl
        self._lease_ttl_ms = round(self._lease_ttl * 1000)

    def get_replica_list(self, req: GetReplicaList) -> ReplicaListReply:
        # `ObjectIndex.get`, inlined (two Python calls fewer per read).
        t = self._index.tenant(req.tenant)
        if t is None:
            return _NOT_FOUND_LIST
        key = req.key
        shards = t.shards
        obj = shards[xxhash.xxh3_64_intdigest(key.encode(), t.seed) % len(shards)].get(key)
        if obj is None:
            return _NOT_FOUND_LIST
        reps = obj.replicas
        if len(reps) == 1:
            # The common case, `_read_obj` inlined: one memory replica, readable.
            r = reps[0]
            seg = r.segment
            if r.kind is _MEMORY and r.status is _COMPLETE and seg.serving:
                deadline = self._clock() + self._lease_ttl
                if obj.lease_deadline < deadline:  # noqa: PLR1730 (max() is a call per read)
                    obj.lease_deadline = deadline
                self._hooks.on_access(obj)
                size = obj.size
                offset = r.offset
                desc = ReplicaDesc(
                    (seg.number << REPLICA_ID_SHIFT) | offset,
                    _MEMORY,
                    _COMPLETE,
                    seg.name,
                    offset,
                    size,
                    seg.endpoint,
                )
                return ReplicaListReply(OK, [desc], size, obj.checksum, self._lease_ttl_ms)
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

    def batch_get_locations(self, req: BatchGetLocations) -> LocationsReply:
        """BatchGetReplicaList's answers in parallel lists (see `LocationsReply`): per key a
        code, size, checksum and the flattened (segment index, offset) of its readable memory
        replicas; no Struct per key or replica, which halves the master's work per key."""
        keys = req.keys
        n = len(keys)
        t = self._index.tenant(req.tenant)
        if t is None:
            return LocationsReply([OBJECT_NOT_FOUND] * n, [0] * n, [None] * n, [[] for _ in keys])
        deadline = self._clock() + self._lease_ttl
        seed, shards = t.seed, t.shards
        nshards = len(shards)
        h = xxhash.xxh3_64_intdigest
        on_access = self._hooks.on_access
        codes: list[int] = []
        sizes: list[int] = []
        sums: list[int | None] = []
        places: list[list[int]] = []
        index: dict[SegmentName, int] = {}
        endpoints: list[str] = []
        empty: list[int] = []
        disks: list[int] = []
        for key in keys:
            obj = shards[h(key.encode(), seed) % nshards].get(key)
            if obj is None:
                codes.append(OBJECT_NOT_FOUND)
                sizes.append(0)
                sums.append(None)
                places.append(empty)
                continue
            reps = obj.replicas
            if len(reps) == 1:  # the common case: one memory replica, readable
                r = reps[0]
                seg = r.segment
                if r.kind is _MEMORY and r.status is _COMPLETE and seg.serving:
                    i = index.get(seg.name)
                    if i is None:
                        i = index[seg.name] = len(endpoints)
                        endpoints.append(seg.endpoint)
                    if obj.lease_deadline < deadline:  # noqa: PLR1730 (max() is a call)
                        obj.lease_deadline = deadline
                    on_access(obj)
                    codes.append(OK)
                    sizes.append(obj.size)
                    sums.append(obj.checksum)
                    places.append([i, r.offset])
                    continue
            where: list[int] = []
            readable = False
            disk: list[Replica] | None = None
            for r in obj.replicas:
                seg = r.segment
                if r.status is _COMPLETE and seg.serving:
                    readable = True
                    if r.kind is _MEMORY:
                        i = index.get(seg.name)
                        if i is None:
                            i = index[seg.name] = len(endpoints)
                            endpoints.append(seg.endpoint)
                        where += (i, r.offset)
                    elif disk is None:
                        disk = [r]
                    else:
                        disk.append(r)
            if disk is not None:
                # Disk-tier replicas after every memory one: readers take them in order.
                if not where and self.on_disk_read is not None:
                    self.on_disk_read(obj)
                for r in disk:
                    seg = r.segment
                    i = index.get(seg.name)
                    if i is None:
                        i = index[seg.name] = len(endpoints)
                        endpoints.append(seg.endpoint)
                        disks.append(i)
                    where += (i, r.offset)
            if not readable:
                code = REPLICA_IS_NOT_READY if obj.has_live_replica() else OBJECT_NOT_FOUND
                if code == OBJECT_NOT_FOUND:
                    self._core.forget_dead(obj)
                codes.append(code)
                sizes.append(0)
                sums.append(None)
                places.append(empty)
                continue
            if obj.lease_deadline < deadline:  # noqa: PLR1730 (max() is a call)
                obj.lease_deadline = deadline
            on_access(obj)
            codes.append(OK)
            sizes.append(obj.size)
            sums.append(obj.checksum)
            places.append(where)
        return LocationsReply(
            codes, sizes, sums, places, list(index), endpoints, self._lease_ttl_ms, disks
        )

    def _read_obj(self, obj: ObjectMeta, deadline: float) -> ReplicaListReply:
        """The readable replicas of `obj`, granting a lease until `deadline` (now + ttl)."""
        size = obj.size
        descs: list[ReplicaDesc] = []
        disk = False
        for r in obj.replicas:
            seg = r.segment
            if r.status is _COMPLETE and seg.serving:
                kind = r.kind
                if kind is not _MEMORY:
                    disk = True
                descs.append(
                    ReplicaDesc(
                        (seg.number << REPLICA_ID_SHIFT) | r.offset,
                        kind,
                        _COMPLETE,
                        seg.name,
                        r.offset,
                        size,
                        seg.endpoint,
                    )
                )
        if not descs:
            if obj.has_live_replica():  # being written, or held by silent segments only
                return _NOT_READY_LIST
            self._core.forget_dead(obj)
            return _NOT_FOUND_LIST
        if disk:
            descs.sort(key=lambda d: d.kind is not _MEMORY)  # memory first (stable)
            if descs[0].kind is not _MEMORY and self.on_disk_read is not None:
                self.on_disk_read(obj)
        if obj.lease_deadline < deadline:  # noqa: PLR1730 (max() is a call per read)
            obj.lease_deadline = deadline
        self._hooks.on_access(obj)
        return ReplicaListReply(OK, descs, size, obj.checksum, self._lease_ttl_ms)

    def exist_key(self, req: ExistKey) -> ExistReply:
        return ExistReply(
            OK, self._exists_one(req.tenant, req.key, self._clock() + self._lease_ttl)
        )

    def batch_exist_key(self, req: BatchExistKey) -> BatchExistReply:
        deadline = self._clock() + self._lease_ttl
        exists = self._exists_one
        tenant = req.tenant
        return BatchExistReply([ExistReply(OK, exists(tenant, k, deadline)) for k in req.keys])

    def _exists_one(self, tenant: TenantId, key: str, deadline: float) -> bool:
        obj = self._core.lookup(tenant, key)
        if obj is None or not obj.complete or not obj.readable_replicas():
            return False
        obj.lease_deadline = max(obj.lease_deadline, deadline)
        self._hooks.on_access(obj)
        return True

    def get_size(self, req: GetSize) -> SizeReply:
        # Mooncake answers GetSize through a replica-list query: same codes, same lease.
        r = self.get_replica_list(GetReplicaList(req.key, req.tenant))
        return SizeReply(r.code, r.size)
