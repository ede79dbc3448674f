"""Tenant quotas: the policy file, admission, exact usage over random sequences, and a real
`kvpool master --tenant-quota-file` (Mooncake's flags too) with SIGHUP and `kvpool status`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool.errors import ErrorCode, InvalidParams
from kvpool.master.config import MasterConfig
from kvpool.master.quota import TenantQuotas, load_quota_file
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m
from kvpool.rpc import RpcClient
from kvtest.procs import kvpool_proc, wait_until
from master.conftest import Clock, MakeService, mount

E = ErrorCode
KiB = 1 << 10
MiB = 1 << 20
TENANTS = ["a", "b", "c"]
QUOTAS = {"a": 64 * KiB, "b": 256 * KiB}  # c has none


def _quota_file(tmp_path: Path, quotas: dict[str, int]) -> Path:
    path = tmp_path / "policy.yaml"
    lines = ["version: 1", "tenants:"]
    lines += [f"  - {{name: {n}, quota: {q}}}" for n, q in quotas.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_policy_file_is_mooncakes_format_and_validated(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\ntenants:\n  - {name: a, quota: 64GiB}\n  - {name: b, quota: 10}\n")
    assert load_quota_file(path) == {"a": 64 << 30, "b": 10}
    for text, message in [
        ("tenants: []", "version"),
        ("version: 1\ntenants: {}", "list"),
        ("version: 1\ntenants: [{name: a}]", "name, quota"),
        ("version: 1\ntenants: [{name: a, quota: lots}]", "quota"),
        ("version: 1\ntenants: [{name: a, quota: 1}, {name: a, quota: 2}]", "twice"),
    ]:
        path.write_text(text)
        with pytest.raises(InvalidParams, match=message):
            load_quota_file(path)


def _register(svc: MasterService, client: m.ClientId) -> None:
    assert svc.handle(m.ReMountSegment(client, m.HostId("h"))).code == 0


def usage_matches_objects(svc: MasterService) -> None:
    index = svc.index
    expected: dict[str, int] = {}
    for obj in index.snapshot():
        # The space held: the size once per replica (one each here; no replica tasks).
        expected[obj.tenant] = expected.get(obj.tenant, 0) + obj.size * len(obj.replicas)
    assert index.tenant_bytes == expected


def test_a_put_past_its_tenants_quota_fails_and_a_remove_refunds(
    make_service: MakeService, tmp_path: Path
) -> None:
    svc = make_service()
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, QUOTAS)))
    w = m.ClientId("w")
    _register(svc, w)
    a = m.TenantId("a")
    assert svc.handle(m.PutStart(w, "k1", 40 * KiB, tenant=a)).code == 0
    assert svc.handle(m.PutStart(w, "k2", 40 * KiB, tenant=a)).code == E.TENANT_QUOTA_EXCEEDED
    assert svc.handle(m.PutStart(w, "k2", 40 * KiB, tenant=m.TenantId("c"))).code == 0
    assert svc.handle(m.PutEnd(w, "k1", 1, tenant=a)).code == 0
    # An upsert is counted net of the bytes it replaces.
    assert svc.handle(m.UpsertStart(w, "k1", 64 * KiB, tenant=a)).code == 0
    assert svc.handle(m.PutEnd(w, "k1", 2, tenant=a)).code == 0
    assert svc.handle(m.UpsertStart(w, "k1", 65 * KiB, tenant=a)).code == E.TENANT_QUOTA_EXCEEDED
    stats = svc.handle(m.Stats())
    assert isinstance(stats, m.StatsReply)
    assert [(t.name, t.used, t.quota) for t in stats.tenants] == [
        ("a", 64 * KiB, 64 * KiB),
        ("b", 0, 256 * KiB),
        ("c", 40 * KiB, None),
    ]
    assert svc.handle(m.Remove("k1", True, tenant=a)).code == 0  # a removal refunds
    assert svc.handle(m.PutStart(w, "k2", 60 * KiB, tenant=a)).code == 0
    assert svc.handle(m.PutRevoke(w, "k2", tenant=a)).code == 0  # so does a failed write
    assert svc.index.tenant_bytes.get("a", 0) == 0
    usage_matches_objects(svc)


_op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(TENANTS), st.integers(0, 5), st.integers(1, 48)),
    st.tuples(st.just("batch"), st.sampled_from(TENANTS), st.integers(0, 5), st.integers(1, 24)),
    st.tuples(st.just("end"), st.sampled_from(TENANTS), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("revoke"), st.sampled_from(TENANTS), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("upsert"), st.sampled_from(TENANTS), st.integers(0, 5), st.integers(1, 64)),
    st.tuples(st.just("remove"), st.sampled_from(TENANTS), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("expire"), st.just("a"), st.just(0), st.just(0)),
    st.tuples(st.just("get"), st.sampled_from(TENANTS), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("pinned"), st.sampled_from(TENANTS), st.integers(0, 5), st.integers(1, 48)),
)


@pytest.mark.parametrize("reclaim", [False, True], ids=["no-reclaim", "reclaim"])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_op, min_size=1, max_size=40))
def test_usage_is_the_sum_of_live_objects_bytes_per_tenant_and_within_quota(
    ops: list[tuple[str, str, int, int]], tmp_path: Path, reclaim: bool
) -> None:
    """With reclaim on, puts over quota evict their tenant's own objects, and reclaim for a
    full pool (2 MiB: tenant c, without a quota, fills it) keeps tenants below their fair
    share: usage stays exact and within quota through both."""
    from kvpool.master.reclaim.adapter import MasterReclaimHooks

    clock = Clock()
    hooks = MasterReclaimHooks() if reclaim else None
    svc = MasterService(MasterConfig(seed=7), clock=clock, hooks=hooks)
    for i in range(2):
        info = m.SegmentInfo(m.SegmentName(f"s{i}"), 1 * MiB, m.HostId("h"), f"127.0.0.1:{i}", "")
        assert svc.handle(m.MountSegment(m.ClientId("node"), m.HostId("h"), info)).code == 0
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, QUOTAS)))
    w = m.ClientId("w")
    _register(svc, w)
    for op, tenant_name, k, n in ops:
        tenant = m.TenantId(tenant_name)
        key = f"k{k}"
        size = n * KiB
        if op == "put":
            svc.handle(m.PutStart(w, key, size, tenant=tenant))
        elif op == "batch":
            svc.handle(m.BatchPutStart(w, [key, key + "x"], [size, size], tenant=tenant))
        elif op == "end":
            svc.handle(m.PutEnd(w, key, 1, tenant=tenant))
        elif op == "revoke":
            svc.handle(m.PutRevoke(w, key, tenant=tenant))
        elif op == "upsert":
            svc.handle(m.UpsertStart(w, key, size, tenant=tenant))
        elif op == "remove":
            svc.handle(m.Remove(key, True, tenant=tenant))
        elif op == "get":
            svc.handle(m.GetReplicaList(key, tenant=tenant))
        elif op == "pinned":
            pin = m.ReplicateConfigMsg(with_hard_pin=True)
            if svc.handle(m.PutStart(w, key, size, pin, tenant=tenant)).code == 0:
                svc.handle(m.PutEnd(w, key, 1, tenant=tenant))
        else:
            clock.advance(31.0)
            svc.release_stale()
        usage_matches_objects(svc)
        for name, quota in QUOTAS.items():
            assert svc.index.tenant_bytes.get(name, 0) <= quota


def test_a_master_with_mooncakes_quota_flags_reloads_on_sighup_and_status_shows_usage(
    tmp_path: Path,
) -> None:
    policy = _quota_file(tmp_path, {"a": 4 * KiB})
    args = ["--enable_multi_tenants", "--tenant_quota_connector_type", "file"]
    with kvpool_proc(
        "master", "--port", "0", *args, "--tenant_quota_connector_uri", str(policy)
    ) as proc:
        address = proc.wait_ready()
        with RpcClient(address, response_type=m.Response, timeout=10) as c:
            w, a = m.ClientId("w"), m.TenantId("a")
            info = m.SegmentInfo(m.SegmentName("s"), 16 * MiB, m.HostId("h"), "127.0.0.1:1", "")
            assert c.call(m.MountSegment(m.ClientId("n"), m.HostId("h"), info)).code == 0
            assert c.call(m.ReMountSegment(w, m.HostId("h"))).code == 0
            assert c.call(m.PutStart(w, "k", 8 * KiB, tenant=a)).code == E.TENANT_QUOTA_EXCEEDED
            policy.write_text("version: 1\ntenants:\n  - {name: a, quota: 16KiB}\n")
            os.kill(proc.pid, signal.SIGHUP)
            wait_until(
                lambda: c.call(m.PutStart(w, "k", 8 * KiB, tenant=a)).code == 0,
                10,
                what="the raised quota",
            )
            out = subprocess.run(
                [sys.executable, "-m", "kvpool", "status", "--master", address, "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            tenants = json.loads(out.stdout)["tenants"]
            assert tenants == [{"name": "a", "used": 8 * KiB, "quota": 16 * KiB}]
            table = subprocess.run(
                [sys.executable, "-m", "kvpool", "status", "--master", address],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            assert "TENANT" in table and "16.0 KiB" in table


# ------------------------------------------------ own eviction and fair share (reclaim on)


def _reclaiming(clock: Clock, size: int = 16 * MiB, **cfg: object) -> MasterService:
    from kvpool.master.reclaim.adapter import MasterReclaimHooks

    svc = MasterService(MasterConfig(seed=1, **cfg), clock=clock, hooks=MasterReclaimHooks())  # type: ignore[arg-type]
    mount(svc, "s", size)
    return svc


def _put(svc: MasterService, w: m.ClientId, key: str, size: int, tenant: str, **cfg: object) -> int:
    config = m.ReplicateConfigMsg(**cfg) if cfg else m.DEFAULT_REPLICATE_CONFIG  # type: ignore[arg-type]
    reply = svc.handle(m.PutStart(w, key, size, config, tenant=m.TenantId(tenant)))
    if reply.code != 0:
        return int(reply.code)
    return int(svc.handle(m.PutEnd(w, key, 1, tenant=m.TenantId(tenant))).code)


def _keys(svc: MasterService, tenant: str) -> set[str]:
    return {o.key for o in svc.index.snapshot() if o.tenant == tenant}


def test_a_put_over_quota_evicts_its_tenants_own_coldest_unpinned_objects(
    clock: Clock, tmp_path: Path
) -> None:
    svc = _reclaiming(clock)
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": 100 * KiB})))
    w = m.ClientId("w")
    _register(svc, w)
    assert _put(svc, w, "pinned", 30 * KiB, "a", with_hard_pin=True) == 0
    assert _put(svc, w, "old", 30 * KiB, "a") == 0
    assert _put(svc, w, "hot", 30 * KiB, "a") == 0
    for _ in range(2):  # read twice: active
        assert svc.handle(m.GetReplicaList("hot", tenant=m.TenantId("a"))).code == 0
    assert _put(svc, w, "other", 60 * KiB, "b") == 0  # another tenant, no quota
    clock.advance(10)  # past the read leases
    # 90 KiB used; a 30 KiB put must free 20 KiB: the cold "old" goes, not "hot" nor "pinned".
    assert _put(svc, w, "new", 30 * KiB, "a") == 0
    assert _keys(svc, "a") == {"pinned", "hot", "new"}
    assert _keys(svc, "b") == {"other"}
    assert svc.index.tenant_bytes["a"] <= 100 * KiB
    # The inactive "new" before the active "hot".
    assert _put(svc, w, "newer", 30 * KiB, "a") == 0
    assert _keys(svc, "a") == {"pinned", "hot", "newer"}
    assert _put(svc, w, "huge", 101 * KiB, "a") == E.TENANT_QUOTA_EXCEEDED  # past it alone
    assert _keys(svc, "a") == {"pinned", "hot", "newer"}  # nothing evicted for it
    # An upsert never evicts the object it replaces: the active "hot" goes now.
    assert svc.handle(m.UpsertStart(w, "newer", 70 * KiB, tenant=m.TenantId("a"))).code == 0
    assert _keys(svc, "a") == {"pinned", "newer"}
    assert svc.index.tenant_bytes["a"] == 100 * KiB
    usage_matches_objects(svc)


def test_without_reclaim_a_put_over_quota_still_fails(
    make_service: MakeService, tmp_path: Path
) -> None:
    svc = make_service()
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": 64 * KiB})))
    w = m.ClientId("w")
    _register(svc, w)
    assert _put(svc, w, "k1", 40 * KiB, "a") == 0
    assert _put(svc, w, "k2", 40 * KiB, "a") == E.TENANT_QUOTA_EXCEEDED
    assert _keys(svc, "a") == {"k1"}


def _fill_pool(svc: MasterService, w: m.ClientId, tenant: str, n: int, size: int) -> int:
    """Puts of `tenant` until `n` succeeded; returns how many were refused."""
    refused = 0
    for i in range(n):
        if _put(svc, w, f"{tenant}{i}", size, tenant) != 0:
            refused += 1
    return refused


@pytest.mark.parametrize("with_quotas", [True, False], ids=["quotas", "no-quotas"])
def test_one_tenant_filling_the_pool_does_not_evict_another_below_its_fair_share(
    clock: Clock, tmp_path: Path, with_quotas: bool
) -> None:
    svc = _reclaiming(clock, size=4 * MiB)
    if with_quotas:  # quotas far above the pool: fair share is the only rule at play
        svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": 1 << 30, "b": 1 << 30})))
    w = m.ClientId("w")
    _register(svc, w)
    assert _fill_pool(svc, w, "b", 16, 64 * KiB) == 0  # b: 1 MiB, a quarter of the pool
    clock.advance(10)
    # a writes three pools' worth: reclaim must make room again and again.
    assert _fill_pool(svc, w, "a", 192, 64 * KiB) == 0
    kept = len(_keys(svc, "b"))
    if with_quotas:
        assert kept == 16  # below its share (half of what is held): never evicted
    else:
        assert kept < 16  # plain LRU: b's older objects went first (as before quotas)
    usage_matches_objects(svc)


def test_a_tenant_above_its_fair_share_is_evicted_down_to_it(clock: Clock, tmp_path: Path) -> None:
    svc = _reclaiming(clock, size=4 * MiB)
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": 1 << 30})))
    w = m.ClientId("w")
    _register(svc, w)
    assert _fill_pool(svc, w, "b", 48, 64 * KiB) == 0  # b: 3 MiB of 4
    clock.advance(10)
    assert _fill_pool(svc, w, "a", 128, 64 * KiB) == 0  # a writes 8 MiB
    b_bytes = svc.index.tenant_bytes.get("b", 0)
    a_bytes = svc.index.tenant_bytes.get("a", 0)
    assert b_bytes < 3 * MiB  # b was above its share: reclaim took from it ...
    assert b_bytes >= (a_bytes + b_bytes) / 2 - 64 * KiB  # ... down to about its share
    usage_matches_objects(svc)
