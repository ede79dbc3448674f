"""The put planner: what a put request's config resolves to, and who may claim a key.

Every way of creating an object (PutStart, UpsertStart of an absent key, PutCommit into an
arena, and their batch forms) asks two questions, answered here once, without changing
anything:

* `PutPlanner.plan`: is the request's config valid (client id, tenant, replica count, soft pin,
  group ids), and what does it resolve to: a `PutPlan`, computed once per request (a batch:
  once for all its keys), which also carries a batch's allocation region (`core.py` cuts it).
* `PutPlanner.finish`: after the request, forget a tenant made for it that stored nothing
  (a refused put naming a new tenant leaves the master no bigger).
* `PutPlanner.claim`: may a key held by `old` be taken? The one rule, Mooncake's:

  ============================================  ===============
  `old` has no replica on a mounted segment      FORGET_DEAD
  `old` is complete                              EXISTS (refuse)
  `old` is a write younger than the discard      EXISTS (refuse)
  timeout (`put_start_discard_timeout`)
  `old` is an older, unfinished write            PREEMPT
  ============================================  ===============

The caller decides first and applies the verdict (`MetadataCore.clear_holder`) only once it
knows its own claim succeeds, so a refused request leaves everything as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from kvpool.codes import INVALID_PARAMS, OK
from kvpool.master.config import AllocationStrategy, MasterConfig
from kvpool.master.lease import resolve_soft_pin
from kvpool.master.liveness import ClientTable
from kvpool.master.metadata import ObjectIndex, ObjectMeta, TenantShards
from kvpool.master.quota import TenantQuotas
from kvpool.master.segments import Segment
from kvpool.protocol.messages import ClientId, ReplicateConfigMsg, SoftPinAction, TenantId

__all__ = ["Claim", "PutPlan", "PutPlanner"]


class Claim(Enum):
    """What a new put may do about the object `old` that holds its key."""

    EXISTS = 0
    """Refuse: `old` is complete, or a write still within its discard timeout."""
    FORGET_DEAD = 1
    """Take the key: `old` has no replica on a mounted segment (it is gone already)."""
    PREEMPT = 2
    """Take the key from `old`, an unfinished write past its discard timeout."""


# What `claim` answers, as module constants (`Claim.X` is a call through EnumType.__getattr__
# on Python 3.11).
_EXISTS = Claim.EXISTS
_FORGET_DEAD = Claim.FORGET_DEAD
_PREEMPT = Claim.PREEMPT
_PIN = SoftPinAction.ENABLE


class PutPlan:
    """What a put request's config resolves to, computed once per request (batch: once)."""

    __slots__ = (
        "action",
        "client_id",
        "code",
        "exclude",
        "fresh_tenant",
        "hard_pin",
        "in_flight",
        "preferred",
        "quota",
        "region_end",
        "region_left",
        "region_next",
        "region_seg",
        "replica_num",
        "retry_after_ms",
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
        self.exclude = cfg.exclude_segments
        self.same_node = cfg.prefer_alloc_in_same_node
        self.shards: TenantShards | None = None  # set by `PutPlanner.plan` once valid
        #: `shards` were made for this request (the tenant had none): `PutPlanner.finish`
        #: drops them again when the request stored nothing.
        self.fresh_tenant = False
        #: The tenant's quota in bytes (None: no limit), set by `plan`; `PutPlanner.admits`.
        self.quota: int | None = None
        #: The client's in-flight set (ClientTable.in_flight_bucket), also set by `plan`.
        self.in_flight: dict[ObjectMeta, None] | None = None
        # A batch's bump region: one range taken for many objects, carved in order (see
        # MetadataCore.carve); `region_left` is what the batch may still need (0: off).
        self.region_seg: Segment | None = None
        self.region_next = 0
        self.region_end = 0
        self.region_left = 0
        #: Pool mode: what a defragmentation said when this request found no range (None:
        #: not asked yet; asked once per request, so a batch starts one at most), as the
        #: retry hint of its NO_AVAILABLE_HANDLE answers (0: nothing under way).
        self.retry_after_ms: int | None = None
        #: One replica, nothing preferred, nothing local: the placement fast path.
        self.simple = (
            cfg.replica_num == 1
            and not cfg.preferred_segments
            and not cfg.exclude_segments
            and not self.same_node
        )


class PutPlanner:
    """Validates puts and rules on claims; changes nothing."""

    __slots__ = ("_clients", "_config", "_discard", "_index", "_random", "quotas", "reclaim_tenant")

    def __init__(
        self,
        config: MasterConfig,
        index: ObjectIndex,
        clients: ClientTable,
        strategy: AllocationStrategy,
    ) -> None:
        self._config = config
        self._index = index
        self._clients = clients
        self._random = strategy is AllocationStrategy.RANDOM
        self._discard = config.put_start_discard_timeout
        #: The tenant quotas in force (None: none; `kvpool.master.quota`).
        self.quotas: TenantQuotas | None = None
        #: Evicts a tenant's own objects for a put over its quota (`ReclaimHooks.reclaim_tenant`;
        #: None: the put is refused at once).
        self.reclaim_tenant: Callable[[str, int, ObjectMeta | None], int] | None = None

    def plan(
        self, client_id: ClientId, tenant: TenantId, cfg: ReplicateConfigMsg, n: int
    ) -> PutPlan:
        """Validate the parts of a put of `n` keys shared by all its keys."""
        if cfg.soft_pin_ttl_ms is None and cfg.soft_pin_action is not _PIN:
            code, ttl = OK, None  # resolve_soft_pin's answer for no pin, without the call
        else:
            pin_code, ttl = resolve_soft_pin(cfg, self._config)
            code = int(pin_code)
        if (
            not client_id
            or not tenant
            or cfg.replica_num <= 0
            or cfg.replica_num > self._config.max_replicas
            or (cfg.group_ids is not None and len(cfg.group_ids) != n)
        ):
            code = INVALID_PARAMS
        plan = PutPlan(code, client_id, tenant, cfg, ttl)
        if plan.code == OK:
            # A tenant's shard list and a client's in-flight set are containers made on first
            # use; making them early changes nothing anyone can observe.
            shards = self._index.tenant(tenant)  # the dict's own get: no Python call
            if shards is None:
                plan.fresh_tenant = True
                shards = self._index.tenant_for_insert(tenant)
            plan.shards = shards
            in_flight = self._clients.in_flight.get(client_id)  # in_flight_bucket, inline
            plan.in_flight = (
                in_flight if in_flight is not None else self._clients.in_flight_bucket(client_id)
            )
            plan.simple = plan.simple and self._random
            if self.quotas is not None:
                plan.quota = self.quotas.limit(tenant)
        return plan

    def admits(
        self, plan: PutPlan, size: int, replaces: int = 0, keep: ObjectMeta | None = None
    ) -> bool:
        """Whether a put of `size` bytes (replacing `keep`, whose charge is refunded when the
        put takes its key) keeps its tenant within its quota, after evicting the tenant's own
        objects when reclaim can (`reclaim_tenant`); callers test `plan.quota is not None`
        first. Charged: `size` per replica asked (`kvpool.master.quota`); what `keep` holds
        now is counted in place of `replaces` (the old object's size, as callers pass it)."""
        quota = plan.quota
        if quota is None:
            return True
        size *= plan.replica_num
        replaces = keep.size * len(keep.replicas) if keep is not None else 0
        over = self._index.tenant_bytes.get(plan.tenant, 0) - replaces + size - quota
        if over <= 0:
            return True
        if self.reclaim_tenant is None or size - replaces > quota:
            return False
        self.reclaim_tenant(plan.tenant, over, keep)
        return self._index.tenant_bytes.get(plan.tenant, 0) - replaces + size <= quota

    def finish(self, plan: PutPlan) -> None:
        """After the request of `plan`: a tenant made for it that holds nothing is dropped
        (callers test `plan.fresh_tenant` first, so this costs nothing on the common path)."""
        plan.fresh_tenant = False
        self._index.drop_if_empty(plan.tenant)

    def claim(self, old: ObjectMeta, now: float) -> Claim:
        """May a put at `now` take the key `old` holds? (module docstring)"""
        if not old.has_live_replica():
            return _FORGET_DEAD
        if old.complete or now - old.put_start_time < self._discard:
            return _EXISTS
        return _PREEMPT
