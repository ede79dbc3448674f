"""ReclaimEngine against the simulated metadata: kswapd, direct reclaim, isolation, pins, modes."""

from __future__ import annotations

import threading

import pytest

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.reclaim import (
    EvictInfo,
    EvictionMode,
    ListState,
    ReclaimConfig,
    ReclaimEngine,
    ReclaimTarget,
    Verdict,
)
from kvpool.master.reclaim.simulated import ManualClock, SimulatedPool
from kvtest.procs import wait_until

SIZE = 100


def make_pool(
    n_objects: int = 10,
    *,
    num_shards: int = 1,
    mode: EvictionMode = EvictionMode.CACHE,
    **cfg: object,
) -> SimulatedPool:
    config = ReclaimConfig(mode=mode, **cfg)  # type: ignore[arg-type]
    return SimulatedPool(n_objects * SIZE, config, num_shards=num_shards, clock=ManualClock())


def fill(pool: SimulatedPool, keys: list[str]) -> None:
    for k in keys:
        assert pool.put(k, SIZE) is ErrorCode.OK


def promote(pool: SimulatedPool, key: str) -> None:
    assert pool.get(key) and pool.get(key)
    assert pool.engine.records_of(key)[0].state is ListState.ACTIVE


def states(pool: SimulatedPool, keys: list[str]) -> list[ListState]:
    return [pool.engine.records_of(k)[0].state for k in keys]


# ---------------------------------------------------------------- online path


def test_put_end_enters_inactive_and_two_reads_promote() -> None:
    pool = make_pool()
    fill(pool, ["a"])
    (r,) = pool.engine.records_of("a")
    assert r.state is ListState.INACTIVE and not r.referenced
    pool.get("a")
    assert r.state is ListState.INACTIVE and r.referenced
    pool.get("a")
    assert r.state is ListState.ACTIVE
    assert pool.engine.stats.promoted == 1


def test_remove_unlinks_the_record() -> None:
    pool = make_pool()
    fill(pool, ["a", "b"])
    (a,) = pool.engine.records_of("a")
    assert pool.remove("a")
    assert a.state is ListState.REMOVED
    assert pool.engine.resident_bytes == SIZE
    assert pool.engine.on_remove("a") == 0  # idempotent


# ---------------------------------------------------------------- direct reclaim


def test_direct_reclaim_takes_the_oldest_inactive_first() -> None:
    pool = make_pool(10)
    fill(pool, [f"k{i}" for i in range(10)])
    assert pool.put("new", SIZE) is ErrorCode.OK  # full: one direct reclaim, retried once
    assert "k0" not in pool.objects and "k1" in pool.objects
    assert pool.engine.stats.direct_passes == 1


def test_direct_reclaim_never_touches_active() -> None:
    pool = make_pool(10)
    keys = [f"k{i}" for i in range(10)]
    fill(pool, keys)
    hot = keys[:4]  # the oldest, so the first in line if active were shrunk
    for k in hot:
        promote(pool, k)
    active_before = [r.key for r in pool.engine.shard(0).active_order()]
    freed = pool.engine.direct_reclaim(10 * SIZE)  # more than inactive holds
    assert freed == 6 * SIZE
    assert [r.key for r in pool.engine.shard(0).active_order()] == active_before
    assert states(pool, hot) == [ListState.ACTIVE] * 4
    assert all(not r.referenced for r in pool.engine.shard(0).active_order())
    # A burst of puts, each needing a direct reclaim, cycles through inactive only.
    fill(pool, [f"n{i}" for i in range(30)])
    assert all(k in pool.objects for k in hot)
    assert states(pool, hot) == [ListState.ACTIVE] * 4
    # With inactive empty, a put fails rather than scatter the hot set.
    for k in [f"n{i}" for i in range(24, 30)]:
        pool.remove(k)
    fill(pool, [f"m{i}" for i in range(6)])
    for k in [f"m{i}" for i in range(6)]:
        promote(pool, k)
    assert pool.put("one-too-many", SIZE) is ErrorCode.NO_AVAILABLE_HANDLE
    assert all(k in pool.objects for k in hot)


def test_put_without_direct_reclaim_fails_and_wakes_nothing_synchronously() -> None:
    pool = make_pool(2)
    fill(pool, ["a", "b"])
    assert pool.put("c", SIZE, allow_direct_reclaim=False) is ErrorCode.NO_AVAILABLE_HANDLE
    assert pool.engine.stats.direct_calls == 0 and set(pool.objects) == {"a", "b"}


def test_direct_reclaim_from_inside_a_pass_is_refused() -> None:
    pool = make_pool(4)
    fill(pool, ["a", "b", "c", "d"])
    inner: list[int] = []
    real_drop = pool.drop

    def drop_that_reclaims(rec: EvictInfo[str]) -> int:
        # A swap-out or offload that allocates would land here; it must not recurse.
        inner.append(pool.engine.direct_reclaim(SIZE))
        return real_drop(rec)

    pool.drop = drop_that_reclaims  # type: ignore[method-assign]
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert inner == [0] and pool.engine.stats.direct_refused == 1


def test_no_direct_reclaim_block_refuses_on_this_thread_only() -> None:
    pool = make_pool(2)
    fill(pool, ["a", "b"])
    with pool.engine.no_direct_reclaim():
        assert pool.put("c", SIZE) is ErrorCode.NO_AVAILABLE_HANDLE
    assert pool.put("c", SIZE) is ErrorCode.OK


class GatedPool(SimulatedPool):
    """Blocks the first inspect until released, so other reclaimers can pile up meanwhile."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.entered = threading.Event()
        self.release = threading.Event()
        self.inspects = 0

    def inspect(self, rec: EvictInfo[str], now: float) -> Verdict:
        self.inspects += 1
        self.entered.set()
        assert self.release.wait(10)
        return super().inspect(rec, now)


def test_concurrent_direct_reclaims_share_one_pass() -> None:
    pool = GatedPool(20 * SIZE, ReclaimConfig(), num_shards=1, clock=ManualClock())
    fill(pool, [f"k{i}" for i in range(20)])
    results: dict[str, int] = {}

    def reclaim(name: str, nbytes: int) -> None:
        results[name] = pool.engine.direct_reclaim(nbytes)

    leader = threading.Thread(target=reclaim, args=("leader", SIZE))
    leader.start()
    assert pool.entered.wait(10)
    followers = [threading.Thread(target=reclaim, args=(f"f{i}", 2 * SIZE)) for i in range(3)]
    for t in followers:
        t.start()
    wait_until(lambda: pool.engine.direct_waiters() == 3, what="three followers waiting")
    pool.release.set()
    for t in [leader, *followers]:
        t.join(10)
    # The leader's pass served itself; the three followers were served by one more pass
    # covering the sum of their needs, not by three passes.
    assert pool.engine.stats.direct_calls == 4
    assert pool.engine.stats.direct_passes == 2
    assert results["leader"] == SIZE
    assert results["f0"] == results["f1"] == results["f2"] == 6 * SIZE
    assert len(pool.objects) == 20 - 7


# ---------------------------------------------------------------- kswapd


def test_kswapd_wakes_above_high_watermark_and_stops_at_low() -> None:
    pool = make_pool(100, high_watermark_ratio=0.9, eviction_ratio=0.2)
    wakeups: list[int] = []
    pool.engine.wakeup = lambda: wakeups.append(1)
    fill(pool, [f"k{i}" for i in range(90)])
    assert not pool.engine.kswapd_wanted() and wakeups == []
    fill(pool, ["k90"])
    assert pool.engine.kswapd_wanted() and wakeups == [1]
    result = pool.engine.kswapd_pass()
    assert pool.used == 70 * SIZE  # low watermark = 0.9 - 0.2
    assert result.freed == 21 * SIZE
    assert not pool.engine.kswapd_wanted()
    assert pool.engine.kswapd_step().freed == 0


def test_allocation_failure_wakes_kswapd_below_the_watermark() -> None:
    pool = make_pool(10, high_watermark_ratio=1.0, eviction_ratio=0.5)
    fill(pool, [f"k{i}" for i in range(10)])
    assert not pool.engine.kswapd_wanted()
    pool.put("big", 3 * SIZE)
    assert pool.engine.kswapd_wanted()
    pool.engine.kswapd_pass()
    assert pool.used <= 5 * SIZE


def test_kswapd_keeps_active_within_its_share_and_spares_referenced() -> None:
    pool = make_pool(10, inactive_ratio=1.0)
    keys = [f"k{i}" for i in range(10)]
    fill(pool, keys)
    for k in keys[:8]:
        promote(pool, k)
    pool.get("k0")  # referenced while active: a second chance
    result = pool.engine.kswapd_pass(SIZE)
    assert result.freed == SIZE
    lists = pool.engine.shard(0)
    # Active may hold at most as much as inactive after the pass (8 active, 2 inactive before).
    assert lists.active_bytes <= lists.inactive_bytes + SIZE
    assert pool.engine.records_of("k0")[0].state is ListState.ACTIVE
    # k1 was the coldest active record: demoted, then evicted as the oldest of inactive? No:
    # demoted records go to the head of inactive, so the old inactive tail (k8) went first.
    assert "k8" not in pool.objects and "k1" in pool.objects


def test_kswapd_shrinks_active_when_inactive_cannot_cover_the_quota() -> None:
    pool = make_pool(4)
    keys = ["a", "b", "c", "d"]
    fill(pool, keys)
    for k in keys:
        promote(pool, k)
    assert pool.engine.direct_reclaim(SIZE) == 0  # direct reclaim will not touch active
    assert pool.engine.kswapd_pass(SIZE).freed == SIZE  # kswapd will
    assert "a" not in pool.objects


def test_a_referenced_inactive_record_gets_one_more_trip_not_a_promotion() -> None:
    pool = make_pool(3)
    fill(pool, ["a", "b", "c"])
    pool.get("a")
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert "a" in pool.objects and "b" not in pool.objects
    (a,) = pool.engine.records_of("a")
    assert a.state is ListState.INACTIVE and not a.referenced
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert "c" not in pool.objects
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert "a" not in pool.objects


# ---------------------------------------------------------------- stale generations


def test_removed_and_reput_key_drops_the_stale_record_on_the_next_pass() -> None:
    pool = make_pool(10)
    fill(pool, ["k", "x"])
    (old,) = pool.engine.records_of("k")
    pool.remove("k")
    fill(pool, ["k"])
    (new,) = pool.engine.records_of("k")
    assert new.generation > old.generation
    promote(pool, "k")
    # A late PutEnd report (or a stale reference) relinks the old generation's record.
    stale = pool.engine.on_complete("k", old.replica_id, SIZE, generation=old.generation)
    assert stale.state is ListState.INACTIVE and pool.engine.records_of("k") == [new]
    # The pass meets it after "x", finds it stale and drops it, freeing nothing for it.
    assert pool.engine.direct_reclaim(2 * SIZE) == SIZE
    assert stale.state is ListState.REMOVED and pool.engine.stats.stale == 1
    assert "x" not in pool.objects and "k" in pool.objects
    assert new.state is ListState.ACTIVE and pool.engine.records_of("k") == [new]
    assert pool.engine.resident_bytes == SIZE


def test_stale_record_of_a_vanished_object_is_dropped_without_freeing() -> None:
    pool = make_pool(10)
    fill(pool, ["gone", "kept"])
    (r,) = pool.engine.records_of("gone")
    del pool.objects["gone"]  # metadata lost it without telling the engine
    pool.used -= SIZE
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert r.state is ListState.REMOVED and "kept" not in pool.objects
    assert pool.engine.stats.stale == 1


# ---------------------------------------------------------------- quota split


def two_shard_pool(n: int) -> SimulatedPool:
    return SimulatedPool(
        n * SIZE,
        ReclaimConfig(),
        num_shards=2,
        clock=ManualClock(),
        shard_of=lambda k: 0 if k.startswith("a") else 1,
    )


def test_quota_is_split_by_each_shards_share_of_used_bytes() -> None:
    pool = two_shard_pool(400)
    fill(pool, [f"a{i}" for i in range(300)] + [f"b{i}" for i in range(100)])
    result = pool.engine.kswapd_pass(40 * SIZE)
    assert result.freed == 40 * SIZE
    a_left = sum(1 for k in pool.objects if k.startswith("a"))
    b_left = sum(1 for k in pool.objects if k.startswith("b"))
    assert (300 - a_left, 100 - b_left) == (30, 10)


def test_small_reclaims_visit_one_shard_each_and_stay_proportional() -> None:
    pool = two_shard_pool(2000)
    fill(pool, [f"a{i}" for i in range(1500)] + [f"b{i}" for i in range(500)])
    for _ in range(400):
        before = pool.engine.stats.isolated
        assert pool.engine.direct_reclaim(SIZE) == SIZE
        assert pool.engine.stats.isolated - before == 1  # one record of one shard
    a_gone = 1500 - sum(1 for k in pool.objects if k.startswith("a"))
    # ~3:1 (300 of 400) over many small passes; an even split would give 200.
    assert 260 <= a_gone <= 340


def test_a_shard_that_cannot_give_its_share_is_covered_by_the_others() -> None:
    pool = two_shard_pool(20)
    fill(pool, [f"a{i}" for i in range(10)])
    for i in range(10):
        assert pool.put(f"b{i}", SIZE, hard_pin=True) is ErrorCode.OK
    assert pool.engine.kswapd_pass(4 * SIZE).freed == 4 * SIZE
    assert sum(1 for k in pool.objects if k.startswith("b")) == 10


# ---------------------------------------------------------------- pins, leases, transfers


def test_leased_objects_are_never_evicted() -> None:
    pool = make_pool(4)
    pool.lease_ttl_s = 10.0
    fill(pool, ["a", "b", "c", "d"])
    assert pool.get("a")  # a read grants a lease (and marks the record referenced)
    freed = pool.engine.direct_reclaim(4 * SIZE)
    assert freed == 3 * SIZE and set(pool.objects) == {"a"}
    assert pool.engine.direct_reclaim(SIZE) == 0  # referenced bit spent, lease still live
    assert pool.engine.stats.kept_leased == 1
    pool.clock.advance(11.0)  # type: ignore[attr-defined]
    assert pool.engine.direct_reclaim(SIZE) == SIZE and "a" not in pool.objects


def test_a_replica_in_flight_is_never_freed_under_its_transfer() -> None:
    pool = make_pool(2)
    fill(pool, ["a", "b"])
    pool.objects["a"].replicas[pool.engine.records_of("a")[0].replica_id].busy = 1
    assert pool.engine.direct_reclaim(2 * SIZE) == SIZE
    assert "a" in pool.objects and pool.engine.stats.kept_busy == 1


def test_hard_pinned_objects_are_never_evicted_but_still_removable() -> None:
    pool = make_pool(3)
    assert pool.put("pinned", SIZE, hard_pin=True) is ErrorCode.OK
    fill(pool, ["a", "b"])
    assert pool.engine.kswapd_pass(3 * SIZE).freed == 2 * SIZE
    assert "pinned" in pool.objects
    assert pool.engine.records_of("pinned")[0].state is ListState.UNEVICTABLE
    assert pool.remove("pinned") and pool.engine.resident_bytes == 0


def test_a_record_found_hard_pinned_is_parked_and_not_rescanned() -> None:
    pool = make_pool(3)
    fill(pool, ["p", "a"])
    pool.objects["p"].hard_pinned = True  # pinned after the record was listed
    pool.engine.direct_reclaim(SIZE)
    assert pool.engine.records_of("p")[0].state is ListState.UNEVICTABLE
    assert pool.engine.stats.parked_hard_pinned == 1
    inspected = pool.engine.stats.isolated
    pool.engine.direct_reclaim(SIZE)
    assert pool.engine.stats.isolated == inspected  # nothing left to look at


def test_cache_mode_evicts_soft_pinned_objects_last() -> None:
    pool = make_pool(4)
    pool.put("pinned", SIZE, soft_pin_ttl_s=60.0)
    fill(pool, ["a", "b", "c"])
    assert pool.engine.direct_reclaim(3 * SIZE) == 3 * SIZE
    assert set(pool.objects) == {"pinned"}
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert pool.objects == {} and pool.engine.stats.soft_pinned_evicted == 1


DEFAULT_SHARDS = MasterConfig().num_shards


@pytest.mark.parametrize("need", [1, 3, 8])
@pytest.mark.parametrize("kswapd", [False, True], ids=["direct", "kswapd"])
def test_cache_mode_evicts_no_soft_pinned_object_while_any_shard_has_an_unpinned_one(
    need: int, kswapd: bool
) -> None:
    """Soft-pinned objects go last across the whole pool, not only within one shard's pass:
    whichever shards a pass visits, the pinned object (the oldest) outlives every unpinned one,
    and goes only once none is left."""
    for trial in range(8):
        pool = SimulatedPool(12 * SIZE, num_shards=DEFAULT_SHARDS, clock=ManualClock())
        pinned = f"pinned-{trial}"
        pool.put(pinned, SIZE, soft_pin_ttl_s=60.0)
        fill(pool, [f"t{trial}-k{i}" for i in range(11)])
        while len(pool.objects) > 1:
            unpinned = len(pool.objects) - 1
            if kswapd:
                pool.engine.kswapd_pass(need * SIZE)
            else:
                pool.engine.direct_reclaim(need * SIZE)
            left = len(pool.objects) - (pinned in pool.objects)
            assert left == max(0, unpinned - need), f"trial {trial}: not the unpinned first"
            assert pinned in pool.objects or left == 0, f"trial {trial}: pinned went first"
        assert pool.engine.stats.soft_pinned_evicted == (0 if pinned in pool.objects else 1)
        assert pool.engine.direct_reclaim(SIZE) + pool.engine.kswapd_pass(SIZE).freed <= SIZE
        assert pool.objects == {}, "a soft-pinned object may still go when nothing else can"


def test_direct_reclaim_ages_active_before_it_evicts_a_soft_pinned_object() -> None:
    """An unpinned object in active is still evictable: it goes before a soft-pinned one."""
    pool = make_pool(3)
    pool.put("pinned", SIZE, soft_pin_ttl_s=60.0)
    fill(pool, ["hot"])
    promote(pool, "hot")
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert set(pool.objects) == {"pinned"}
    assert pool.engine.records_of("pinned")[0].state is ListState.SOFT_PINNED
    assert pool.engine.stats.parked_soft_pinned == 1 and pool.engine.stats.soft_pinned_evicted == 0


def test_direct_reclaim_without_soft_pins_leaves_active_alone() -> None:
    pool = make_pool(3)
    fill(pool, ["hot", "cold"])
    promote(pool, "hot")
    pool.objects["cold"].lease_deadline = 1e9
    assert pool.engine.direct_reclaim(SIZE) == 0
    assert pool.engine.records_of("hot")[0].state is ListState.ACTIVE


def test_more_soft_pinned_records_than_one_pass_scans_do_not_hide_the_unpinned_ones() -> None:
    """Parked soft-pinned records cost later passes nothing: with far more of them than
    `scan_limit` in front of the unpinned ones, every put still takes an unpinned object."""
    pool = make_pool(45, num_shards=DEFAULT_SHARDS, scan_limit=16)
    for i in range(40):
        pool.put(f"pinned{i}", SIZE, soft_pin_ttl_s=60.0)
    fill(pool, [f"k{i}" for i in range(5)])
    for i in range(5):
        assert pool.put(f"new{i}", SIZE) is ErrorCode.OK
    assert pool.engine.stats.soft_pinned_evicted == 0
    assert sum(k.startswith("pinned") for k in pool.objects) == 40
    # Each pinned record was looked at no more than once, then parked.
    assert pool.engine.stats.parked_soft_pinned <= 40 and pool.engine.stats.isolated <= 45


def test_a_soft_pin_that_ends_puts_its_parked_record_back_among_the_unpinned() -> None:
    pool = make_pool(3)
    pool.put("pinned", SIZE, soft_pin_ttl_s=60.0)
    fill(pool, ["a", "b"])
    pool.objects["a"].lease_deadline = 1e9
    assert pool.engine.direct_reclaim(SIZE) == SIZE  # b; the pinned one is parked on the way
    (rec,) = pool.engine.records_of("pinned")
    assert rec.state is ListState.SOFT_PINNED and set(pool.objects) == {"pinned", "a"}
    pool.clock.advance(61.0)  # type: ignore[attr-defined]
    assert pool.expire_soft_pins() == 1
    assert rec.state is ListState.INACTIVE and pool.engine.stats.unparked_soft_pinned == 1
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert set(pool.objects) == {"a"} and pool.engine.stats.soft_pinned_evicted == 0


def test_a_parked_record_whose_pin_ran_out_before_the_tick_is_evicted_as_unpinned() -> None:
    pool = make_pool(3)
    pool.put("pinned", SIZE, soft_pin_ttl_s=60.0)
    fill(pool, ["a", "b"])
    pool.objects["a"].lease_deadline = 1e9
    assert pool.engine.direct_reclaim(SIZE) == SIZE  # b; the pinned one is parked
    pool.clock.advance(61.0)  # type: ignore[attr-defined]  (no tick: still parked)
    assert pool.engine.records_of("pinned")[0].state is ListState.SOFT_PINNED
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert set(pool.objects) == {"a"}
    assert pool.engine.stats.soft_pinned_evicted == 0
    assert pool.engine.stats.unparked_soft_pinned == 1


def test_a_referenced_parked_record_gets_one_more_trip_before_it_is_evicted() -> None:
    pool = make_pool(4)
    for k in ("p1", "p2"):
        pool.put(k, SIZE, soft_pin_ttl_s=60.0)
    fill(pool, ["b", "a"])
    pool.objects["a"].lease_deadline = 1e9
    assert pool.engine.direct_reclaim(SIZE) == SIZE  # b; p1 and p2 parked on the way
    assert pool.get("p1")  # the bit only: a parked record is not promoted
    assert pool.engine.records_of("p1")[0].state is ListState.SOFT_PINNED
    kept = pool.engine.stats.kept_referenced
    assert pool.engine.direct_reclaim(SIZE) == SIZE
    assert set(pool.objects) == {"p1", "a"}
    assert pool.engine.stats.kept_referenced == kept + 1
    assert not pool.engine.records_of("p1")[0].referenced


def test_cache_mode_never_evicts_soft_pinned_when_not_allowed_until_the_pin_expires() -> None:
    pool = make_pool(2, allow_evict_soft_pinned=False)
    pool.put("pinned", SIZE, soft_pin_ttl_s=60.0)
    fill(pool, ["a"])
    assert pool.engine.direct_reclaim(2 * SIZE) == SIZE
    assert set(pool.objects) == {"pinned"}
    pool.clock.advance(61.0)  # type: ignore[attr-defined]
    assert pool.expire_soft_pins() == 1
    assert pool.objects["pinned"].soft_pin_deadline == 0.0
    assert pool.engine.direct_reclaim(SIZE) == SIZE and pool.objects == {}


# ---------------------------------------------------------------- pool mode


def test_pool_mode_drops_non_primary_replicas_and_swaps_out_primaries() -> None:
    pool = make_pool(6, mode=EvictionMode.POOL)
    pool.remote_capacity = 10 * SIZE
    assert pool.put("two", SIZE, replicas=2) is ErrorCode.OK
    fill(pool, ["a", "b"])
    primary, secondary = sorted(pool.engine.records_of("two"), key=lambda r: r.replica_id)
    freed = pool.engine.direct_reclaim(4 * SIZE)
    # Only the non-primary replica can be dropped at once; the rest are moving, still resident.
    assert freed == SIZE and secondary.state is ListState.REMOVED
    assert primary.state is ListState.MIGRATING
    assert pool.used == 3 * SIZE and pool.engine.migrating_bytes == 3 * SIZE
    assert pool.finish_swap_outs() == 3
    assert pool.used == 0 and pool.engine.migrating_bytes == 0
    # Nothing was lost: every object still exists, now outside this memory.
    assert set(pool.objects) == {"two", "a", "b"}
    assert pool.engine.stats.swap_outs_moved == 3 and pool.engine.resident_bytes == 0


def test_pool_mode_soft_pinned_replicas_move_even_when_not_primary() -> None:
    pool = make_pool(4, mode=EvictionMode.POOL)
    pool.remote_capacity = 10 * SIZE
    pool.put("sp", SIZE, replicas=2, soft_pin_ttl_s=60.0)
    assert pool.engine.direct_reclaim(2 * SIZE) == 0
    assert [r.state for r in pool.engine.records_of("sp")] == [ListState.MIGRATING] * 2


def test_pool_mode_put_fails_with_no_available_handle_when_nothing_can_take_it() -> None:
    pool = make_pool(3, mode=EvictionMode.POOL)  # remote_capacity 0: no other memory
    pool.put("sp", SIZE, soft_pin_ttl_s=60.0)
    fill(pool, ["a", "b"])
    assert pool.put("c", SIZE) is ErrorCode.NO_AVAILABLE_HANDLE
    assert set(pool.objects) == {"sp", "a", "b"}  # nothing lost
    assert all(
        r.state is ListState.INACTIVE for k in ("sp", "a", "b") for r in pool.engine.records_of(k)
    )
    assert pool.engine.stats.swap_outs_refused == 3


def test_pool_mode_failed_swap_out_puts_the_record_back() -> None:
    pool = make_pool(2, mode=EvictionMode.POOL)
    pool.remote_capacity = 10 * SIZE
    fill(pool, ["a", "b"])
    pool.engine.direct_reclaim(SIZE)
    assert pool.finish_swap_outs(ok=False) == 1
    (a,) = pool.engine.records_of("a")
    assert a.state is ListState.INACTIVE and pool.used == 2 * SIZE
    assert pool.engine.stats.swap_outs_failed == 1 and pool.remote_used == 0


def test_pool_mode_kswapd_counts_moving_bytes_toward_its_target() -> None:
    pool = make_pool(10, mode=EvictionMode.POOL, high_watermark_ratio=0.8, eviction_ratio=0.3)
    pool.remote_capacity = 100 * SIZE
    fill(pool, [f"k{i}" for i in range(9)])
    pool.engine.kswapd_pass()
    assert pool.engine.migrating_bytes == 4 * SIZE  # 9 - 5 (low watermark), none twice
    assert pool.engine.kswapd_step().pending == 0
    pool.finish_swap_outs()
    assert pool.used == 5 * SIZE


def test_removing_an_object_while_it_moves_retires_its_record() -> None:
    pool = make_pool(2, mode=EvictionMode.POOL)
    pool.remote_capacity = 10 * SIZE
    fill(pool, ["a", "b"])
    pool.engine.direct_reclaim(SIZE)
    (a,) = pool.engine.records_of("a")
    pool.remove("a")
    assert a.state is ListState.REMOVED
    pool.finish_swap_outs()
    assert a.state is ListState.REMOVED and pool.engine.migrating_bytes == 0


# ---------------------------------------------------------------- cost


class CountingTarget(ReclaimTarget[int]):
    """Every record is evictable; counts how many the engine had to look at."""

    def __init__(self) -> None:
        self.used = 0
        self.inspected = 0

    def memory_usage(self) -> tuple[int, int]:
        return 1 << 60, self.used

    def inspect(self, rec: EvictInfo[int], now: float) -> Verdict:
        self.inspected += 1
        return Verdict.DROPPABLE

    def drop(self, rec: EvictInfo[int]) -> int:
        self.used -= rec.size
        return rec.size

    def swap_out(self, rec: EvictInfo[int]) -> bool:
        return False


@pytest.mark.parametrize("resident", [1_000, 50_000])
def test_work_per_evicted_object_does_not_depend_on_resident_objects(resident: int) -> None:
    target = CountingTarget()
    engine: ReclaimEngine[int] = ReclaimEngine(target, num_shards=16)
    for i in range(resident):
        engine.on_complete(i, i, SIZE)
    target.used = resident * SIZE
    for _ in range(100):
        assert engine.direct_reclaim(SIZE) == SIZE
    assert target.inspected == 100 and engine.stats.isolated == 100


def test_a_failing_target_never_strands_isolated_records() -> None:
    pool = make_pool(10)
    fill(pool, [f"k{i}" for i in range(10)])
    real_inspect = pool.inspect

    def broken(rec: EvictInfo[str], now: float) -> Verdict:
        if rec.key == "k2":
            raise RuntimeError("bug in the metadata")
        return real_inspect(rec, now)

    pool.inspect = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        pool.engine.kswapd_pass(5 * SIZE)
    assert set(pool.objects) == {f"k{i}" for i in range(2, 10)}  # k0, k1 went before it
    states = {r.state for k in pool.objects for r in pool.engine.records_of(k)}
    assert states == {ListState.INACTIVE}
    # k2 went back to the tail, where it was: the next pass meets it first.
    assert pool.engine.shard(0).inactive_order()[0].key == "k2"


def test_a_pass_looks_at_no_more_than_its_scan_limit() -> None:
    pool = make_pool(1000, scan_limit=64)
    pool.lease_ttl_s = 10.0
    fill(pool, [f"k{i}" for i in range(1000)])
    for i in range(1000):
        pool.objects[f"k{i}"].lease_deadline = pool.clock() + 10.0
    assert pool.put("one-more", SIZE) is ErrorCode.NO_AVAILABLE_HANDLE
    assert pool.engine.stats.kept_leased == 64  # not all 1,000
    # Kept records rotated to the head: the next pass looks at 64 others.
    first = {r.key for r in pool.engine.shard(0).inactive_order()[:64]}
    assert "k0" not in first and "k64" in first


def test_pool_mode_asks_for_a_swap_out_once_per_pass_when_nothing_can_take_it() -> None:
    pool = make_pool(4, mode=EvictionMode.POOL)  # no remote memory
    fill(pool, ["a", "b", "c", "d"])
    asked: list[str] = []
    real = pool.swap_out

    def counting(rec: EvictInfo[str]) -> bool:
        asked.append(rec.key)
        return real(rec)

    pool.swap_out = counting  # type: ignore[method-assign]
    assert pool.engine.direct_reclaim(4 * SIZE) == 0
    assert asked == ["a"]
    assert set(pool.objects) == {"a", "b", "c", "d"}


def test_kswapd_sleeps_between_the_low_and_the_high_watermark() -> None:
    pool = make_pool(100, high_watermark_ratio=0.9, eviction_ratio=0.2, kswapd_step_records=4)
    fill(pool, [f"k{i}" for i in range(91)])
    steps = 0
    while pool.engine.kswapd_wanted():
        pool.engine.kswapd_step()
        steps += 1
    assert pool.used == 70 * SIZE and steps == 6  # 21 records, 4 per step
    # Puts below the high watermark do not wake it, even one record above the low one.
    for i in range(20):
        fill(pool, [f"n{i}"])
        assert not pool.engine.kswapd_wanted()
    fill(pool, ["n20"])
    assert pool.engine.kswapd_wanted()


def test_an_access_racing_a_pass_only_marks_the_isolated_record() -> None:
    pool = make_pool(10)
    fill(pool, [f"k{i}" for i in range(10)])
    real_inspect = pool.inspect

    def inspect_while_reads_arrive(rec: EvictInfo[str], now: float) -> Verdict:
        if rec.key == "k0":
            # Two reads of k1 land while k0..k3 are isolated (outside the list lock): on a
            # listed record they would promote it; on an isolated one they only set the bit.
            pool.get("k1")
            pool.get("k1")
            (k1,) = pool.engine.records_of("k1")
            assert k1.state is ListState.ISOLATED and k1.referenced
            assert pool.engine.shard(0).active_order() == []
        return real_inspect(rec, now)

    pool.inspect = inspect_while_reads_arrive  # type: ignore[method-assign]
    assert pool.engine.direct_reclaim(4 * SIZE) == 4 * SIZE
    # The pass saw k1's bit: kept it (one more trip) and took k4 instead.
    assert "k1" in pool.objects and "k4" not in pool.objects
    (k1,) = pool.engine.records_of("k1")
    assert k1.state is ListState.INACTIVE and not k1.referenced
    assert pool.engine.stats.promoted == 0


def test_a_drop_that_frees_nothing_keeps_the_record_listed() -> None:
    pool = make_pool(2)
    fill(pool, ["a", "b"])
    pool.drop = lambda rec: 0  # type: ignore[method-assign,assignment]
    assert pool.engine.direct_reclaim(SIZE) == 0
    # Still tracked: a later pass (with a working drop) can evict it.
    assert [r.state for r in pool.engine.records_of("a")] == [ListState.INACTIVE]
    del pool.drop
    assert pool.engine.direct_reclaim(SIZE) == SIZE
