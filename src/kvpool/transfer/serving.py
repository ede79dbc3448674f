"""What a `TransferServer` keeps per connection and per worker thread (`kvpool.transfer.server`).

`Conn` is one accepted connection, with what it carries between workers: the part of a request
header it has sent (`partial`), the challenge it has not proven yet (`nonce`), and a WRITE whose
payload is still coming (`PendingWrite`). `Worker` is what one worker thread reuses for every
connection it serves: its `SocketReader`, its queue of answers not sent yet (`Replies`) and its
counters (`ServeCounters`).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Final

from kvpool.errors import ErrorCode
from kvpool.transfer.limits import ServerLimits
from kvpool.transfer.memory import SegmentMemory
from kvpool.transfer.wire import SocketReader, send_parts

__all__ = ["Conn", "PendingWrite", "Replies", "ServeCounters", "Worker", "kernel_timeout"]

TIMEVAL: Final = struct.Struct("@ll")


def kernel_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET, option, TIMEVAL.pack(whole, int((seconds - whole) * 1_000_000))
    )


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
        "stalls",
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

    def add(self, other: ServeCounters) -> None:
        for f in ServeCounters.__slots__:
            setattr(self, f, getattr(self, f) + getattr(other, f))


class Worker:
    """What one worker thread reuses for every connection it serves (one buffer each, not
    one per connection: an idle connection holds no buffer)."""

    __slots__ = ("counts", "out", "reader", "scratch")

    def __init__(self, sock: socket.socket, patience: int, limits: ServerLimits) -> None:
        grace = limits.stall_timeout
        self.reader = SocketReader(sock, patience=patience, min_rate=limits.min_rate, grace=grace)
        self.out = Replies(sock)
        self.out.min_rate = limits.min_rate
        self.out.grace = grace
        self.scratch: memoryview | None = None  # only a refused write needs it
        self.counts = ServeCounters()
