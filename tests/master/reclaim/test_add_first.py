"""The one-call record insert of a put's first replica (`ReclaimLists.add_first`,
`ReclaimEngine.on_complete_first`, what every PutCommit and PutEnd takes): the same lists, usage,
records and kswapd wake-ups as the general `add` / `on_complete`, and nothing done when the key
has a record already."""

from __future__ import annotations

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.reclaim import EvictInfo, ListState, ReclaimConfig, ReclaimLists
from kvpool.master.reclaim.adapter import MasterReclaimHooks
from kvpool.master.reclaim.simulated import ManualClock, SimulatedPool
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m


def _snapshot(lists: ReclaimLists[str], keys: list[str]) -> object:
    recs = [lists.records_of(k) for k in keys]
    return (
        [r.key for r in lists.inactive_order()],
        [r.key for r in lists.active_order()],
        lists.inactive_bytes,
        lists.resident_bytes,
        lists.usage.count[0],
        [
            [(r.replica_id, r.size, r.generation, r.state, r.referenced, r.epoch) for r in rs]
            for rs in recs
        ],
    )


def test_add_first_leaves_the_lists_as_add_does() -> None:
    keys = [f"k{i}" for i in range(6)]
    general: ReclaimLists[str] = ReclaimLists(0)
    fast: ReclaimLists[str] = ReclaimLists(0)
    for i, k in enumerate(keys):
        general.add(EvictInfo(k, i, 0, 64 * (i + 1)))
        rec = fast.add_first(k, i, 64 * (i + 1))
        assert rec is not None and fast.records_of(k) == [rec]
    assert _snapshot(fast, keys) == _snapshot(general, keys)
    # The records behave the same afterwards: promotion, removal, isolation.
    for lists in (general, fast):
        lists.mark_accessed("k1")
        lists.mark_accessed("k1")
        lists.remove("k3")
    assert _snapshot(fast, keys) == _snapshot(general, keys)
    assert fast.records_of("k1")[0].state is ListState.ACTIVE


def test_add_first_does_nothing_when_the_key_has_a_record() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    old = lists.add(EvictInfo("k", 1, 0, 100))
    before = _snapshot(lists, ["k"])
    assert lists.add_first("k", 2, 100) is None
    assert _snapshot(lists, ["k"]) == before and lists.records_of("k") == [old]


def test_on_complete_first_wakes_kswapd_at_the_same_completion_as_on_complete() -> None:
    """High watermark 0.9 of 100 objects: the 91st completed replica wakes kswapd, once."""
    config = ReclaimConfig(high_watermark_ratio=0.9, eviction_ratio=0.2)
    pool = SimulatedPool(100 * 100, config, num_shards=1, clock=ManualClock())
    wakeups: list[int] = []
    pool.engine.wakeup = lambda: wakeups.append(1)
    for i in range(91):
        assert pool.put_start(f"k{i}", 100) is ErrorCode.OK
        pool.engine.on_complete_first(f"k{i}", 0, 100, 0)
        assert pool.engine.kswapd_wanted() is (i == 90)
    assert wakeups == [1]
    assert pool.engine.resident_count == 91 and pool.engine.resident_bytes == 91 * 100
    # A second completion of a listed key changes nothing (idempotent, as on_complete).
    pool.engine.on_complete_first("k0", 0, 100, 0)
    assert pool.engine.resident_count == 91 and len(pool.engine.records_of("k0")) == 1


def test_put_commits_list_their_replica_like_put_end() -> None:
    """A PutCommit's record: inactive at the aligned size, unevictable when hard pinned, its
    soft pin indexed; the usage counts each once."""
    hooks = MasterReclaimHooks()
    svc = MasterService(MasterConfig(num_shards=4, seed=1), clock=ManualClock(), hooks=hooks)
    node, writer, host = m.ClientId("node-1"), m.ClientId("writer-1"), m.HostId("host-a")
    info = m.SegmentInfo(m.SegmentName("seg"), 1 << 20, host, "127.0.0.1:1", "")
    assert svc.handle(m.MountSegment(node, host, info)).code == 0  # type: ignore[union-attr]
    arena = svc.handle(m.ReserveArena(writer, 64 * 1024))
    assert isinstance(arena, m.ArenaReply) and arena.code == 0
    configs = {
        "plain": m.ReplicateConfigMsg(),
        "hard": m.ReplicateConfigMsg(with_hard_pin=True),
        "soft": m.ReplicateConfigMsg(
            soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000
        ),
    }
    for i, (key, cfg) in enumerate(configs.items()):
        rep = svc.handle(
            m.PutCommit(writer, key, 1000, arena.arena_id, arena.offset + i * 4096, 7, cfg)
        )
        assert isinstance(rep, m.Reply) and rep.code == 0, (key, rep)
    engine = hooks.engine
    states = {}
    for key in configs:
        obj = svc.index.get("default", key)
        assert obj is not None
        (rec,) = engine.records_of(obj)
        assert rec.size == 1024 and rec.replica_id is obj.replicas[0]  # aligned to 64
        states[key] = rec.state
    assert states == {
        "plain": ListState.INACTIVE,
        "hard": ListState.UNEVICTABLE,
        "soft": ListState.INACTIVE,
    }
    soft = svc.index.get("default", "soft")
    assert soft is not None and soft.soft_pin_deadline is not None
    assert hooks.soft_pins.deadline(soft) == soft.soft_pin_deadline
    assert len(hooks.soft_pins) == 1
    assert engine.resident_count == 3 and engine.resident_bytes == 3 * 1024
