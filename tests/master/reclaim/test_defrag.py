"""Issue #13 in pool mode: a put that finds a segment's bytes only in pieces gets a retry hint
while the master moves the neighbours out of one range (`reclaim/defrag.py`), and succeeds
once the moves are done; nothing is dropped. The real `MasterService` with
`MasterReclaimHooks` and a hand clock; the test plays the node that executes the moves."""

from __future__ import annotations

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.reclaim.adapter import MasterReclaimHooks
from kvpool.master.reclaim.simulated import ManualClock
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

NODE = m.ClientId("node-1")
WRITER = m.ClientId("writer-1")
HOST = m.HostId("host-a")
SLOT = 64 << 10
OK = ErrorCode.OK
NO_ROOM = ErrorCode.NO_AVAILABLE_HANDLE


class Pool:
    """One segment of 16 slots, pool mode, one shard, a hand clock."""

    def __init__(self, hooks: MasterReclaimHooks | None = None, **cfg: object) -> None:
        self.clock = ManualClock()
        self.hooks = hooks or MasterReclaimHooks()
        settings: dict[str, object] = {"num_shards": 1, "seed": 1, "eviction_mode": "pool", **cfg}
        config = MasterConfig(**settings)  # type: ignore[arg-type]
        self.svc = MasterService(config, clock=self.clock, hooks=self.hooks)
        info = m.SegmentInfo(m.SegmentName("seg"), 16 * SLOT, HOST, "127.0.0.1:1", "")
        assert self.svc.handle(m.MountSegment(NODE, HOST, info)) == m.Reply(OK)

    def start(self, key: str, size: int = SLOT, **cfg: object) -> m.PutStartReply:
        config = m.ReplicateConfigMsg(**cfg)  # type: ignore[arg-type]
        reply = self.svc.handle(m.PutStart(WRITER, key, size, config))
        assert isinstance(reply, m.PutStartReply)
        if reply.code == OK:
            assert self.svc.handle(m.PutEnd(WRITER, key, 1)) == m.Reply(OK)
        return reply

    def comb(self, **cfg: object) -> None:
        """16 slots of 64 KiB, the even ones removed: half the segment free, in 64 KiB
        pieces, no free block of two slots."""
        for i in range(16):
            assert self.start(f"k{i}", **cfg).code == OK
        for i in range(0, 16, 2):
            assert self.svc.handle(m.Remove(f"k{i}")) == m.Reply(OK)
        self.clock.advance(60.0)  # past every read lease

    def tasks(self) -> list[m.ReplicaTask]:
        reply = self.svc.handle(m.FetchTasks(NODE, 100))
        assert isinstance(reply, m.FetchTasksReply) and reply.code == OK
        return list(reply.tasks)

    def report(self, task: m.ReplicaTask, ok: bool = True) -> None:
        assert self.svc.handle(m.MarkTaskComplete(NODE, task.task_id, ok)) == m.Reply(OK)

    def survivors(self) -> list[int]:
        return [i for i in range(1, 16, 2) if self.svc.index.get("default", f"k{i}") is not None]


def test_a_fragmented_pool_mode_put_gets_a_retry_hint_and_fits_once_the_moves_are_done() -> None:
    pool = Pool()
    pool.comb()
    first = pool.start("big", 4 * SLOT)
    assert first.code == NO_ROOM
    assert first.retry_after_ms > 0  # on main: no hint, the put just fails
    moves = pool.tasks()
    assert moves and all(t.task_type is m.TaskType.MOVE for t in moves)
    assert len(moves) <= 2  # two neighbours make 4 slots (free, k1, free, k3 or alike)
    window = {t.source.offset for t in moves}
    for t in moves:
        (target,) = t.targets
        assert target.offset not in window  # not into the range being made
        assert not (target.offset < min(window) + 4 * SLOT and target.offset >= min(window) - SLOT)
    # Retried before the moves ended: the same hint, no second window.
    again = pool.start("big", 4 * SLOT)
    assert again.code == NO_ROOM and again.retry_after_ms > 0
    assert pool.tasks() == []
    for t in moves:
        pool.report(t)
    assert pool.start("big", 4 * SLOT).code == OK
    assert pool.survivors() == list(range(1, 16, 2))  # moved, never dropped
    stats = pool.hooks.stats()
    assert stats["defrag_moved"] == len(moves) and stats["defrag_in_flight"] == 0


def test_a_failed_move_keeps_the_object_and_the_next_put_starts_again() -> None:
    pool = Pool()
    pool.comb()
    assert pool.start("big", 4 * SLOT).retry_after_ms > 0
    for t in pool.tasks():
        pool.report(t, ok=False)
    assert pool.survivors() == list(range(1, 16, 2))
    assert pool.hooks.stats()["defrag_in_flight"] == 0
    assert pool.start("big", 4 * SLOT).retry_after_ms > 0  # a new window
    for t in pool.tasks():
        pool.report(t)
    assert pool.start("big", 4 * SLOT).code == OK


def test_leased_and_hard_pinned_neighbours_never_move() -> None:
    pool = Pool()
    pool.comb(with_hard_pin=True)
    reply = pool.start("big", 4 * SLOT)
    assert reply.code == NO_ROOM and reply.retry_after_ms == 0
    assert pool.tasks() == []

    leased = Pool(default_kv_lease_ttl=3600.0)
    leased.comb()
    for i in range(1, 16, 2):
        assert leased.svc.handle(m.GetReplicaList(f"k{i}")).code == OK  # type: ignore[attr-defined]
    reply = leased.start("big", 4 * SLOT)
    assert reply.code == NO_ROOM and reply.retry_after_ms == 0
    assert leased.tasks() == []


def test_no_moves_when_no_segment_has_the_bytes_or_in_cache_mode() -> None:
    pool = Pool()
    pool.comb()
    reply = pool.start("huge", 9 * SLOT)  # 8 slots free in all
    assert reply.code == NO_ROOM and reply.retry_after_ms == 0
    assert pool.tasks() == []
    cache = Pool(eviction_mode="cache")
    assert cache.hooks.defragmenter is None


def test_moves_per_range_are_bounded() -> None:
    pool = Pool(MasterReclaimHooks(defrag_max_moves=1))
    pool.comb()
    reply = pool.start("big", 4 * SLOT)  # needs two moves
    assert reply.code == NO_ROOM and reply.retry_after_ms == 0
    assert pool.tasks() == []
    assert pool.start("mid", 3 * SLOT).retry_after_ms > 0  # free, k, free: one move
    assert len(pool.tasks()) == 1


def test_removing_an_object_being_moved_cancels_its_move_and_frees_both_ranges() -> None:
    pool = Pool()
    pool.comb()
    assert pool.start("big", 4 * SLOT).retry_after_ms > 0
    moves = pool.tasks()
    seg = pool.svc.segments.get(m.SegmentName("seg"))
    assert seg is not None
    before = seg.allocator.allocated
    key = moves[0].key
    # The master's own move: the caller's Remove is not refused for it (unlike a move the
    # caller asked for: OBJECT_HAS_REPLICATION_TASK).
    assert pool.svc.handle(m.Remove(key)) == m.Reply(OK)
    assert pool.svc.handle(m.QueryTask(moves[0].task_id)).status is m.TaskStatus.FAILED  # type: ignore[attr-defined]
    # The source is freed; the target the node may still be copying into stays parked.
    assert seg.allocator.allocated == before - SLOT
    assert pool.hooks.stats()["defrag_in_flight"] == len(moves) - 1


def test_a_range_whose_moves_cannot_all_find_a_place_starts_none_of_them() -> None:
    # Free slots 0, 2 and 9, the other 13 held: a 3-slot range (0-2) needs k1 moved, and slot
    # 9 takes it. A 4-slot range needs two moves (0-3) or three, each into a free slot outside
    # the range, and there are fewer: no move starts, nothing changes.
    pool = Pool()
    for i in range(16):
        assert pool.start(f"k{i}").code == OK
    for i in (0, 2, 9):
        assert pool.svc.handle(m.Remove(f"k{i}")) == m.Reply(OK)
    pool.clock.advance(60.0)
    seg = pool.svc.segments.get(m.SegmentName("seg"))
    assert seg is not None
    before = seg.allocator.allocated
    reply = pool.start("four", 4 * SLOT)
    assert reply.code == NO_ROOM and reply.retry_after_ms == 0
    assert pool.tasks() == [] and seg.allocator.allocated == before
    assert pool.start("three", 3 * SLOT).retry_after_ms > 0
    (move,) = pool.tasks()
    assert move.key == "k1" and move.targets[0].offset == 9 * SLOT
    pool.report(move)
    assert pool.start("three", 3 * SLOT).code == OK


def test_a_batch_starts_one_range_and_every_key_refused_meanwhile_gets_the_hint() -> None:
    pool = Pool()
    pool.comb()
    config = m.ReplicateConfigMsg()
    reply = pool.svc.handle(m.BatchPutStart(WRITER, ["a", "b"], [4 * SLOT, 4 * SLOT], config))
    assert isinstance(reply, m.BatchPutStartReply)
    assert [r.code for r in reply.results] == [NO_ROOM, NO_ROOM]
    assert all(r.retry_after_ms > 0 for r in reply.results)
    assert pool.hooks.stats()["defrag_windows"] == 1
