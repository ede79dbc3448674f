"""A transfer server given a data key serves only connections that proved it
(`kvpool.transfer.proof`): a raw connection that skips the proof, or proves another key, gets
no byte beyond the challenge and cannot write one; an engine with the key reads and writes."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from kvpool.errors import ErrorCode
from kvpool.transfer import (
    SegmentLocation,
    SegmentMemory,
    TransferEngine,
    TransferOp,
    TransferRequest,
    TransferServer,
)
from kvpool.transfer.proof import CHALLENGE, CHALLENGE_MAGIC, HELLO, data_proof
from kvpool.transfer.wire import REQ, REQ_MAGIC, RESP, RESP_MAGIC
from kvtest.procs import wait_until

NAME = "proofseg"
SIZE = 1 << 16
KEY = b"k" * 32
OTHER_KEY = b"o" * 32


@pytest.fixture
def served() -> Iterator[tuple[TransferServer, SegmentMemory]]:
    mem = SegmentMemory.create(NAME, SIZE)
    mem.buffer[:SIZE] = bytes(range(256)) * (SIZE // 256)
    server = TransferServer(data_key=lambda: KEY)
    try:
        server.add_segment(mem)
        yield server, mem
    finally:
        server.close()
        mem.close()


def _connect(server: TransferServer) -> socket.socket:
    s = socket.create_connection((server.host, server.port), timeout=10)
    return s


def _read_all(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    got = b""
    while True:
        try:
            chunk = s.recv(1 << 16)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def _challenge(s: socket.socket) -> bytes:
    head = b""
    while len(head) < CHALLENGE.size:
        chunk = s.recv(CHALLENGE.size - len(head))
        assert chunk, "closed before the challenge"
        head += chunk
    magic, nonce = CHALLENGE.unpack(head)
    assert magic == CHALLENGE_MAGIC
    return bytes(nonce)


def _read_req(rid: int, n: int = 64) -> bytes:
    return REQ.pack(REQ_MAGIC, int(TransferOp.READ), 0, len(NAME), rid, 0, n) + NAME.encode()


def _write_req(rid: int, payload: bytes) -> bytes:
    head = REQ.pack(REQ_MAGIC, int(TransferOp.WRITE), 0, len(NAME), rid, 0, len(payload))
    return head + NAME.encode() + payload


def test_a_read_without_the_proof_gets_nothing_but_the_challenge_and_a_close(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, _ = served
    with _connect(server) as s:
        # A request in place of the proof, padded past the proof's size.
        s.sendall(_read_req(1) + _read_req(2))
        got = _read_all(s)
    assert len(got) == CHALLENGE.size and got.startswith(CHALLENGE_MAGIC)
    assert server.counters().unproven == 1
    assert server.counters().reads == 0
    wait_until(lambda: server.connection_count() == 0, timeout=5)


def test_a_write_without_the_proof_changes_no_byte(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, mem = served
    before = bytes(mem.buffer[:SIZE])
    with _connect(server) as s:
        with contextlib.suppress(OSError):  # closed under us: as good
            s.sendall(_write_req(1, b"\xff" * 4096) * 4)
        got = _read_all(s)
    assert RESP_MAGIC not in got
    assert bytes(mem.buffer[:SIZE]) == before
    assert server.counters().writes == 0


def test_a_proof_of_another_key_or_a_replayed_one_is_closed(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, _ = served
    with _connect(server) as s:
        nonce = _challenge(s)
        s.sendall(HELLO + data_proof(OTHER_KEY, nonce) + _read_req(1))
        assert _read_all(s) == b""
    with _connect(server) as s:
        _challenge(s)
        s.sendall(HELLO + data_proof(KEY, nonce) + _read_req(1))  # the first one's nonce
        assert _read_all(s) == b""
    assert server.counters().unproven == 2


def test_a_raw_client_that_proves_the_key_is_served(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, mem = served
    with _connect(server) as s:
        nonce = _challenge(s)
        s.sendall(HELLO + data_proof(KEY, nonce) + _read_req(7, 16))
        head = b""
        while len(head) < RESP.size + 16:
            head += s.recv(RESP.size + 16 - len(head))
    magic, status, rid, length = RESP.unpack(head[: RESP.size])
    assert (magic, status, rid, length) == (RESP_MAGIC, 0, 7, 16)
    assert head[RESP.size :] == bytes(mem.buffer[:16])


def _engine(server: TransferServer, key: bytes | None) -> TransferEngine:
    loc = SegmentLocation(NAME, SIZE, "another-host", server.endpoint, "")
    return TransferEngine(lambda _n: loc, "tcp", stall_timeout=3.0, data_key=lambda: key)


def test_an_engine_with_the_key_reads_and_writes_over_tcp(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    server, mem = served
    engine = _engine(server, KEY)
    try:
        engine.transfer([TransferRequest(TransferOp.WRITE, b"hello" * 100, NAME, 1000)])
        out = bytearray(500)
        engine.transfer([TransferRequest(TransferOp.READ, out, NAME, 1000)])
        assert bytes(out) == b"hello" * 100
        assert bytes(mem.buffer[1000:1500]) == b"hello" * 100
        # Striped, on several connections, each proving the key.
        big = bytes(range(256)) * (SIZE // 256)
        codes = engine.transfer_batch([TransferRequest(TransferOp.WRITE, big, NAME, 0)])
        assert codes == [ErrorCode.OK]
    finally:
        engine.close()


@pytest.mark.parametrize("key", [OTHER_KEY, None], ids=["other-key", "no-key"])
def test_an_engine_with_another_key_or_none_moves_no_byte(
    served: tuple[TransferServer, SegmentMemory], key: bytes | None
) -> None:
    server, mem = served
    before = bytes(mem.buffer[:SIZE])
    engine = _engine(server, key)
    try:
        codes = engine.transfer_batch(
            [TransferRequest(TransferOp.WRITE, b"\xee" * 4096, NAME, 0)], timeout=10
        )
        assert codes == [ErrorCode.TRANSFER_FAIL]
        out = bytearray(64)
        codes = engine.transfer_batch([TransferRequest(TransferOp.READ, out, NAME, 0)], timeout=10)
        assert codes == [ErrorCode.TRANSFER_FAIL]
        assert bytes(out) == bytes(64)
    finally:
        engine.close()
    assert bytes(mem.buffer[:SIZE]) == before
    assert server.counters().reads == server.counters().writes == 0


def test_a_server_without_a_key_serves_a_client_without_one() -> None:
    mem = SegmentMemory.create(NAME, SIZE)
    server = TransferServer()
    try:
        server.add_segment(mem)
        engine = _engine(server, None)
        try:
            out = bytearray(16)
            engine.transfer([TransferRequest(TransferOp.READ, out, NAME, 0)])
        finally:
            engine.close()
    finally:
        server.close()
        mem.close()


def test_random_bytes_in_place_of_the_proof_are_closed_and_the_server_serves_on(
    served: tuple[TransferServer, SegmentMemory],
) -> None:
    """200 connections sending random garbage of every length (less than a proof, exactly
    one, more) get nothing but the challenge; a proven client is served afterwards and no
    connection is left open."""
    import random

    server, mem = served
    rng = random.Random(15)
    for i in range(200):
        n = rng.choice([1, 7, len(HELLO), 43, 44, 45, 100, 4096])
        with _connect(server) as s:
            with contextlib.suppress(OSError):
                s.sendall(rng.randbytes(n))
            if n >= len(HELLO) + 36:
                got = _read_all(s)
                assert len(got) == CHALLENGE.size, (i, n)
    wait_until(lambda: server.connection_count() == 0, timeout=10)
    assert server.counters().reads == server.counters().writes == 0
    with _connect(server) as s:
        nonce = _challenge(s)
        s.sendall(HELLO + data_proof(KEY, nonce) + _read_req(9, 8))
        head = b""
        while len(head) < RESP.size + 8:
            head += s.recv(RESP.size + 8 - len(head))
    assert RESP.unpack(head[: RESP.size])[1:3] == (0, 9)
    assert head[RESP.size :] == bytes(mem.buffer[:8])
