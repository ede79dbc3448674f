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
