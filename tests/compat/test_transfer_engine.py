"""The shim's `mooncake.engine.TransferEngine`: SGLang's calls between two engines on loopback.

SGLang (sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py) makes an
engine, `initialize(hostname, "P2PHANDSHAKE", protocol, device)` (non-zero aborts), names its
session "host:get_rpc_port()", registers memory (0 expected) and moves bytes with
`transfer_sync_write` / `batch_transfer_sync_write` (negative is a failure). kvpool's engine
only: the real one binds every interface (docs/compat.md).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from kvpool.compat.mooncake.transfer_engine import TransferEngine


@pytest.fixture
def engines() -> Iterator[tuple[TransferEngine, TransferEngine]]:
    a, b = TransferEngine(), TransferEngine()
    try:
        assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        yield a, b
    finally:
        a.close()
        b.close()


def _session(engine: TransferEngine) -> str:
    return f"127.0.0.1:{engine.get_rpc_port()}"


def test_write_and_read_between_two_engines(engines: tuple[TransferEngine, TransferEngine]) -> None:
    a, b = engines
    src = np.arange(1 << 16, dtype=np.uint8)
    dst = np.zeros(1 << 16, dtype=np.uint8)
    back = np.zeros(1 << 16, dtype=np.uint8)
    assert a.register_memory(src.ctypes.data, src.nbytes) == 0
    assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert a.send_probe(_session(b)) == 0
    assert a.transfer_sync_write(_session(b), src.ctypes.data, dst.ctypes.data, 4096) == 0
    assert np.array_equal(dst[:4096], src[:4096])
    ptrs = [src.ctypes.data + 4096 * i for i in range(1, 4)]
    peers = [dst.ctypes.data + 4096 * i for i in (3, 2, 1)]
    assert a.batch_transfer_sync_write(_session(b), ptrs, peers, [4096] * 3) == 0
    assert np.array_equal(dst[3 * 4096 : 4 * 4096], src[4096 : 2 * 4096])
    assert a.transfer_sync_read(_session(b), back.ctypes.data, dst.ctypes.data, 1 << 16) == 0
    assert np.array_equal(back, dst)


def test_memory_the_peer_did_not_register_is_refused(
    engines: tuple[TransferEngine, TransferEngine],
) -> None:
    a, b = engines
    src = np.ones(4096, dtype=np.uint8)
    dst = np.zeros(8192, dtype=np.uint8)
    assert b.register_memory(dst.ctypes.data, 4096) == 0
    assert a.transfer_sync_write(_session(b), src.ctypes.data, dst.ctypes.data + 4096, 4096) == -1
    assert a.transfer_sync_write(_session(b), src.ctypes.data, dst.ctypes.data + 1, 4096) == -1
    assert not dst.any()
    assert b.unregister_memory(dst.ctypes.data) == 0
    assert a.transfer_sync_write(_session(b), src.ctypes.data, dst.ctypes.data, 4096) == -1
    assert b.unregister_memory(dst.ctypes.data) == -1


def test_registration_answers_as_mooncake(engines: tuple[TransferEngine, TransferEngine]) -> None:
    a, _ = engines
    buf = np.zeros(8192, dtype=np.uint8)
    base = buf.ctypes.data
    assert a.batch_register_memory([base, base + 4096], [4096, 4096]) == 0
    assert a.register_memory(base + 100, 10) == -1  # overlaps
    assert a.register_memory(base, 0) == -1
    assert a.batch_unregister_memory([base, base + 4096]) == 0
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1  # twice
    with pytest.raises(NotImplementedError):
        a.get_engine()


def test_a_dead_or_malformed_peer_is_a_failure_not_a_crash(
    engines: tuple[TransferEngine, TransferEngine],
) -> None:
    a, b = engines
    buf = np.zeros(16, dtype=np.uint8)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    assert a.transfer_sync_write(f"127.0.0.1:{closed_port}", buf.ctypes.data, 1, 16) == -1
    assert a.transfer_sync_write("127.0.0.1", buf.ctypes.data, 1, 16) == -1  # no port
    # Garbage, then a frame of an unknown op: the peer answers -1 or hangs up, and lives on.
    with socket.create_connection(("127.0.0.1", b.get_rpc_port()), timeout=5) as s:
        s.sendall(struct.pack("<cQQ", b"X", 0, 0))
        assert s.recv(4) in (b"", struct.pack("<i", -1))
    with socket.create_connection(("127.0.0.1", b.get_rpc_port()), timeout=5) as s:
        s.sendall(b"\x00\x01")
    assert a.send_probe(_session(b)) == 0
