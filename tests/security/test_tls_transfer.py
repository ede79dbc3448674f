"""TLS on the transfer server (`TransferServer(tls=...)`, `TransferEngine(tls=...)`): reads and
writes, small and striped, with mutual TLS and the data key; a client with no certificate,
one of another CA, or no TLS at all moves no byte and fails promptly."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from kvpool.errors import ErrorCode
from kvpool.rpc.tls import TlsConfig
from kvpool.transfer import (
    SegmentLocation,
    SegmentMemory,
    TransferEngine,
    TransferOp,
    TransferRequest,
    TransferServer,
)
from kvpool.transfer.limits import ServerLimits
from kvpool.transfer.wire import REQ, REQ_MAGIC
from kvtest.procs import wait_until
from security.pki import Pki

NAME = "tlsseg"
SIZE = 32 << 20
KEY = b"d" * 32


@pytest.fixture
def served(pki: Pki) -> Iterator[tuple[TransferServer, SegmentMemory]]:
    mem = SegmentMemory.create(NAME, SIZE)
    server = TransferServer(
        tls=TlsConfig(pki.cert, pki.key, pki.ca).server_context(),
        data_key=lambda: KEY,
        limits=ServerLimits(stall_timeout=2.0),
    )
    try:
        server.add_segment(mem)
        yield server, mem
    finally:
        server.close()
        mem.close()


def _engine(server: TransferServer, cfg: TlsConfig | None) -> TransferEngine:
    loc = SegmentLocation(NAME, SIZE, "another-host", server.endpoint, "")
    return TransferEngine(
        lambda _n: loc,
        "tcp",
        stall_timeout=3.0,
        data_key=lambda: KEY,
        tls=None if cfg is None else cfg.client_context(),
        tcp_streams=2,
    )


def test_reads_and_writes_small_and_striped_over_mutual_tls(
    served: tuple[TransferServer, SegmentMemory], pki: Pki
) -> None:
    server, mem = served
    engine = _engine(server, TlsConfig(pki.cert, pki.key, pki.ca))
    try:
        engine.transfer([TransferRequest(TransferOp.WRITE, b"tls!" * 25, NAME, 64)])
        assert bytes(mem.buffer[64:164]) == b"tls!" * 25
        big = bytes(range(256)) * ((16 << 20) // 256)
        assert engine.transfer_batch([TransferRequest(TransferOp.WRITE, big, NAME, 1 << 20)]) == [
            ErrorCode.OK
        ]
        out = bytearray(len(big))
        assert engine.transfer_batch([TransferRequest(TransferOp.READ, out, NAME, 1 << 20)]) == [
            ErrorCode.OK
        ]
        assert out == big
        small = [bytearray(100) for _ in range(50)]  # pipelined small reads
        engine.transfer([TransferRequest(TransferOp.READ, b, NAME, 64) for b in small])
        assert all(bytes(b) == b"tls!" * 25 for b in small)
    finally:
        engine.close()
    assert server.counters().unproven == 0


@pytest.mark.parametrize("who", ["no-certificate", "other-ca", "plain"])
def test_a_client_without_a_certificate_of_the_ca_or_without_tls_moves_no_byte(
    served: tuple[TransferServer, SegmentMemory], pki: Pki, who: str
) -> None:
    server, mem = served
    cfg = {
        "no-certificate": TlsConfig(ca=pki.ca),
        "other-ca": TlsConfig(pki.other_cert, pki.other_key, pki.ca),
        "plain": None,
    }[who]
    engine = _engine(server, cfg)
    t0 = time.monotonic()
    try:
        write = TransferRequest(TransferOp.WRITE, b"\xee" * 4096, NAME, 0)
        assert engine.transfer_batch([write], timeout=20) == [ErrorCode.TRANSFER_FAIL]
        out = bytearray(4096)
        read = TransferRequest(TransferOp.READ, out, NAME, 0)
        assert engine.transfer_batch([read], timeout=20) == [ErrorCode.TRANSFER_FAIL]
        assert out == bytearray(4096)
    finally:
        engine.close()
    assert time.monotonic() - t0 < 10  # refused, not hung
    assert bytes(mem.buffer[:4096]) == bytes(4096)
    assert server.counters().writes == server.counters().reads == 0


def test_a_raw_plain_request_gets_no_plain_answer(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, _ = served
    name = NAME.encode()
    with socket.create_connection((server.host, server.port), timeout=10) as s:
        s.sendall(REQ.pack(REQ_MAGIC, int(TransferOp.READ), 0, len(name), 1, 0, 64) + name)
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
    assert b"KVR1" not in got and b"KVC1" not in got  # at most a TLS alert
    wait_until(lambda: server.connection_count() == 0, timeout=5)


def test_stalled_tls_handshakes_hold_no_worker_and_are_closed_at_the_stall_timeout(
    pki: Pki,
) -> None:
    """Peers that send the start of a ClientHello and stop would hold a worker each for the
    stall timeout; with `2 x workers` of them a real client waited that long. They now wait
    in the poller, and are closed after the stall timeout."""
    workers = 2
    mem = SegmentMemory.create(NAME, 1 << 20)
    server = TransferServer(
        tls=TlsConfig(pki.cert, pki.key, pki.ca).server_context(),
        limits=ServerLimits(workers=workers, stall_timeout=2.0),
    )
    held: list[socket.socket] = []
    engine = None
    try:
        server.add_segment(mem)
        for _ in range(2 * workers):
            s = socket.create_connection((server.host, server.port), timeout=10)
            s.sendall(b"\x16\x03\x01")  # a TLS record header, cut short
            held.append(s)
        time.sleep(0.3)  # every one of them reaches a worker
        loc = SegmentLocation(NAME, 1 << 20, "another-host", server.endpoint, "")
        engine = TransferEngine(
            lambda _n: loc,
            "tcp",
            stall_timeout=5.0,
            tls=TlsConfig(pki.cert, pki.key, pki.ca).client_context(),
        )
        out = bytearray(16)
        t0 = time.monotonic()
        engine.transfer([TransferRequest(TransferOp.READ, out, NAME, 0)])
        assert time.monotonic() - t0 < 1.0
        wait_until(lambda: server.connection_count() <= 1, timeout=8, what="the stalled ones")
    finally:
        for s in held:
            s.close()
        if engine is not None:
            engine.close()
        server.close()
        mem.close()


def test_idle_tls_connections_give_their_workers_back(pki: Pki) -> None:
    """A TLS connection that goes quiet is handed back to the poller like a plain one (the
    ssl module would otherwise wait inside a read for ever): more idle clients than workers
    do not keep another client waiting."""
    workers = 2
    mem = SegmentMemory.create(NAME, 1 << 20)
    server = TransferServer(
        tls=TlsConfig(pki.cert, pki.key, pki.ca).server_context(),
        limits=ServerLimits(workers=workers, stall_timeout=2.0),
    )
    engines: list[TransferEngine] = []
    try:
        server.add_segment(mem)
        loc = SegmentLocation(NAME, 1 << 20, "another-host", server.endpoint, "")
        for _ in range(2 * workers + 1):
            engine = TransferEngine(
                lambda _n: loc,
                "tcp",
                stall_timeout=5.0,
                tls=TlsConfig(pki.cert, pki.key, pki.ca).client_context(),
            )
            engines.append(engine)
            out = bytearray(16)
            t0 = time.monotonic()
            engine.transfer([TransferRequest(TransferOp.READ, out, NAME, 0)])
            assert time.monotonic() - t0 < 1.5  # its connection stays open, idle, afterwards
        assert server.connection_count() == 2 * workers + 1
    finally:
        for engine in engines:
            engine.close()
        server.close()
        mem.close()
