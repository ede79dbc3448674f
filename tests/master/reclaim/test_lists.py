"""The per-shard list state machine: O(1) online transitions and isolation (seed 001)."""

from __future__ import annotations

from kvpool.master.reclaim import EvictInfo, ListState, ReclaimLists


def rec(key: str, replica: int = 1, generation: int = 1, size: int = 100) -> EvictInfo[str]:
    return EvictInfo(key, replica, generation, size, shard=0)


def keys(records: list[EvictInfo[str]]) -> list[str]:
    return [r.key for r in records]


def test_new_replica_enters_the_head_of_inactive() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    for k in "abc":
        lists.add(rec(k))
    assert keys(lists.inactive_order()) == ["a", "b", "c"]  # tail (next victim) first
    assert lists.active_order() == []
    assert lists.inactive_bytes == 300 and lists.resident_bytes == 300


def test_single_access_marks_referenced_but_does_not_promote() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    r = lists.add(rec("a"))
    assert lists.mark_accessed("a") == 0
    assert r.state is ListState.INACTIVE and r.referenced
    assert keys(lists.inactive_order()) == ["a"]


def test_second_access_while_inactive_promotes_to_the_head_of_active() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    a = lists.add(rec("a"))
    lists.add(rec("b"))
    lists.mark_accessed("a")
    assert lists.mark_accessed("a") == 1
    assert a.state is ListState.ACTIVE and not a.referenced
    assert keys(lists.active_order()) == ["a"]
    assert keys(lists.inactive_order()) == ["b"]
    assert (lists.active_bytes, lists.inactive_bytes) == (100, 100)


def test_access_to_an_active_record_only_sets_referenced() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    a = lists.add(rec("a"))
    b = lists.add(rec("b"))
    for k in ("a", "a", "b", "b"):
        lists.mark_accessed(k)
    assert keys(lists.active_order()) == ["a", "b"]
    assert lists.mark_accessed("a") == 0
    assert a.referenced and a.state is ListState.ACTIVE and not b.referenced
    assert keys(lists.active_order()) == ["a", "b"]  # no reordering on the online path


def test_access_to_an_unknown_key_is_a_no_op() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    assert lists.mark_accessed("nope") == 0


def test_remove_unlinks_every_replica_and_is_idempotent() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    r1 = lists.add(rec("a", replica=1))
    r2 = lists.add(rec("a", replica=2))
    lists.add(rec("b"))
    lists.mark_accessed("a")
    lists.mark_accessed("a")  # both replicas of "a" promoted
    assert {r.replica_id for r in lists.records_of("a")} == {1, 2}
    assert len(lists.remove("a")) == 2
    assert r1.state is ListState.REMOVED and r2.state is ListState.REMOVED
    assert lists.remove("a") == []
    assert keys(lists.inactive_order()) == ["b"] and lists.active_order() == []
    assert lists.resident_bytes == 100 and lists.active_bytes == 0


def test_complete_reported_twice_for_one_replica_keeps_one_record() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    first = lists.add(rec("a"))
    again = lists.add(rec("a"))
    assert again is first
    assert lists.resident_count == 1 and lists.resident_bytes == 100


def test_remove_of_another_generation_leaves_the_current_one() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    lists.add(rec("a", generation=1))
    lists.remove("a", generation=1)
    current = lists.add(rec("a", replica=7, generation=2))
    assert lists.remove("a", generation=1) == []
    assert current.state is ListState.INACTIVE
    assert lists.records_of("a") == [current]


def test_late_report_of_an_older_generation_is_listed_but_not_indexed() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    current = lists.add(rec("a", replica=2, generation=5))
    stale = lists.add(rec("a", replica=1, generation=4))
    assert lists.records_of("a") == [current]
    assert stale.state is ListState.INACTIVE  # lingers until a pass finds it stale
    lists.mark_accessed("a")
    assert not stale.referenced


def test_isolation_takes_the_oldest_under_a_new_epoch() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    for k in "abcde":
        lists.add(rec(k))
    epoch, batch = lists.isolate_inactive(3)
    assert keys(batch) == ["a", "b", "c"]
    assert all(r.state is ListState.ISOLATED and r.epoch == epoch for r in batch)
    assert keys(lists.inactive_order()) == ["d", "e"]
    assert lists.inactive_bytes == 200 and lists.resident_bytes == 500
    epoch2, _ = lists.isolate_inactive(1)
    assert epoch2 == epoch + 1


def test_an_isolated_record_is_not_moved_by_a_concurrent_access() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    for k in "abc":
        lists.add(rec(k))
    epoch, batch = lists.isolate_inactive(2)
    a = batch[0]
    # Two accesses would promote an inactive record; an isolated one only gets the bit.
    assert lists.mark_accessed("a") == 0
    assert lists.mark_accessed("a") == 0
    assert a.state is ListState.ISOLATED and a.referenced and a.epoch == epoch
    assert lists.active_order() == [] and keys(lists.inactive_order()) == ["c"]
    # The pass that holds the epoch relinks it; the heat bit it gained is kept.
    assert lists.putback(batch, epoch, ListState.INACTIVE) == 2
    assert keys(lists.inactive_order()) == ["c", "a", "b"]
    assert a.state is ListState.INACTIVE and a.referenced


def test_a_record_removed_while_isolated_is_not_put_back() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    lists.add(rec("a"))
    lists.add(rec("b"))
    epoch, batch = lists.isolate_inactive(2)
    assert len(lists.remove("a")) == 1
    assert batch[0].state is ListState.REMOVED
    assert lists.putback(batch, epoch, ListState.INACTIVE) == 1
    assert keys(lists.inactive_order()) == ["b"]
    assert lists.resident_bytes == 100 and lists.inactive_bytes == 100


def test_putback_with_a_wrong_epoch_does_nothing() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    lists.add(rec("a"))
    epoch, batch = lists.isolate_inactive(1)
    assert lists.putback(batch, epoch + 1, ListState.INACTIVE) == 0
    assert batch[0].state is ListState.ISOLATED


def test_putback_at_the_tail_restores_the_old_order() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    for k in "abcd":
        lists.add(rec(k))
    epoch, batch = lists.isolate_inactive(3)
    lists.putback(batch[1:], epoch, ListState.INACTIVE, at_tail=True)
    assert keys(lists.inactive_order()) == ["b", "c", "d"]


def test_hard_pinned_records_are_parked_off_the_lists_but_removable() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    p = lists.add(rec("p"), unevictable=True)
    assert p.state is ListState.UNEVICTABLE
    assert lists.inactive_order() == [] and lists.counts() == (0, 0, 1)
    assert lists.isolate_inactive(10)[1] == []
    assert len(lists.remove("p")) == 1
    assert lists.counts() == (0, 0, 0) and lists.resident_bytes == 0


def test_shrink_active_demotes_unreferenced_and_gives_referenced_a_second_chance() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    for k in "abcd":
        lists.add(rec(k))
        lists.mark_accessed(k)
        lists.mark_accessed(k)
    assert keys(lists.active_order()) == ["a", "b", "c", "d"]
    lists.mark_accessed("a")  # a is referenced: survives one scan
    demoted, scanned = lists.shrink_active(200, max_scan=10, chunk=2)
    assert demoted == 200 and scanned == 3
    assert keys(lists.inactive_order()) == ["b", "c"]
    assert keys(lists.active_order()) == ["d", "a"]
    assert not lists.records_of("a")[0].referenced


def test_migration_keeps_bytes_resident_until_it_reports() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    lists.add(rec("a"))
    lists.add(rec("b"))
    epoch, (a, b) = lists.isolate_inactive(2)
    assert lists.start_migration(a, epoch) and lists.start_migration(b, epoch)
    assert lists.resident_bytes == 200
    assert lists.end_migration(a, moved=True)
    assert a.state is ListState.REMOVED and lists.records_of("a") == []
    assert not lists.end_migration(b, moved=False)
    assert b.state is ListState.INACTIVE and keys(lists.inactive_order()) == ["b"]
    assert lists.resident_bytes == 100


def test_soft_pinned_records_park_on_their_own_ring_and_unpark_to_the_inactive_head() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    for k in "abc":
        lists.add(rec(k))
    epoch, (a, b) = lists.isolate_inactive(2)
    assert lists.park_soft_pinned(a, epoch) and lists.park_soft_pinned(b, epoch)
    assert not lists.park_soft_pinned(a, epoch)  # not isolated any more
    assert a.state is ListState.SOFT_PINNED
    assert keys(lists.soft_pinned_order()) == ["a", "b"] and keys(lists.inactive_order()) == ["c"]
    assert lists.soft_pinned_len == 2 and lists.soft_pinned_bytes == 200
    assert lists.inactive_bytes == 100 and lists.resident_bytes == 300
    assert lists.isolate_inactive(10)[1] == [lists.records_of("c")[0]]  # the ring is not inactive
    lists.mark_accessed("a")  # parked: only the bit
    assert a.state is ListState.SOFT_PINNED and a.referenced
    assert lists.unpark("a") == 1 and lists.unpark("a") == 0
    assert a.state is ListState.INACTIVE and keys(lists.inactive_order()) == ["a"]
    assert lists.soft_pinned_bytes == 100 and lists.inactive_bytes == 100


def test_isolating_the_soft_pinned_ring_takes_the_longest_parked_first() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    for k in "abcd":
        lists.add(rec(k))
    epoch, batch = lists.isolate_inactive(4)
    for r in batch:
        lists.park_soft_pinned(r, epoch)
    epoch, (a, b) = lists.isolate_soft_pinned(2)
    assert keys([a, b]) == ["a", "b"] and lists.soft_pinned_bytes == 200
    lists.putback([a], epoch, ListState.SOFT_PINNED)  # looked at, kept: to the head
    lists.putback([b], epoch, ListState.SOFT_PINNED, at_tail=True)  # not reached
    assert keys(lists.soft_pinned_order()) == ["b", "c", "d", "a"]


def test_a_parked_soft_pinned_record_is_still_removable() -> None:
    lists: ReclaimLists[str] = ReclaimLists(0)
    lists.add(rec("a"))
    epoch, (a,) = lists.isolate_inactive(1)
    lists.park_soft_pinned(a, epoch)
    assert len(lists.remove("a")) == 1
    assert a.state is ListState.REMOVED and lists.soft_pinned_order() == []
    assert lists.soft_pinned_len == 0 and lists.soft_pinned_bytes == 0
    assert lists.resident_bytes == 0
