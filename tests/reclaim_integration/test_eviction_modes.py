"""Issue 6: reclaim end to end, with a real `kvpool master` and `kvpool node` processes.

* cache mode: a pool filled far past its capacity keeps accepting puts, and a set of objects
  read over and over stays resident while the cold ones are evicted;
* pool mode: objects swapped out of a full node are moved (by replica tasks that the nodes
  execute) to another node, and every object stays readable byte-exact;
* no room anywhere: puts fail cleanly with NO_AVAILABLE_HANDLE and no stored object is lost;
* copy / move / query tasks through the Store API.

Every master here grants 100 ms read leases (`--default-kv-lease-ttl`), so objects that were
read become evictable again quickly; waits are conditions with deadlines.
"""

from __future__ import annotations

import numpy as np

from kvpool.client import ReplicateConfig, Store
from kvpool.errors import ErrorCode, NoSpace
from kvpool.protocol.messages import TaskStatus, TaskType
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until

LEASE = ("--default-kv-lease-ttl", "100ms")
SIZE = 64 << 10


def value(i: int) -> bytes:
    """64 KiB, different for every i (a seeded generator, so byte swaps would show)."""
    return np.random.default_rng(i).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


def test_cache_mode_keeps_puts_succeeding_and_the_hot_set_resident(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(nodes=1, segment_size="8MiB", master_args=("--eviction-mode", "cache", *LEASE))
    n = 512  # 32 MiB of values through an 8 MiB segment
    hot = [f"obj{i}" for i in range(6)]
    with Store(p.address) as s:
        for i in range(n):
            assert s.put(f"obj{i}", value(i)) is True, f"put {i} of {n} refused"
            if i >= len(hot) and i % 8 == 0:
                for h in hot:  # read often: promoted to the active list, never reclaimed
                    assert s.get(h) == value(int(h[3:]))
        alive = [k for k, d in s.batch_get_replica_desc([f"obj{i}" for i in range(n)]).items() if d]
        assert set(hot) <= set(alive)
        assert len(alive) < n // 2, "nothing was evicted: the pool was not filled past capacity"
        for k in alive:
            assert s.get(k) == value(int(k[3:]))  # eviction never leaves a torn object


def test_pool_mode_moves_objects_off_a_full_node_and_loses_none(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(nodes=0, master_args=("--eviction-mode", "pool", *LEASE))
    p.add_node("8MiB")  # node A: small, written to
    p.add_node("64MiB")  # node B: where A's objects go
    a, b = (e + "/0" for e in p.node_endpoints)
    n = 320  # 20 MiB of values, all asked to land on A
    first: dict[str, str] = {}
    with Store(p.address) as s:
        cfg = ReplicateConfig(preferred_segments=[a])
        for i in range(n):
            key = f"obj{i}"
            assert s.put(key, value(i), cfg) is True, f"put {i} of {n} refused"
            first[key] = s.get_replica_desc(key)[0].segment

        def moved() -> list[str]:
            descs = s.batch_get_replica_desc(list(first))
            return [k for k, d in descs.items() if first[k] == a and [r.segment for r in d] == [b]]

        # The nodes executed move tasks: objects written to A now live on B.
        assert len(wait_until(moved, timeout=20, what="objects moved from A to B")) > 0
        descs = s.batch_get_replica_desc(list(first))
        assert all(descs[k] for k in first), "an object was dropped in pool mode"
        for i in range(n):
            assert s.get(f"obj{i}") == value(i)


def test_with_no_room_anywhere_puts_fail_cleanly_and_nothing_is_lost(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(nodes=2, segment_size="4MiB", master_args=("--eviction-mode", "pool", *LEASE))
    stored: list[int] = []
    refused = 0
    with Store(p.address) as s:
        for i in range(400):  # 25 MiB of puts into 8 MiB
            try:
                assert s.put(f"obj{i}", value(i)) is True
                stored.append(i)
            except NoSpace as exc:
                assert exc.code == ErrorCode.NO_AVAILABLE_HANDLE
                refused += 1
        assert refused > 0 and len(stored) > 0
        # A refused put leaves no trace; every stored object is whole.
        assert not any(s.batch_exists([f"obj{i}" for i in range(400) if i not in stored]))
        codes = s.batch_put([f"late{i}" for i in range(8)], [value(1000 + i) for i in range(8)])
        assert all(c in (ErrorCode.OK, ErrorCode.NO_AVAILABLE_HANDLE) for c in codes)
        for i in stored:
            assert s.get(f"obj{i}") == value(i)


def test_copy_move_and_query_tasks_end_to_end(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=3, segment_size="16MiB", master_args=LEASE)
    a, b, c = (e + "/0" for e in p.node_endpoints)
    data = np.random.default_rng(9).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    with Store(p.address) as s:
        s.put("big", data, ReplicateConfig(preferred_segments=[a]))

        def ended(task_id: str) -> TaskStatus | None:
            info = s.query_task(task_id)
            return info.status if info.done else None

        copy = s.create_copy_task("big", [b])
        assert wait_until(lambda: ended(copy), timeout=10, what="copy") == TaskStatus.SUCCESS
        assert sorted(r.segment for r in s.get_replica_desc("big")) == sorted([a, b])

        move = s.create_move_task("big", a, c)
        assert s.query_task(move).task_type == TaskType.MOVE
        assert wait_until(lambda: ended(move), timeout=10, what="move") == TaskStatus.SUCCESS
        assert sorted(r.segment for r in s.get_replica_desc("big")) == sorted([b, c])

        # Each replica holds the whole value: kill the other node and read again.
        p.kill_node(2)  # c
        assert s.get("big") == data
        s.remove("big", force=True)


def test_a_store_with_its_own_segment_executes_tasks_too(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="16MiB", master_args=LEASE)
    (b,) = (e + "/0" for e in p.node_endpoints)
    with Store(p.address, segment_size="4MiB") as s:
        (own,) = s.segments
        s.put("mine", value(7), ReplicateConfig(preferred_segments=[own]))
        task = s.create_move_task("mine", own, b)
        assert (
            wait_until(lambda: s.query_task(task).done and s.query_task(task).status, timeout=10)
            == TaskStatus.SUCCESS
        )
        assert [r.segment for r in s.get_replica_desc("mine")] == [b]
        assert s.get("mine") == value(7)
