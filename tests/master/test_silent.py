"""A paused node is not a dead node: the SILENT state of a client, on the service (hand-driven
clock, no sockets). A client without a ping for `client_ttl` is silent: its segments take no
new replicas and serve no reads, but are kept; it comes back with its objects by remounting
the same memory (name and generation); only past `client_dead_ttl` is it dropped."""

from __future__ import annotations

from typing import Any

import pytest
from tests.master.conftest import HOST, WRITER, Clock, MakeService, MiB

from kvpool.errors import ErrorCode, InvalidParams
from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

E = ErrorCode
A = m.ClientId("node-a")
B = m.ClientId("node-b")
SA, SB = m.SegmentName("seg-a"), m.SegmentName("seg-b")
GEN = 0x5EED_0000_0000_0001


def info(name: str, gen: int = GEN) -> m.SegmentInfo:
    return m.SegmentInfo(m.SegmentName(name), 16 * MiB, HOST, f"127.0.0.1:{len(name)}", "", "", gen)


def service(make_service: MakeService, **cfg: Any) -> MasterService:
    """Two nodes (A owns seg-a, B seg-b) and a writer; A is silent after 2 s, dead after 10 s."""
    cfg.setdefault("client_ttl", 2.0)
    cfg.setdefault("client_dead_ttl", 10.0)
    svc = make_service(segments=0, **cfg)
    assert svc.handle(m.MountSegment(A, HOST, info("seg-a"))) == m.Reply(0)
    assert svc.handle(m.MountSegment(B, HOST, info("seg-b", GEN + 1))) == m.Reply(0)
    assert svc.handle(m.ReMountSegment(WRITER, HOST, [])) == m.Reply(0)
    return svc


def put(svc: MasterService, key: str, *segments: m.SegmentName) -> None:
    cfg = m.ReplicateConfigMsg(replica_num=len(segments), preferred_segments=list(segments))
    reply = svc.handle(m.PutStart(WRITER, key, 4096, cfg))
    assert reply.code == 0 and [d.segment for d in reply.replicas] == list(segments), reply
    assert svc.handle(m.PutEnd(WRITER, key, 7)) == m.Reply(0)


def pause_a(svc: MasterService, clock: Clock, seconds: float = 3.0) -> None:
    """A misses its pings for `seconds`; B and the writer keep pinging."""
    clock.advance(seconds)
    for c in (B, WRITER):
        assert svc.handle(m.Ping(c)).client_status is m.ClientStatus.OK
    svc.expire_clients()


def test_a_client_silent_past_client_ttl_is_kept_not_dropped(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    put(svc, "k", SA)
    clock.advance(3.0)
    svc.handle(m.Ping(B))
    svc.handle(m.Ping(WRITER))
    assert svc.expire_clients() == []  # silent, not dropped
    stats = svc.handle(m.Stats())
    assert [s.name for s in stats.segments] == [SB]
    assert [s.name for s in stats.silent_segments] == [SA]
    assert [(c.client_id, c.silent) for c in stats.silent_clients] == [(A, True)]
    assert A not in {c.client_id for c in stats.clients}
    assert stats.silent_clients[0].ttl_left_s == 7.0  # left before it is dropped (10 - 3)
    assert svc.segments.get(SA) is not None


def test_a_silent_segments_replicas_are_not_offered_and_the_reader_may_retry(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    put(svc, "only-a", SA)
    put(svc, "both", SA, SB)
    pause_a(svc, clock)
    assert svc.handle(m.GetReplicaList("only-a")).code == E.REPLICA_IS_NOT_READY
    assert [d.segment for d in svc.handle(m.GetReplicaList("both")).replicas] == [SB]
    loc = svc.handle(m.BatchGetLocations(["only-a", "both"]))
    assert loc.codes == [E.REPLICA_IS_NOT_READY, 0] and loc.segments == [SB]
    batch = svc.handle(m.BatchGetReplicaList(["only-a"]))
    assert batch.results[0].code == E.REPLICA_IS_NOT_READY
    assert svc.handle(m.ExistKey("only-a")).exists is False
    # Kept: a put of the key is still refused, the object still counts.
    reply = svc.handle(m.PutStart(WRITER, "only-a", 4096))
    assert reply.code == E.OBJECT_ALREADY_EXISTS


def test_a_silent_segment_takes_no_new_replica_arena_or_task_target(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    put(svc, "k", SB)
    pause_a(svc, clock)
    for i in range(20):
        reply = svc.handle(m.PutStart(WRITER, f"n{i}", 4096, m.ReplicateConfigMsg(replica_num=2)))
        assert reply.code == 0 and [d.segment for d in reply.replicas] == [SB]
    preferred = m.ReplicateConfigMsg(preferred_segments=[SA])
    assert svc.handle(m.PutStart(WRITER, "pref", 4096, preferred)).replicas[0].segment == SB
    arena = svc.handle(m.ReserveArena(WRITER, MiB))
    assert arena.code == 0 and arena.segment == SB
    assert svc.handle(m.CreateCopyTask("k", [SA])).code == E.SEGMENT_NOT_FOUND


def test_a_silent_client_that_remounts_the_same_memory_gets_its_objects_back(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    put(svc, "k", SA)
    before = svc.handle(m.GetReplicaList("k")).replicas
    pause_a(svc, clock)
    assert svc.handle(m.Ping(A)).client_status is m.ClientStatus.NEED_REMOUNT
    reply = svc.handle(m.ReMountSegment(A, HOST, [info("seg-a")]))
    assert reply == m.RemountReply(0, [SA])
    assert svc.handle(m.GetReplicaList("k")).replicas == before
    assert svc.handle(m.Ping(A)).client_status is m.ClientStatus.OK
    stats = svc.handle(m.Stats())
    assert {s.name for s in stats.segments} == {SA, SB} and stats.silent_segments == []
    # And it takes new replicas again.
    names = set()
    for i in range(20):
        names.add(svc.handle(m.PutStart(WRITER, f"n{i}", 4096)).replicas[0].segment)
    assert names == {SA, SB}


def test_a_remount_with_another_generation_mounts_the_segment_fresh(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    put(svc, "k", SA)
    pause_a(svc, clock)
    reply = svc.handle(m.ReMountSegment(A, HOST, [info("seg-a", GEN + 7)]))
    assert reply == m.Reply(0)  # nothing restored: new memory under the old name
    assert svc.handle(m.GetReplicaList("k")).code == E.OBJECT_NOT_FOUND
    seg = svc.segments.get(SA)
    assert seg is not None and seg.serving and seg.generation == GEN + 7
    assert seg.allocator.allocated == 0


def test_a_silent_client_that_does_not_name_its_segment_again_loses_it(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    put(svc, "k", SA)
    pause_a(svc, clock)
    assert svc.handle(m.ReMountSegment(A, HOST, [])) == m.Reply(0)
    assert svc.segments.get(SA) is None
    assert svc.handle(m.GetReplicaList("k")).code == E.OBJECT_NOT_FOUND


def test_a_client_silent_past_client_dead_ttl_is_dropped(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    put(svc, "k", SA)
    pause_a(svc, clock)
    for _ in range(3):
        pause_a(svc, clock)  # 12 s without a ping from A
    assert svc.segments.get(SA) is None
    assert svc.clients.get(A) is None
    assert svc.handle(m.GetReplicaList("k")).code == E.OBJECT_NOT_FOUND
    assert svc.handle(m.Ping(A)).client_status is m.ClientStatus.NEED_REMOUNT
    # Back after it was dropped: a fresh mount, nothing restored.
    assert svc.handle(m.ReMountSegment(A, HOST, [info("seg-a")])) == m.Reply(0)
    assert svc.handle(m.GetReplicaList("k")).code == E.OBJECT_NOT_FOUND


def test_a_silent_writers_unfinished_put_is_preempted_and_its_ranges_parked(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    reply = svc.handle(m.PutStart(A, "late", 4096, m.ReplicateConfigMsg(preferred_segments=[SB])))
    assert reply.code == 0
    offset = reply.replicas[0].offset
    pause_a(svc, clock)
    # The key is free again, but the range a late write could land in stays allocated.
    assert svc.handle(m.PutEnd(A, "late", 1)).code == E.OBJECT_NOT_FOUND
    assert any(r.offset == offset and r.segment.name == SB for r, _ in svc.parked())
    for i in range(50):
        got = svc.handle(m.PutStart(WRITER, f"n{i}", 4096)).replicas[0]
        assert (got.segment, got.offset) != (SB, offset)


def test_a_silent_writers_arena_is_parked_and_a_commit_into_a_silent_segment_refused(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    arena = svc.handle(m.ReserveArena(A, MiB))
    assert arena.code == 0
    pause_a(svc, clock)
    assert svc.arenas_of(A) == []
    parked = {(r.segment.name, r.offset) for r, _ in svc.parked()}
    assert (arena.segment, arena.offset) in parked
    # Another writer's arena on A's segment: commits are refused while A is silent.
    svc2 = service(make_service)
    for _ in range(8):
        mine = svc2.handle(m.ReserveArena(WRITER, MiB))
        if mine.segment == SA:
            break
    assert mine.segment == SA
    pause_a(svc2, clock)
    commit = m.PutCommit(WRITER, "c", 64, mine.arena_id, mine.offset, 1)
    assert svc2.handle(commit).code == E.INVALID_WRITE


def test_a_task_executed_by_a_client_that_falls_silent_fails(
    make_service: MakeService, clock: Clock
) -> None:
    svc = service(make_service)
    put(svc, "k", SA)
    task = svc.handle(m.CreateCopyTask("k", [SB]))
    assert task.code == 0
    pause_a(svc, clock)
    assert svc.handle(m.QueryTask(task.task_id)).status is m.TaskStatus.FAILED


def test_the_dead_ttl_defaults_to_three_client_ttls_and_is_at_least_the_ttl() -> None:
    assert MasterConfig(client_ttl=3.0).dead_ttl == 9.0
    assert MasterConfig().dead_ttl == 30.0
    assert MasterConfig(client_ttl=3.0, client_dead_ttl=3.0).dead_ttl == 3.0
    with pytest.raises(InvalidParams, match="client_dead_ttl"):
        MasterConfig(client_ttl=3.0, client_dead_ttl=2.0)
