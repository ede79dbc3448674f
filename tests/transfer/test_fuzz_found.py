"""What `kvpool bench fuzz` found on the data plane, one test per finding: fixed in
`kvpool.transfer`, or marked xfail (strict) with what the fix needs."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from kvpool.errors import ErrorCode
from kvpool.transfer import SegmentMemory, TransferServer
from kvpool.transfer.limits import ServerLimits
from kvpool.transfer.wire import REQ, REQ_MAGIC, RESP, RESP_MAGIC
from kvtest.procs import wait_until

NAME = b"fuzzfound"
WORKERS = 4


@pytest.fixture
def served() -> Iterator[tuple[TransferServer, SegmentMemory]]:
    mem = SegmentMemory.create(NAME.decode(), 1 << 20)
    srv = TransferServer(limits=ServerLimits(workers=WORKERS, stall_timeout=3.0))
    srv.add_segment(mem)
    try:
        yield srv, mem
    finally:
        srv.close()
        mem.close()


@pytest.fixture
def server(served: tuple[TransferServer, SegmentMemory]) -> TransferServer:
    return served[0]


def _connect(server: TransferServer) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=10)


def _request(rid: int, offset: int = 0, n: int = 8) -> bytes:
    return REQ.pack(REQ_MAGIC, 1, 0, len(NAME), rid, offset, n) + NAME


def _answer(s: socket.socket) -> tuple[int, int, bytes]:
    head = b""
    while len(head) < RESP.size:
        chunk = s.recv(RESP.size - len(head))
        assert chunk, "closed by the server"
        head += chunk
    magic, status, rid, length = RESP.unpack(head)
    assert magic == RESP_MAGIC
    body = b""
    while len(body) < length:
        body += s.recv(length - len(body))
    return status, rid, body


def test_half_sent_headers_hold_no_worker_and_delay_no_other_request(
    server: TransferServer,
) -> None:
    """A peer that sends part of a request header and stops (slowloris) held a worker for the
    whole stall timeout: `workers` such connections, renewed every few seconds, starved every
    other client (a well-formed READ waited the stall timeout, as long as a client's own stall
    limit, so gets failed). A partial header now waits in the poller, not in a worker."""
    held = [_connect(server) for _ in range(2 * WORKERS)]
    for i, s in enumerate(held):
        s.sendall(_request(100 + i)[: 1 + i % (REQ.size - 1)])
    time.sleep(0.3)  # let the poller hand every one of them to a worker (the bug's setup)
    with _connect(server) as s:
        t0 = time.monotonic()
        s.sendall(_request(1))
        assert _answer(s)[:2] == (0, 1)
        assert time.monotonic() - t0 < 1.0
    # The partial headers are still served once complete, each on its own connection.
    for i, s in enumerate(held):
        s.sendall(_request(100 + i)[1 + i % (REQ.size - 1) :])
    for i, s in enumerate(held):
        assert _answer(s)[:2] == (0, 100 + i)
        s.close()


def test_a_header_that_never_completes_is_closed_after_the_stall_timeout(
    server: TransferServer,
) -> None:
    with _connect(server) as s:
        s.sendall(_request(1)[:10])
        t0 = time.monotonic()
        s.settimeout(10)
        assert s.recv(1) == b""
        assert 2.0 < time.monotonic() - t0 < 6.0
    wait_until(lambda: server.connection_count() == 0, timeout=5)


def test_a_header_trickled_a_byte_at_a_time_is_closed_after_the_stall_timeout(
    server: TransferServer,
) -> None:
    """Each byte comes before any stall, but the header as a whole is too slow."""
    with _connect(server) as s:
        data = _request(1)
        t0 = time.monotonic()
        closed = False
        for i in range(len(data)):
            try:
                s.sendall(data[i : i + 1])
            except OSError:
                closed = True
                break
            time.sleep(0.25)
        assert closed or _gone(s)
        assert time.monotonic() - t0 < 8.0


def _gone(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        return s.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


def test_writes_without_payload_hold_no_worker_and_delay_no_other_request(
    server: TransferServer,
) -> None:
    """A WRITE whose payload never came held its worker until the stall timeout (`read_into`
    in the worker): `2 x workers` such requests, renewed, made every other client wait the
    stall timeout (the fuzz: a Store put failed after 5.0 s, its own stall limit). A stalled
    payload now waits in the poller with its progress while others wait for a worker."""
    held = [_connect(server) for _ in range(2 * WORKERS)]
    for s in held:
        s.sendall(REQ.pack(REQ_MAGIC, 2, 0, len(NAME), 7, 0, 4096) + NAME)
    time.sleep(0.3)  # let the poller hand every one of them to a worker
    try:
        with _connect(server) as s:
            t0 = time.monotonic()
            s.sendall(_request(1))
            assert _answer(s)[:2] == (0, 1)
            assert time.monotonic() - t0 < 1.0
    finally:
        for s in held:
            s.close()


def _write(rid: int, offset: int, n: int, name: bytes = NAME) -> bytes:
    return REQ.pack(REQ_MAGIC, 2, 0, len(name), rid, offset, n) + name


def test_writes_that_stall_mid_payload_give_way_and_complete_when_the_rest_comes(
    server: TransferServer,
) -> None:
    """Half a payload, a pause while another client is served, then the rest: each write is
    resumed by whichever worker is free, its bytes land where they belong, and it is answered
    in order before the connection's next request."""
    n = 64 << 10
    held = [_connect(server) for _ in range(2 * WORKERS)]
    payloads = [bytes([i + 1]) * n for i in range(len(held))]
    for i, s in enumerate(held):
        s.sendall(_write(10 + i, i * n, n) + payloads[i][: n // 2])
    time.sleep(0.3)  # every one of them stalls mid-payload in a worker
    try:
        with _connect(server) as s:
            t0 = time.monotonic()
            s.sendall(_request(1))
            assert _answer(s)[:2] == (0, 1)
            assert time.monotonic() - t0 < 1.0
        for i, s in enumerate(held):
            s.sendall(payloads[i][n // 2 :] + _request(50 + i, i * n, 16))
        for i, s in enumerate(held):
            assert _answer(s)[:2] == (0, 10 + i)
            assert _answer(s) == (0, 50 + i, bytes([i + 1]) * 16)
    finally:
        for s in held:
            s.close()
    assert server.counters().writes == len(held)


def test_refused_writes_without_payload_hold_no_worker_either(server: TransferServer) -> None:
    held = [_connect(server) for _ in range(2 * WORKERS)]
    for s in held:
        s.sendall(_write(7, 0, 4096, b"no-such-segment"))
    time.sleep(0.3)
    try:
        with _connect(server) as s:
            t0 = time.monotonic()
            s.sendall(_request(1))
            assert _answer(s)[:2] == (0, 1)
            assert time.monotonic() - t0 < 1.0
        held[0].sendall(b"\0" * 4096)  # the drained payload, then the refusal
        assert _answer(held[0])[:2] == (int(ErrorCode.SEGMENT_NOT_FOUND), 7)
    finally:
        for s in held:
            s.close()


def test_a_write_whose_payload_stops_is_closed_after_the_stall_timeout_and_lets_go(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    """A pending write holds its segment's mapping; the sweep closes it and releases it."""
    server, mem = served
    others = [_connect(server) for _ in range(2 * WORKERS)]
    with _connect(server) as s:
        s.sendall(_write(3, 0, 4096) + b"x" * 100)
        for o in others:  # others wait, so the stalled write gives way to the poller
            o.sendall(_request(4))
        t0 = time.monotonic()
        assert _gone(s)
        assert 2.0 < time.monotonic() - t0 < 7.0
    for o in others:
        assert _answer(o)[:2] == (0, 4)
        o.close()
    wait_until(lambda: server.connection_count() == 0, timeout=5)
    assert mem.mapping.holders == 0
