"""Puts in one master round trip (arenas) against a real pool: a master and `kvpool node`s.

What must hold: a put through an arena costs one request to the master and is readable by
another client right after it returns; put stays insert-if-absent; concurrent puts from many
threads never share bytes; closing a Store gives back everything it did not commit; a pool
with no room for an arena, an arena whose node died, and a master with arenas turned off all
fall back to PutStart/PutEnd without losing a put; the arena of a client killed with SIGKILL
stays reserved until put_start_release_timeout, then comes back.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvpool.client import Store
from kvpool.errors import ErrorCode, NoSpace
from kvpool.protocol.messages import GetReplicaList, ReplicaListReply, Response, Stats, StatsReply
from kvpool.rpc.client import RpcClient
from kvtest.pool import Pool, PoolFactory, pool, pool_module  # noqa: F401
from kvtest.procs import kvpool_proc, wait_until
from kvtest.stores import emptied_after

KiB = 1 << 10
MiB = 1 << 20


def stats(address: str) -> StatsReply:
    with RpcClient(address, response_type=Response) as rpc:
        return rpc.call_as(Stats(), StatsReply)


def used(address: str) -> int:
    return stats(address).used


class Counting:
    """Counts the requests a Store sends to the master, by type (wraps its RpcClient.call)."""

    def __init__(self, store: Store) -> None:
        self.rpc = store._node.rpc
        self.inner = self.rpc.call
        self.sent: list[str] = []
        self.rpc.call = self._call  # type: ignore[method-assign]

    def _call(self, req: Any, *a: Any, **kw: Any) -> Any:
        self.sent.append(type(req).__name__)
        return self.inner(req, *a, **kw)

    def data_requests(self) -> list[str]:
        return [n for n in self.sent if n != "Ping"]


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="64MiB")


@pytest.fixture
def store(one_node: Pool) -> Iterator[Store]:
    with emptied_after(one_node.address, arena_size="4MiB") as s:
        yield s


def test_a_put_is_one_request_and_another_client_reads_it(store: Store, one_node: Pool) -> None:
    store.put("warm", b"w")  # the first put also reserves the arena
    count = Counting(store)
    value = np.random.default_rng(1).integers(0, 256, 100 * KiB, dtype=np.uint8).tobytes()
    assert store.put("k", value) is True
    assert count.data_requests() == ["PutCommit"]
    with Store(one_node.address) as reader:
        assert reader.get("k") == value


def test_a_batch_put_is_one_request(store: Store) -> None:
    store.put("warm", b"w")
    count = Counting(store)
    keys = [f"b{i}" for i in range(64)]
    vals = [bytes([i]) * (4 * KiB + i) for i in range(64)]
    assert store.batch_put(keys, vals) == [ErrorCode.OK] * 64
    assert count.data_requests() == ["BatchPutCommit"]
    assert [bytes(v or b"") for v in store.batch_get(keys)] == vals


def test_put_stays_insert_if_absent(store: Store) -> None:
    assert store.put("k", b"first") is True
    assert store.put("k", b"second!") is False
    assert store.get("k") == b"first"
    codes = store.batch_put(["k", "new"], [b"third", b"n"])
    assert codes == [ErrorCode.OBJECT_ALREADY_EXISTS, ErrorCode.OK]
    assert store.get("k") == b"first" and store.get("new") == b"n"


def test_consecutive_puts_share_one_arena(store: Store) -> None:
    store.put("a", b"x" * 1000)
    first = store._arenas._current if store._arenas else None
    store.put("b", b"y" * 1000)
    assert first is not None and store._arenas is not None
    assert store._arenas._current is first


def test_closing_gives_back_everything_not_committed(one_node: Pool) -> None:
    base = used(one_node.address)
    with Store(one_node.address, arena_size="4MiB") as s:
        assert s.put("one", b"1" * 1000) is True
        assert s.put("one", b"2" * 1000) is False  # its range is wasted, not leaked
        assert used(one_node.address) == base + 4 * MiB  # the arena, all of it
    assert used(one_node.address) == base + 1024  # the one object (1000 bytes, aligned)
    with Store(one_node.address) as s:
        s.remove_all(force=True)
    assert used(one_node.address) == base


def test_threads_putting_at_once_never_share_bytes(store: Store) -> None:
    rng = np.random.default_rng(3)
    values = {
        f"t{t}-{i}": rng.integers(0, 256, int(rng.integers(1, 64 * KiB)), dtype=np.uint8).tobytes()
        for t in range(4)
        for i in range(60)
    }
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(60):
                key = f"t{t}-{i}"
                if i % 3 == 0:
                    batch = [f"t{t}-{i}"]
                    assert store.batch_put(batch, [values[key]]) == [ErrorCode.OK]
                else:
                    assert store.put(key, values[key]) is True
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    for key, value in values.items():
        assert store.get(key) == value, key  # also verifies every checksum


def test_values_above_a_quarter_of_the_arena_take_putstart(store: Store) -> None:
    store.put("warm", b"w")
    count = Counting(store)
    assert store.put("big", b"z" * (2 * MiB)) is True
    assert count.data_requests() == ["PutStart", "PutEnd"]
    assert store.get("big") == b"z" * (2 * MiB)


def test_arenas_off_at_the_master_fall_back(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="16MiB", master_args=("--max-arena-size", "0"))
    with Store(p.address) as s:
        assert s.put("a", b"1") is True
        count = Counting(s)
        assert s.put("b", b"2") is True
        assert s.batch_put(["c", "d"], [b"3", b"4"]) == [ErrorCode.OK] * 2
        assert "ReserveArena" not in count.sent  # refused once, never asked again
        assert count.data_requests() == ["PutStart", "PutEnd", "BatchPutStart", "BatchPutEnd"]
        assert [bytes(v or b"") for v in s.batch_get(["a", "b", "c", "d"])] == [
            b"1",
            b"2",
            b"3",
            b"4",
        ]


def test_a_full_pool_falls_back_to_putstart_then_says_no_space(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="8MiB", master_args=("--no-reclaim",))
    with Store(p.address, arena_size="1MiB") as s:
        stored = 0
        with pytest.raises(NoSpace):
            for i in range(200):
                assert s.put(f"k{i}", bytes([i % 256]) * (200 * KiB)) is True
                stored += 1
        # Nearly the whole segment holds objects: the last ones came through PutStart once no
        # arena fit, and nothing was lost on the way.
        assert stored * 200 * KiB >= 7 * MiB
        for i in range(stored):
            assert s.get(f"k{i}") == bytes([i % 256]) * (200 * KiB)


def test_arena_on_a_dead_node_is_dropped_and_puts_go_on(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=2, segment_size="32MiB", client_ttl="1s")
    with Store(p.address, arena_size="2MiB") as s:
        assert s.put("first", b"f") is True
        arenas = s._arenas
        assert arenas is not None and arenas._current is not None
        seg = arenas._current.segment
        owner = next(
            i for i, ep in enumerate(p.node_endpoints) if s._open().resolve(seg).endpoint == ep
        )
        p.kill_node(owner)
        wait_until(lambda: len(stats(p.address).segments) == 1, timeout=30, what="node expired")
        for i in range(20):
            assert s.put(f"after{i}", bytes([i]) * 5000) is True
        for i in range(20):
            assert s.get(f"after{i}") == bytes([i]) * 5000
        assert arenas._current is not None and arenas._current.segment != seg


def test_a_killed_client_arena_is_held_until_release_timeout(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(
        nodes=1,
        segment_size="32MiB",
        client_ttl="1s",
        master_args=("--put-start-discard-timeout", "1s", "--put-start-release-timeout", "3s"),
    )
    code = (
        "import os, sys\n"
        "from kvpool.client import Store\n"
        f"s = Store({p.address!r}, arena_size='2MiB')\n"
        "assert s.put('from-child', b'c' * 1000)\n"
        "print('ok', flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert child.stdout.strip() == "ok", child.stderr
    assert used(p.address) == 2 * MiB  # its arena, still reserved
    # Expired after 1 s: the arena's gaps are parked (the client might only be silent)...
    wait_until(lambda: len(stats(p.address).clients) == 1, timeout=30, what="client expired")
    assert used(p.address) == 2 * MiB
    # ...and released 3 s later; the committed object stays.
    wait_until(lambda: used(p.address) == 1024, timeout=30, what="parked gaps released")
    with Store(p.address) as s:
        assert s.get("from-child") == b"c" * 1000


# ---------------------------------------------------------------- leases (review findings)


def _objects_intact(store: Store, values: dict[str, bytes]) -> None:
    for key, value in values.items():
        assert store.get(key) == value, key  # a clobbered value fails its checksum here


def test_a_segment_owner_that_expires_and_remounts_keeps_the_old_arena_safe(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(nodes=0, client_ttl="1s")
    with (
        Store(p.address, segment_size="4MiB", heartbeat_interval=0.1, arena_size=0) as owner,
        Store(p.address, heartbeat_interval=0.1, arena_size=0) as third,
        Store(p.address, heartbeat_interval=0.1) as writer,
    ):
        assert writer.put("w1", b"W" * 1000)
        owner._node.heartbeat.stop()  # the owner misses its pings past client_ttl ...
        wait_until(lambda: not stats(p.address).segments, timeout=30, what="owner expired")
        owner._node.heartbeat.beat()  # ... then answers: NEED_REMOUNT, same name and memory
        assert [s.name for s in stats(p.address).segments] == owner.segments
        values = {f"t{i}": bytes([65 + i]) * 1000 for i in range(16)}
        for k, v in values.items():
            assert third.put(k, v)
        assert writer.put("w2", b"Z" * 1000)
        _objects_intact(third, values)
        assert writer.get("w2") == b"Z" * 1000


def test_a_writer_that_expired_and_comes_back_writes_nowhere_stale(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(
        nodes=0,
        client_ttl="1s",
        master_args=("--put-start-discard-timeout", "1s", "--put-start-release-timeout", "2s"),
    )
    with (
        Store(p.address, segment_size="4MiB", heartbeat_interval=0.1, arena_size=0) as owner,
        Store(p.address, heartbeat_interval=0.1) as writer,
    ):
        assert writer.put("w1", b"W" * 1000)
        writer._node.heartbeat.stop()  # falls silent: expired after 1 s ...
        wait_until(lambda: len(stats(p.address).clients) == 1, timeout=30, what="writer expired")
        # ... and its parked arena is released once its lease and the release timeout pass.
        wait_until(lambda: stats(p.address).arenas == 0 and used(p.address) == 1024, timeout=30)
        values = {f"o{i}": bytes([65 + i]) * 1000 for i in range(8)}
        for k, v in values.items():
            assert owner.put(k, v)
        assert writer.put("w2", b"Z" * 1000)  # its lease ran out long ago: a new arena
        _objects_intact(owner, values)


def test_after_a_master_restart_old_arenas_are_not_written(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=0)
    port = int(p.address.rsplit(":", 1)[1])
    with (
        Store(p.address, segment_size="4MiB", heartbeat_interval=0.1, arena_size=0) as owner,
        Store(p.address, heartbeat_interval=0.1) as writer,
    ):
        assert writer.put("w1", b"W" * 1000)
        p.master.kill9()
        p.master = kvpool_proc(
            "master", "--host", "127.0.0.1", "--port", str(port), name="kvpool master 2"
        )
        p.master.wait_ready(timeout=30)
        # Both notice at their next pings (NEED_REMOUNT) and register again.
        wait_until(lambda: len(stats(p.address).clients) == 2, timeout=30, what="re-registered")
        wait_until(lambda: writer._arenas is not None and writer._arenas._current is None)
        values = {f"o{i}": bytes([65 + i]) * 1000 for i in range(8)}
        for k, v in values.items():
            assert owner.put(k, v)
        assert writer.put("w2", b"Z" * 1000)
        _objects_intact(owner, values)


def test_close_leaves_an_arena_a_put_still_writes_into(one_node: Pool) -> None:
    with Store(one_node.address, arena_size=0) as other:
        writer = Store(one_node.address, arena_size="4MiB")
        try:
            assert writer.put("w0", b"x" * 100)
            arenas = writer._arenas
            assert arenas is not None
            got = arenas.take([4096])  # another thread's put, between take and done
            assert got is not None
            arena, (off,) = got
        finally:
            writer.close()  # idempotent: the close under test, or the cleanup of a failure
        assert stats(one_node.address).arenas == 1  # not released under the writer's feet
        for i in range(8):
            assert other.put(f"victim{i}", b"v" * 4096)
        with RpcClient(one_node.address, response_type=Response) as rpc:
            placed = [
                rpc.call_as(GetReplicaList(f"victim{i}"), ReplicaListReply).replicas[0]
                for i in range(8)
            ]
        assert all(r.segment != arena.segment or r.offset != off for r in placed)
        arenas.done(arena)
        other.remove_all(force=True)


def test_arenas_survive_a_reconnect_of_the_control_connection(store: Store) -> None:
    assert store.put("a", b"1")
    store._node.reconnect()  # what the heartbeat does after three failed pings
    count = Counting(store)
    assert store.put("b", b"2")
    assert count.data_requests() in (["PutCommit"], ["ReserveArena", "PutCommit"])
    assert store.get("b") == b"2"


def test_a_value_above_the_granted_arena_takes_putstart_and_leaves_the_arena(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(nodes=1, segment_size="16MiB")  # arenas of at most 2 MiB here
    with Store(p.address) as s:
        assert s.put("small", b"x" * 4096)
        arenas = s._arenas
        assert arenas is not None and arenas.max_value == 512 << 10
        current = arenas._current
        count = Counting(s)
        assert s.put("big", b"y" * (3 << 20))
        assert count.data_requests() == ["PutStart", "PutEnd"]
        assert arenas._current is current and arenas._retry_at <= 0
        assert s.put("small2", b"z" * 4096)
        assert count.data_requests()[-1] == "PutCommit"


def test_an_idle_store_gives_its_arena_back(one_node: Pool) -> None:
    # A closed Store's in-use arena may still be held: let it go first, or its release would
    # pass for this Store's below.
    wait_until(lambda: stats(one_node.address).arenas == 0, timeout=30, what="old arenas released")
    base = 0
    with Store(one_node.address, heartbeat_interval=0.1, arena_size="4MiB") as s:
        assert s.put("k", b"v" * 100)
        assert stats(one_node.address).arenas == base + 1
        # Half a lease (1 s) after its last use, the next heartbeat releases it.
        wait_until(lambda: stats(one_node.address).arenas == base, timeout=30, what="released")
        assert s.put("k2", b"w" * 100)  # and a new one is taken on the next put
        assert stats(one_node.address).arenas == base + 1
        s.remove_all(force=True)
