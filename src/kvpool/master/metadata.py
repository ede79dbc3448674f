"""Object metadata: the per-object and per-replica records, and the sharded index of them.

Built for a million objects in a few hundred bytes each:

* `ObjectMeta` and `Replica` are slotted records (no per-instance dict). The key string is
  stored once: the index's dict key and `ObjectMeta.key` are the same object.
* An object's replicas are a tuple (one pointer and no spare capacity, unlike a list).
* A replica's id is not stored: it is derived from the segment's mount number and the offset,
  which together are unique among live replicas.
* Shards are plain dicts `key -> ObjectMeta`, one per (tenant, shard). The shard of a key is
  `xxh3_64(key, seed=xxh3_64(tenant)) % num_shards`: stable across processes and runs (never
  Python's salted `hash()`), and it depends on the tenant as well as the key. `group_id` plays
  no part in it.

The index only stores and finds; every rule about what may change lives in `service.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import xxhash

from kvpool.master.segments import Segment
from kvpool.protocol.messages import (
    ClientId,
    ReplicaDesc,
    ReplicaKind,
    ReplicaStatus,
    TenantId,
)

__all__ = ["REPLICA_ID_SHIFT", "ObjectIndex", "ObjectMeta", "Replica", "TenantShards"]

_COMPLETE = ReplicaStatus.COMPLETE
_MEMORY = ReplicaKind.MEMORY
_COMPLETE_BIT = 1
_HARD_PIN = 2
_REPLICAS_SHIFT = 2  # the replica count the put asked for lives above the two flags
# Replica ids pack the segment's mount number above the offset (segments up to 2**44 bytes).
REPLICA_ID_SHIFT = 44


class Replica:
    """One copy of an object's bytes: `size` of the object at `offset` of `segment`."""

    __slots__ = ("kind", "offset", "segment", "status")

    def __init__(
        self, segment: Segment, offset: int, status: ReplicaStatus, kind: ReplicaKind = _MEMORY
    ) -> None:
        self.segment = segment
        self.offset = offset
        self.status = status
        self.kind = kind

    @property
    def replica_id(self) -> int:
        return (self.segment.number << REPLICA_ID_SHIFT) | self.offset

    def readable(self) -> bool:
        """COMPLETE and on a serving segment (mounted, its owner not silent)."""
        return self.status is _COMPLETE and self.segment.serving

    def desc(self, size: int) -> ReplicaDesc:
        seg = self.segment
        return ReplicaDesc(
            (seg.number << REPLICA_ID_SHIFT) | self.offset,
            self.kind,
            self.status,
            seg.name,
            self.offset,
            size,
            seg.endpoint,
        )


class ObjectMeta:
    """Everything the master knows about one object.

    Times are in the master clock's seconds. `lease_deadline`: no Remove or eviction before it.
    `soft_pin_ttl` is what PutStart asked for; `soft_pin_deadline` is set at PutEnd (a soft
    pin runs from first readability and reads do not extend it). `complete` is False from
    PutStart (or an in-place UpsertStart) until PutEnd. `reclaim` belongs to the reclaim hooks
    (list links, flags); the service never reads it.
    """

    __slots__ = (
        "_bits",
        "checksum",
        "client_id",
        "group_id",
        "key",
        "lease_deadline",
        "put_start_time",
        "reclaim",
        "replicas",
        "shard",
        "size",
        "soft_pin_deadline",
        "soft_pin_ttl",
        "tenant",
    )

    # Positional on purpose: built once per put, on the hot path.
    def __init__(  # noqa: PLR0917
        self,
        key: str,
        tenant: TenantId,
        shard: int,
        size: int,
        client_id: ClientId,
        replicas: tuple[Replica, ...],
        put_start_time: float,
        soft_pin_ttl: float | None,
        hard_pin: bool,
        group_id: str,
        replica_num: int = 1,
        complete: bool = False,
        checksum: int | None = None,
        lease_deadline: float = 0.0,
    ) -> None:
        self.key = key
        self.tenant = tenant
        self.shard = shard
        self.size = size
        self.client_id = client_id
        self.replicas = replicas
        self.put_start_time = put_start_time
        self.soft_pin_ttl = soft_pin_ttl
        self.soft_pin_deadline: float | None = None
        # `complete` (bit 0), `hard_pin` (bit 1) and the replica count asked for (above) share
        # one slot: 14 slots make a 144-byte record, 15 made a 160-byte one (allocations come
        # in 16-byte steps).
        # 2: _REPLICAS_SHIFT; `complete` given here saves a commit the property setter's call.
        self._bits = (
            (replica_num << 2) | (_HARD_PIN if hard_pin else 0) | (_COMPLETE_BIT if complete else 0)
        )
        self.group_id = group_id
        self.checksum = checksum
        self.lease_deadline = lease_deadline
        self.reclaim: object = None

    @property
    def complete(self) -> bool:
        return bool(self._bits & _COMPLETE_BIT)

    @complete.setter
    def complete(self, value: bool) -> None:
        self._bits = (self._bits | _COMPLETE_BIT) if value else (self._bits & ~_COMPLETE_BIT)

    @property
    def hard_pin(self) -> bool:
        """Never evicted (still removable); fixed when the object is created."""
        return bool(self._bits & _HARD_PIN)

    @property
    def replica_num(self) -> int:
        """The replicas the put asked for (what repair restores after a loss)."""
        return self._bits >> _REPLICAS_SHIFT

    def readable_replicas(self) -> list[Replica]:
        return [r for r in self.replicas if r.status is _COMPLETE and r.segment.serving]

    def has_live_replica(self) -> bool:
        """Whether any replica (complete or still being written) is on a mounted segment."""
        return any(r.segment.alive for r in self.replicas)

    def __repr__(self) -> str:
        return (
            f"ObjectMeta({self.tenant}/{self.key!r}, size={self.size}, "
            f"replicas={len(self.replicas)}, complete={self.complete})"
        )


class TenantShards:
    """One tenant's shards and hash seed, looked up once per request by the batch loops."""

    __slots__ = ("seed", "shards")

    def __init__(self, tenant: str, num_shards: int) -> None:
        self.seed: int = xxhash.xxh3_64_intdigest(tenant.encode())
        self.shards: list[dict[str, ObjectMeta]] = [{} for _ in range(num_shards)]

    def shard_of(self, key: str) -> int:
        return int(xxhash.xxh3_64_intdigest(key.encode(), self.seed)) % len(self.shards)


class ObjectIndex:
    """Objects by (tenant, key) in `num_shards` dicts per tenant."""

    __slots__ = ("_num_shards", "_tenants", "count", "tenant", "tenant_bytes")

    def __init__(self, num_shards: int) -> None:
        self._num_shards = num_shards
        self._tenants: dict[str, TenantShards] = {}
        #: `tenant(name)`: the tenant's shards, None when it never had an object. The dict's
        #: own bound `get` (never replaced: the dict is), so every read path's lookup costs no
        #: Python call.
        self.tenant: Callable[[str], TenantShards | None] = self._tenants.get
        #: Objects indexed (kept by `add` / `discard`; read it through len()).
        self.count = 0
        #: Bytes charged per tenant (tenant quotas, `kvpool.master.quota`): an indexed
        #: object's size once per replica it holds, kept by `add` / `discard` and by
        #: `MetadataCore` wherever an indexed object's replicas change (`charge`), plus the
        #: targets of running replica tasks (`kvpool.master.task_table`); a tenant charged
        #: nothing has no entry.
        self.tenant_bytes: dict[str, int] = {}

    def __len__(self) -> int:
        return self.count

    @property
    def num_shards(self) -> int:
        return self._num_shards

    def tenant_for_insert(self, tenant: str) -> TenantShards:
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = TenantShards(tenant, self._num_shards)
        return t

    def drop_if_empty(self, tenant: str) -> None:
        """Forget `tenant`'s containers when it holds no object: a tenant made for a put that
        was then refused must not keep its ~5 KiB of empty shards for good."""
        t = self._tenants.get(tenant)
        if t is not None and not any(t.shards):
            del self._tenants[tenant]

    def shard_of(self, tenant: str, key: str) -> int:
        """The stable shard index of (tenant, key): xxh3_64(key, seed=xxh3_64(tenant)) % N."""
        t = self._tenants.get(tenant)
        if t is not None:
            return t.shard_of(key)
        seed = xxhash.xxh3_64_intdigest(tenant.encode())
        return int(xxhash.xxh3_64_intdigest(key.encode(), seed)) % self._num_shards

    def get(self, tenant: str, key: str) -> ObjectMeta | None:
        t = self._tenants.get(tenant)
        if t is None:
            return None
        return t.shards[t.shard_of(key)].get(key)

    def add(self, shard: dict[str, ObjectMeta], obj: ObjectMeta) -> None:
        """Index `obj` in `shard` (the dict of its tenant and `obj.shard`); key not present."""
        shard[obj.key] = obj
        self.count += 1
        self.charge(obj.tenant, obj.size * len(obj.replicas))

    def insert(self, obj: ObjectMeta) -> None:
        """Index `obj` (its shard already computed); the key must not be present."""
        self.add(self.tenant_for_insert(obj.tenant).shards[obj.shard], obj)

    def discard(self, obj: ObjectMeta) -> bool:
        """Remove `obj` if it is still the one indexed under its key."""
        t = self._tenants.get(obj.tenant)
        if t is None:
            return False
        shard = t.shards[obj.shard]
        if shard.get(obj.key) is not obj:
            return False
        del shard[obj.key]
        self.count -= 1
        self.charge(obj.tenant, -obj.size * len(obj.replicas))
        return True

    def holds(self, obj: ObjectMeta) -> bool:
        """Whether `obj` is the record indexed under its key (its replicas are charged)."""
        t = self._tenants.get(obj.tenant)
        return t is not None and t.shards[obj.shard].get(obj.key) is obj

    def charge(self, tenant: str, delta: int) -> None:
        """Add `delta` bytes (negative: a refund) to `tenant`'s usage (`tenant_bytes`)."""
        if delta:
            tb = self.tenant_bytes
            left = tb.get(tenant, 0) + delta
            if left > 0:
                tb[tenant] = left
            else:
                tb.pop(tenant, None)

    def tenants(self) -> list[str]:
        return list(self._tenants)

    def snapshot(self, tenant: str | None = None) -> list[ObjectMeta]:
        """Every object (of one tenant, or all), copied out so the caller may mutate the index
        while walking the list (stale entries are recognised by `discard` returning False)."""
        out: list[ObjectMeta] = []
        names = [tenant] if tenant is not None else list(self._tenants)
        for name in names:
            t = self._tenants.get(name)
            if t is not None:
                for shard in t.shards:
                    out.extend(shard.values())
        return out

    def shard_objects(self, tenant: str, shard: int) -> Iterator[ObjectMeta]:
        """The objects of one shard (for the reclaim hooks; do not mutate while iterating)."""
        t = self._tenants.get(tenant)
        if t is not None:
            yield from t.shards[shard].values()
