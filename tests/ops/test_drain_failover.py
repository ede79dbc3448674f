"""A drain survives a kill -9 of the leader: the new leader (real etcd, two `kvpool master
--ha` processes) resumes it from its copy of the log, keeps the segment out of placement,
moves the pinned objects out through the segment's owner and unmounts it when its grace ends
as it would have on the old leader. The nodes are `FakeNode`s (control plane only); the test
plays the draining node's task executor (FetchTasks, MarkTaskComplete)."""

from __future__ import annotations

from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus
from kvpool.protocol.messages import (
    FetchTasks,
    FetchTasksReply,
    GetReplicaList,
    MarkTaskComplete,
    PutEnd,
    PutStart,
    PutStartReply,
    ReplicaListReply,
    ReplicateConfigMsg,
    Reply,
    SegmentName,
)
from kvpool.rpc.client import RpcClient
from kvtest.etcd import EtcdServer
from kvtest.ha import FakeNode, HaMaster, checksum, master_rpc, wait_leader
from kvtest.procs import wait_until

PINNED = ReplicateConfigMsg(with_hard_pin=True)


def _segment_of(rpc: RpcClient, key: str) -> set[str]:
    reply = rpc.call_as(GetReplicaList(key), ReplicaListReply)
    assert reply.code == 0, reply
    return {r.segment for r in reply.replicas}


def test_a_drain_in_progress_is_resumed_by_the_new_leader_after_a_kill_9(
    etcd_shared: EtcdServer, cluster: str, masters: list[HaMaster], nodes: list[FakeNode]
) -> None:
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m1"))
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m2"))
    leader = wait_leader(masters)
    standby = next(m for m in masters if m is not leader)
    a = FakeNode(leader.address, cluster, name="seg-a")
    nodes.append(a)
    keys = [f"pinned-{i}" for i in range(20)]
    with master_rpc(leader) as rpc:
        for k in keys:  # only seg-a is mounted: every pinned object lands there
            start = rpc.call_as(PutStart(a.client_id, k, 4096, PINNED), PutStartReply)
            assert start.code == 0, start
            assert rpc.call_as(PutEnd(a.client_id, k, checksum(k)), Reply).code == 0
        b = FakeNode(leader.address, cluster, name="seg-b")
        nodes.append(b)
        # A grace long enough for the failover; the owner of seg-a runs no task, so the
        # moves wait (PENDING) on the old leader.
        started = rpc.call_as(DrainSegment(SegmentName("seg-a"), grace_ms=60_000), DrainReply)
        assert started.code == 0 and started.state in ("scanning", "moving"), started
        wait_until(
            lambda: rpc.call_as(DrainStatus(SegmentName("seg-a")), DrainReply).state == "moving",
            10,
            what="the drain to move the pinned objects",
        )
        before = rpc.call_as(DrainStatus(SegmentName("seg-a")), DrainReply)
        assert before.must_keep == len(keys) and before.moved == 0, before
    wait_until(
        lambda: (s := standby.status()) is not None and s.objects == len(keys),
        10,
        what="the standby's copy to hold every object",
    )
    leader.proc.kill9()
    wait_until(
        lambda: (s := standby.status()) is not None and s.role == "leader",
        15,
        interval=0.05,
        what="the standby to lead",
    )
    for n in (a, b):
        n.point(standby.address)
        n.mount()
    with master_rpc(standby) as rpc:
        # The drain goes on where it was: same grace, elapsed time kept, seg-a out of
        # placement (a new put lands on seg-b).
        st = rpc.call_as(DrainStatus(SegmentName("seg-a")), DrainReply)
        assert st.code == 0, st
        assert st.grace_s == 60.0 and st.elapsed_s >= before.elapsed_s, (before, st)
        assert st.state in ("scanning", "moving"), st
        for i in range(5):
            start = rpc.call_as(PutStart(b.client_id, f"new-{i}", 4096), PutStartReply)
            assert start.code == 0, start
            assert {r.segment for r in start.replicas} == {"seg-b"}, start
        # Asking again joins the drain under way (idempotent), on the new leader too.
        again = rpc.call_as(DrainSegment(SegmentName("seg-a"), grace_ms=60_000), DrainReply)
        assert again.code == 0 and again.grace_s == 60.0
        # Play seg-a's task executor: the new leader hands it the moves; report them done.
        done: set[str] = set()

        def moved_all() -> bool:
            tasks = rpc.call_as(FetchTasks(a.client_id), FetchTasksReply)
            for t in tasks.tasks:
                assert t.key in keys and t.source.segment == "seg-a", t
                ok = rpc.call_as(MarkTaskComplete(a.client_id, t.task_id, True), Reply)
                assert ok.code == 0, ok
                done.add(t.key)
            return len(done) == len(keys)

        wait_until(moved_all, 20, what="the resumed drain to move every pinned object")
        wait_until(
            lambda: rpc.call_as(DrainStatus(SegmentName("seg-a")), DrainReply).state == "done",
            20,
            what="the resumed drain to end",
        )
        end = rpc.call_as(DrainStatus(SegmentName("seg-a")), DrainReply)
        assert end.moved == len(keys) and end.failed == 0, end
        for k in keys:  # every pinned object lives on, on seg-b
            assert _segment_of(rpc, k) == {"seg-b"}, k
