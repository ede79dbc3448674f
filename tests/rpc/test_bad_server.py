"""The sync and async clients against a server that misbehaves (a plain socket in a thread)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import msgspec
import pytest

from kvpool.errors import ErrorCode, KVPoolError, RpcError
from kvpool.protocol.framing import FrameDecoder, encode_frame
from kvpool.protocol.handshake import PROTOCOL_VERSION, Welcome
from kvpool.rpc.aio import AsyncRpcClient
from kvpool.rpc.client import RpcClient
from rpc.rpc_testkit import CLUSTER, Add, Response, Sum

# What the bad server does with each request frame: returns the bytes to send back.
Behaviour = Callable[[int, bytes], bytes]


class BadServer:
    """Accepts connections one at a time, answers the handshake, then applies `behaviour`."""

    def __init__(self, behaviour: Behaviour, welcome: bytes | None = None) -> None:
        self.behaviour = behaviour
        self.welcome = welcome  # raw bytes to answer the Hello with, instead of a Welcome
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="bad-server", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        dec = FrameDecoder()
        welcomed = False
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            for rid, payload in dec.feed(data):
                if not welcomed:
                    if self.welcome is not None:
                        conn.sendall(self.welcome)
                        return
                    welcome = Welcome(PROTOCOL_VERSION, CLUSTER, "bad")
                    conn.sendall(encode_frame(rid, msgspec.msgpack.encode(welcome)))
                    welcomed = True
                    continue
                out = self.behaviour(rid, payload)
                if out == b"CLOSE":
                    return
                conn.sendall(out)

    def close(self) -> None:
        self._stop = True
        # close() alone does not wake a thread blocked in accept(); shutdown() does (Linux).
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self.listener.close()
        assert not self._thread.is_alive()


@pytest.fixture
def bad_server(request: pytest.FixtureRequest) -> Iterator[BadServer]:
    srv = BadServer(request.param)
    try:
        yield srv
    finally:
        srv.close()


def _good(rid: int, payload: bytes) -> bytes:
    return encode_frame(rid, msgspec.msgpack.encode(Sum(1)))


def _reply_then_broken_prefix(rid: int, payload: bytes) -> bytes:
    return _good(rid, payload) + struct.pack("<I", 2)


def _undecodable_reply(rid: int, payload: bytes) -> bytes:
    return encode_frame(rid, b"\xc1")


def _unknown_id(rid: int, payload: bytes) -> bytes:
    return encode_frame(rid + 1000, msgspec.msgpack.encode(Sum(1))) + _good(rid, payload)


def _close(rid: int, payload: bytes) -> bytes:
    return b"CLOSE"


@pytest.mark.parametrize("bad_server", [_reply_then_broken_prefix], indirect=True)
def test_reply_before_a_broken_stream_is_delivered_then_the_client_reconnects(
    bad_server: BadServer,
) -> None:
    with RpcClient(bad_server.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
        assert c.call(Add(1, 1)) == Sum(1)  # the reply came before the break
        assert not c.connected  # the break failed the connection
        assert c.call(Add(1, 1)) == Sum(1)  # a fresh connection
    assert bad_server.connections == 2


@pytest.mark.parametrize("bad_server", [_undecodable_reply], indirect=True)
def test_undecodable_reply_fails_that_call_only(bad_server: BadServer) -> None:
    with RpcClient(bad_server.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
        with pytest.raises(KVPoolError) as info:
            c.call(Add(1, 1))
        assert info.value.code == ErrorCode.DESERIALIZE_FAIL
        assert c.connected


@pytest.mark.parametrize("bad_server", [_unknown_id], indirect=True)
def test_reply_with_an_unknown_id_is_dropped(bad_server: BadServer) -> None:
    with RpcClient(bad_server.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
        assert c.call(Add(1, 1)) == Sum(1)
        assert c.call(Add(1, 1)) == Sum(1)


@pytest.mark.parametrize("bad_server", [_close], indirect=True)
def test_server_closing_mid_call_is_rpc_fail_not_a_hang(bad_server: BadServer) -> None:
    with RpcClient(bad_server.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
        with pytest.raises(RpcError) as info:
            c.call(Add(1, 1), timeout=10)
        assert info.value.code == ErrorCode.RPC_FAIL


@pytest.mark.parametrize("bad_server", [_reply_then_broken_prefix], indirect=True)
def test_async_client_reply_before_a_broken_stream(bad_server: BadServer) -> None:
    async def main() -> None:
        async with AsyncRpcClient(
            bad_server.endpoint, response_type=Response, cluster_id=CLUSTER
        ) as c:
            assert await c.call(Add(1, 1)) == Sum(1)
            assert not c.connected
            assert await c.call(Add(1, 1)) == Sum(1)

    asyncio.run(main())


@pytest.mark.parametrize(
    "answer",
    [
        struct.pack("<I", 1),  # a broken length prefix
        encode_frame(0, b"\xc1"),  # not msgpack
        encode_frame(0, msgspec.msgpack.encode(Sum(1))),  # not a Welcome
        encode_frame(0, msgspec.msgpack.encode(Welcome(PROTOCOL_VERSION, "other", "x"))),
    ],
)
def test_a_bad_handshake_answer_fails_the_connect_cleanly(answer: bytes) -> None:
    srv = BadServer(_good, welcome=answer)
    try:
        with RpcClient(srv.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
            with pytest.raises(KVPoolError) as info:
                c.connect()
            assert info.value.code in (ErrorCode.RPC_FAIL, ErrorCode.ILLEGAL_CLIENT)
            assert not c.connected

        async def main() -> None:
            async with AsyncRpcClient(
                srv.endpoint, response_type=Response, cluster_id=CLUSTER
            ) as a:
                with pytest.raises(KVPoolError) as info:
                    await a.connect()
                assert info.value.code in (ErrorCode.RPC_FAIL, ErrorCode.ILLEGAL_CLIENT)

        asyncio.run(main())
    finally:
        srv.close()
