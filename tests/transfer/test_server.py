"""TransferServer on a raw socket: bounds, refusals, malformed input, half-closed and dying
peers. The server must answer precisely, serve no byte outside a segment, and keep serving."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvpool.errors import ErrorCode, InvalidParams, SegmentError
from kvpool.transfer import SegmentMemory, TransferServer
from kvpool.transfer.wire import REQ, REQ_MAGIC, RESP, RESP_MAGIC
from kvtest.procs import wait_until

SIZE = 1 << 16


@pytest.fixture
def served() -> Iterator[tuple[TransferServer, SegmentMemory]]:
    mem = SegmentMemory.create("srv", SIZE)
    server = TransferServer()
    try:
        server.add_segment(mem)
        yield server, mem
    finally:
        server.close()
        mem.close()


def connect(server: TransferServer) -> socket.socket:
    host, port = server.endpoint.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def request(op: int, name: bytes, req_id: int, offset: int, length: int) -> bytes:
    return REQ.pack(REQ_MAGIC, op, 0, len(name), req_id, offset, length) + name


def recv_exact(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"EOF after {len(out)} of {n}")
        out += chunk
    return bytes(out)


def answer(s: socket.socket) -> tuple[int, int, int]:
    magic, status, rid, length = RESP.unpack(recv_exact(s, RESP.size))
    assert magic == RESP_MAGIC
    return status, rid, length


def test_read_and_write_in_bounds(served: tuple[TransferServer, SegmentMemory]) -> None:
    server, mem = served
    with connect(server) as s:
        s.sendall(request(2, b"srv", 1, SIZE - 4, 4) + b"tail")
        assert answer(s) == (0, 1, 0)
        assert bytes(mem.buffer[SIZE - 4 :]) == b"tail"
        s.sendall(request(1, b"srv", 2, SIZE - 4, 4))
        assert answer(s) == (0, 2, 4)
        assert recv_exact(s, 4) == b"tail"


@pytest.mark.parametrize(
    ("offset", "length"),
    [(SIZE, 1), (SIZE - 1, 2), (0, SIZE + 1), (2**63, 1), (1, 2**64 - 1)],
)
def test_out_of_bounds_is_refused_and_serves_no_byte(
    served: tuple[TransferServer, SegmentMemory], offset: int, length: int
) -> None:
    server, _mem = served
    with connect(server) as s:
        s.sendall(request(1, b"srv", 7, offset, length))
        assert answer(s) == (int(ErrorCode.INVALID_PARAMS), 7, 0)
        # The connection is still in step: a good request right after works.
        s.sendall(request(1, b"srv", 8, 0, 2))
        assert answer(s) == (0, 8, 2)
        assert recv_exact(s, 2) == b"\0\0"


def test_refused_write_is_drained_and_writes_nothing(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, mem = served
    payload = b"Z" * 3000
    with connect(server) as s:
        s.sendall(request(2, b"srv", 1, SIZE - 1000, 3000) + payload)
        assert answer(s)[0] == int(ErrorCode.INVALID_PARAMS)
        s.sendall(request(2, b"nope", 2, 0, 3000) + payload)
        assert answer(s)[0] == int(ErrorCode.SEGMENT_NOT_FOUND)
        s.sendall(request(1, b"srv", 3, 0, 1))
        assert answer(s) == (0, 3, 1)
        recv_exact(s, 1)
    assert b"Z" not in bytes(mem.buffer)


def test_malformed_header_closes_only_that_connection(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, _ = served
    with connect(server) as bad, connect(server) as good:
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 32)
        status, _, _ = answer(bad)
        assert status == int(ErrorCode.INVALID_PARAMS)
        assert bad.recv(1) == b""  # closed by the server
        bad2 = connect(server)
        bad2.sendall(REQ.pack(REQ_MAGIC, 9, 0, 3, 1, 0, 1) + b"srv")  # unknown op
        assert answer(bad2)[0] == int(ErrorCode.INVALID_PARAMS)
        bad2.close()
        good.sendall(request(1, b"srv", 1, 0, 8))
        assert answer(good) == (0, 1, 8)


def test_half_closed_and_dying_peers_do_not_hurt_the_server(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, _mem = served
    # Half a header, then half-close.
    s1 = connect(server)
    s1.sendall(request(1, b"srv", 1, 0, 8)[:10])
    s1.shutdown(socket.SHUT_WR)
    assert s1.recv(1) == b""
    s1.close()
    # A write that dies halfway through its payload (RST on close).
    s2 = connect(server)
    s2.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s2.sendall(request(2, b"srv", 1, 0, 10000) + b"q" * 5000)
    s2.close()
    # A reader that vanishes before reading its answer.
    s3 = connect(server)
    s3.sendall(request(1, b"srv", 1, 0, SIZE))
    s3.close()
    wait_until(lambda: server.connection_count() == 0, timeout=10, what="connections to end")
    with connect(server) as s:
        s.sendall(request(1, b"srv", 5, 0, 4))
        assert answer(s) == (0, 5, 4)
        recv_exact(s, 4)


def test_a_segment_closed_under_a_write_whose_peer_dies_is_unmapped(
    closing: Callable[[Any], Any],
) -> None:
    mem = closing(SegmentMemory.create("dying", SIZE))
    with TransferServer() as server:
        server.add_segment(mem)
        s = connect(server)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(request(2, b"dying", 1, 0, 10000) + b"q" * 5000)
        wait_until(lambda: mem.mapping.holders == 1, timeout=10, what="the write to hold it")
        mem.close()  # the owner unmounts while the payload is arriving: quarantined
        assert mem.mapping.quarantined
        s.close()  # the peer dies halfway through its payload (RST)
        wait_until(lambda: server.connection_count() == 0, timeout=10, what="the connection")
        # The server's last release unmapped it (no slice of it was left alive).
        assert mem.mapping.closed and not mem.mapping.quarantined


def test_removed_segment_is_no_longer_served(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, mem = served
    with pytest.raises(SegmentError) as info:
        server.add_segment(mem)
    assert info.value.code is ErrorCode.SEGMENT_ALREADY_EXISTS
    server.remove_segment("srv")
    with pytest.raises(SegmentError):
        server.remove_segment("srv")
    with connect(server) as s:
        s.sendall(request(1, b"srv", 1, 0, 4))
        assert answer(s)[0] == int(ErrorCode.SEGMENT_NOT_FOUND)


def test_closing_a_segment_removes_it_from_the_server(closing: Callable[[Any], Any]) -> None:
    with TransferServer() as server:
        mem = closing(SegmentMemory.create("gone", 4096))
        server.add_segment(mem)
        mem.close()
        assert server.segment_names() == []


def test_bad_port_is_refused() -> None:
    with pytest.raises(InvalidParams):
        TransferServer(port=70000)


def test_close_ends_idle_connections_and_threads(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, _ = served
    conns = [connect(server) for _ in range(3)]
    try:
        wait_until(lambda: server.connection_count() == 3, timeout=10, what="3 connections")
        server.close()
        assert server.connection_count() == 0
        for c in conns:
            assert c.recv(1) == b""
    finally:
        for c in conns:
            c.close()


def test_pipelined_requests_are_answered_in_order(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, mem = served
    mem.buffer[:256] = bytes(range(256))
    blob = bytearray()
    expected: list[tuple[int, int, bytes]] = []  # (status, req_id, payload)
    for i in range(1, 61):
        kind = i % 4
        if kind == 0:  # read
            blob += request(1, b"srv", i, i, 16)
            expected.append((0, i, bytes(range(i, i + 16))))
        elif kind == 1:  # write into the upper half
            data = bytes([i]) * 100
            blob += request(2, b"srv", i, 1000 + i * 100, 100) + data
            expected.append((0, i, b""))
        elif kind == 2:  # refused read
            blob += request(1, b"srv", i, SIZE, 1)
            expected.append((int(ErrorCode.INVALID_PARAMS), i, b""))
        else:  # refused write (payload drained)
            blob += request(2, b"nope", i, 0, 50) + b"x" * 50
            expected.append((int(ErrorCode.SEGMENT_NOT_FOUND), i, b""))
    with connect(server) as s:
        s.sendall(blob)
        for status, rid, payload in expected:
            assert answer(s) == (status, rid, len(payload))
            assert recv_exact(s, len(payload)) == payload if payload else True
    for i in range(1, 61, 4):
        assert bytes(mem.buffer[1000 + i * 100 : 1100 + i * 100]) == bytes([i]) * 100
    assert b"x" * 50 not in bytes(mem.buffer)
