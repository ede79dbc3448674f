"""Issue #13 on the client side: the Store heals itself and never fails a put it could serve.

* A live Store never raises `StoreClosed` while its heartbeat replaces the master connection.
* A put whose replica's node died is started again on live segments within its deadline.
* A put stored with fewer replicas than asked says so (`put_ex`, `put_stats`).
* One key being written never sinks a `batch_get`.

Real master and node processes on loopback (`kvtest.pool`).
"""

from __future__ import annotations

import sys
import threading

import pytest

from kvpool.client import PutResult, ReplicateConfig, Store
from kvpool.errors import ErrorCode, KVPoolError, RpcError, StoreClosed
from kvpool.protocol.messages import PutStart, PutStartReply
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until


def test_a_live_store_never_raises_store_closed_while_its_connection_is_replaced(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(nodes=1, segment_size="16MiB")
    closed: list[BaseException] = []
    other: list[BaseException] = []
    done = [0]
    stop = threading.Event()
    with Store(p.address) as s:

        def work(n: int) -> None:
            i = 0
            while not stop.is_set() and i < 100_000:
                key = f"t{n}/{i}"
                try:
                    if s.put(key, b"x" * 100):
                        s.get(key)
                    s.batch_exists([key])
                except StoreClosed as exc:
                    closed.append(exc)
                except RpcError:
                    pass  # a call in flight on the replaced connection: allowed
                except KVPoolError as exc:
                    other.append(exc)
                done[0] += 1
                i += 1

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        # Switch threads far more often than every 5 ms, so that a caller is often caught
        # between taking the node's client and using it when the heartbeat replaces it.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)
        for t in threads:
            t.start()
        try:
            for _ in range(150):
                seen = done[0]
                s._node.reconnect()  # what the heartbeat does after failed pings
                wait_until(lambda seen=seen: done[0] > seen + 2, timeout=10)  # type: ignore[misc]
        finally:
            stop.set()
            for t in threads:
                t.join(30)
            sys.setswitchinterval(interval)
        assert not closed, f"{len(closed)} StoreClosed on a live Store: {closed[0]}"
        assert not other, other[:3]
        s.put("after", b"ok")  # the Store still works
        assert s.get("after") == b"ok"
    with pytest.raises(StoreClosed):  # once the user closed it, StoreClosed it is
        s.get("after")


def test_puts_keep_succeeding_when_a_node_is_killed(pool: PoolFactory) -> None:  # noqa: F811
    """kill -9 of one of two nodes while puts run: the master still lists the dead segment for
    client_ttl, so puts land there and fail to write; each is revoked and started again on
    the live segment."""
    p = pool(nodes=2, segment_size="16MiB", client_ttl="30s")
    with Store(p.address, protocol="tcp", transfer_timeout=5, arena_size=0) as s:
        for i in range(20):  # both nodes serve
            assert s.put(f"warm{i}", b"w" * 1000)
        p.kill_node(0)
        failures: list[BaseException] = []
        for i in range(60):
            try:
                assert s.put(f"k{i}", b"v" * 1000)
            except KVPoolError as exc:
                failures.append(exc)
        codes = s.batch_put([f"b{i}" for i in range(40)], [b"b" * 500] * 40)
        # Two replicas asked, one live segment: stored on it, and said so.
        two = ReplicateConfig(replica_num=2)
        pairs = [s.put_ex(f"r{i}", b"r" * 300, two) for i in range(10)]
        assert all(r.stored and r.replicas == 1 and r.degraded for r in pairs), pairs
        assert not failures, f"{len(failures)} of 60 puts failed: {failures[0]}"
        assert codes == [ErrorCode.OK] * 40
        assert s.put_stats.retries > 0
        assert s.batch_get([f"k{i}" for i in range(60)]) == [b"v" * 1000] * 60


def test_a_put_with_fewer_replicas_than_asked_says_so(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="16MiB")
    two = ReplicateConfig(replica_num=2)
    with Store(p.address) as s:
        got = s.put_ex("one", b"x" * 100, two)
        assert isinstance(got, PutResult)
        assert got and got.stored and got.replicas == 1 and got.requested == 2 and got.degraded
        assert s.put("two", b"x" * 100, two) is True  # put keeps answering a bool
        assert s.batch_put(["b1", "b2"], [b"1", b"2"], two) == [ErrorCode.OK] * 2
        assert s.put_stats.degraded == 4
        again = s.put_ex("one", b"y", two)
        assert not again and not again.degraded and again.replicas == 0
        fine = s.put_ex("fine", b"z")
        assert fine.replicas == fine.requested == 1 and not fine.degraded
        assert s.put_stats.degraded == 4


def test_one_key_being_written_does_not_sink_a_batch_get(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="16MiB")
    with Store(p.address) as s:
        s.put("ready", b"r" * 100)
        # A PutStart with no PutEnd yet: the key is being written (REPLICA_IS_NOT_READY).
        rep = s._node.rpc.call_as(PutStart(s.client_id, "busy", 100), PutStartReply)
        assert rep.code == 0
        assert s.batch_get(["ready", "busy", "missing"]) == [b"r" * 100, None, None]
        assert s.batch_get_ex(["ready", "busy", "missing"]) == [
            b"r" * 100,
            ErrorCode.REPLICA_IS_NOT_READY,
            ErrorCode.OBJECT_NOT_FOUND,
        ]
        assert s.batch_exists(["ready", "busy"]) == [True, False]
