"""What a `TransferServer` keeps per connection and per worker thread (`kvpool.transfer.server`).

`Conn` is one accepted connection, with what it carries between workers: the part of a request
header it has sent (`partial`), the challenge it has not proven yet (`nonce`), and a WRITE whose
payload is still coming (`PendingWrite`). `Worker` is what one worker thread reuses for every
connection it serves: its `SocketReader`, its queue of answers not sent yet (`Replies`) and its
counters (`ServeCounters`).

`TierFile` is the server's own descriptor of a disk tier's data file (a segment mapped from a
`DISK_FILE_NAME` file, `kvpool.client.disk`). User space never reads a disk tier's mapping for
a READ (a file truncated under the server would kill the process with SIGBUS there; on TLS the
payload is encrypted in user space while a slow peer keeps the send going): a small READ is
read with `pread` before its header (a short read answers FILE_READ_FAIL) and joins the
batched answers; a large one on TLS is read with `preadv` into the worker's buffer and sent
piece by piece (`send_pieces`: a file that ends early closes the connection); a large one on
plain TCP is sent with `os.sendfile` from that descriptor (`send_file`), zero-copy from the
page cache, or, where the `SendfilePolicy` says no (loopback), with `sendmsg` from the mapping:
the kernel copies it, and a page gone with the file is its EFAULT, not a SIGBUS.
"""

from __future__ import annotations

import os
import socket
import ssl
import stat
import struct
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Final

from kvpool.errors import ErrorCode
from kvpool.transfer.limits import ServerLimits
from kvpool.transfer.memory import DISK_FILE_NAME, SegmentMemory
from kvpool.transfer.wire import RESP, RESP_MAGIC, SocketReader, send_parts

__all__ = [
    "SENDFILE_MIN",
    "Conn",
    "PendingWrite",
    "Replies",
    "SendfilePolicy",
    "ServeCounters",
    "TierFile",
    "Worker",
    "kernel_timeout",
    "send_file",
    "send_pieces",
    "serve_tier_read",
]

SENDFILE_MIN: Final = 64 << 10
"""READs of a disk tier this large or larger are sent with `sendfile`; smaller ones join the
batched `sendmsg` of the answers around them (one syscall for many, the common small case)."""

TIER_PIECE: Final = 256 << 10
"""Bytes of a disk tier read (`preadv`) and sent at a time by `send_pieces` (a worker's buffer)."""

TIMEVAL: Final = struct.Struct("@ll")


def kernel_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET, option, TIMEVAL.pack(whole, int((seconds - whole) * 1_000_000))
    )


class SendfilePolicy(Enum):
    """Which connections get `sendfile` for a large READ of a disk tier (`TierFile`)."""

    #: Peers on other hosts; loopback peers get the mapping's `sendmsg`, which measured faster
    #: over loopback on the test machine (docs/parts/perf-tiers.md).
    REMOTE = "remote"
    ALWAYS = "always"
    NEVER = "never"

    def allows(self, loopback: bool) -> bool:
        return self is SendfilePolicy.ALWAYS or (self is SendfilePolicy.REMOTE and not loopback)


class Replies:
    """Answers not sent yet, and the segments their READ payloads hold."""

    __slots__ = ("bytes", "grace", "held", "min_rate", "parts", "sock")

    MAX_BYTES: Final = 1 << 20
    MAX_PARTS: Final = 128

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parts: list[bytes | memoryview] = []
        self.held: list[SegmentMemory] = []
        self.bytes = 0
        self.min_rate = 0  # the pace rule of `send_parts` (0: none)
        self.grace = 0.0

    def add(
        self, header: bytes, payload: memoryview | None = None, mem: SegmentMemory | None = None
    ) -> None:
        self.parts.append(header)
        self.bytes += len(header)
        if payload is not None:
            self.parts.append(payload)
            self.bytes += payload.nbytes
        if mem is not None:
            self.held.append(mem)
        if self.bytes >= self.MAX_BYTES or len(self.parts) >= self.MAX_PARTS:
            self.flush()

    def flush(self) -> None:
        if not self.parts:
            return
        try:
            send_parts(self.sock, self.parts, self.bytes, self.min_rate, self.grace)
        finally:
            self.drop()

    def drop(self) -> None:
        """Forget unsent answers and release what they held (also when the peer is gone)."""
        for part in self.parts:
            if isinstance(part, memoryview):
                part.release()
        self.parts.clear()
        self.bytes = 0
        for mem in self.held:
            mem.mapping.release()
        self.held.clear()


class Conn:
    """One accepted connection: its socket, its peer's IP, when it was last active, and the
    part of a request header it has sent so far (kept here, not in a worker, while it waits
    for the rest)."""

    __slots__ = (
        "fd",
        "last_active",
        "loopback",
        "nonce",
        "partial",
        "partial_since",
        "peer",
        "pending",
        "served",
        "sock",
        "tls",
    )

    def __init__(self, sock: socket.socket, peer: str, now: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        #: The peer is on this host's loopback (`SendfilePolicy.REMOTE` sends it no sendfile).
        self.loopback = peer.startswith(("127.", "::ffff:127.")) or peer == "::1"
        self.last_active = now
        self.served = False  # has sent at least one byte
        self.partial = b""
        self.partial_since = 0.0  # when the incomplete header began (0: none)
        #: The challenge sent and not yet proven (None: proven, or the server has no key).
        self.nonce: bytes | None = None
        #: A WRITE whose payload is still coming, kept here while the connection waits in the
        #: poller (a peer that stops mid-payload holds no worker).
        self.pending: PendingWrite | None = None
        #: The TLS handshake is still to be made (by the first worker that serves it).
        self.tls = False

    def release_pending(self) -> None:
        """Let go of the segment a pending write holds (the connection ends)."""
        pending, self.pending = self.pending, None
        if pending is not None and pending.mem is not None:
            pending.mem.mapping.release()


@dataclass(slots=True)
class PendingWrite:
    """A WRITE whose payload has not all arrived: where the rest goes and what to answer."""

    req_id: int
    #: The segment it lands in (its mapping held until the write ends), or None: a refused
    #: write whose payload is drained, answered with `code`.
    mem: SegmentMemory | None
    #: Where the next byte lands in the segment.
    offset: int
    #: Bytes still to come.
    left: int
    #: The whole payload's bytes, and when its first byte was awaited (the pace rule).
    total: int
    started: float
    code: ErrorCode = ErrorCode.OK


class ServeCounters:
    """What one worker thread served since it started (plain ints, written by that thread
    only; `TransferServer.counters` sums them when metrics are read, so serving pays one
    integer add per count)."""

    __slots__ = (
        "errors",
        "read_bytes",
        "reads",
        "refused",
        "sendfile_reads",
        "stalls",
        "tier_reads",
        "unproven",
        "write_bytes",
        "writes",
    )

    def __init__(self) -> None:
        self.reads = 0
        self.read_bytes = 0
        self.writes = 0
        self.write_bytes = 0
        self.refused = 0
        """Requests answered with an error (no such segment, out of bounds, malformed)."""
        self.stalls = 0
        """Connections closed for moving no byte within the stall timeout (or too slowly)."""
        self.errors = 0
        """Connections that ended on a socket error or a failure of the server."""
        self.unproven = 0
        """Connections closed because their first bytes were not a proof of the data key."""
        self.sendfile_reads = 0
        """READs of a disk tier sent with `sendfile` (a `TierFile`), counted in `reads` too."""
        self.tier_reads = 0
        """READs of a disk tier answered with its bytes (peers' reads of offloaded objects,
        Mooncake's offload RPC reads), counted in `reads` too."""

    def add(self, other: ServeCounters) -> None:
        for f in ServeCounters.__slots__:
            setattr(self, f, getattr(self, f) + getattr(other, f))


class Worker:
    """What one worker thread reuses for every connection it serves (one buffer each, not
    one per connection: an idle connection holds no buffer)."""

    __slots__ = ("counts", "out", "piece", "reader", "scratch")

    def __init__(self, sock: socket.socket, patience: int, limits: ServerLimits) -> None:
        grace = limits.stall_timeout
        self.reader = SocketReader(sock, patience=patience, min_rate=limits.min_rate, grace=grace)
        self.out = Replies(sock)
        self.out.min_rate = limits.min_rate
        self.out.grace = grace
        self.scratch: memoryview | None = None  # only a refused write needs it
        self.piece: memoryview | None = None  # only a large disk-tier READ without sendfile
        self.counts = ServeCounters()


class TierFile:
    """The server's read-only descriptor of one disk tier's data file, closed once dropped
    (the segment is no longer served) and no READ uses it: a descriptor closed under a
    `sendfile` would be reused by the next `open`, and the peer sent another file's bytes."""

    __slots__ = ("_dropped", "_lock", "_users", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._users = 0
        self._dropped = False
        self._lock = threading.Lock()

    @classmethod
    def of(cls, mem: SegmentMemory) -> TierFile | None:
        """The data file of `mem` when it is a disk tier mapped from offset 0 of a file of
        exactly its size (what `kvpool.client.disk` mounts), else None (served from the
        mapping as any segment)."""
        path = mem.shm_path
        if not path:
            return None
        try:
            if os.path.basename(os.readlink(path)) != DISK_FILE_NAME:
                return None
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size != mem.size:
            os.close(fd)
            return None
        return cls(fd)

    def acquire(self) -> bool:
        """Hold the descriptor for one READ (`release` it); False once dropped."""
        with self._lock:
            if self._dropped:
                return False
            self._users += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            close = self._dropped and self._users == 0
        if close:
            os.close(self.fd)

    def drop(self) -> None:
        """No new READ uses it; closed now or by the last `release` (idempotent)."""
        with self._lock:
            if self._dropped:
                return
            self._dropped = True
            close = self._users == 0
        if close:
            os.close(self.fd)

    def holds(self, offset: int, length: int) -> bool:
        """Whether the file still has [offset, offset + length) (it may have been truncated
        under the server: the mapping would then kill the process with SIGBUS)."""
        try:
            return os.fstat(self.fd).st_size >= offset + length
        except OSError:
            return False


def send_file(  # noqa: PLR0917
    sock: socket.socket, fd: int, offset: int, length: int, min_rate: int, grace: float
) -> None:
    """Send [offset, offset + length) of file `fd` on the blocking socket `sock` with
    `os.sendfile`, looping over partial sends. A send that moves nothing within the socket's
    SO_SNDTIMEO (the server's stall timeout: the kernel answers EAGAIN) raises `TimeoutError`,
    as does one slower than `min_rate` bytes/s past `grace` (the pace rule of `send_parts`);
    a file that ends early (truncated meanwhile) raises `OSError`: the connection is closed,
    since its answer's header already promised `length` bytes."""
    out = sock.fileno()
    moved = 0
    started = time.monotonic() if min_rate else 0.0
    while moved < length:
        try:
            sent = os.sendfile(out, fd, offset + moved, length - moved)
        except BlockingIOError as exc:
            raise TimeoutError(f"sendfile moved nothing after {moved} of {length} bytes") from exc
        if sent == 0:
            raise OSError(f"the tier file ended after {moved} of {length} bytes")
        moved += sent
        if min_rate and time.monotonic() - started > grace + moved / min_rate:
            raise TimeoutError(f"peer took {moved} bytes slower than {min_rate} bytes/s")


def send_pieces(w: Worker, fd: int, offset: int, length: int) -> None:
    """Send [offset, offset + length) of file `fd` on `w`'s connection, `TIER_PIECE` bytes at a
    time read with `preadv` into the worker's buffer (TLS encrypts from it; no mapping is
    touched). The sends keep the pace and stall rules of `send_parts`; a file that ends early
    (truncated meanwhile) raises `OSError`: the connection is closed, since the answer's
    header already promised `length` bytes."""
    buf = w.piece
    if buf is None:
        buf = w.piece = memoryview(bytearray(TIER_PIECE))
    out = w.out
    moved = 0
    while moved < length:
        n = min(TIER_PIECE, length - moved)
        got = os.preadv(fd, [buf[:n]], offset + moved)
        if got <= 0:
            raise OSError(f"the tier file ended after {moved} of {length} bytes")
        send_parts(out.sock, [buf[:got]], got, out.min_rate, out.grace)
        moved += got


def serve_tier_read(  # noqa: PLR0917
    w: Worker,
    tier: TierFile,
    mem: SegmentMemory,
    req_id: int,
    offset: int,
    length: int,
    zero_copy: bool,
) -> None:
    """Answer a READ of disk tier `mem` (held: released here) on `w`'s connection from the
    tier's file, never its mapping in user space (module docstring): FILE_READ_FAIL when the
    file no longer holds the range (truncated under the node), else the bytes: read with
    `pread` when the READ is under `SENDFILE_MIN`, sent with `sendfile` when `zero_copy`
    (plain TCP, as the server's `SendfilePolicy` allows), in pieces on TLS (`send_pieces`:
    TLS encrypts in user space), else by the kernel from the mapping (plain TCP)."""
    counts = w.counts
    out = w.out
    if not tier.acquire():  # the segment left meanwhile
        mem.mapping.release()
        counts.refused += 1
        out.add(RESP.pack(RESP_MAGIC, int(ErrorCode.SEGMENT_NOT_FOUND), req_id, 0))
        return
    try:
        if length < SENDFILE_MIN:  # read whole before the header: a short read is refused
            mem.mapping.release()
            try:
                data = os.pread(tier.fd, length, offset)
            except OSError:
                data = b""
            if len(data) != length:
                counts.refused += 1
                out.add(RESP.pack(RESP_MAGIC, int(ErrorCode.FILE_READ_FAIL), req_id, 0))
                return
            counts.reads += 1
            counts.tier_reads += 1
            counts.read_bytes += length
            out.add(RESP.pack(RESP_MAGIC, 0, req_id, length), memoryview(data))
            return
        if not tier.holds(offset, length):
            mem.mapping.release()
            counts.refused += 1
            out.add(RESP.pack(RESP_MAGIC, int(ErrorCode.FILE_READ_FAIL), req_id, 0))
            return
        counts.reads += 1
        counts.tier_reads += 1
        counts.read_bytes += length
        if not zero_copy and not isinstance(out.sock, ssl.SSLSocket):
            # Plain TCP without sendfile (a loopback peer: faster, docs/parts/perf-tiers.md):
            # the kernel copies from the mapping, and a page gone with a truncated file is
            # its EFAULT (the connection closes), never a SIGBUS in user space.
            out.add(
                RESP.pack(RESP_MAGIC, 0, req_id, length),
                mem.mapping.view[offset : offset + length],
                mem,
            )
            return
        try:
            out.add(RESP.pack(RESP_MAGIC, 0, req_id, length))
            out.flush()
            if zero_copy:
                send_file(out.sock, tier.fd, offset, length, out.min_rate, out.grace)
            else:
                send_pieces(w, tier.fd, offset, length)
        finally:
            mem.mapping.release()
        if zero_copy:
            counts.sendfile_reads += 1
    finally:
        tier.release()
