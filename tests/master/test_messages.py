"""The wire messages of the master: every request and reply survives a msgpack round trip
through the `Request` / `Response` unions, and the defaults a client relies on hold."""

from __future__ import annotations

import typing

import msgspec
import pytest

from kvpool.protocol import messages as m
from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus


def _members(union: object) -> list[type[m.Message]]:
    return list(typing.get_args(union))


def test_every_request_and_reply_class_is_in_a_union_exactly_once() -> None:
    requests = _members(m.Request)
    replies = _members(m.Response)
    assert len(set(requests)) == len(requests)
    assert len(set(replies)) == len(replies)
    assert not set(requests) & set(replies)
    assert m.Echo in requests and m.EchoReply in replies


SAMPLES: list[m.Message] = [
    m.Echo(b"x" * 10),
    m.Ping(m.ClientId("c1")),
    m.MountSegment(
        m.ClientId("c1"),
        m.HostId("h1"),
        m.SegmentInfo(m.SegmentName("s1"), 1 << 20, m.HostId("h1"), "127.0.0.1:1", "/dev/shm/x"),
    ),
    m.ReMountSegment(m.ClientId("c1"), m.HostId("h1"), []),
    m.UnmountSegment(m.ClientId("c1"), m.SegmentName("s1")),
    m.GetSegment(m.SegmentName("s1")),
    m.PutStart(
        m.ClientId("c1"),
        "k",
        10,
        m.ReplicateConfigMsg(
            replica_num=2,
            soft_pin_action=m.SoftPinAction.ENABLE,
            soft_pin_ttl_ms=5000,
            with_hard_pin=True,
            preferred_segments=[m.SegmentName("s1")],
            group_ids=["g"],
        ),
        m.TenantId("t"),
    ),
    m.UpsertStart(m.ClientId("c1"), "k", 10),
    m.BatchPutStart(m.ClientId("c1"), ["a", "b"], [1, 2]),
    m.BatchUpsertStart(m.ClientId("c1"), ["a"], [1]),
    m.PutEnd(m.ClientId("c1"), "k", 2**64 - 1),
    m.BatchPutEnd(m.ClientId("c1"), ["a", "b"], [1, 2]),
    m.BatchGetLocations(["a", "b"]),
    m.LocationsReply(
        [0, -704], [10, 0], [5, None], [[0, 4096, 1, 0], []], ["s0", "s1"], ["e0", "e1"], 5000
    ),
    m.ReserveArena(m.ClientId("c1"), 32 << 20, 4096, [7, 9]),
    m.ReleaseArenas(m.ClientId("c1"), [7]),
    m.PutCommit(m.ClientId("c1"), "k", 100, 7, 4096, 2**64 - 1),
    m.BatchPutCommit(m.ClientId("c1"), 7, ["a", "b"], [1, 2], [0, 64], [3, 4]),
    m.ArenaReply(0, 7, m.SegmentName("s"), 4096, 1 << 20, 64, "127.0.0.1:1"),
    m.PutRevoke(m.ClientId("c1"), "k"),
    m.BatchPutRevoke(m.ClientId("c1"), ["k"]),
    m.GetReplicaList("k"),
    m.BatchGetReplicaList(["a", "b"]),
    m.ExistKey("k"),
    m.BatchExistKey(["k"]),
    m.GetSize("k"),
    m.Remove("k", True),
    m.BatchRemove(["k"], False),
    m.RemoveAll(True),
    m.RemoveByRegex("^a", False),
    m.Stats(),
    m.EchoReply(b"y"),
    m.Reply(-704),
    m.BatchReply([0, -704]),
    m.RemountReply(0, [m.SegmentName("s1")]),
    m.ReportBadReplica("k", m.SegmentName("s1"), 4096, m.TenantId("t")),
    m.RegisterDiskReplicas(
        m.ClientId("c1"),
        m.SegmentName("s1"),
        [m.DiskEntry(m.TenantId("t"), "k", 4096, 100, 7)],
    ),
    m.PingReply(0, m.ClientStatus.NEED_REMOUNT, 3),
    m.SegmentReply(0, m.SegmentInfo(m.SegmentName("s"), 1)),
    m.PutStartReply(
        0,
        [
            m.ReplicaDesc(
                7, m.ReplicaKind.MEMORY, m.ReplicaStatus.PROCESSING, m.SegmentName("s"), 64, 10
            )
        ],
    ),
    m.BatchPutStartReply([m.PutStartReply(-200)]),
    m.ReplicaListReply(0, [], 10, 123, 10_000),
    m.BatchReplicaListReply([m.ReplicaListReply(-704)]),
    m.ExistReply(0, True),
    m.BatchExistReply([m.ExistReply(0, False)]),
    m.SizeReply(0, 5),
    m.CountReply(0, 3),
    m.StatsReply(
        0,
        [m.SegmentStats(m.SegmentName("s"), m.ClientId("c"), m.HostId("h"), "e", 100, 10, 1)],
        [m.ClientStats(m.ClientId("c"), m.HostId("h"), 1, 9.5)],
        1,
    ),
    m.CreateCopyTask("k", [m.SegmentName("s2"), m.SegmentName("s3")], m.TenantId("t")),
    m.CreateMoveTask("k", m.SegmentName("s1"), m.SegmentName("s2")),
    m.TaskReply(0, "abc"),
    m.QueryTask("abc"),
    m.QueryTaskReply(
        0, "abc", m.TaskType.MOVE, m.TaskStatus.FAILED, "executor expired", 1.0, 2.0, "k"
    ),
    m.FetchTasks(m.ClientId("c1"), 4),
    m.FetchTasksReply(
        0,
        [
            m.ReplicaTask(
                "abc",
                m.TaskType.COPY,
                "k",
                m.TenantId("default"),
                10,
                2**64 - 1,
                m.ReplicaDesc(
                    1, m.ReplicaKind.MEMORY, m.ReplicaStatus.COMPLETE, m.SegmentName("s1"), 0, 10
                ),
                [
                    m.ReplicaDesc(
                        2,
                        m.ReplicaKind.MEMORY,
                        m.ReplicaStatus.PROCESSING,
                        m.SegmentName("s2"),
                        64,
                        10,
                        "127.0.0.1:2",
                    )
                ],
                [m.SegmentInfo(m.SegmentName("s1"), 1 << 20, m.HostId("h"), "e", "/dev/shm/s1")],
            )
        ],
    ),
    m.MarkTaskComplete(m.ClientId("c1"), "abc", False, "transfer failed"),
    m.BatchReplicaClear(["a", "b"], m.ClientId("c1"), m.SegmentName("s1")),
    m.BatchReplicaClearReply(0, ["a"]),
    m.HaStatus(),
    m.Barrier(),
    m.HaStatusReply(0, "leader", "m1", 3, "127.0.0.1:1", 3, 100, ["m2"], 0, 5),
    m.FollowLog("m2", 3, 100, 500),
    m.LogReply(0, 3, 100, b"\x01\x02", False),
    m.FetchSnapshot("m2", 3, 0),
    m.SnapshotReply(0, 3, 100, 0, b"\x03", True),
    DrainSegment(m.SegmentName("s1"), 5000),
    DrainStatus(m.SegmentName("s1")),
    DrainReply(0, "moving", 10, 4, 2, 0, 1, 0.5, 5.0),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda x: type(x).__name__)
def test_message_round_trips_through_its_union(msg: m.Message) -> None:
    union = m.Request if type(msg) in _members(m.Request) else m.Response
    data = msgspec.msgpack.encode(msg)
    assert msgspec.msgpack.decode(data, type=union) == msg


def test_every_message_class_has_a_sample() -> None:
    covered = {type(s) for s in SAMPLES}
    assert set(_members(m.Request)) | set(_members(m.Response)) == covered


def test_put_start_defaults_are_one_replica_no_pin_default_tenant() -> None:
    req = msgspec.msgpack.decode(
        msgspec.msgpack.encode(m.PutStart(m.ClientId("c"), "k", 1)), type=m.Request
    )
    assert isinstance(req, m.PutStart)
    assert req.config.replica_num == 1
    assert req.config.soft_pin_action is m.SoftPinAction.PRESERVE
    assert req.config.soft_pin_ttl_ms is None
    assert req.tenant == "default"


def test_soft_pin_action_numbers_match_mooncake() -> None:
    assert [int(a) for a in m.SoftPinAction] == [0, 1, 2]
    assert m.ReplicaStatus.COMPLETE == 3 and m.ReplicaKind.LOCAL_DISK == 2


def test_a_frame_of_the_wrong_shape_does_not_decode() -> None:
    bad = msgspec.msgpack.encode(["PutStart", "c", "k", "not-a-size"])
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(bad, type=m.Request)


def test_a_ping_reply_of_an_older_master_still_decodes() -> None:
    """Fields added later have defaults: a reply without them decodes (the compatibility rule)."""
    old = msgspec.msgpack.encode(["PingReply", 0, int(m.ClientStatus.OK), 3])
    reply = msgspec.msgpack.decode(old, type=m.Response)
    assert isinstance(reply, m.PingReply) and reply.pending_tasks == 0


def test_task_status_numbers_follow_mooncake_order() -> None:
    assert [s.name for s in m.TaskStatus] == ["PENDING", "PROCESSING", "SUCCESS", "FAILED"]
    assert m.TaskType.COPY == 0 and m.TaskType.MOVE == 1


class _PutStartReplyBefore(msgspec.Struct, array_like=True, tag="PutStartReply"):
    """`PutStartReply` as it was before `retry_after_ms` (issue #13, pool-mode defrag)."""

    code: int
    replicas: list[m.ReplicaDesc] = []


def test_put_start_reply_retry_hint_is_wire_compatible_both_ways() -> None:
    hinted = msgspec.msgpack.encode(m.PutStartReply(-200, [], 50))
    assert msgspec.msgpack.decode(hinted, type=_PutStartReplyBefore).code == -200
    before = msgspec.msgpack.encode(_PutStartReplyBefore(-200, []))
    assert msgspec.msgpack.decode(before, type=m.PutStartReply).retry_after_ms == 0
