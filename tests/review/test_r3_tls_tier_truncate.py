"""Review finding (round 3) on the disk-tier READ path of the transfer server
(src/kvpool/transfer/serving.py `serve_tier_read`, src/kvpool/transfer/wire.py `_send_tls`).

docs/parts/tiers.md ("Disk-tier READs over TCP") and the merge say a tier file truncated under
the node answers FILE_READ_FAIL "instead of a SIGBUS". The check (`TierFile.holds`, one
`fstat`) runs once, before the answer's header; on a TLS connection (and for READs below
`SENDFILE_MIN`, or peers the `SendfilePolicy` sends no `sendfile`) the payload is then sent
from the segment's *mapping*. TLS encrypts in user space (`ssl.SSLSocket.sendall` of the
mapped memoryview), so a page the file lost after the check is touched by OpenSSL: the node
dies of SIGBUS. A peer that reads its answer slowly keeps the send going for as long as it
likes, so the window is not a race: here the peer stops reading once the answer began, the
file shrinks (an operator's mistake, a full disk's repair, another process), and the peer
reads on. (A plain TCP `sendmsg` of the mapping gets EFAULT from the kernel instead and the
connection is closed: the server lives, checked here too.)

A real `TransferServer` in a child process, serving a `kvpool-disk.data` file mapped as a
node mounts its disk tier, over TLS with the test PKI.
"""

from __future__ import annotations

import fcntl
import os
import socket
import ssl
import struct
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.errors import ErrorCode
from kvpool.rpc.tls import TlsConfig
from kvpool.transfer.memory import DISK_FILE_NAME
from kvpool.transfer.request import TransferOp
from kvpool.transfer.wire import REQ, REQ_MAGIC, RESP, RESP_MAGIC
from kvtest.procs import Proc, wait_until
from security.pki import Pki, pki  # noqa: F401

MiB = 1 << 20
_SIZE = 64 * MiB
_NAME = b"tier"

_CHILD = """
import os, sys, time
from kvpool.rpc.tls import TlsConfig
from kvpool.transfer import TransferServer
from kvpool.transfer.memory import DISK_FILE_NAME, SegmentMemory

disk, size, cert, key, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
path = os.path.join(disk, DISK_FILE_NAME)
with open(path, "wb") as f:
    f.write(os.urandom(size))
mem = SegmentMemory.map_file("tier", path, size, populate=False, share=True)
tls = TlsConfig(cert, key, ca).server_context() if cert != "-" else None
server = TransferServer("127.0.0.1", 0, tls=tls)
server.add_segment(mem)
print(f"tier server on {server.endpoint}", flush=True)
while True:
    time.sleep(3600)
"""


TierServer = tuple[Proc, str, int, Path, ssl.SSLContext | None]


@pytest.fixture
def tier_server(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    pki: Pki,  # noqa: F811
) -> Iterator[TierServer]:
    """A child TransferServer serving a 64 MiB disk-tier file, over TLS when the test is
    parametrized (indirectly) with "tls", else over plain TCP."""
    use_tls = getattr(request, "param", "plain") == "tls"
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "tier_server.py"
    script.write_text(_CHILD)
    cert = pki.cert if use_tls else "-"
    proc = Proc(
        [sys.executable, str(script), str(disk), str(_SIZE), cert, pki.key, pki.ca],
        name="tier server",
    )
    try:
        m = proc.wait_for_line(r"tier server on (?P<host>\S+):(?P<port>\d+)", timeout=30)
        ctx = TlsConfig(pki.cert, pki.key, pki.ca).client_context() if use_tls else None
        yield proc, m["host"], int(m["port"]), disk / DISK_FILE_NAME, ctx
    finally:
        proc.stop()


def _connect(host: str, port: int, ctx: ssl.SSLContext | None, rcvbuf: int = 0) -> socket.socket:
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.settimeout(10)
    raw.connect((host, port))
    if ctx is None:
        return raw
    return ctx.wrap_socket(raw, server_hostname="localhost")


def _request(req_id: int, offset: int, length: int) -> bytes:
    return REQ.pack(REQ_MAGIC, int(TransferOp.READ), 0, len(_NAME), req_id, offset, length) + _NAME


def _queued(s: socket.socket) -> int:
    """Bytes the kernel holds for `s`, not read yet (the server has begun its answer)."""
    got = fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return int(struct.unpack("i", got)[0])


def _drain(s: socket.socket, deadline_s: float = 20.0) -> None:
    """Read until the server ends the connection (EOF or an error), within a deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if not s.recv(1 << 20):
                return
        except (OSError, ssl.SSLError):
            return
    raise AssertionError("the server neither finished nor closed the answer")


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"EOF after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def _truncate_mid_answer(server: TierServer) -> None:
    """A READ of the whole tier by a peer that stops reading once the answer began; the file
    shrinks to nothing meanwhile; the peer reads on. Then the node must still be there and
    answer a READ of the lost range with FILE_READ_FAIL."""
    proc, host, port, data_file, ctx = server
    slow = _connect(host, port, ctx, rcvbuf=4096)
    try:
        slow.sendall(_request(1, 0, _SIZE))
        # The server passed its `holds` check and is sending (blocked on this slow reader).
        wait_until(lambda: _queued(slow) > 0, timeout=10, what="the answer to begin")
        os.truncate(data_file, 0)  # the file shrinks under the server, mid-answer
        _drain(slow)  # the answer can only end early now
    finally:
        slow.close()
    try:
        s = _connect(host, port, ctx)
    except ConnectionRefusedError:
        code = proc.popen.wait(10)
        raise AssertionError(f"the node died while answering (exit status {code})") from None
    with s:
        s.sendall(_request(2, 0, 4096))
        magic, status, rid, n = RESP.unpack(_recv_exact(s, RESP.size))
        assert (magic, rid, n) == (RESP_MAGIC, 2, 0)
        assert status == int(ErrorCode.FILE_READ_FAIL)
    assert proc.alive()


def test_plain_tcp_a_tier_file_truncated_mid_answer_closes_only_the_connection(
    tier_server: TierServer,
) -> None:
    """The control: `sendmsg` of the mapping gets EFAULT from the kernel (passes on main)."""
    _truncate_mid_answer(tier_server)


@pytest.mark.parametrize("tier_server", ["tls"], indirect=True)
def test_tls_a_tier_file_truncated_mid_answer_never_kills_the_node(
    tier_server: TierServer,
) -> None:
    _truncate_mid_answer(tier_server)
