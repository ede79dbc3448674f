"""Pool-mode eviction on the real MasterService (seed 001's unified pool, issue 6): evicting
moves a replica out of a node's memory through a MOVE replica task and never loses an object.
No sockets; the clock is moved by hand and the test plays the node that executes the moves."""

from __future__ import annotations

from typing import Any

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.reclaim import ListState
from kvpool.master.reclaim.adapter import MasterReclaimHooks
from kvpool.master.reclaim.simulated import ManualClock
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

E = ErrorCode
NODE = m.ClientId("node-hot")
NODE2 = m.ClientId("node-cold")
WRITER = m.ClientId("writer")
HOST = m.HostId("host-a")
OBJ = 4096


class Pool:
    """Two segments of `n` objects each ("hot" of NODE, "cold" of NODE2), pool mode, kswapd
    between 80 % (high) and 50 % (low) of the fullest segment."""

    def __init__(self, n: int = 10, **cfg: Any) -> None:
        self.clock = ManualClock()
        self.hooks = MasterReclaimHooks()
        cfg = {
            "num_shards": 4,
            "seed": 1,
            "default_kv_lease_ttl": 0.0,
            "eviction_mode": "pool",
            "eviction_high_watermark_ratio": 0.8,
            "eviction_ratio": 0.3,
            **cfg,
        }
        self.svc = MasterService(MasterConfig(**cfg), clock=self.clock, hooks=self.hooks)
        for name, node in (("hot", NODE), ("cold", NODE2)):
            info = m.SegmentInfo(m.SegmentName(name), n * OBJ, HOST, f"127.0.0.1:{len(name)}", "")
            assert self.svc.handle(m.MountSegment(node, HOST, info)) == m.Reply(0)
        self.engine = self.hooks.engine

    def put(self, key: str, *segments: str, **cfg: Any) -> int:
        config = m.ReplicateConfigMsg(
            replica_num=max(1, len(segments)),
            preferred_segments=[m.SegmentName(s) for s in segments],
            **cfg,
        )
        reply = self.svc.handle(m.PutStart(WRITER, key, OBJ, config))
        if reply.code != 0:
            return int(reply.code)
        return int(self.svc.handle(m.PutEnd(WRITER, key, 7)).code)

    def where(self, key: str) -> list[str]:
        reply = self.svc.handle(m.GetReplicaList(key))
        assert reply.code == 0, (key, reply)
        return [d.segment for d in reply.replicas]

    def used(self, name: str) -> int:
        seg = self.svc.segments.get(m.SegmentName(name))
        assert seg is not None
        return seg.allocator.allocated // OBJ

    def fetch(self, client: m.ClientId = NODE) -> list[m.ReplicaTask]:
        reply = self.svc.handle(m.FetchTasks(client, 100))
        assert reply.code == 0
        return list(reply.tasks)

    def report(self, task: m.ReplicaTask, ok: bool, client: m.ClientId = NODE) -> None:
        assert self.svc.handle(m.MarkTaskComplete(client, task.task_id, ok)) == m.Reply(0)

    def tick(self) -> None:
        self.hooks.tick(self.clock())


def test_kswapd_moves_primaries_off_a_full_segment_and_frees_them_only_after_the_move() -> None:
    pool = Pool()
    for i in range(9):
        assert pool.put(f"k{i}", "hot") == 0
    assert pool.used("hot") == 9 and pool.engine.kswapd_wanted()  # 90 % > 80 %
    pool.tick()
    tasks = pool.fetch()
    # Down to the low watermark (5 of 10): four moves, all to the segment with room.
    assert len(tasks) == 4 and pool.engine.migrating_bytes == 4 * OBJ
    assert all(t.task_type is m.TaskType.MOVE and t.source.segment == "hot" for t in tasks)
    assert all([d.segment for d in t.targets] == ["cold"] for t in tasks)
    # Nothing is freed yet, and every object is still read from where it was.
    assert pool.used("hot") == 9 and pool.used("cold") == 4
    assert all(pool.where(f"k{i}") == ["hot"] for i in range(9))

    moved, failed = tasks[:3], tasks[3]
    for t in moved:
        pool.report(t, ok=True)
    pool.report(failed, ok=False)
    assert pool.used("hot") == 6 and pool.used("cold") == 3
    assert all(pool.where(t.key) == ["cold"] for t in moved)
    assert pool.where(failed.key) == ["hot"]
    stats = pool.engine.stats
    assert (stats.swap_outs_moved, stats.swap_outs_failed) == (3, 1)
    assert pool.engine.migrating_bytes == 0
    obj = pool.svc.index.get("default", failed.key)
    (rec,) = pool.engine.records_of(obj)  # type: ignore[arg-type]
    # Back on a list, to be tried again (the reads above promoted it).
    assert rec.state in (ListState.INACTIVE, ListState.ACTIVE)
    # The moved objects' records now describe their replicas on "cold".
    for t in moved:
        obj = pool.svc.index.get("default", t.key)
        assert obj is not None
        (rec,) = pool.engine.records_of(obj)
        assert rec.replica_id is obj.replicas[0] and obj.replicas[0].segment.name == "cold"


def test_replicas_on_a_segment_below_the_low_watermark_never_move() -> None:
    pool = Pool()
    for i in range(4):
        assert pool.put(f"c{i}", "cold") == 0
    for i in range(9):
        assert pool.put(f"h{i}", "hot") == 0
    pool.tick()
    tasks = pool.fetch()
    assert tasks and all(t.source.segment == "hot" for t in tasks)
    assert pool.fetch(NODE2) == []  # nothing asked of cold's owner: its replicas stay


def test_nothing_can_take_it_so_the_put_fails_and_nothing_is_lost() -> None:
    pool = Pool()
    for i in range(10):
        assert pool.put(f"h{i}", "hot") == 0
        assert pool.put(f"c{i}", "cold") == 0
    assert pool.put("one-more") == E.NO_AVAILABLE_HANDLE
    pool.tick()  # kswapd finds no segment at or below the low watermark
    assert pool.fetch() == [] and pool.fetch(NODE2) == []
    assert all(pool.where(f"{p}{i}") for p in "hc" for i in range(10))
    assert pool.svc.handle(m.Stats()).tasks_active == 0


def test_direct_reclaim_drops_a_secondary_replica_but_never_starts_a_move() -> None:
    pool = Pool()
    for i in range(10):
        assert pool.put(f"k{i}", "hot", "cold") == 0
    assert pool.used("hot") == pool.used("cold") == 10
    # Full everywhere: the put reclaims directly; only non-primary replicas may go at once.
    assert pool.put("new") == 0
    assert pool.fetch() == [] and pool.fetch(NODE2) == []
    for i in range(10):
        assert pool.where(f"k{i}")[0] == "hot"  # every primary is where it was
    assert pool.engine.stats.swap_outs_started == 0
    assert pool.engine.stats.dropped >= 1


def test_a_soft_pinned_replica_is_moved_even_when_it_is_not_the_primary() -> None:
    pool = Pool()
    for i in range(9):
        assert pool.put(f"k{i}", "cold", "hot", soft_pin_action=m.SoftPinAction.ENABLE) == 0
    # Both segments at 90 %: nothing can take anything, and nothing pinned is dropped.
    pool.tick()
    assert pool.fetch() == [] and pool.fetch(NODE2) == []
    assert all(pool.where(f"k{i}") == ["cold", "hot"] for i in range(9))
    assert pool.engine.stats.dropped == 0


def test_removing_a_moving_object_fails_its_move_and_frees_both_sides() -> None:
    pool = Pool()
    for i in range(9):
        pool.put(f"k{i}", "hot")
    pool.tick()
    tasks = pool.fetch()
    victim = tasks[0]
    assert pool.svc.handle(m.Remove(victim.key)) == m.Reply(E.OBJECT_HAS_REPLICATION_TASK)
    assert pool.svc.handle(m.Remove(victim.key, True)) == m.Reply(0)
    reply = pool.svc.handle(m.MarkTaskComplete(NODE, victim.task_id, True))
    assert reply == m.Reply(E.OBJECT_NO_REPLICATION_TASK)
    assert pool.engine.migrating_bytes == (len(tasks) - 1) * OBJ
    # The executor had fetched the move and may still be copying: its target stays parked.
    assert pool.used("hot") == 8 and pool.used("cold") == len(tasks)
    pool.clock.advance(pool.svc.config.put_start_release_timeout)
    for task in tasks[1:]:
        pool.report(task, True)
    pool.svc.handle(m.Ping(NODE))
    pool.svc.handle(m.Ping(NODE2))
    pool.svc.release_stale()
    assert pool.used("cold") == len(tasks) - 1


def test_direct_reclaim_never_starts_a_move_even_when_some_segment_could_take_it() -> None:
    pool = Pool()
    spare = m.SegmentInfo(m.SegmentName("spare"), 4 * OBJ, HOST, "127.0.0.1:9", "")
    assert pool.svc.handle(m.MountSegment(NODE2, HOST, spare)) == m.Reply(0)
    for i in range(10):
        assert pool.put(f"k{i}", "hot", "cold") == 0
    # Too large for the room left anywhere: the put reclaims directly. "spare" could take a
    # moved primary, but a put cannot wait for a move.
    reply = pool.svc.handle(m.PutStart(WRITER, "big", 6 * OBJ))
    assert reply.code in (0, E.NO_AVAILABLE_HANDLE)
    assert pool.fetch() == [] and pool.engine.stats.swap_outs_started == 0
    assert all(pool.where(f"k{i}")[0] == "hot" for i in range(10))


def test_kswapd_backs_off_after_a_step_that_found_nothing_to_do() -> None:
    pool = Pool()
    for i in range(9):
        assert pool.put(f"h{i}", "hot") == 0
        assert pool.put(f"c{i}", "cold") == 0
    pool.tick()  # both at 90 %: nowhere to move anything
    assert pool.engine.stats.kswapd_steps == 1 and pool.fetch() == []
    assert pool.put("h9", "hot") == 0  # a PutEnd above the watermark does not wake it again
    pool.tick()
    assert pool.engine.stats.kswapd_steps == 1 and not pool.engine.kswapd_wanted()
    pool.clock.advance(1.5)  # the backoff (1 s) is over: it looks again
    pool.tick()
    assert pool.engine.stats.kswapd_steps == 2
