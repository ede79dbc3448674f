"""Answers of the master that fail or do not fit: the Store leaves no trace and raises RPC_FAIL.

A PutEnd / BatchPutEnd that fails (an error answer, or a connection lost before its answer)
must not leave the PutStart behind: for put_start_discard_timeout the key would answer
OBJECT_ALREADY_EXISTS though it cannot be read, and its space would stay held. A batch answer with
another number of entries than the keys asked is a fault (RpcError, RPC_FAIL), never a bare
ValueError out of a zip.

The tests wrap the Store's real RPC client and alter only the answers (or requests) named; the
master, the node and the bytes are real.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from kvpool.client import Store
from kvpool.errors import ErrorCode, KVPoolError, RpcError
from kvpool.protocol.messages import (
    BatchExistKey,
    BatchGetLocations,
    BatchGetReplicaList,
    BatchPutCommit,
    BatchPutEnd,
    BatchPutStart,
    BatchRemove,
    BatchReply,
    PutEnd,
    Reply,
    Response,
    Stats,
    StatsReply,
)
from kvpool.rpc.client import RpcClient
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401

Call = Callable[..., Any]


@pytest.fixture(scope="module")
def node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="16MiB")


@pytest.fixture
def store(node: Pool) -> Iterator[Store]:
    # No arenas: every put takes PutStart/PutEnd, the path under test.
    with Store(node.address, arena_size=0) as s:
        try:
            yield s
        finally:
            s._node.rpc.__dict__.pop("call", None)  # the real client again
            s.remove_all(force=True)


def _intercept(store: Store, change: Callable[[Call, Any], Any]) -> None:
    """Route every call of `store` through `change(real_call, request)`."""
    rpc = store._node.rpc
    real = rpc.call

    def call(req: Any, *a: Any, **kw: Any) -> Any:
        return change(lambda r: real(r, *a, **kw), req)

    rpc.call = call  # type: ignore[method-assign]


def _restore(store: Store) -> None:
    store._node.rpc.__dict__.pop("call", None)


def _processing(address: str) -> int:
    with RpcClient(address, response_type=Response) as rpc:
        return rpc.call_as(Stats(), StatsReply).processing


# ---------------------------------------------------------------- a failed PutEnd is revoked


def _end_fails(how: str) -> Callable[[Call, Any], Any]:
    def change(real: Call, req: Any) -> Any:
        if isinstance(req, PutEnd):
            if how == "lost":
                raise RpcError("connection lost before the PutEnd was answered")
            return Reply(int(ErrorCode.INTERNAL_ERROR))  # refused, never carried out
        return real(req)

    return change


@pytest.mark.parametrize("how", ["refused", "lost"])
def test_a_put_whose_put_end_fails_is_revoked(store: Store, node: Pool, how: str) -> None:
    _intercept(store, _end_fails(how))
    with pytest.raises(KVPoolError):
        store.put("k", b"first" * 100)
    _restore(store)
    assert _processing(node.address) == 0  # the space of the PutStart is free again
    assert store.exists("k") is False
    assert store.put("k", b"second") is True  # not OBJECT_ALREADY_EXISTS for 30 s
    assert store.get("k") == b"second"


def test_a_put_end_that_was_carried_out_is_not_undone(store: Store) -> None:
    # The PutEnd reached the master, but its answer was lost: the revoke that follows is
    # refused (the object is complete), so the value stays.
    def change(real: Call, req: Any) -> Any:
        reply = real(req)
        if isinstance(req, PutEnd):
            raise RpcError("connection lost after the PutEnd was carried out")
        return reply

    _intercept(store, change)
    with pytest.raises(RpcError):
        store.put("k", b"kept")
    _restore(store)
    assert store.get("k") == b"kept"


def test_keys_whose_batch_put_end_fails_are_revoked_the_others_kept(
    store: Store, node: Pool
) -> None:
    keys = [f"b{i}" for i in range(4)]

    def change(real: Call, req: Any) -> Any:
        if isinstance(req, BatchPutEnd):
            # The master ends every key but the first, and refuses that one.
            rest = msgspec.structs.replace(
                req,
                keys=req.keys[1:],
                checksums=req.checksums[1:],
                replica_ids=req.replica_ids[1:],
            )
            codes = real(rest).codes
            return BatchReply([int(ErrorCode.INTERNAL_ERROR), *codes])
        return real(req)

    _intercept(store, change)
    got = store.batch_put(keys, [k.encode() * 50 for k in keys])
    _restore(store)
    assert got == [ErrorCode.INTERNAL_ERROR] + [ErrorCode.OK] * 3
    assert _processing(node.address) == 0
    assert store.batch_get(keys) == [None] + [k.encode() * 50 for k in keys[1:]]
    assert store.put(keys[0], b"again") is True


def test_a_batch_put_end_lost_revokes_the_whole_batch(store: Store, node: Pool) -> None:
    keys = [f"l{i}" for i in range(3)]
    _intercept(store, _batch_end_lost)
    with pytest.raises(RpcError):
        store.batch_put(keys, [b"x" * 10] * 3)
    _restore(store)
    assert _processing(node.address) == 0
    assert store.batch_put(keys, [b"y" * 10] * 3) == [ErrorCode.OK] * 3


def _batch_end_lost(real: Call, req: Any) -> Any:
    if isinstance(req, BatchPutEnd):
        raise RpcError("connection lost before the BatchPutEnd was answered")
    return real(req)


# ---------------------------------------------------------------- batch answers of the wrong length


def _shorter(field: str) -> Callable[[Any], Any]:
    return lambda reply: msgspec.structs.replace(reply, **{field: getattr(reply, field)[:-1]})


def _longer(field: str) -> Callable[[Any], Any]:
    def change(reply: Any) -> Any:
        entries = getattr(reply, field)
        return msgspec.structs.replace(reply, **{field: [*entries, entries[0]]})

    return change


def _put_two(s: Store) -> object:
    return s.batch_put(["a", "b"], [b"1" * 10, b"2" * 10])


LENGTH_CASES: dict[str, tuple[type, Callable[[Any], Any], Callable[[Store], object]]] = {
    "BatchPutStart shorter": (BatchPutStart, _shorter("results"), _put_two),
    "BatchPutEnd shorter": (BatchPutEnd, _shorter("codes"), _put_two),
    "BatchPutEnd longer": (BatchPutEnd, _longer("codes"), _put_two),
    "BatchPutCommit shorter": (BatchPutCommit, _shorter("codes"), _put_two),
    "BatchExistKey shorter": (BatchExistKey, _shorter("results"), lambda s: s.batch_exists(KEYS)),
    "BatchExistKey longer": (BatchExistKey, _longer("results"), lambda s: s.batch_exists(KEYS)),
    "BatchRemove shorter": (BatchRemove, _shorter("codes"), lambda s: s.batch_remove(KEYS)),
    "BatchRemove longer": (BatchRemove, _longer("codes"), lambda s: s.batch_remove(KEYS)),
    "BatchGetLocations shorter": (
        BatchGetLocations,
        _shorter("codes"),
        lambda s: s.batch_get(KEYS),
    ),
    "BatchGetReplicaList shorter": (
        BatchGetReplicaList,
        _shorter("results"),
        lambda s: s.batch_get_replica_desc(KEYS),
    ),
}
KEYS = ["x", "y"]


@pytest.mark.parametrize("case", list(LENGTH_CASES))
def test_a_batch_answer_of_the_wrong_length_is_rpc_fail(node: Pool, case: str) -> None:
    request, change, run = LENGTH_CASES[case]
    arenas = "64MiB" if request is BatchPutCommit else 0
    with Store(node.address, arena_size=arenas) as s:
        try:
            for k in KEYS:
                assert s.put(k, k.encode() * 10)

            def alter(real: Call, req: Any) -> Any:
                reply = real(req)
                return change(reply) if isinstance(req, request) else reply

            _intercept(s, alter)
            with pytest.raises(RpcError) as info:
                got = run(s)
                pytest.fail(f"answered {got!r}")
            assert info.value.code == ErrorCode.RPC_FAIL
            _restore(s)
            if request is not BatchPutStart:
                # Nothing of the batch is left in flight. (After a BatchPutStart answer that
                # does not fit, the Store cannot tell which keys it started: revoking them all
                # could revoke this client's own put of a key in flight in another thread. The
                # master discards them after put_start_discard_timeout.)
                assert _processing(node.address) == 0
        finally:
            _restore(s)
            s.remove_all(force=True)
