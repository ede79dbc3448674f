"""MasterReclaimHooks on the real MasterService (no sockets): the hooks drive the engine."""

from __future__ import annotations

import asyncio

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.reclaim import ListState
from kvpool.master.reclaim.adapter import MasterReclaimHooks
from kvpool.master.reclaim.simulated import ManualClock
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

NODE = m.ClientId("node-1")
WRITER = m.ClientId("writer-1")
HOST = m.HostId("host-a")
OBJ = 4096
OK = ErrorCode.OK


class Pool:
    """A service with one segment of `n` objects, reclaim hooks and a hand-driven clock."""

    def __init__(self, n: int = 10, *, num_shards: int = 4, **cfg: object) -> None:
        self.clock = ManualClock()
        self.hooks = MasterReclaimHooks()
        config = MasterConfig(num_shards=num_shards, seed=1, **cfg)  # type: ignore[arg-type]
        self.svc = MasterService(config, clock=self.clock, hooks=self.hooks)
        info = m.SegmentInfo(m.SegmentName("seg"), n * OBJ, HOST, "127.0.0.1:1", "")
        reply = self.svc.handle(m.MountSegment(NODE, HOST, info))
        assert isinstance(reply, m.Reply) and reply.code == OK
        self.engine = self.hooks.engine

    def start(self, key: str, **cfg: object) -> int:
        config = m.ReplicateConfigMsg(**cfg)  # type: ignore[arg-type]
        reply = self.svc.handle(m.PutStart(WRITER, key, OBJ, config))
        assert isinstance(reply, m.PutStartReply)
        return reply.code

    def put(self, key: str, **cfg: object) -> int:
        code = self.start(key, **cfg)
        if code == OK:
            reply = self.svc.handle(m.PutEnd(WRITER, key, 1))
            assert isinstance(reply, m.Reply)
            code = reply.code
        return code

    def get(self, key: str) -> int:
        reply = self.svc.handle(m.GetReplicaList(key))
        assert isinstance(reply, m.ReplicaListReply)
        return reply.code

    def exists(self, key: str) -> bool:
        return self.svc.index.get("default", key) is not None

    def state(self, key: str) -> ListState:
        obj = self.svc.index.get("default", key)
        assert obj is not None
        (rec,) = self.engine.records_of(obj)
        return rec.state

    def used(self) -> int:
        return self.svc.memory_usage()[1]


def test_put_end_lists_the_replica_and_two_reads_promote_it() -> None:
    pool = Pool()
    assert pool.put("a") == OK
    assert pool.state("a") is ListState.INACTIVE
    assert pool.get("a") == OK
    assert pool.state("a") is ListState.INACTIVE
    assert pool.get("a") == OK
    assert pool.state("a") is ListState.ACTIVE
    assert pool.engine.resident_bytes == OBJ


def test_a_full_pool_reclaims_the_oldest_inactive_object_for_put_start() -> None:
    pool = Pool(10, default_kv_lease_ttl=1.0)
    for i in range(10):
        assert pool.put(f"k{i}") == OK
    assert pool.put("new") == OK  # direct reclaim once, then the retry fits
    assert not pool.exists("k0") and pool.exists("k1") and pool.exists("new")
    assert pool.engine.stats.direct_passes == 1
    assert pool.engine.resident_bytes == pool.used() == 10 * OBJ


def test_direct_reclaim_through_the_service_never_touches_active() -> None:
    pool = Pool(4, default_kv_lease_ttl=1.0)
    for k in "abcd":
        assert pool.put(k) == OK
    for k in "abc":
        pool.get(k)
        pool.get(k)
    pool.clock.advance(2.0)  # leases over
    assert pool.put("e") == OK  # evicts d, the only inactive object
    assert not pool.exists("d")
    assert pool.put("f") == OK  # evicts e
    assert [pool.state(k) for k in "abc"] == [ListState.ACTIVE] * 3
    pool.clock.advance(2.0)
    assert pool.put("g") == OK  # f is the only inactive one again
    assert all(pool.exists(k) for k in "abc")


def test_leased_objects_are_not_evicted_and_the_put_fails_cleanly() -> None:
    pool = Pool(2, default_kv_lease_ttl=10.0)
    assert pool.put("a") == OK and pool.put("b") == OK
    pool.get("a")
    pool.engine.shard(pool.svc.index.shard_of("default", "a"))  # (records stay put)
    pool.get("b")
    assert pool.start("c") == ErrorCode.NO_AVAILABLE_HANDLE
    assert pool.exists("a") and pool.exists("b")
    pool.clock.advance(11.0)
    assert pool.put("c") == OK


def test_hard_pinned_objects_are_never_evicted_but_still_removable() -> None:
    pool = Pool(2, default_kv_lease_ttl=0.0)
    assert pool.put("pinned", with_hard_pin=True) == OK
    assert pool.put("a") == OK
    assert pool.state("pinned") is ListState.UNEVICTABLE
    assert pool.put("b") == OK and pool.put("c") == OK
    assert pool.exists("pinned") and not pool.exists("a")
    reply = pool.svc.handle(m.Remove("pinned"))
    assert isinstance(reply, m.Reply) and reply.code == OK
    assert pool.engine.resident_bytes == OBJ


def test_remove_retires_the_record_and_a_reput_is_a_new_generation() -> None:
    pool = Pool(4, default_kv_lease_ttl=0.0)
    assert pool.put("k") == OK
    old = pool.svc.index.get("default", "k")
    assert old is not None
    (old_rec,) = pool.engine.records_of(old)
    reply = pool.svc.handle(m.Remove("k"))
    assert isinstance(reply, m.Reply) and reply.code == OK
    assert old_rec.state is ListState.REMOVED and pool.engine.resident_bytes == 0
    assert pool.put("k") == OK
    new = pool.svc.index.get("default", "k")
    assert new is not None and new is not old
    # A stale report of the old generation lingers on a list until a pass meets it.
    stale = pool.engine.on_complete(old, old_rec.replica_id, OBJ)
    assert pool.engine.direct_reclaim(2 * OBJ) == OBJ  # only the live one frees bytes
    assert stale.state is ListState.REMOVED and pool.engine.stats.stale == 1


def test_tick_runs_kswapd_down_to_the_low_watermark() -> None:
    pool = Pool(20, default_kv_lease_ttl=0.0, eviction_high_watermark_ratio=0.8, eviction_ratio=0.3)
    for i in range(17):
        assert pool.put(f"k{i}") == OK
    assert pool.engine.kswapd_wanted()
    pool.hooks.tick(pool.clock())
    assert pool.used() == 10 * OBJ  # 0.8 - 0.3 of 20 objects
    assert not pool.exists("k6") and pool.exists("k7")
    assert pool.engine.stats.direct_calls == 0


def test_soft_pinned_objects_go_last_in_cache_mode() -> None:
    pool = Pool(3, default_kv_lease_ttl=0.0)
    assert pool.put("pinned", soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000) == OK
    assert pool.put("a") == OK and pool.put("b") == OK
    assert len(pool.hooks.soft_pins) == 1
    assert pool.put("c") == OK and pool.put("d") == OK
    assert pool.exists("pinned")
    assert pool.engine.direct_reclaim(3 * OBJ) == 3 * OBJ
    assert not pool.exists("pinned") and pool.engine.stats.soft_pinned_evicted == 1
    assert len(pool.hooks.soft_pins) == 0
    stats = pool.hooks.stats()
    assert stats["soft_pins"] == 0 and stats["soft_pinned_evicted"] == 1
    assert stats["resident_records"] == 0 and stats["resident_bytes"] == pool.used() == 0


def test_soft_pinned_objects_go_last_across_all_shards_of_a_filling_pool() -> None:
    """With the default shard count, a full pool's puts evict every unpinned object before the
    soft-pinned one, whichever shard each put's reclaim visits first."""
    pool = Pool(12, num_shards=MasterConfig().num_shards, default_kv_lease_ttl=0.0)
    assert pool.put("pinned", soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000) == OK
    for i in range(60):
        assert pool.put(f"k{i}") == OK
        assert pool.exists("pinned"), f"evicted at put {i} while unpinned objects were resident"
    assert pool.engine.stats.evicted == 60 - 11 and pool.engine.stats.soft_pinned_evicted == 0


def test_the_tick_that_expires_a_soft_pin_unparks_the_objects_records() -> None:
    pool = Pool(3, num_shards=1, default_kv_lease_ttl=0.0)
    assert pool.put("pinned", soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=30_000) == OK
    assert pool.put("a") == OK and pool.put("b") == OK
    assert pool.engine.direct_reclaim(OBJ) == OBJ
    assert pool.exists("pinned") and not pool.exists("a")
    assert pool.state("pinned") is ListState.SOFT_PINNED  # looked at once, parked
    pool.clock.advance(31.0)
    pool.hooks.tick(pool.clock())
    assert pool.state("pinned") is ListState.INACTIVE
    assert pool.hooks.stats()["unparked_soft_pinned"] == 1


def test_soft_pins_expire_on_tick_in_deadline_order() -> None:
    pool = Pool(4, default_kv_lease_ttl=0.0, allow_evict_soft_pinned_objects=False)
    for key, ttl in (("late", 90_000), ("early", 30_000)):
        assert pool.put(key, soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=ttl) == OK
    pool.clock.advance(31.0)
    pool.hooks.tick(pool.clock())
    early = pool.svc.index.get("default", "early")
    late = pool.svc.index.get("default", "late")
    assert pool.hooks.soft_pins.deadline(early) is None  # type: ignore[arg-type]
    assert pool.hooks.soft_pins.deadline(late) is not None  # type: ignore[arg-type]
    # Not allowed to evict soft-pinned objects: only the expired pin's object can go.
    assert pool.engine.direct_reclaim(2 * OBJ) == OBJ
    assert not pool.exists("early") and pool.exists("late")


def test_pool_mode_never_loses_an_object_without_somewhere_to_move_it() -> None:
    pool = Pool(2, default_kv_lease_ttl=0.0, eviction_mode="pool")
    assert pool.put("a") == OK and pool.put("b") == OK
    assert pool.start("c") == ErrorCode.NO_AVAILABLE_HANDLE
    assert pool.exists("a") and pool.exists("b")
    assert pool.state("a") is ListState.INACTIVE
    assert pool.engine.stats.swap_outs_refused >= 1


def test_in_a_running_loop_kswapd_runs_as_separate_steps_between_requests() -> None:
    async def main() -> None:
        clock = ManualClock()
        hooks = MasterReclaimHooks(kswapd_step_records=2)
        config = MasterConfig(
            num_shards=4,
            seed=1,
            default_kv_lease_ttl=0.0,
            eviction_high_watermark_ratio=0.8,
            eviction_ratio=0.3,
        )
        svc = MasterService(config, clock=clock, hooks=hooks)
        info = m.SegmentInfo(m.SegmentName("seg"), 20 * OBJ, HOST, "127.0.0.1:1", "")
        svc.handle(m.MountSegment(NODE, HOST, info))

        def used() -> int:
            return svc.memory_usage()[1]

        for i in range(17):
            svc.handle(m.PutStart(WRITER, f"k{i}", OBJ))
            svc.handle(m.PutEnd(WRITER, f"k{i}", 1))
        # Crossing the watermark scheduled kswapd; nothing was reclaimed inside the request.
        assert used() == 17 * OBJ and hooks.engine.kswapd_wanted()
        await asyncio.sleep(0)
        assert used() == 15 * OBJ  # one step of two records, then the loop is free again
        for _ in range(100):
            if not hooks.engine.kswapd_wanted():
                break
            await asyncio.sleep(0)
        assert used() == 10 * OBJ and hooks.engine.stats.kswapd_steps >= 4
        assert hooks.engine.stats.direct_calls == 0

    asyncio.run(main())


def test_a_batch_commit_lists_every_replica_as_puts_do_with_one_hook_call() -> None:
    """BatchPutCommit hands the hooks its completed replicas in one call
    (`on_replicas_complete`): each lands at the head of inactive like a PutEnd's, soft pins
    and hard pins included, the usage counts them all, and kswapd wakes past the watermark."""
    pool = Pool(n=64)
    w = WRITER
    arena = pool.svc.handle(m.ReserveArena(w, 16 * OBJ))
    assert isinstance(arena, m.ArenaReply) and arena.code == OK
    keys = [f"b{i}" for i in range(8)]
    offs = [arena.offset + i * OBJ for i in range(8)]
    pinned = m.ReplicateConfigMsg(
        soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000, with_hard_pin=False
    )
    rep = pool.svc.handle(m.BatchPutCommit(w, arena.arena_id, keys[:4], [OBJ] * 4, offs[:4]))
    assert isinstance(rep, m.BatchReply) and rep.codes == [0] * 4
    rep = pool.svc.handle(
        m.BatchPutCommit(w, arena.arena_id, keys[4:], [OBJ] * 4, offs[4:], config=pinned)
    )
    assert isinstance(rep, m.BatchReply) and rep.codes == [0] * 4
    assert [pool.state(k) for k in keys] == [ListState.INACTIVE] * 8
    assert len(pool.hooks.soft_pins) == 4
    for k in keys[4:]:
        obj = pool.svc.index.get("default", k)
        assert obj is not None and obj.soft_pin_deadline is not None
        assert pool.hooks.soft_pins.deadline(obj) == obj.soft_pin_deadline  # type: ignore[arg-type]
    stats = pool.hooks.stats()
    assert stats["resident_records"] == 8 and stats["resident_bytes"] == 8 * OBJ
    assert pool.put("single") == OK  # and a PutEnd after them lands the same way
    assert pool.state("single") is ListState.INACTIVE
