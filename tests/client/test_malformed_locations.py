"""A buggy master's LocationsReply never crashes a batch read or returns wrong bytes.

The reply is the master's, checked by msgspec for types only; its lengths, sizes, segment
indexes and offsets are checked by the Store, which answers RPC_FAIL for what does not fit. The
test wraps the Store's real RPC client and alters only the BatchGetLocations answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from kvpool.client import Store
from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.messages import BatchGetLocations, LocationsReply
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401


@pytest.fixture(scope="module")
def node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="16MiB")


@pytest.fixture
def store(node: Pool) -> Iterator[Store]:
    with Store(node.address) as s:
        for k in ("a", "b"):
            assert s.put(k, bytes([ord(k)]) * 1000)
        try:
            yield s
        finally:
            s.remove_all(force=True)


def _altering(store: Store, change: Callable[[LocationsReply], LocationsReply]) -> None:
    rpc = store._node.rpc
    real = rpc.call

    def call(req: Any, *a: Any, **kw: Any) -> Any:
        reply = real(req, *a, **kw)
        return change(reply) if isinstance(req, BatchGetLocations) else reply

    rpc.call = call  # type: ignore[method-assign]


def _first(loc: LocationsReply, **fields: Any) -> LocationsReply:
    return msgspec.structs.replace(loc, **fields)


CASES: dict[str, Callable[[LocationsReply], LocationsReply]] = {
    "odd-length places": lambda x: _first(x, places=[[0], *x.places[1:]]),
    "negative size": lambda x: _first(x, sizes=[-5, *x.sizes[1:]]),
    "negative offset": lambda x: _first(
        x, places=[[0, -1000], *x.places[1:]], checksums=[None, None]
    ),
    "segment index out of range": lambda x: _first(x, places=[[7, 0], *x.places[1:]]),
    "fewer results than keys": lambda x: _first(x, codes=x.codes[:1]),
    "more endpoints than segments": lambda x: _first(x, endpoints=[*x.endpoints, "x"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_reply_fails_cleanly(store: Store, case: str) -> None:
    assert [bytes(v or b"") for v in store.batch_get(["a", "b"])] == [b"a" * 1000, b"b" * 1000]
    _altering(store, CASES[case])
    with pytest.raises(KVPoolError) as info:
        got = store.batch_get(["a", "b"])
        pytest.fail(f"answered {[None if v is None else len(v) for v in got]}")
    assert info.value.code == ErrorCode.RPC_FAIL


def test_batch_get_into_reports_the_bad_key(store: Store) -> None:
    import numpy as np

    bufs = [np.zeros(1000, np.uint8), np.zeros(1000, np.uint8)]
    for b in bufs:
        store.register_buffer(b)
    _altering(store, CASES["negative offset"])
    assert store.batch_get_into(["a", "b"], bufs) == [int(ErrorCode.RPC_FAIL), 1000]
    assert bytes(bufs[1]) == b"b" * 1000 and not bufs[0].any()
