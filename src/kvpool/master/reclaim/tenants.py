"""Reclaim that knows tenants: a put over quota makes room among its own tenant's objects, and
a tenant holding no more than its fair share is not evicted for others (docs/security.md,
"Tenant quotas"). Both run only in cache mode, with reclaim on and a quota file in force.

**Own eviction.** A put (PutStart, UpsertStart, a commit from an arena) that would take its
tenant past its quota asks `evict_own(tenant, bytes_needed, keep)` before it is refused
(`kvpool.master.planner.PutPlanner.admits`): the tenant's complete objects that are neither
pinned (hard or soft), leased, nor under a replica task are evicted, coldest first by their
reclaim records (inactive unreferenced, then inactive referenced, then active, then objects
with no record), until the tenant's usage leaves room for the put. `keep` (the object the put
replaces) is never taken. At most `SCAN_LIMIT` objects are looked at per call, so a put over
quota costs a bounded scan; an eviction that frees no quota now (it started a move to a disk
tier, whose target is charged until the move lands) stops it. An eviction that keeps a disk
replica frees the memory replicas' share of the usage. The put is refused
TENANT_QUOTA_EXCEEDED when that was not enough.

**Fair share.** A tenant's fair share is an equal split of the bytes that the tenants hold
(their usage summed, divided by the number of tenants holding any). While some tenant holds
more than its share, pool-pressure reclaim (kswapd, a put's direct reclaim, range reclaim)
keeps the objects of every tenant at or below its share (`Verdict.BUSY`, put back on its
list): one tenant filling the pool evicts its own objects and those of other tenants above
their share, never a tenant below it. When nobody is above its share (one tenant, or an even
split), reclaim is plain LRU as without quotas. Usage is the unit of quotas: the space held,
an object's size once per replica (`kvpool.master.quota`). The rule is evaluated afresh for every record reclaim inspects (each eviction
changes the shares): O(tenants holding data) per record, reclaim's path only, never a put's
or a get's fast path.
"""

from __future__ import annotations

from typing import Final

from kvpool.master import hooks
from kvpool.master.metadata import ObjectMeta
from kvpool.master.reclaim.records import INACTIVE_BITS, REF, STATE_MASK
from kvpool.protocol.messages import ReplicaKind

__all__ = ["TenantReclaim"]

#: Objects looked at, at most, by one `evict_own`.
SCAN_LIMIT: Final = 4096


class TenantReclaim:
    """Own eviction and fair share for one service (`target`). Loop-owned."""

    __slots__ = ("_target",)

    def __init__(self, target: hooks.ReclaimTarget) -> None:
        self._target = target

    # ---- own eviction ---------------------------------------------------------------------

    def evict_own(self, tenant: str, bytes_needed: int, keep: ObjectMeta | None) -> int:
        """Evict `tenant`'s coldest unpinned objects until `bytes_needed` of its usage is
        freed; answer the usage freed. Evicts nothing when the takeable objects together hold
        less than `bytes_needed` (the put that asked is refused then, and changes nothing)."""
        target = self._target
        index = target.index
        shards = index.tenant(tenant)
        if shards is None or bytes_needed <= 0:
            return 0
        now = target.now()
        ranked: tuple[list[ObjectMeta], ...] = ([], [], [], [])
        seen = 0
        for shard in shards.shards:
            for obj in shard.values():
                seen += 1
                if seen > SCAN_LIMIT:
                    break
                if obj is keep or not self._takeable(obj, now):
                    continue
                ranked[_coldness(obj)].append(obj)
            if seen > SCAN_LIMIT:
                break
        # What the candidates hold at most: when even all of it cannot free enough, the put is
        # refused anyway, and a refused put must change nothing (evict nothing).
        if sum(o.size * len(o.replicas) for group in ranked for o in group) < bytes_needed:
            return 0
        before = index.tenant_bytes.get(tenant, 0)
        for group in ranked:
            for obj in group:
                used = index.tenant_bytes.get(tenant, 0)
                if before - used >= bytes_needed:
                    return before - used
                if not target.evictable(obj, now):
                    continue  # an earlier eviction changed it
                target.evict(obj)
                if index.tenant_bytes.get(tenant, 0) >= used:
                    return before - used  # nothing freed now (a move to a disk tier began)
        return before - index.tenant_bytes.get(tenant, 0)

    def _takeable(self, obj: ObjectMeta, now: float) -> bool:
        if obj.soft_pin_deadline is not None and now < obj.soft_pin_deadline:
            return False
        if obj.soft_pin_ttl is not None and obj.soft_pin_deadline is None:
            return False  # pinned at its PutEnd, not yet complete anyway
        if not self._target.evictable(obj, now):
            return False
        return any(r.kind is ReplicaKind.MEMORY and r.readable() for r in obj.replicas)

    # ---- fair share -----------------------------------------------------------------------

    def protected(self, tenant: str) -> bool:
        """Whether reclaim must keep `tenant`'s objects now (at or below its fair share while
        another tenant is above its own)."""
        target = self._target
        if target.quotas is None:
            return False
        usage = target.index.tenant_bytes
        mine = usage.get(tenant, 0)
        total = held = top = 0
        for b in usage.values():
            if b > 0:
                total += b
                held += 1
                top = max(top, b)
        # share = total / held; compared multiplied out (exact in integers).
        return held >= 2 and mine * held <= total and top * held > total


def _coldness(obj: ObjectMeta) -> int:
    """0 coldest: inactive and unreferenced; 1 inactive referenced; 2 active; 3 no record."""
    rec = obj.reclaim
    if rec is None:
        return 3
    flags: int = rec.flags  # type: ignore[attr-defined]
    if flags & STATE_MASK == INACTIVE_BITS:
        return 1 if flags & REF else 0
    return 2
