"""`PutPlanner.plan`, the per-request part of every put: a config without a soft pin (the
default) answers without `resolve_soft_pin`'s call, the tenant's shards and the client's
in-flight set come from the dicts' own `get` (created on a miss only), and what the full rules
refuse is still refused."""

from __future__ import annotations

import pytest

from kvpool.codes import INVALID_PARAMS, OK
from kvpool.master import planner as planner_module
from kvpool.master.config import AllocationStrategy, MasterConfig
from kvpool.master.liveness import ClientTable
from kvpool.master.metadata import ObjectIndex
from kvpool.master.planner import PutPlanner
from kvpool.protocol.messages import ClientId, ReplicateConfigMsg, SoftPinAction, TenantId

CLIENT = ClientId("client-a")
TENANT = TenantId("tenant-a")


def _planner() -> tuple[PutPlanner, ObjectIndex, ClientTable]:
    index = ObjectIndex(4)
    clients = ClientTable(10.0)
    return PutPlanner(MasterConfig(), index, clients, AllocationStrategy.RANDOM), index, clients


def test_a_config_without_a_soft_pin_skips_the_rules_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planner, index, clients = _planner()

    def refuse(*_: object) -> object:
        raise AssertionError("resolve_soft_pin called for a config without a soft pin")

    monkeypatch.setattr(planner_module, "resolve_soft_pin", refuse)
    plan = planner.plan(CLIENT, TENANT, ReplicateConfigMsg(), 1)
    assert plan.code == OK and plan.soft_pin is None
    assert plan.fresh_tenant and plan.shards is index.tenant(TENANT)
    assert plan.in_flight is clients.in_flight[CLIENT]
    again = planner.plan(CLIENT, TENANT, ReplicateConfigMsg(), 1)
    assert not again.fresh_tenant and again.shards is plan.shards
    assert again.in_flight is plan.in_flight


def test_soft_pin_rules_still_apply() -> None:
    planner, _, _ = _planner()
    bad_ttl = ReplicateConfigMsg(soft_pin_action=SoftPinAction.PRESERVE, soft_pin_ttl_ms=5)
    assert planner.plan(CLIENT, TENANT, bad_ttl, 1).code == INVALID_PARAMS
    negative = ReplicateConfigMsg(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=-1)
    assert planner.plan(CLIENT, TENANT, negative, 1).code == INVALID_PARAMS
    pinned = ReplicateConfigMsg(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=2000)
    plan = planner.plan(CLIENT, TENANT, pinned, 1)
    assert plan.code == OK and plan.soft_pin == 2.0
    assert planner.plan(CLIENT, TenantId(""), ReplicateConfigMsg(), 1).code == INVALID_PARAMS
