"""Quotas charge the space a tenant holds, replica by replica (`kvpool.master.quota`): every
replica a put, a copy or a move allocates is charged when it is allocated and refunded when it
is freed; a property test over random sequences (puts of one or two replicas, whole or
left unfinished, batch puts,
revokes, stale writes, upserts of another size, removes, copy and move tasks that succeed or
fail) checks that usage equals the space held at every step; real nodes run copy and move
tasks through the Store's task API."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvpool.client import ReplicateConfig, Store
from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.quota import TenantQuotas
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m
from kvpool.protocol.messages import TaskStatus
from kvpool.rpc import RpcClient
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import wait_until
from master.conftest import NODE, WRITER, Clock, MakeService, mount

E = ErrorCode
KiB = 1 << 10
MiB = 1 << 20
TENANTS = ["a", "b", "c"]
QUOTAS = {"a": 96 * KiB, "b": 256 * KiB}  # c has none
SEGS = ["s0", "s1", "s2"]


def _quota_file(tmp_path: Path, quotas: dict[str, int]) -> Path:
    path = tmp_path / "policy.yaml"
    lines = ["version: 1", "tenants:"]
    lines += [f"  - {{name: {n}, quota: {q}}}" for n, q in quotas.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def held(svc: MasterService) -> dict[str, int]:
    """The bytes each tenant's space takes: every replica of every indexed object, and the
    targets of every running copy or move task."""
    out: dict[str, int] = {}
    for obj in svc.index.snapshot():
        out[obj.tenant] = out.get(obj.tenant, 0) + obj.size * len(obj.replicas)
    for task in svc._tasks.running():
        t = task.obj.tenant
        out[t] = out.get(t, 0) + task.obj.size * len(task.targets)
    return {t: b for t, b in out.items() if b}


def usage_is_space(svc: MasterService) -> None:
    assert svc.index.tenant_bytes == held(svc)


def _cfg(replicas: int = 1, *segments: str) -> m.ReplicateConfigMsg:
    return m.ReplicateConfigMsg(
        replica_num=replicas, preferred_segments=[m.SegmentName(s) for s in segments]
    )


def _used(svc: MasterService, tenant: str) -> int:
    return svc.index.tenant_bytes.get(tenant, 0)


def _task(svc: MasterService, req: m.CreateCopyTask | m.CreateMoveTask) -> str:
    reply = svc.handle(req)
    assert isinstance(reply, m.TaskReply) and reply.code == 0, reply
    return reply.task_id


def _finish(svc: MasterService, task_id: str, ok: bool) -> None:
    reply = svc.handle(m.FetchTasks(NODE, 16))
    assert isinstance(reply, m.FetchTasksReply) and reply.code == 0
    assert svc.handle(m.MarkTaskComplete(NODE, task_id, ok)).code == 0


def test_every_replica_is_charged_and_a_put_is_admitted_for_all_it_asks(
    make_service: MakeService, tmp_path: Path
) -> None:
    svc = make_service(segments=3)
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": 100 * KiB})))
    a = m.TenantId("a")
    assert svc.handle(m.PutStart(WRITER, "k1", 40 * KiB, _cfg(2), tenant=a)).code == 0
    assert _used(svc, "a") == 80 * KiB  # two replicas, charged at PutStart (PROCESSING)
    # 40 KiB more would be 120 KiB of space: refused, nothing changed.
    assert svc.handle(m.PutStart(WRITER, "k2", 40 * KiB, tenant=a)).code == E.TENANT_QUOTA_EXCEEDED
    assert svc.index.get("a", "k2") is None and _used(svc, "a") == 80 * KiB
    assert svc.handle(m.PutStart(WRITER, "k2", 20 * KiB, tenant=a)).code == 0
    assert svc.handle(m.PutRevoke(WRITER, "k2", tenant=a)).code == 0  # a failed write refunds
    assert _used(svc, "a") == 80 * KiB
    assert svc.handle(m.PutEnd(WRITER, "k1", 1, tenant=a)).code == 0
    # An upsert to another size is charged for its new replicas net of the old ones.
    reply = svc.handle(m.UpsertStart(WRITER, "k1", 50 * KiB, _cfg(2), tenant=a))
    assert reply.code == 0 and _used(svc, "a") == 100 * KiB
    assert svc.handle(m.PutEnd(WRITER, "k1", 2, tenant=a)).code == 0
    reply = svc.handle(m.UpsertStart(WRITER, "k1", 51 * KiB, _cfg(2), tenant=a))
    assert reply.code == E.TENANT_QUOTA_EXCEEDED and _used(svc, "a") == 100 * KiB
    stats = svc.handle(m.Stats())
    assert isinstance(stats, m.StatsReply)
    assert [(t.name, t.used) for t in stats.tenants] == [("a", 100 * KiB)]
    assert svc.handle(m.Remove("k1", True, tenant=a)).code == 0  # a removal refunds both
    assert _used(svc, "a") == 0
    usage_is_space(svc)


def test_copy_and_move_targets_are_charged_when_allocated_and_refunded_when_freed(
    make_service: MakeService, tmp_path: Path
) -> None:
    svc = make_service(segments=3)
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": 1 * MiB})))
    a = m.TenantId("a")
    size = 64 * KiB
    assert svc.handle(m.PutStart(WRITER, "k", size, _cfg(1, "seg-0"), tenant=a)).code == 0
    assert svc.handle(m.PutEnd(WRITER, "k", 1, tenant=a)).code == 0
    assert _used(svc, "a") == size
    # A copy: its target is charged from CreateCopyTask; a failure refunds it.
    task = _task(svc, m.CreateCopyTask("k", [m.SegmentName("seg-1")], tenant=a))
    assert _used(svc, "a") == 2 * size
    _finish(svc, task, ok=False)
    assert _used(svc, "a") == size
    usage_is_space(svc)
    # A successful copy keeps the charge: the target is now a replica.
    task = _task(svc, m.CreateCopyTask("k", [m.SegmentName("seg-1")], tenant=a))
    _finish(svc, task, ok=True)
    assert len(svc.index.get("a", "k").replicas) == 2  # type: ignore[union-attr]
    assert _used(svc, "a") == 2 * size
    usage_is_space(svc)
    # A move: source and target both held while it runs; the source's charge goes with it.
    src, dst = m.SegmentName("seg-0"), m.SegmentName("seg-2")
    task = _task(svc, m.CreateMoveTask("k", src, dst, tenant=a))
    assert _used(svc, "a") == 3 * size
    usage_is_space(svc)
    _finish(svc, task, ok=True)
    assert _used(svc, "a") == 2 * size
    usage_is_space(svc)
    # Removing the object while a copy runs refunds the object and the task's target.
    task = _task(svc, m.CreateCopyTask("k", [m.SegmentName("seg-0")], tenant=a))
    assert _used(svc, "a") == 3 * size
    assert svc.handle(m.Remove("k", True, tenant=a)).code == 0
    assert _used(svc, "a") == 0
    usage_is_space(svc)


def test_a_copy_past_the_quota_is_refused_and_a_move_proceeds(
    make_service: MakeService, tmp_path: Path
) -> None:
    svc = make_service(segments=3)
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": 150 * KiB})))
    a = m.TenantId("a")
    size = 64 * KiB
    assert svc.handle(m.PutStart(WRITER, "k", size, _cfg(1, "seg-0"), tenant=a)).code == 0
    assert svc.handle(m.PutEnd(WRITER, "k", 1, tenant=a)).code == 0
    task = _task(svc, m.CreateCopyTask("k", [m.SegmentName("seg-1")], tenant=a))
    _finish(svc, task, ok=True)
    assert _used(svc, "a") == 2 * size
    reply = svc.handle(m.CreateCopyTask("k", [m.SegmentName("seg-2")], tenant=a))
    assert reply.code == E.TENANT_QUOTA_EXCEEDED
    assert not svc._tasks.running() and _used(svc, "a") == 2 * size  # nothing allocated
    # A move keeps what was admitted: it may hold one replica more while it runs.
    src, dst = m.SegmentName("seg-0"), m.SegmentName("seg-2")
    task = _task(svc, m.CreateMoveTask("k", src, dst, tenant=a))
    assert _used(svc, "a") == 3 * size
    _finish(svc, task, ok=True)
    assert _used(svc, "a") == 2 * size
    usage_is_space(svc)


@pytest.mark.parametrize("quota", [4 * MiB, 2 * MiB], ids=["room", "no-room"])
def test_a_promotion_is_charged_and_skipped_while_it_would_pass_the_quota(
    make_service: MakeService, tmp_path: Path, quota: int
) -> None:
    from kvpool.protocol.tiers import DiskEntry, RegisterDiskReplicas

    svc = make_service(segments=1)
    disk = m.SegmentInfo(
        m.SegmentName("disk"), 64 * MiB, m.HostId("host-a"), "127.0.0.1:9", "", NODE,
        kind=m.ReplicaKind.LOCAL_DISK,
    )  # fmt: skip
    assert svc.handle(m.MountSegment(NODE, m.HostId("host-a"), disk)).code == 0
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": quota})))
    a = m.TenantId("a")
    entries = [DiskEntry(a, "cold", 0, 1 * MiB, 5), DiskEntry(a, "small", 1 * MiB, 64 * KiB, 6)]
    reply = svc.handle(RegisterDiskReplicas(NODE, m.SegmentName("disk"), entries))
    assert reply.code == 0 and _used(svc, "a") == 1 * MiB + 64 * KiB  # disk replicas count
    for _ in range(2):  # two reads from disk admit it for promotion
        assert svc.handle(m.GetReplicaList("cold", tenant=a)).code == 0
    svc.repair_tick()
    running = svc._tasks.running()
    if quota == 4 * MiB:  # room for a memory copy: its target is charged while it runs
        assert [t.obj.key for t in running] == ["cold"]
        assert _used(svc, "a") == 2 * MiB + 64 * KiB
        _finish(svc, running[0].task_id, ok=True)
        kinds = sorted(r.kind for r in svc.index.get("a", "cold").replicas)  # type: ignore[union-attr]
        assert kinds == [m.ReplicaKind.MEMORY, m.ReplicaKind.LOCAL_DISK]
        assert _used(svc, "a") == 2 * MiB + 64 * KiB
    else:  # at its quota: no promotion, nothing charged
        assert running == [] and _used(svc, "a") == 1 * MiB + 64 * KiB
    usage_is_space(svc)


_key = st.integers(0, 2)
_tenant = st.sampled_from(TENANTS)
_op = st.one_of(
    st.tuples(st.just("put"), _tenant, _key, st.integers(1, 40), st.integers(1, 2)),
    st.tuples(st.just("stored"), _tenant, _key, st.integers(1, 40), st.integers(1, 2)),
    st.tuples(st.just("batch"), _tenant, _key, st.integers(1, 24), st.integers(1, 2)),
    st.tuples(st.just("end"), _tenant, _key, st.just(0), st.just(0)),
    st.tuples(st.just("revoke"), _tenant, _key, st.just(0), st.just(0)),
    st.tuples(st.just("upsert"), _tenant, _key, st.integers(1, 48), st.integers(1, 2)),
    st.tuples(st.just("remove"), _tenant, _key, st.just(0), st.just(0)),
    st.tuples(st.just("stale"), st.just("a"), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("copy"), _tenant, _key, st.integers(0, 2), st.just(0)),
    st.tuples(st.just("move"), _tenant, _key, st.integers(0, 2), st.just(0)),
    st.tuples(st.just("tasks"), st.just("a"), st.just(0), st.just(0), st.integers(0, 1)),
)


@pytest.mark.parametrize("reclaim", [False, True], ids=["no-reclaim", "reclaim"])
@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_op, min_size=8, max_size=40))
def test_usage_is_the_space_each_tenant_holds_at_every_step(
    ops: list[tuple[str, str, int, int, int]], tmp_path: Path, reclaim: bool
) -> None:
    from kvpool.master.reclaim.adapter import MasterReclaimHooks

    clock = Clock()
    hooks = MasterReclaimHooks() if reclaim else None
    svc = MasterService(MasterConfig(seed=7), clock=clock, hooks=hooks)
    for name in SEGS:
        mount(svc, name, 1 * MiB)
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, QUOTAS)))
    assert svc.handle(m.ReMountSegment(WRITER, m.HostId("h"))).code == 0
    for op, tenant_name, k, n, r in ops:
        tenant = m.TenantId(tenant_name)
        key = f"k{k}"
        if op == "put":
            svc.handle(m.PutStart(WRITER, key, n * KiB, _cfg(r), tenant=tenant))
        elif op == "stored":  # a whole put
            if svc.handle(m.PutStart(WRITER, key, n * KiB, _cfg(r), tenant=tenant)).code == 0:
                svc.handle(m.PutEnd(WRITER, key, 1, tenant=tenant))
        elif op == "batch":
            keys = [key, key + "x"]
            svc.handle(m.BatchPutStart(WRITER, keys, [n * KiB] * 2, _cfg(r), tenant=tenant))
        elif op == "end":
            svc.handle(m.PutEnd(WRITER, key, 1, tenant=tenant))
        elif op == "revoke":
            svc.handle(m.PutRevoke(WRITER, key, tenant=tenant))
        elif op == "upsert":
            svc.handle(m.UpsertStart(WRITER, key, n * KiB, _cfg(r), tenant=tenant))
        elif op == "remove":
            svc.handle(m.Remove(key, True, tenant=tenant))
        elif op == "stale":  # unfinished writes go stale, leases and pins run out
            clock.advance(31.0)
            svc.release_stale()
        elif op in ("copy", "move"):  # of the k-th complete object indexed, if any
            objs = sorted(
                (o for o in svc.index.snapshot() if o.complete), key=lambda o: (o.tenant, o.key)
            )
            if objs:
                obj = objs[k % len(objs)]
                to = m.SegmentName(SEGS[n])
                if op == "copy":
                    req: m.Message = m.CreateCopyTask(obj.key, [to], tenant=obj.tenant)
                else:  # from its first replica
                    where = obj.replicas[0].segment.name if obj.replicas else to
                    req = m.CreateMoveTask(obj.key, where, to, tenant=obj.tenant)
                event(f"{op} task: {svc.handle(req).code}")
        else:  # the executor runs every task it holds: all succeed or all fail
            reply = svc.handle(m.FetchTasks(NODE, 16))
            assert isinstance(reply, m.FetchTasksReply)
            for task in reply.tasks:
                svc.handle(m.MarkTaskComplete(NODE, task.task_id, bool(r)))
        usage_is_space(svc)
        moving: dict[str, int] = {}  # a running move holds one replica more than admitted
        for t in svc._tasks.running():
            if t.task_type is m.TaskType.MOVE:
                moving[t.obj.tenant] = moving.get(t.obj.tenant, 0) + t.obj.size
        for name, quota in QUOTAS.items():
            assert svc.index.tenant_bytes.get(name, 0) - moving.get(name, 0) <= quota


# ---------------------------------------------------- real nodes, the Store's task API


@pytest.fixture(scope="module")
def quota_pool(pool_module: PoolFactory, tmp_path_factory: pytest.TempPathFactory) -> Pool:  # noqa: F811
    policy = _quota_file(tmp_path_factory.mktemp("quota"), {"default": 64 * MiB})
    return pool_module(
        nodes=2, segment_size="16MiB", master_args=("--tenant-quota-file", str(policy))
    )


def _usage(address: str) -> int:
    with RpcClient(address, response_type=m.Response, timeout=10) as c:
        stats = c.call(m.Stats())
    assert isinstance(stats, m.StatsReply)
    return next((t.used for t in stats.tenants if t.name == "default"), 0)


def test_copy_and_move_tasks_on_real_nodes_charge_and_refund_exactly(quota_pool: Pool) -> None:
    a, b = (e + "/0" for e in quota_pool.node_endpoints)
    size = 300_000
    with Store(quota_pool.address) as store:
        try:
            store.put("q", b"x" * size, ReplicateConfig(preferred_segments=[a]))
            assert _usage(quota_pool.address) == size

            def ended(task_id: str) -> TaskStatus:
                info = wait_until(
                    lambda: (i := store.query_task(task_id)).done and i,
                    10,
                    what=f"task {task_id} to end",
                )
                return info.status

            assert ended(store.create_copy_task("q", [b])) is TaskStatus.SUCCESS
            assert _usage(quota_pool.address) == 2 * size  # the copy is a second replica
            store.remove("q", force=True)
            assert _usage(quota_pool.address) == 0
            store.put("q", b"y" * size, ReplicateConfig(preferred_segments=[a]))
            assert ended(store.create_move_task("q", a, b)) is TaskStatus.SUCCESS
            assert [r.segment for r in store.get_replica_desc("q")] == [b]
            assert _usage(quota_pool.address) == size  # the source's charge went with it
            assert store.get("q") == b"y" * size
        finally:
            store.remove_all(force=True)
    assert _usage(quota_pool.address) == 0
