"""Replica copy/move tasks, BatchReplicaClear and eviction of single replicas, on the service
(no sockets, a hand-driven clock). The test plays the executing node: it fetches its tasks,
"copies" by recording what it was asked to do, and reports."""

from __future__ import annotations

from typing import Any

from tests.master.conftest import HOST, NODE, OTHER, WRITER, Clock, MakeService, MiB, mount

from kvpool.errors import ErrorCode
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

E = ErrorCode
NODE2 = m.ClientId("node-2")
HOST_B = m.HostId("host-b")
S0, S1, S2 = m.SegmentName("seg-0"), m.SegmentName("seg-1"), m.SegmentName("seg-2")
SIZE = 4096


def call(svc: MasterService, req: Any) -> Any:
    return svc.handle(req)


def put(svc: MasterService, key: str, *segments: str, size: int = SIZE, **cfg: Any) -> None:
    config = m.ReplicateConfigMsg(
        replica_num=max(1, len(segments)),
        preferred_segments=[m.SegmentName(s) for s in segments],
        **cfg,
    )
    assert call(svc, m.PutStart(WRITER, key, size, config)).code == 0
    assert call(svc, m.PutEnd(WRITER, key, 99)) == m.Reply(0)


def segments_of(svc: MasterService, key: str) -> list[str]:
    reply = call(svc, m.GetReplicaList(key))
    assert reply.code == 0, reply
    return [d.segment for d in reply.replicas]


def used(svc: MasterService, name: str) -> int:
    seg = svc.segments.get(m.SegmentName(name))
    assert seg is not None
    return seg.allocator.allocated


def fetch(svc: MasterService, client: m.ClientId = NODE, n: int = 16) -> list[m.ReplicaTask]:
    reply = call(svc, m.FetchTasks(client, n))
    assert isinstance(reply, m.FetchTasksReply) and reply.code == 0, reply
    return reply.tasks


def status(svc: MasterService, task_id: str) -> m.TaskStatus:
    reply = call(svc, m.QueryTask(task_id))
    assert isinstance(reply, m.QueryTaskReply) and reply.code == 0, reply
    return reply.status


def three_segments(make_service: MakeService, **cfg: Any) -> MasterService:
    # Long lease-free defaults so that sources are freed at once unless a test reads first.
    return make_service(segments=3, **cfg)


# ---------------------------------------------------------------- copy


def test_copy_task_adds_a_replica_only_after_the_executor_reports(
    make_service: MakeService,
) -> None:
    svc = three_segments(make_service)
    put(svc, "k", "seg-0")
    reply = call(svc, m.CreateCopyTask("k", [S1, S2]))
    assert reply.code == 0 and reply.task_id
    assert status(svc, reply.task_id) is m.TaskStatus.PENDING
    # The destinations are allocated now, but nobody can read them yet.
    assert used(svc, "seg-1") == used(svc, "seg-2") == SIZE
    assert segments_of(svc, "k") == ["seg-0"]
    assert call(svc, m.Ping(NODE)).pending_tasks == 1

    (task,) = fetch(svc)
    assert (task.task_id, task.task_type, task.key, task.size, task.checksum) == (
        reply.task_id,
        m.TaskType.COPY,
        "k",
        SIZE,
        99,
    )
    assert task.source.segment == "seg-0" and task.source.status is m.ReplicaStatus.COMPLETE
    assert [t.segment for t in task.targets] == ["seg-1", "seg-2"]
    assert all(t.status is m.ReplicaStatus.PROCESSING for t in task.targets)
    assert {s.name for s in task.segments} == {"seg-0", "seg-1", "seg-2"}
    assert status(svc, reply.task_id) is m.TaskStatus.PROCESSING
    assert call(svc, m.Ping(NODE)).pending_tasks == 0 and fetch(svc) == []

    assert call(svc, m.MarkTaskComplete(NODE, task.task_id, True)) == m.Reply(0)
    assert status(svc, reply.task_id) is m.TaskStatus.SUCCESS
    assert sorted(segments_of(svc, "k")) == ["seg-0", "seg-1", "seg-2"]
    offsets = {d.segment: d.offset for d in call(svc, m.GetReplicaList("k")).replicas}
    assert offsets["seg-1"] == task.targets[0].offset  # the bytes are where the node wrote them


def test_a_failed_copy_frees_its_destinations_and_leaves_the_object_as_it_was(
    make_service: MakeService,
) -> None:
    svc = three_segments(make_service)
    put(svc, "k", "seg-0")
    task_id = call(svc, m.CreateCopyTask("k", [S1])).task_id
    fetch(svc)
    assert call(svc, m.MarkTaskComplete(NODE, task_id, False, "transfer failed")) == m.Reply(0)
    q = call(svc, m.QueryTask(task_id))
    assert (q.status, q.message, q.task_type) == (
        m.TaskStatus.FAILED,
        "transfer failed",
        m.TaskType.COPY,
    )
    assert used(svc, "seg-1") == 0 and segments_of(svc, "k") == ["seg-0"]
    # A late second report of an ended task is refused, and changes nothing.
    late = call(svc, m.MarkTaskComplete(NODE, task_id, True))
    assert late == m.Reply(E.OBJECT_NO_REPLICATION_TASK)
    assert segments_of(svc, "k") == ["seg-0"]


# ---------------------------------------------------------------- move


def test_move_keeps_the_source_readable_until_it_succeeds_then_frees_it(
    make_service: MakeService, clock: Clock
) -> None:
    svc = three_segments(make_service, default_kv_lease_ttl=0.0)
    put(svc, "k", "seg-0")
    task_id = call(svc, m.CreateMoveTask("k", S0, S2)).task_id
    (task,) = fetch(svc)
    assert task.task_type is m.TaskType.MOVE and [t.segment for t in task.targets] == ["seg-2"]
    assert segments_of(svc, "k") == ["seg-0"]  # readable from the source during the move
    assert call(svc, m.MarkTaskComplete(NODE, task_id, True)) == m.Reply(0)
    assert segments_of(svc, "k") == ["seg-2"]
    assert used(svc, "seg-0") == 0 and used(svc, "seg-2") == SIZE


def test_a_moved_source_under_a_read_lease_is_freed_when_the_lease_runs_out(
    make_service: MakeService, clock: Clock
) -> None:
    svc = three_segments(make_service, default_kv_lease_ttl=10.0)
    put(svc, "k", "seg-0")
    segments_of(svc, "k")  # a reader takes a 10 s lease and may be copying from seg-0
    task_id = call(svc, m.CreateMoveTask("k", S0, S1)).task_id
    fetch(svc)
    clock.advance(1)
    assert call(svc, m.MarkTaskComplete(NODE, task_id, True)) == m.Reply(0)
    assert segments_of(svc, "k") == ["seg-1"]
    assert used(svc, "seg-0") == SIZE  # still held for the reader
    svc.release_stale()
    assert used(svc, "seg-0") == SIZE
    clock.advance(30)  # the lease (extended by the read above) has run out
    svc.release_stale()
    assert used(svc, "seg-0") == 0


def test_a_moved_primary_stays_the_primary(make_service: MakeService) -> None:
    svc = three_segments(make_service, default_kv_lease_ttl=0.0)
    put(svc, "k", "seg-0", "seg-1")
    assert segments_of(svc, "k") == ["seg-0", "seg-1"]
    task_id = call(svc, m.CreateMoveTask("k", S0, S2)).task_id
    fetch(svc)
    call(svc, m.MarkTaskComplete(NODE, task_id, True))
    assert segments_of(svc, "k") == ["seg-2", "seg-1"]


# ---------------------------------------------------------------- refusals


def test_task_requests_are_refused_with_mooncakes_codes(make_service: MakeService) -> None:
    svc = three_segments(make_service)
    put(svc, "k", "seg-0")
    assert call(svc, m.CreateCopyTask("nope", [S1])).code == E.OBJECT_NOT_FOUND
    assert call(svc, m.CreateCopyTask("k", [m.SegmentName("gone")])).code == E.SEGMENT_NOT_FOUND
    assert call(svc, m.CreateCopyTask("k", [S0])).code == E.REPLICA_ALREADY_EXISTS
    assert call(svc, m.CreateCopyTask("k", [])).code == E.INVALID_PARAMS
    assert call(svc, m.CreateCopyTask("k", [S1, S1])).code == E.INVALID_PARAMS
    assert call(svc, m.CreateMoveTask("k", S1, S2)).code == E.REPLICA_NOT_FOUND
    assert call(svc, m.CreateMoveTask("k", S0, S0)).code == E.INVALID_PARAMS
    assert call(svc, m.QueryTask("no-such-task")).code == E.TASK_NOT_FOUND
    assert call(svc, m.MarkTaskComplete(NODE, "no-such-task", True)).code == E.TASK_NOT_FOUND
    assert call(svc, m.FetchTasks(m.ClientId("stranger"), 4)).code == E.CLIENT_NOT_FOUND
    assert call(svc, m.FetchTasks(NODE, 0)).code == E.INVALID_PARAMS
    # Nothing was allocated by any refused request.
    assert used(svc, "seg-1") == used(svc, "seg-2") == 0
    # A write in progress cannot be copied yet.
    assert call(svc, m.PutStart(WRITER, "busy", SIZE)).code == 0
    assert call(svc, m.CreateCopyTask("busy", [S1])).code == E.REPLICA_IS_NOT_READY


def test_a_target_without_room_is_no_available_handle_and_nothing_is_held(
    make_service: MakeService,
) -> None:
    svc = make_service(segments=0)
    mount(svc, "seg-0", 16 * MiB)
    mount(svc, "seg-1", 16 * MiB)
    mount(svc, "small", 4096)
    put(svc, "k", "seg-0", size=8192)
    reply = call(svc, m.CreateCopyTask("k", [S1, m.SegmentName("small")]))
    assert reply.code == E.NO_AVAILABLE_HANDLE
    assert used(svc, "seg-1") == 0 and used(svc, "small") == 0


def test_one_task_per_object_and_it_blocks_plain_remove_and_upsert(
    make_service: MakeService,
) -> None:
    svc = three_segments(make_service, default_kv_lease_ttl=0.0)
    put(svc, "k", "seg-0")
    task_id = call(svc, m.CreateCopyTask("k", [S1])).task_id
    assert call(svc, m.CreateMoveTask("k", S0, S2)).code == E.OBJECT_HAS_REPLICATION_TASK
    assert call(svc, m.Remove("k")) == m.Reply(E.OBJECT_HAS_REPLICATION_TASK)
    assert call(svc, m.UpsertStart(WRITER, "k", SIZE)).code == E.OBJECT_HAS_REPLICATION_TASK
    assert call(svc, m.RemoveAll()).count == 0
    assert call(svc, m.Stats()).tasks_active == 1
    # Remove with force drops the task: it fails, its destination is freed.
    assert call(svc, m.Remove("k", True)) == m.Reply(0)
    q = call(svc, m.QueryTask(task_id))
    assert q.status is m.TaskStatus.FAILED and "removed" in q.message
    assert used(svc, "seg-1") == 0 and call(svc, m.Stats()).tasks_active == 0
    assert call(svc, m.MarkTaskComplete(NODE, task_id, True)).code == (E.OBJECT_NO_REPLICATION_TASK)


def test_only_the_executor_may_report(make_service: MakeService) -> None:
    svc = three_segments(make_service)
    put(svc, "k", "seg-0")
    task_id = call(svc, m.CreateCopyTask("k", [S1])).task_id
    assert call(svc, m.MarkTaskComplete(OTHER, task_id, True)) == m.Reply(E.ILLEGAL_CLIENT)
    assert status(svc, task_id) is m.TaskStatus.PENDING


# ---------------------------------------------------------------- who executes


def test_the_executor_is_the_source_owner_else_a_live_client_on_its_host(
    make_service: MakeService, clock: Clock
) -> None:
    svc = make_service(segments=0)
    mount(svc, "src", client=NODE, host=HOST)
    mount(svc, "dst", client=NODE2, host=HOST_B)
    put(svc, "k", "src")
    first = call(svc, m.CreateCopyTask("k", [m.SegmentName("dst")])).task_id
    assert call(svc, m.QueryTask(first)).executor == NODE
    assert fetch(svc, NODE2) == [] and len(fetch(svc, NODE)) == 1
    call(svc, m.MarkTaskComplete(NODE, first, False))
    # The owner of "src" is gone (expired without unmounting, as after a crash the master
    # has not noticed yet): another client on the same host executes.
    svc.clients.forget(NODE)
    assert call(svc, m.CreateCopyTask("k", [m.SegmentName("dst")])).code == E.CLIENT_NOT_FOUND
    mount(svc, "peer", client=OTHER, host=HOST)
    second = call(svc, m.CreateCopyTask("k", [m.SegmentName("dst")])).task_id
    assert call(svc, m.QueryTask(second)).executor == OTHER


def test_a_task_fails_when_its_executor_expires(make_service: MakeService, clock: Clock) -> None:
    svc = make_service(segments=0, client_ttl=10.0)
    mount(svc, "src", client=NODE)
    mount(svc, "dst", client=NODE2)
    put(svc, "k", "src")
    task_id = call(svc, m.CreateCopyTask("k", [m.SegmentName("dst")])).task_id
    fetch(svc)
    clock.advance(6)
    call(svc, m.Ping(NODE2))
    clock.advance(6)  # NODE silent for 12 s, NODE2 for 6 s
    assert svc.expire_clients() == [NODE]
    q = call(svc, m.QueryTask(task_id))
    assert q.status is m.TaskStatus.FAILED
    # NODE may still be copying into its target: parked, freed after the release timeout.
    assert used(svc, "dst") == SIZE
    clock.advance(svc.config.put_start_release_timeout)
    call(svc, m.Ping(NODE2))
    svc.release_stale()
    assert used(svc, "dst") == 0


def test_a_task_fails_when_a_segment_it_touches_is_unmounted(make_service: MakeService) -> None:
    svc = make_service(segments=0)
    mount(svc, "src", client=NODE)
    mount(svc, "dst", client=NODE2)
    put(svc, "k", "src")
    task_id = call(svc, m.CreateMoveTask("k", m.SegmentName("src"), m.SegmentName("dst"))).task_id
    assert call(svc, m.UnmountSegment(NODE2, m.SegmentName("dst"))) == m.Reply(0)
    q = call(svc, m.QueryTask(task_id))
    assert q.status is m.TaskStatus.FAILED and "dst" in q.message
    assert segments_of(svc, "k") == ["src"]


def test_an_expired_executors_target_is_not_given_to_the_next_put(
    make_service: MakeService, clock: Clock
) -> None:
    svc = make_service(segments=0, client_ttl=10.0)
    mount(svc, "segA", client=NODE)
    mount(svc, "segB", client=NODE2)
    put(svc, "k", "segA")
    task_id = call(svc, m.CreateCopyTask("k", [m.SegmentName("segB")])).task_id
    (task,) = fetch(svc)
    target = (task.targets[0].segment, task.targets[0].offset)
    clock.advance(11)
    call(svc, m.Ping(NODE2))
    assert svc.expire_clients() == [NODE]
    assert status(svc, task_id) is m.TaskStatus.FAILED
    # NODE may still be copying into `target`: the next put on segB must land elsewhere.
    config = m.ReplicateConfigMsg(preferred_segments=[m.SegmentName("segB")])
    reply = call(svc, m.PutStart(WRITER, "next", SIZE, config))
    assert reply.code == 0
    assert (reply.replicas[0].segment, reply.replicas[0].offset) != target


def test_a_target_of_a_task_failed_by_unmounting_its_source_stays_parked(
    make_service: MakeService, clock: Clock
) -> None:
    svc = make_service(segments=0)
    mount(svc, "src", client=NODE)
    mount(svc, "dst", client=NODE2)
    put(svc, "k", "src")
    task_id = call(svc, m.CreateMoveTask("k", m.SegmentName("src"), m.SegmentName("dst"))).task_id
    fetch(svc)
    assert call(svc, m.UnmountSegment(NODE, m.SegmentName("src"))) == m.Reply(0)
    assert status(svc, task_id) is m.TaskStatus.FAILED
    assert used(svc, "dst") == SIZE and len(svc.parked()) == 1
    clock.advance(svc.config.put_start_release_timeout)
    call(svc, m.Ping(NODE2))
    svc.release_stale()
    assert used(svc, "dst") == 0 and svc.parked() == []


def test_a_task_failed_before_its_executor_fetched_it_frees_its_targets_at_once(
    make_service: MakeService,
) -> None:
    svc = make_service(segments=0)
    mount(svc, "src", client=NODE)
    mount(svc, "dst", client=NODE2)
    put(svc, "k", "src")
    task_id = call(svc, m.CreateCopyTask("k", [m.SegmentName("dst")])).task_id
    assert call(svc, m.UnmountSegment(NODE, m.SegmentName("src"))) == m.Reply(0)
    assert status(svc, task_id) is m.TaskStatus.FAILED
    assert used(svc, "dst") == 0 and svc.parked() == []


def test_a_task_older_than_the_timeout_fails_and_ended_tasks_are_forgotten_later(
    make_service: MakeService, clock: Clock
) -> None:
    svc = three_segments(make_service, replica_task_timeout=60.0, task_retention=100.0)
    svc.clients.ping(NODE, clock())
    put(svc, "k", "seg-0")
    task_id = call(svc, m.CreateCopyTask("k", [S1])).task_id
    fetch(svc)
    clock.advance(59)
    call(svc, m.Ping(NODE))
    svc.release_stale()
    assert status(svc, task_id) is m.TaskStatus.PROCESSING
    clock.advance(2)
    call(svc, m.Ping(NODE))
    svc.release_stale()
    q = call(svc, m.QueryTask(task_id))
    assert q.status is m.TaskStatus.FAILED and "timed out" in q.message
    assert used(svc, "seg-1") == SIZE  # parked: the executor may still be copying
    clock.advance(99)
    call(svc, m.Ping(NODE))
    svc.release_stale()
    assert call(svc, m.QueryTask(task_id)).code == 0
    clock.advance(2)
    call(svc, m.Ping(NODE))
    svc.release_stale()
    assert call(svc, m.QueryTask(task_id)).code == E.TASK_NOT_FOUND


# ---------------------------------------------------------------- BatchReplicaClear


def test_batch_replica_clear_drops_own_unleased_replicas(
    make_service: MakeService, clock: Clock
) -> None:
    svc = three_segments(make_service, default_kv_lease_ttl=5.0)
    put(svc, "whole", "seg-0", "seg-1")
    put(svc, "part", "seg-0", "seg-1")
    put(svc, "leased", "seg-0")
    clock.advance(10)
    segments_of(svc, "leased")  # leased for 5 s from now
    reply = call(svc, m.BatchReplicaClear(["whole", "leased", "nope"], WRITER, m.SegmentName("")))
    assert reply == m.BatchReplicaClearReply(0, ["whole"])
    assert call(svc, m.GetReplicaList("whole")).code == E.OBJECT_NOT_FOUND
    one = call(svc, m.BatchReplicaClear(["part"], WRITER, S0))
    assert one.cleared == ["part"] and segments_of(svc, "part") == ["seg-1"]
    # Only the owner's objects.
    assert call(svc, m.BatchReplicaClear(["part"], OTHER)).cleared == []
    assert call(svc, m.BatchReplicaClear(["part"], m.ClientId(""))).code == E.INVALID_PARAMS


def test_evicting_one_replica_keeps_the_object(make_service: MakeService) -> None:
    svc = three_segments(make_service, default_kv_lease_ttl=0.0)
    put(svc, "k", "seg-0", "seg-1")
    obj = svc.index.get("default", "k")
    assert obj is not None
    second = obj.replicas[1]
    assert svc.evict_replica(obj, second) == SIZE
    assert segments_of(svc, "k") == ["seg-0"] and used(svc, "seg-1") == 0
    assert svc.evict_replica(obj, second) == 0  # not a replica of it any more
    assert svc.evict_replica(obj, obj.replicas[0]) == SIZE
    assert svc.index.get("default", "k") is None
