"""Replica copy/move tasks through the Store API, executed by real nodes (`kvpool.client.tasks`).

A master and two `kvpool node` processes on loopback; the nodes run `TaskExecutor`s. One test
uses a Store with its own segment as the source, so that it can corrupt the source bytes and see
the executor refuse to copy them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from kvpool.client import AsyncStore, ReplicateConfig, Store
from kvpool.client.control import TaskInfo
from kvpool.client.datapath import DataPath
from kvpool.client.node import NodeRuntime
from kvpool.client.tasks import TaskExecutor
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, ObjectNotFound
from kvpool.protocol.messages import ReplicaStatus, TaskStatus, TaskType
from kvpool.transfer.request import TransferOp
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import wait_until
from kvtest.stores import emptied_after


@pytest.fixture(scope="module")
def two_nodes(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(
        nodes=2, segment_size="16MiB", master_args=("--default-kv-lease-ttl", "200ms")
    )


@pytest.fixture
def store(two_nodes: Pool) -> Iterator[Store]:
    with emptied_after(two_nodes.address) as s:
        yield s


def segments(pool: Pool) -> list[str]:
    return [e + "/0" for e in pool.node_endpoints]


def finished(store: Store, task_id: str, timeout: float = 10.0) -> TaskInfo:
    return wait_until(
        lambda: (info := store.query_task(task_id)).done and info,
        timeout=timeout,
        what=f"task {task_id} to end",
    )


def value(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_copy_task_adds_a_complete_replica_on_each_target(store: Store, two_nodes: Pool) -> None:
    a, b = segments(two_nodes)
    data = value(300_000, 1)
    store.put("copy-me", data, ReplicateConfig(preferred_segments=[a]))
    assert [r.segment for r in store.get_replica_desc("copy-me")] == [a]

    task = store.create_copy_task("copy-me", [b])
    info = finished(store, task)
    assert (info.status, info.task_type, info.key, info.message) == (
        TaskStatus.SUCCESS,
        TaskType.COPY,
        "copy-me",
        "",
    )
    descs = store.get_replica_desc("copy-me")
    assert sorted(r.segment for r in descs) == sorted([a, b])
    assert all(r.status == ReplicaStatus.COMPLETE and r.size == len(data) for r in descs)
    (copy,) = [r for r in descs if r.segment == b]
    out = bytearray(len(data))  # the copy's own bytes, read straight from segment b
    codes, _ = store._open().move_many(
        TransferOp.READ, [memoryview(out)], [b], [copy.offset], False
    )
    assert codes == [ErrorCode.OK] and out == data


def test_move_task_replaces_the_source_and_the_bytes_follow(store: Store, two_nodes: Pool) -> None:
    a, b = segments(two_nodes)
    data = value(2 << 20, 2)
    store.put("move-me", data, ReplicateConfig(preferred_segments=[a]))
    info = finished(store, store.create_move_task("move-me", a, b))
    assert info.status == TaskStatus.SUCCESS, info.message
    assert [r.segment for r in store.get_replica_desc("move-me")] == [b]
    assert store.get("move-me") == data  # read from b, checksum verified


def test_a_second_task_on_the_same_object_is_refused_until_the_first_ends(
    store: Store, two_nodes: Pool
) -> None:
    a, b = segments(two_nodes)
    store.put("busy", value(4096, 3), ReplicateConfig(preferred_segments=[a]))
    first = store.create_copy_task("busy", [b])
    try:
        store.create_move_task("busy", a, b)
    except KVPoolError as exc:  # OBJECT_HAS_REPLICATION_TASK, or the copy already added b
        assert exc.code.name in ("OBJECT_HAS_REPLICATION_TASK", "REPLICA_ALREADY_EXISTS")
    else:
        pytest.fail("a move on an object with a task (or a replica on the target) was accepted")
    assert finished(store, first).status == TaskStatus.SUCCESS


def test_task_refusals_and_unknown_ids(store: Store, two_nodes: Pool) -> None:
    a, b = segments(two_nodes)
    with pytest.raises(ObjectNotFound):
        store.create_copy_task("no-such-key", [b])
    store.put("here", b"x" * 100, ReplicateConfig(preferred_segments=[a]))
    with pytest.raises(KVPoolError):
        store.create_move_task("here", a, a)  # source == target
    with pytest.raises(KVPoolError):
        store.query_task("0" * 32)
    with pytest.raises(InvalidParams):
        store.create_copy_task("here", "not-a-list")  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        store.create_move_task("", a, b)
    with pytest.raises(InvalidParams):
        store.get_replica_desc("")


def test_replica_descriptors_of_missing_and_present_keys(store: Store, two_nodes: Pool) -> None:
    a, _ = segments(two_nodes)
    store.put("d1", b"1" * 10, ReplicateConfig(preferred_segments=[a]))
    assert store.get_replica_desc("missing") == []
    got = store.batch_get_replica_desc(["d1", "missing"])
    assert got["missing"] == []
    (r,) = got["d1"]
    assert (r.segment, r.size, r.status, r.endpoint) == (a, 10, ReplicaStatus.COMPLETE, a[:-2])


def test_batch_replica_clear_drops_own_objects_once_their_lease_ended(
    store: Store, two_nodes: Pool
) -> None:
    a, b = segments(two_nodes)
    cfg = ReplicateConfig(replica_num=2)
    store.put("c1", b"1" * 100, cfg)
    store.put("c2", b"2" * 100, cfg)
    store.put("c3", b"3" * 100)
    with Store(two_nodes.address) as other:  # not the owner: clears nothing
        assert other.batch_replica_clear(["c1", "c2", "c3"]) == []
    # Leases last 200 ms on this master (a put grants none; get_replica_desc would).
    assert sorted(wait_until(lambda: store.batch_replica_clear(["c1"], a), what="clear")) == ["c1"]
    assert [r.segment for r in store.get_replica_desc("c1")] == [b]
    assert sorted(store.batch_replica_clear(["c2", "c3", "nope"])) == ["c2", "c3"]
    assert store.batch_exists(["c2", "c3"]) == [False, False]
    assert store.get("c1") == b"1" * 100


def test_a_corrupt_source_fails_the_task_and_changes_nothing(two_nodes: Pool) -> None:
    _, b = segments(two_nodes)
    with Store(two_nodes.address, segment_size="4MiB") as owner:
        (own,) = owner.segments
        data = value(1 << 20, 4)
        owner.put("fragile", data, ReplicateConfig(preferred_segments=[own]))
        (r,) = owner.get_replica_desc("fragile")
        mem, _ = owner._node.segments[own]  # the memory this process owns
        mem.buffer[r.offset + 1000] ^= 0xFF

        info = finished(owner, owner.create_copy_task("fragile", [b]))
        assert info.status == TaskStatus.FAILED
        assert "checksum" in info.message
        assert [d.segment for d in owner.get_replica_desc("fragile")] == [own]  # target freed
        mem.buffer[r.offset + 1000] ^= 0xFF
        info = finished(owner, owner.create_copy_task("fragile", [b]))
        assert info.status == TaskStatus.SUCCESS, info.message
        assert owner._tasks is not None and owner._tasks.stats.failed == 1
        owner.remove_all(force=True)


def test_async_store_has_the_task_methods(two_nodes: Pool) -> None:
    a, b = segments(two_nodes)

    async def main() -> None:
        async with AsyncStore(two_nodes.address) as s:
            await s.put("async-task", b"v" * 5000, ReplicateConfig(preferred_segments=[a]))
            task = await s.create_copy_task("async-task", [b])
            deadline = asyncio.get_running_loop().time() + 10
            while not (info := await s.query_task(task)).done:
                assert asyncio.get_running_loop().time() < deadline, "copy task never finished"
                await asyncio.sleep(0.01)
            assert info.status == TaskStatus.SUCCESS
            assert len(await s.get_replica_desc("async-task")) == 2
            assert set(await s.batch_get_replica_desc(["async-task"])) == {"async-task"}
            await s.remove_all(force=True)

    asyncio.run(main())


def test_an_executor_writes_targets_over_tcp(two_nodes: Pool) -> None:
    """A node whose data path is TCP-only (as for targets on another host) still copies."""
    _, b = segments(two_nodes)
    node = NodeRuntime(two_nodes.address, heartbeat_interval=0.2).start()
    data = DataPath(node, "tcp", 30.0)
    try:
        mem = node.mount("4MiB", on_created=data.engine.attach_local)
        executor = TaskExecutor(node, data, poll_interval=0.02).start()
        node.on_pending_tasks = executor.wake
        with Store(two_nodes.address) as s:
            payload = value(700_000, 5)
            s.put("over-tcp", payload, ReplicateConfig(preferred_segments=[mem.name]))
            info = finished(s, s.create_move_task("over-tcp", mem.name, b))
            assert info.status == TaskStatus.SUCCESS, info.message
            assert [r.segment for r in s.get_replica_desc("over-tcp")] == [b]
            assert s.get("over-tcp") == payload
            assert executor.stats.succeeded == 1
            assert executor.stats.bytes_copied == len(payload)
            s.remove_all(force=True)
        executor.close()
    finally:
        node.close()
        data.close()


def test_a_ping_announces_pending_tasks_and_run_once_executes_them(two_nodes: Pool) -> None:
    """Beat by beat: no executor thread, so nothing happens until the test says so."""
    _, b = segments(two_nodes)
    node = NodeRuntime(two_nodes.address, heartbeat_interval=3600).start()
    data = DataPath(node, "auto", 30.0)
    woken: list[int] = []
    node.on_pending_tasks = lambda: woken.append(1)
    try:
        mem = node.mount("4MiB", on_created=data.engine.attach_local)
        executor = TaskExecutor(node, data)  # not started: run_once by hand
        node.heartbeat.beat()
        assert woken == []
        with Store(two_nodes.address) as s:
            payload = value(50_000, 6)
            s.put("pending", payload, ReplicateConfig(preferred_segments=[mem.name]))
            task = s.create_copy_task("pending", [b])
            assert s.query_task(task).status == TaskStatus.PENDING
            node.heartbeat.beat()
            assert woken == [1]
            assert executor.run_once() == 1
            assert s.query_task(task).status == TaskStatus.SUCCESS
            assert executor.run_once() == 0
            node.heartbeat.beat()
            assert woken == [1]  # nothing pending any more
            assert sorted(r.segment for r in s.get_replica_desc("pending")) == sorted([mem.name, b])
            s.remove_all(force=True)
    finally:
        node.close()
        data.close()


def test_a_corrupt_source_with_a_good_replica_elsewhere_is_dropped_and_repaired(
    two_nodes: Pool,
) -> None:
    """The executor reports that the source failed the checksum (`bad_source`); the master
    drops that replica, since another one is readable, and repair copies the good one back up
    to two replicas: the corrupt bytes are never read or copied."""
    a, b = segments(two_nodes)
    with Store(two_nodes.address, segment_size="4MiB") as owner:
        (own,) = owner.segments
        data = value(1 << 16, 5)
        assert owner.put("twice", data, ReplicateConfig(replica_num=2, preferred_segments=[own, a]))
        (r,) = (d for d in owner.get_replica_desc("twice") if d.segment == own)
        mem, _ = owner._node.segments[own]
        mem.buffer[r.offset + 100] ^= 0xFF
        # A copy from the first readable replica (ours, corrupt) is refused by the executor...
        info = finished(owner, owner.create_copy_task("twice", [b]))
        assert info.status == TaskStatus.FAILED and "checksum" in info.message

        # ...which drops it at the master; repair then copies the good one.
        def repaired() -> bool:
            descs = owner.get_replica_desc("twice")
            ours = [d for d in descs if d.segment == own]
            return (
                len(descs) == 2
                and a in {d.segment for d in descs}
                and all(bytes(mem.buffer[d.offset : d.offset + len(data)]) == data for d in ours)
            )

        wait_until(repaired, timeout=20, what="the corrupt replica to be replaced by a good copy")
        assert owner.get("twice") == data
        owner.remove_all(force=True)
