"""The RPC server's connection limits (docs/parts/limits.md): handshake and idle timeouts,
per-peer and total caps with a clear refusal, and the counts they keep coming back to zero."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import msgspec
import pytest

from kvpool.errors import ErrorCode, InvalidParams, KVPoolError
from kvpool.protocol.framing import ERROR_FLAG, ErrorReply
from kvpool.rpc.client import RpcClient
from kvpool.rpc.server import RpcServer
from kvpool.rpc.thread import ServerThread
from kvtest.procs import wait_until
from rpc.rpc_testkit import CLUSTER, Add, RawConn, Request, Response, Said, Say, Sum, handler


def _server(**limits: float) -> ServerThread[RpcServer]:
    srv = RpcServer(handler, request_type=Request, cluster_id=CLUSTER, unix=False, **limits)  # type: ignore[arg-type]
    return ServerThread(srv).start()


@pytest.fixture
def limited() -> Iterator[ServerThread[RpcServer]]:
    st = _server(handshake_timeout=0.3, idle_timeout=0.6, max_connections_per_peer=3)
    try:
        yield st
    finally:
        st.stop()


def _closed_with(conn: RawConn, code: ErrorCode, within: float) -> float:
    """Seconds until the server closed `conn`, after an ErrorReply of `code`."""
    start = time.monotonic()
    conn.sock.settimeout(within)
    assert conn.closed_by_peer()
    errors = [p for rid, p in conn.frames if rid & ERROR_FLAG]
    assert errors, "no error frame before the close"
    assert msgspec.msgpack.decode(errors[0], type=ErrorReply).code == int(code)
    return time.monotonic() - start


def test_a_connection_without_a_hello_is_closed_after_the_handshake_timeout(
    limited: ServerThread[RpcServer],
) -> None:
    raw = RawConn(limited.endpoint)
    try:
        raw.send(b"\x10\x00")  # a few bytes of a frame that never completes
        waited = _closed_with(raw, ErrorCode.RPC_TIMEOUT, 5)
        assert waited < 3
    finally:
        raw.close()


def test_an_idle_handshaken_connection_is_closed_and_a_busy_one_is_not(
    limited: ServerThread[RpcServer],
) -> None:
    idle = RawConn(limited.endpoint)
    try:
        assert idle.hello().cluster_id == CLUSTER
        with RpcClient(
            limited.endpoint, response_type=Response, cluster_id=CLUSTER, unix=False
        ) as c:
            # Busy: a request every 0.1 s for twice the idle limit, never cut.
            deadline = time.monotonic() + 1.2
            while time.monotonic() < deadline:
                assert c.call(Add(1, 1)) == Sum(2)
                time.sleep(0.1)
            _closed_with(idle, ErrorCode.RPC_TIMEOUT, 5)
            assert c.call(Add(2, 2)) == Sum(4)
    finally:
        idle.close()


def test_connections_past_the_per_peer_cap_are_refused_clearly_and_the_count_recovers(
    limited: ServerThread[RpcServer],
) -> None:
    clients = [
        RpcClient(limited.endpoint, response_type=Response, cluster_id=CLUSTER, unix=False)
        for _ in range(4)
    ]
    try:
        for c in clients[:3]:
            assert c.call(Add(1, 2)) == Sum(3)
        with pytest.raises(KVPoolError) as refused:
            clients[3].call(Add(1, 2))
        assert refused.value.code == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
        assert "too many connections from 127.0.0.1" in str(refused.value)
        assert limited.server.refused_connections == 1
        clients[0].close()
        wait_until(lambda: limited.server.connection_count == 2, timeout=5)
        assert clients[3].call(Add(2, 2)) == Sum(4)  # room again
    finally:
        for c in clients:
            c.close()
    wait_until(lambda: not limited.server._per_peer, timeout=5, what="per-peer counts to drain")


def test_the_total_cap_refuses_too() -> None:
    st = _server(max_connections=2)
    try:
        a, b, c = (
            RpcClient(st.endpoint, response_type=Response, cluster_id=CLUSTER, unix=False)
            for _ in range(3)
        )
        with a, b, c:
            assert a.call(Add(0, 1)) == Sum(1) and b.call(Add(0, 2)) == Sum(2)
            with pytest.raises(KVPoolError, match="in all"):
                c.call(Add(0, 3))
    finally:
        st.stop()


@pytest.mark.parametrize(
    "limits",
    [
        {"handshake_timeout": 0},
        {"idle_timeout": -1},
        {"max_connections": 0},
        {"max_connections_per_peer": 0},
    ],
)
def test_bad_limits_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(InvalidParams):
        RpcServer(handler, request_type=Request, **limits)  # type: ignore[arg-type]


def test_before_its_handshake_a_peer_cannot_make_the_server_buffer_a_large_frame(
    limited: ServerThread[RpcServer],
) -> None:
    raw = RawConn(limited.endpoint)
    try:
        raw.send(struct.pack("<IQ", 1 << 20, 0))  # a 1 MiB Hello is announced, never sent
        assert raw.closed_by_peer()
        errors = [p for rid, p in raw.frames if rid & ERROR_FLAG]
        assert msgspec.msgpack.decode(errors[0], type=ErrorReply).code == int(
            ErrorCode.BUFFER_OVERFLOW
        )
    finally:
        raw.close()
    # After the handshake the server's own frame limit applies (64 MiB by default).
    with RpcClient(limited.endpoint, response_type=Response, cluster_id=CLUSTER, unix=False) as c:
        assert c.call(Say("x" * (1 << 20))) == Said("x" * (1 << 20))
