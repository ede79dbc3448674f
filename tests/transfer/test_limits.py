"""The transfer server's bounds (docs/parts/limits.md) and the client's progress-based
deadline: idle connections cost no thread and are closed after their limits, the connection
caps refuse clearly, a stalled request frees its worker, a frozen peer fails a transfer in
seconds."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvpool.errors import ErrorCode, InvalidParams, TransferError
from kvpool.transfer import SegmentLocation, SegmentMemory, TransferEngine, TransferServer
from kvpool.transfer.hostid import host_id
from kvpool.transfer.limits import ServerLimits
from kvpool.transfer.request import TransferOp, TransferRequest
from kvpool.transfer.wire import REQ, REQ_MAGIC, RESP, RESP_MAGIC
from kvtest.procs import freeze, wait_until
from transfer.conftest import Peer

SIZE = 1 << 20
NAME = b"lim"


def _server(**limits: Any) -> tuple[TransferServer, SegmentMemory]:
    mem = SegmentMemory.create("lim", SIZE)
    server = TransferServer(limits=ServerLimits(**limits))
    server.add_segment(mem)
    return server, mem


@pytest.fixture
def make_server() -> Iterator[Callable[..., TransferServer]]:
    owned: list[tuple[TransferServer, SegmentMemory]] = []

    def make(**limits: Any) -> TransferServer:
        owned.append(_server(**limits))
        return owned[-1][0]

    try:
        yield make
    finally:
        for server, mem in owned:
            server.close()
            mem.close()


@pytest.fixture
def sockets() -> Iterator[Callable[[TransferServer], socket.socket]]:
    owned: list[socket.socket] = []

    def connect(server: TransferServer) -> socket.socket:
        host, port = server.endpoint.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        owned.append(s)
        return s

    try:
        yield connect
    finally:
        for s in owned:
            s.close()


def _read(s: socket.socket, req_id: int = 1, n: int = 8) -> tuple[int, int]:
    s.sendall(REQ.pack(REQ_MAGIC, 1, 0, len(NAME), req_id, 0, n) + NAME)
    head = _recv(s, RESP.size)
    magic, status, rid, length = RESP.unpack(head)
    assert magic == RESP_MAGIC
    _recv(s, length)
    return status, rid


def _recv(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"EOF after {len(out)} of {n}")
        out += chunk
    return bytes(out)


def _closed_within(s: socket.socket, seconds: float) -> float:
    start = time.monotonic()
    s.settimeout(seconds)
    with contextlib.suppress(ConnectionResetError):
        while s.recv(1 << 16):
            pass
    return time.monotonic() - start


def _server_threads(server: TransferServer) -> int:
    prefix = f"kvpool-xfer-{server.port}-"
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix))


def test_many_connections_cost_at_most_the_workers_in_threads(
    make_server: Callable[..., TransferServer],
    sockets: Callable[[TransferServer], socket.socket],
) -> None:
    server = make_server(workers=4, first_request_timeout=60)
    conns = [sockets(server) for _ in range(200)]
    for i, s in enumerate(conns):
        assert _read(s, i + 1) == (0, i + 1)  # each one served, then left idle
    assert server.connection_count() == 200
    assert server.worker_count() <= 4 and _server_threads(server) <= 4
    for i, s in enumerate(conns[:20]):  # still served after going idle
        assert _read(s, 1000 + i) == (0, 1000 + i)


def test_a_silent_connection_is_closed_after_the_first_request_timeout(
    make_server: Callable[..., TransferServer],
    sockets: Callable[[TransferServer], socket.socket],
) -> None:
    server = make_server(first_request_timeout=0.3, idle_timeout=30)
    s = sockets(server)
    assert _closed_within(s, 5) < 3
    wait_until(lambda: server.connection_count() == 0, timeout=5)


def test_an_idle_connection_is_closed_after_the_idle_timeout(
    make_server: Callable[..., TransferServer],
    sockets: Callable[[TransferServer], socket.socket],
) -> None:
    server = make_server(first_request_timeout=30, idle_timeout=0.5)
    s = sockets(server)
    assert _read(s) == (0, 1)
    assert 0.3 < _closed_within(s, 5) < 4


def test_a_stalled_request_frees_its_worker_within_the_stall_timeout(
    make_server: Callable[..., TransferServer],
    sockets: Callable[[TransferServer], socket.socket],
) -> None:
    server = make_server(workers=1, stall_timeout=0.5)
    stalled = sockets(server)
    # Half a write, and then nothing: the one worker waits for the rest, but not for long.
    stalled.sendall(REQ.pack(REQ_MAGIC, 2, 0, len(NAME), 1, 0, 4096) + NAME + b"x" * 100)
    other = sockets(server)
    start = time.monotonic()
    assert _read(other) == (0, 1)
    assert time.monotonic() - start < 4
    assert _closed_within(stalled, 5) < 4


def test_connections_past_the_per_peer_cap_are_refused_and_the_engine_says_why(
    make_server: Callable[..., TransferServer],
    sockets: Callable[[TransferServer], socket.socket],
    make_engine: Callable[..., TransferEngine],
) -> None:
    server = make_server(max_connections_per_peer=2)
    held = [sockets(server), sockets(server)]
    wait_until(lambda: server.connection_count() == 2, timeout=5)
    loc = SegmentLocation("lim", SIZE, host_id(), server.endpoint, "")
    eng = make_engine({"lim": loc}, "tcp")
    buf = bytearray(8)
    with pytest.raises(TransferError, match="refused the connection") as refused:
        eng.transfer([TransferRequest(TransferOp.READ, buf, "lim", 0)])
    assert refused.value.code == ErrorCode.TRANSFER_FAIL
    assert server.refused_connections == 1
    held[0].close()
    wait_until(lambda: server.connection_count() == 1, timeout=5)
    eng.transfer([TransferRequest(TransferOp.READ, buf, "lim", 0)])  # room again


def test_a_frozen_peer_fails_a_transfer_within_the_stall_timeout(
    spawn_peer: Callable[..., Peer], make_engine: Callable[..., TransferEngine]
) -> None:
    peer = spawn_peer("frozen")
    eng = make_engine({"frozen": peer.location}, "tcp", timeout=60, stall_timeout=1.0)
    buf = bytearray(1 << 16)
    eng.transfer([TransferRequest(TransferOp.READ, buf, "frozen", 0)])  # pooled, warm
    freeze(peer.pid)
    try:
        start = time.monotonic()
        for op in (TransferOp.READ, TransferOp.WRITE):
            with pytest.raises(TransferError) as failed:
                eng.transfer([TransferRequest(op, buf, "frozen", 0)])
            assert failed.value.code == ErrorCode.TRANSFER_FAIL
        assert time.monotonic() - start < 8  # two requests, each about one stall timeout
    finally:
        import os
        import signal

        os.kill(peer.pid, signal.SIGCONT)


@pytest.mark.parametrize(
    "bad",
    [
        {"workers": 0},
        {"max_connections": 0},
        {"max_connections_per_peer": -1},
        {"first_request_timeout": 0},
        {"idle_timeout": float("nan")},
        {"stall_timeout": -1},
    ],
)
def test_bad_limits_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidParams):
        ServerLimits(**bad)


def test_engine_refuses_a_bad_stall_timeout() -> None:
    with pytest.raises(InvalidParams):
        TransferEngine(lambda name: None, stall_timeout=0)  # type: ignore[arg-type, return-value]


def test_a_pooled_connection_the_server_closed_for_idleness_costs_the_client_nothing(
    make_server: Callable[..., TransferServer], make_engine: Callable[..., TransferEngine]
) -> None:
    server = make_server(idle_timeout=0.3)
    loc = SegmentLocation("lim", SIZE, host_id(), server.endpoint, "")
    eng = make_engine({"lim": loc}, "tcp")
    for op in (TransferOp.READ, TransferOp.WRITE):
        buf = bytearray(64 << 10)
        eng.transfer([TransferRequest(op, buf, "lim", 0)])
        wait_until(lambda: server.connection_count() == 0, timeout=10, what="the idle close")
        eng.transfer([TransferRequest(op, buf, "lim", 0)])  # the stale one is retried fresh
        assert eng.transfer_batch([TransferRequest(op, buf, "lim", 0)] * 3) == [ErrorCode.OK] * 3


def test_a_client_that_stops_reading_frees_its_worker_within_the_stall_timeout(
    make_server: Callable[..., TransferServer],
    sockets: Callable[[TransferServer], socket.socket],
) -> None:
    server = make_server(workers=1, stall_timeout=0.5)
    greedy = sockets(server)
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # 64 reads of the whole segment, never read back: the worker's sendmsg stops moving.
    greedy.sendall(
        b"".join(REQ.pack(REQ_MAGIC, 1, 0, len(NAME), i + 1, 0, SIZE) + NAME for i in range(64))
    )
    greedy.settimeout(10)
    assert greedy.recv(RESP.size)  # the one worker is sending to it now
    other = sockets(server)
    start = time.monotonic()
    assert _read(other) == (0, 1)
    assert 0.3 < time.monotonic() - start < 4
    # Its connection was ended, not just paused (only `other` is left).
    wait_until(lambda: server.connection_count() == 1, timeout=5, what="the stalled close")


def test_a_peer_that_trickles_its_payload_cannot_hold_a_worker(
    make_server: Callable[..., TransferServer],
    sockets: Callable[[TransferServer], socket.socket],
) -> None:
    """A byte now and then is never a stall, but far below the minimum rate it ends the
    request: a slow-loris writer frees the one worker within seconds."""
    server = make_server(workers=1, stall_timeout=0.5, min_rate=64 << 10)
    slow = sockets(server)
    slow.sendall(REQ.pack(REQ_MAGIC, 2, 0, len(NAME), 1, 0, SIZE) + NAME)
    start = time.monotonic()
    closed = False
    while time.monotonic() - start < 10:  # 100 bytes every 5 ms: 20 KB/s, until cut off
        try:
            slow.sendall(b"s" * 100)
        except OSError:
            closed = True
            break
        if server.connection_count() == 0:
            closed = True
            break
        time.sleep(0.005)  # the pace of the slow peer itself, not a wait for the server
    assert closed, "the slow writer was never cut off"
    assert time.monotonic() - start < 5
    other = sockets(server)
    assert _read(other) == (0, 1)


def test_a_slow_payload_above_the_minimum_rate_is_not_cut(
    make_server: Callable[..., TransferServer],
    sockets: Callable[[TransferServer], socket.socket],
) -> None:
    server = make_server(stall_timeout=0.5, min_rate=1024)
    slow = sockets(server)
    payload = 64 << 10
    slow.sendall(REQ.pack(REQ_MAGIC, 2, 0, len(NAME), 1, 0, payload) + NAME)
    for _ in range(16):  # 64 KiB in 16 pieces over ~1.6 s: 40 KB/s, far above 1 KiB/s
        slow.sendall(b"p" * (payload // 16))
        time.sleep(0.1)  # the slow peer's own pace
    status, rid, _ = RESP.unpack(_recv(slow, RESP.size))[1:]
    assert (status, rid) == (0, 1)
