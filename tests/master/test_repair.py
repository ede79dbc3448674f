"""Replica repair on the service (hand-driven clock, no sockets): an object that lost replicas to
an unmounted segment is copied back to the count its put asked for, by COPY tasks the test
executes as the node would, throttled, retried with backoff, cancelled by a removal."""

from __future__ import annotations

from typing import Any

import pytest
from tests.master.conftest import HOST, WRITER, Clock, MakeService, MiB

from kvpool.errors import ErrorCode
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

E = ErrorCode
NODES = [m.ClientId(f"node-{c}") for c in "abcd"]
SEGS = [m.SegmentName(f"seg-{c}") for c in "abcd"]


def service(make_service: MakeService, nodes: int = 3, **cfg: Any) -> MasterService:
    svc = make_service(segments=0, **cfg)
    for i in range(nodes):
        add_node(svc, i)
    assert svc.handle(m.ReMountSegment(WRITER, HOST, [])) == m.Reply(0)
    return svc


def add_node(svc: MasterService, i: int) -> None:
    info = m.SegmentInfo(SEGS[i], 16 * MiB, HOST, f"127.0.0.1:{i + 1}", "", "", i + 1)
    assert svc.handle(m.MountSegment(NODES[i], HOST, info)) == m.Reply(0)


def put(svc: MasterService, key: str, *segs: m.SegmentName) -> None:
    cfg = m.ReplicateConfigMsg(replica_num=len(segs), preferred_segments=list(segs))
    assert svc.handle(m.PutStart(WRITER, key, 4096, cfg)).code == 0
    assert svc.handle(m.PutEnd(WRITER, key, 7)) == m.Reply(0)


def lose(svc: MasterService, i: int) -> None:
    """Node i unmounts its segment; the monitor's sweep then finds what lost a replica."""
    assert svc.handle(m.UnmountSegment(NODES[i], SEGS[i])) == m.Reply(0)
    for _ in svc.sweep_dead():
        pass


def run_tasks(svc: MasterService, ok: bool = True) -> int:
    """Every node fetches its tasks and reports them; answers how many ran."""
    ran = 0
    for node in NODES:
        reply = svc.handle(m.FetchTasks(node, 64))
        if reply.code != 0:
            continue
        for task in reply.tasks:
            assert svc.handle(m.MarkTaskComplete(node, task.task_id, ok)).code == 0
            ran += 1
    return ran


def replicas(svc: MasterService, key: str) -> list[str]:
    reply = svc.handle(m.GetReplicaList(key))
    assert reply.code == 0, reply
    return sorted(d.segment for d in reply.replicas)


def test_the_put_records_the_replica_count_it_asked_for(make_service: MakeService) -> None:
    svc = service(make_service)
    put(svc, "k", SEGS[0], SEGS[1])
    obj = svc.index.get(m.DEFAULT_TENANT, "k")
    assert obj is not None and obj.replica_num == 2 and obj.complete


def test_an_object_that_lost_a_replica_is_copied_back_to_its_count(
    make_service: MakeService,
) -> None:
    svc = service(make_service)
    put(svc, "k", SEGS[0], SEGS[1])
    put(svc, "one", SEGS[1])  # asked for one: nothing to repair
    lose(svc, 0)
    assert svc.handle(m.Stats()).under_replicated == 1
    assert svc.repair_tick() == 1
    stats = svc.handle(m.Stats())
    assert (stats.repair_in_flight, stats.tasks_active) == (1, 1)
    (task,) = svc.handle(m.FetchTasks(NODES[1], 16)).tasks  # the source's owner copies
    assert task.source.segment == SEGS[1] and [t.segment for t in task.targets] == [SEGS[2]]
    assert svc.handle(m.MarkTaskComplete(NODES[1], task.task_id, True)).code == 0
    assert replicas(svc, "k") == [SEGS[1], SEGS[2]]
    assert svc.repair_tick() == 0
    stats = svc.handle(m.Stats())
    assert (stats.under_replicated, stats.repair_done, stats.repair_failed) == (0, 1, 0)


def test_a_failed_repair_is_retried_after_a_backoff(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service, repair_backoff=2.0)
    put(svc, "k", SEGS[0], SEGS[1])
    lose(svc, 0)
    assert svc.repair_tick() == 1
    assert run_tasks(svc, ok=False) == 1
    assert svc.handle(m.Stats()).repair_failed == 1
    assert svc.repair_tick() == 0  # not before the backoff
    clock.advance(1.0)
    assert svc.repair_tick() == 0
    clock.advance(1.5)
    assert svc.repair_tick() == 1
    assert run_tasks(svc) == 1
    assert replicas(svc, "k") == [SEGS[1], SEGS[2]]


def test_a_repair_is_given_up_after_its_attempts(make_service: MakeService, clock: Clock) -> None:
    svc = service(make_service, repair_backoff=1.0, repair_max_attempts=3)
    put(svc, "k", SEGS[0], SEGS[1])
    lose(svc, 0)
    for _ in range(3):
        clock.advance(10.0)
        assert svc.repair_tick() == 1
        run_tasks(svc, ok=False)
    clock.advance(100.0)
    assert svc.repair_tick() == 0
    stats = svc.handle(m.Stats())
    assert (stats.repair_failed, stats.under_replicated) == (3, 0)


def test_removing_an_object_cancels_its_repair(make_service: MakeService) -> None:
    svc = service(make_service)
    put(svc, "k", SEGS[0], SEGS[1])
    lose(svc, 0)
    assert svc.repair_tick() == 1
    # A Remove does not wait for the master's own copy (it would for one a client asked for).
    assert svc.handle(m.Remove("k")) == m.Reply(0)
    stats = svc.handle(m.Stats())
    assert (stats.tasks_active, stats.under_replicated, stats.repair_failed) == (0, 0, 0)
    assert run_tasks(svc) == 0


def test_an_upsert_cancels_a_repair_and_rewrites(make_service: MakeService) -> None:
    svc = service(make_service)
    put(svc, "k", SEGS[0], SEGS[1])
    lose(svc, 0)
    assert svc.repair_tick() == 1
    assert svc.handle(m.UpsertStart(WRITER, "k", 4096)).code == 0
    assert svc.handle(m.Stats()).tasks_active == 0


def test_repair_is_throttled_per_tick_and_in_flight(make_service: MakeService) -> None:
    svc = service(make_service, repair_per_tick=2, repair_max_in_flight=3)
    for i in range(10):
        put(svc, f"k{i}", SEGS[0], SEGS[1])
    lose(svc, 0)
    assert [svc.repair_tick() for _ in range(3)] == [2, 1, 0]
    assert run_tasks(svc) == 3
    started = [svc.repair_tick() for _ in range(6)]
    assert max(started) <= 2
    while run_tasks(svc):
        svc.repair_tick()
        svc.repair_tick()
    for i in range(10):
        assert replicas(svc, f"k{i}") == [SEGS[1], SEGS[2]]
    assert svc.handle(m.Stats()).repair_done == 10


def test_an_object_with_nowhere_to_go_waits_for_a_new_segment(make_service: MakeService) -> None:
    svc = service(make_service, nodes=2)
    put(svc, "k", SEGS[0], SEGS[1])
    lose(svc, 0)
    assert svc.repair_tick() == 0
    assert svc.handle(m.Stats()).under_replicated == 1
    add_node(svc, 2)
    assert svc.repair_tick() == 1
    run_tasks(svc)
    assert replicas(svc, "k") == [SEGS[1], SEGS[2]]


def test_a_silent_replica_counts_and_is_never_a_source_or_target(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service, nodes=4, client_ttl=2.0, client_dead_ttl=20.0)
    put(svc, "k", SEGS[0], SEGS[1], SEGS[2])
    lose(svc, 0)
    clock.advance(3.0)  # node-b falls silent; the others ping
    for c in (NODES[2], NODES[3], WRITER):
        svc.handle(m.Ping(c))
    svc.expire_clients()
    assert svc.repair_tick() == 1
    (task,) = svc.handle(m.FetchTasks(NODES[2], 16)).tasks
    assert task.source.segment == SEGS[2] and [t.segment for t in task.targets] == [SEGS[3]]


def test_an_object_put_with_fewer_replicas_than_asked_is_copied_up_later(
    make_service: MakeService,
) -> None:
    svc = service(make_service, nodes=1)
    cfg = m.ReplicateConfigMsg(replica_num=2)
    assert len(svc.handle(m.PutStart(WRITER, "k", 4096, cfg)).replicas) == 1
    assert svc.handle(m.PutEnd(WRITER, "k", 7)) == m.Reply(0)
    assert svc.repair_tick() == 0  # nowhere to copy to yet
    assert svc.handle(m.Stats()).under_replicated == 1
    add_node(svc, 1)
    assert svc.repair_tick() == 1
    run_tasks(svc)
    assert replicas(svc, "k") == [SEGS[0], SEGS[1]]
    assert svc.handle(m.Stats()).under_replicated == 0


def test_a_replica_reported_bad_is_dropped_and_repaired_from_a_good_one(
    make_service: MakeService,
) -> None:
    svc = service(make_service)
    put(svc, "k", SEGS[0], SEGS[1])
    (bad,) = (d for d in svc.handle(m.GetReplicaList("k")).replicas if d.segment == SEGS[0])
    assert svc.handle(m.ReportBadReplica("k", SEGS[0], bad.offset)) == m.Reply(0)
    assert replicas(svc, "k") == [SEGS[1]]
    assert svc.repair_tick() == 1
    (task,) = svc.handle(m.FetchTasks(NODES[1], 16)).tasks
    assert task.source.segment == SEGS[1]
    assert svc.handle(m.MarkTaskComplete(NODES[1], task.task_id, True)).code == 0
    assert len(replicas(svc, "k")) == 2 and SEGS[1] in replicas(svc, "k")
    assert svc.handle(m.ReportBadReplica("k", SEGS[0], bad.offset + 64)).code in (
        E.REPLICA_NOT_FOUND,
        0,
    )
    assert svc.handle(m.ReportBadReplica("nope", SEGS[0], 0)).code == E.OBJECT_NOT_FOUND


def test_the_last_readable_replica_reported_bad_is_kept(make_service: MakeService) -> None:
    svc = service(make_service)
    put(svc, "k", SEGS[0])
    (d,) = svc.handle(m.GetReplicaList("k")).replicas
    assert svc.handle(m.ReportBadReplica("k", SEGS[0], d.offset)) == m.Reply(0)
    assert replicas(svc, "k") == [SEGS[0]]  # nothing better exists
    assert svc.repair_tick() == 0


def test_an_executor_whose_source_fails_the_checksum_gets_it_replaced(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service, nodes=4)
    put(svc, "k", SEGS[0], SEGS[1], SEGS[2])
    lose(svc, 2)
    assert svc.repair_tick() == 1
    (task,) = [t for n in NODES for t in svc.handle(m.FetchTasks(n, 16)).tasks]
    src = task.source.segment
    executor = NODES[SEGS.index(src)]
    report = m.MarkTaskComplete(executor, task.task_id, False, "source bytes differ", True)
    assert svc.handle(report) == m.Reply(0)
    assert src not in replicas(svc, "k")  # the bad source is gone, the other one stays
    clock.advance(5.0)
    assert svc.repair_tick() == 1
    assert run_tasks(svc) == 1
    # Three again (the new copy may land on the bad source's segment: its range was freed).
    assert len(replicas(svc, "k")) == 3


@pytest.mark.parametrize("replica_num", [1, 2, 3])
def test_a_put_excluding_segments_gets_none_of_them_and_keeps_its_count(
    make_service: MakeService, replica_num: int
) -> None:
    # A Store retrying a put whose write to seg-a failed excludes it (its node died, the
    # master may not know yet): no replica lands there, and the count asked for is kept, so
    # a put degraded by the exclusion is copied up to it once the segment is back or another
    # one mounts.
    svc = service(make_service, nodes=2)
    cfg = m.ReplicateConfigMsg(replica_num=replica_num, exclude_segments=[SEGS[0]])
    for i in range(8):
        rep = svc.handle(m.PutStart(WRITER, f"k{i}", 4096, cfg))
        assert rep.code == 0 and [d.segment for d in rep.replicas] == [SEGS[1]]
        assert svc.handle(m.PutEnd(WRITER, f"k{i}", 7)) == m.Reply(0)
        obj = svc.index.get(m.DEFAULT_TENANT, f"k{i}")
        assert obj is not None and obj.replica_num == replica_num
    only = m.ReplicateConfigMsg(exclude_segments=[SEGS[0], SEGS[1]])
    assert svc.handle(m.PutStart(WRITER, "none", 4096, only)).code == E.NO_AVAILABLE_HANDLE
    if replica_num > 1:
        assert svc.handle(m.Stats()).under_replicated == 8
        assert svc.repair_tick() == 8  # seg-a takes the missing replicas now
        run_tasks(svc)
        assert replicas(svc, "k0") == [SEGS[0], SEGS[1]]
