"""READs of a disk tier over TCP are sent with `sendfile` from the tier's file
(`kvpool.transfer.serving.TierFile`): exact bytes through a whole pool, an error code (never a
SIGBUS, never a hang) for a range its file no longer holds, and TLS keeps the mapping's path."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.errors import ErrorCode
from kvpool.protocol.messages import ReplicaKind
from kvpool.rpc.tls import TlsConfig
from kvpool.transfer import (
    SegmentLocation,
    SegmentMemory,
    TransferEngine,
    TransferOp,
    TransferRequest,
    TransferServer,
)
from kvpool.transfer.memory import DISK_FILE_NAME
from kvpool.transfer.serving import SENDFILE_MIN, SendfilePolicy
from kvpool.transfer.wire import REQ, REQ_MAGIC, RESP, RESP_MAGIC
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import Proc, wait_until
from security.pki import Pki, pki  # noqa: F401

from .conftest import PEER_RE, pattern

MiB = 1 << 20


def _request(name: bytes, req_id: int, offset: int, length: int) -> bytes:
    return REQ.pack(REQ_MAGIC, int(TransferOp.READ), 0, len(name), req_id, offset, length) + name


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError(f"EOF after {len(out)} of {n}")
        out += chunk
    return bytes(out)


def _read(s: socket.socket, name: bytes, req_id: int, offset: int, length: int) -> int | bytes:
    """One READ on the raw socket: its bytes, or the error code answered."""
    s.sendall(_request(name, req_id, offset, length))
    magic, status, rid, n = RESP.unpack(_recv_exact(s, RESP.size))
    assert magic == RESP_MAGIC and rid == req_id
    if status:
        assert n == 0
        return status
    assert n == length
    return _recv_exact(s, n)


def _kinds(s: Store, key: str) -> list[ReplicaKind]:
    return [ReplicaKind(r.kind) for r in s.get_replica_desc(key)]


def test_a_tcp_get_of_a_disk_only_16mib_object_is_exact_through_sendfile(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    p = pool(nodes=0, master_args=("--offload-policy", "on-evict", "--no-promotion-on-hit"))
    value = os.urandom(16 * MiB)
    with (
        Store(
            p.address,
            segment_size="40MiB",
            offload_dir=str(tmp_path / "disk"),
            offload_size="128MiB",
            rpc_timeout=30.0,
        ) as owner,
        Store(p.address, protocol="tcp", rpc_timeout=30.0) as tcp,
    ):
        assert owner.put("big", value)

        # Filler puts push it out of memory (on-evict); each look is an access (it becomes
        # the most recent), so a memory's worth of filler goes between two looks.
        for n in range(40):
            assert tcp.put(f"fill{n}", b"f" * (8 * MiB))
            if n % 6 == 5 and _kinds(tcp, "big") == [ReplicaKind.LOCAL_DISK]:
                break
        assert _kinds(tcp, "big") == [ReplicaKind.LOCAL_DISK]
        server = owner._node.transfer_server
        assert server is not None
        server.sendfile = SendfilePolicy.ALWAYS  # (by default only peers on other hosts)
        before = server.counters().sendfile_reads
        assert tcp.get("big") == value
        buf = bytearray(16 * MiB)
        tcp.register_buffer(buf)
        try:
            assert tcp.get_into("big", buf) == 16 * MiB
            assert buf == value
        finally:
            tcp.unregister_buffer(buf)
        wait_until(  # (counted by the worker once its send returned)
            lambda: server.counters().sendfile_reads >= before + 2, what="two sendfile reads"
        )
        assert server.counters().tier_reads >= server.counters().sendfile_reads


@pytest.fixture
def disk_peer(tmp_path: Path) -> Iterator[Proc]:
    """A `python -m kvpool.transfer.serve --disk-dir` child serving a 16 MiB tier file."""
    args = [sys.executable, "-m", "kvpool.transfer.serve", "--name", "tier", "--size", "16MiB"]
    proc = Proc([*args, "--fill", "--disk-dir", str(tmp_path)], name="serve tier")
    try:
        proc.wait_for_line(PEER_RE, timeout=30)
        yield proc
    finally:
        proc.stop()


def test_a_tier_file_truncated_under_the_server_answers_an_error_code(
    disk_peer: Proc, tmp_path: Path
) -> None:
    m = disk_peer.wait_for_line(PEER_RE, timeout=1)
    host, port = m["endpoint"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        assert _read(s, b"tier", 1, 3 * MiB, 4 * MiB) == pattern(3 * MiB, 4 * MiB)
        os.truncate(tmp_path / DISK_FILE_NAME, MiB)  # the file shrinks under the server
        assert _read(s, b"tier", 2, 8 * MiB, 4 * MiB) == int(ErrorCode.FILE_READ_FAIL)
        assert _read(s, b"tier", 3, 2 * MiB, 4096) == int(ErrorCode.FILE_READ_FAIL)
        assert _read(s, b"tier", 4, MiB - 4096, 8192) == int(ErrorCode.FILE_READ_FAIL)
        assert _read(s, b"tier", 5, 0, SENDFILE_MIN) == pattern(0, SENDFILE_MIN)
        assert _read(s, b"tier", 6, 4096, 100) == pattern(4096, 100)
    assert disk_peer.alive()


def _tier(tmp_path: Path, size: int) -> SegmentMemory:
    path = tmp_path / DISK_FILE_NAME
    path.write_bytes(os.urandom(size))
    return SegmentMemory.map_file("tier", str(path), size, populate=False, share=True)


@pytest.mark.parametrize(
    ("tls", "policy"),
    [
        (False, SendfilePolicy.ALWAYS),
        (True, SendfilePolicy.ALWAYS),
        (False, SendfilePolicy.REMOTE),  # the default: this peer is on loopback
    ],
)
def test_plain_tcp_reads_use_sendfile_and_tls_reads_the_mapping(
    tmp_path: Path,
    pki: Pki,  # noqa: F811
    tls: bool,
    policy: SendfilePolicy,
) -> None:
    size = 16 * MiB
    mem = _tier(tmp_path, size)
    cfg = TlsConfig(pki.cert, pki.key, pki.ca)
    server = TransferServer(tls=cfg.server_context() if tls else None)
    assert server.sendfile is SendfilePolicy.REMOTE
    server.sendfile = policy
    engine: TransferEngine | None = None
    try:
        server.add_segment(mem)
        loc = SegmentLocation("tier", size, "another-host", server.endpoint, "")
        engine = TransferEngine(
            lambda _n: loc, "tcp", tls=cfg.client_context() if tls else None, tcp_streams=2
        )
        out = bytearray(size)
        assert engine.transfer_batch([TransferRequest(TransferOp.READ, out, "tier", 0)]) == [
            ErrorCode.OK
        ]
        assert out == bytes(mem.buffer)
        small = [bytearray(100) for _ in range(20)]  # pipelined small reads: the mapping
        engine.transfer(
            [TransferRequest(TransferOp.READ, b, "tier", 100 * i) for i, b in enumerate(small)]
        )
        assert all(
            bytes(b) == bytes(mem.buffer[100 * i : 100 * i + 100]) for i, b in enumerate(small)
        )
        if tls or policy is not SendfilePolicy.ALWAYS:
            assert server.counters().sendfile_reads == 0
        else:
            wait_until(lambda: server.counters().sendfile_reads >= 1, what="a sendfile read")
        server.remove_segment("tier")  # its file is let go; later READs are refused
        assert engine.transfer_batch([TransferRequest(TransferOp.READ, out, "tier", 0)]) != [
            ErrorCode.OK
        ]
    finally:
        if engine is not None:
            engine.close()
        server.close()
        mem.close()
