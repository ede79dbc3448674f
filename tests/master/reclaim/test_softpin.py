"""The deadline index that expires soft pins in deadline order, shard by shard."""

from __future__ import annotations

from kvpool.master.reclaim import SoftPinIndex


def two_shards() -> SoftPinIndex[str]:
    return SoftPinIndex(2, lambda k: 0 if k.startswith("a") else 1)


def test_expiry_runs_in_deadline_order_shard_by_shard_and_only_what_is_due() -> None:
    index = two_shards()
    for key, deadline in [("a3", 30.0), ("b1", 10.0), ("a1", 10.0), ("a2", 20.0), ("b9", 90.0)]:
        index.pin(key, deadline)
    seen: list[tuple[str, float]] = []
    assert index.expire(30.0, lambda k, d: seen.append((k, d))) == 4
    assert seen == [("a1", 10.0), ("a2", 20.0), ("a3", 30.0), ("b1", 10.0)]
    assert len(index) == 1 and index.deadline("b9") == 90.0


def test_a_moved_or_removed_pin_does_not_expire_at_its_old_deadline() -> None:
    index = two_shards()
    index.pin("a", 10.0)
    index.pin("a", 50.0)  # re-pinned: the 10.0 heap entry is stale
    index.pin("b", 10.0)
    assert not index.unpin("b", deadline=11.0)  # only the matching deadline unpins
    assert index.unpin("b", deadline=10.0)
    seen: list[str] = []
    assert index.expire(20.0, lambda k, d: seen.append(k)) == 0 and seen == []
    assert index.deadline("a") == 50.0
    assert index.expire(50.0, lambda k, d: seen.append(k)) == 1 and seen == ["a"]
    assert len(index) == 0


def test_the_heap_stays_proportional_to_live_pins_under_repinning() -> None:
    index: SoftPinIndex[str] = SoftPinIndex(1, lambda k: 0)
    for i in range(10_000):
        index.pin("hot", float(i))
    assert len(index) == 1
    assert len(index._heaps[0]) <= 130  # compacted, not 10,000 stale entries
    assert index.expire(20_000.0) == 1
