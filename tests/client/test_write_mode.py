"""`Store(write_mode="nowait")`: arena puts that return once the bytes are written and the
commit is on the wire; the answer is checked at the next call, `flush()` or `close()`.

Against a real pool on loopback. A frozen master (SIGSTOP) shows that the put does not wait
for it; an arena released behind the Store's back (a real `ReleaseArenas` on the wire) makes
the master refuse the commit, and the failure surfaces later with its key.
"""

from __future__ import annotations

import os
import signal

import pytest

from kvpool.client import Store
from kvpool.client.config import StoreConfig
from kvpool.client.pending import DeferredPutError
from kvpool.errors import ErrorCode, InvalidParams
from kvpool.protocol.messages import ClientId, ReleaseArenas, Response
from kvpool.rpc.client import RpcClient
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import freeze


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="32MiB")


def test_write_mode_is_validated() -> None:
    with pytest.raises(InvalidParams, match="write_mode"):
        StoreConfig(write_mode="later")  # type: ignore[arg-type]
    assert StoreConfig().write_mode == "wait"


def test_a_nowait_put_returns_while_the_master_is_frozen(one_node: Pool) -> None:
    with Store(one_node.address, write_mode="nowait") as s, Store(one_node.address) as other:
        assert s.put("warm", b"w" * 4096) is True  # the arena is reserved here
        s.flush()
        pid = one_node.master.pid
        freeze(pid)
        try:
            assert s.put("early", b"e" * 4096) is True  # written, commit sent, not answered
            assert s.batch_put(["b1", "b2"], [b"1" * 100, b"2" * 200]) == [ErrorCode.OK] * 2
        finally:
            os.kill(pid, signal.SIGCONT)
        s.flush()
        assert other.get("early") == b"e" * 4096
        assert other.batch_get(["b1", "b2"]) == [b"1" * 100, b"2" * 200]
        s.remove_all(force=True)


def _release_current_arena(address: str, store: Store) -> None:
    """Release the Store's arena at the master without telling the Store (a master that
    forgot it, as after a restart)."""
    arena = store._arenas._current if store._arenas is not None else None
    assert arena is not None
    with RpcClient(address, response_type=Response) as rpc:
        rpc.call(ReleaseArenas(ClientId(store.client_id), [arena.arena_id]))


def test_a_failed_commit_surfaces_at_the_next_call_with_its_key(one_node: Pool) -> None:
    with Store(one_node.address, write_mode="nowait") as s:
        assert s.put("first", b"f" * 1000) is True
        s.flush()
        _release_current_arena(one_node.address, s)
        assert s.put("doomed", b"d" * 1000) is True  # the commit will be refused
        with pytest.raises(DeferredPutError) as info:
            s.flush()
        assert info.value.key == "doomed"
        assert info.value.code == ErrorCode.INVALID_WRITE
        s.flush()  # reported once
        assert s.exists("doomed") is False
        # The next put takes a new arena and is stored.
        assert s.put("after", b"a" * 1000) is True
        s.flush()
        assert s.get("after") == b"a" * 1000
        s.remove_all(force=True)


def test_close_raises_a_failure_still_in_flight(one_node: Pool) -> None:
    s = Store(one_node.address, write_mode="nowait")
    try:
        assert s.put("x1", b"x" * 512) is True
        s.flush()
        _release_current_arena(one_node.address, s)
        assert s.batch_put(["y1", "y2"], [b"y" * 10, b"z" * 10]) == [ErrorCode.OK] * 2
    except BaseException:
        s.close()
        raise
    with pytest.raises(DeferredPutError) as info:
        s.close()
    assert info.value.key in ("y1", "y2")
    s.close()  # idempotent, nothing left to raise
    with Store(one_node.address) as other:
        assert other.batch_exists(["y1", "y2"]) == [False, False]
        other.remove_all(force=True)


def test_the_queue_of_unanswered_commits_is_bounded(one_node: Pool) -> None:
    with Store(one_node.address, write_mode="nowait") as s:
        pending = s._pending
        assert pending is not None
        for i in range(3 * pending.limit):
            assert s.put(f"q{i}", b"q" * 64) is True
            assert len(pending) <= pending.limit
        s.flush()
        assert len(pending) == 0
        assert s.batch_exists([f"q{i}" for i in range(3 * pending.limit)]) == [True] * (
            3 * pending.limit
        )
        s.remove_all(force=True)


def test_a_large_batch_is_committed_in_parts_that_overlap_the_copy(one_node: Pool) -> None:
    from kvpool.client.writer import _parts

    assert _parts([1 << 20] * 3) == [[0, 1, 2]]  # under two parts' worth: one
    parts = _parts([1 << 20] * 10)
    assert [i for p in parts for i in p] == list(range(10)) and 2 <= len(parts) <= 8
    keys = [f"big{i}" for i in range(10)]
    values = [os.urandom(1 << 20) for _ in keys]
    for mode in ("wait", "nowait"):
        with Store(one_node.address, write_mode=mode) as s, Store(one_node.address) as other:
            assert s.batch_put(keys, values) == [ErrorCode.OK] * 10
            s.flush()
            assert other.batch_get(keys) == values
            # wait: the master's answer; nowait: the same when the batch took PutStart (no
            # arena room left), else OK (sent), and "exists" is no failure later
            again = s.batch_put(keys[:2], values[:2])
            exists = [ErrorCode.OBJECT_ALREADY_EXISTS] * 2
            assert again == exists if mode == "wait" else again in (exists, [ErrorCode.OK] * 2)
            s.flush()
            other.remove_all(force=True)
