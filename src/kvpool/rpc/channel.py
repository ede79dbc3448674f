"""`Channel`: one connection of an `RpcClient` (`kvpool.rpc.client`), the socket and the
bookkeeping of the calls in flight on it, and `Sent`, a request whose reply is taken later.

A channel is opened by the `Connector` (`kvpool.rpc.connector`) and replaced, never reused,
after a fault; the client's lock guards its call tables and reading role (the leader/follower
scheme in `kvpool.rpc.client`'s docstring).
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from kvpool.errors import KVPoolError, RpcError
from kvpool.protocol.framing import HEADER, HEADER_SIZE, FrameDecoder
from kvpool.rpc.spin import ReplyPoll
from kvpool.rpc.tls import TlsStream

__all__ = [
    "RECV_BYTES",
    "Call",
    "Channel",
    "Sent",
    "Transport",
    "as_rpc_error",
    "set_kernel_timeout",
]

#: What one recv asks for.
RECV_BYTES: Final = 64 << 10

#: Which socket a connected client talks over.
Transport = Literal["tcp", "unix"]


class Call:
    """One request in flight: filled in by whichever thread reads its reply."""

    __slots__ = ("cond", "done", "error", "request_id", "value")

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        # Made only when the caller has to sleep (a follower): the lock-step path never needs it.
        self.cond: threading.Condition | None = None

    def take_error(self) -> BaseException:
        """The call's error, no longer kept here (the raiser's traceback holds it alone)."""
        error, self.error = self.error, None
        assert error is not None
        return error


class Channel:
    """One connection's socket and bookkeeping; replaced, never reused, after a fault."""

    __slots__ = (
        "broken",
        "decoder",
        "last_used",
        "pending",
        "poll",
        "reading",
        "recv_timeout",
        "send_lock",
        "sleepers",
        "sock",
        "tls",
        "transport",
    )

    def __init__(
        self,
        sock: socket.socket,
        decoder: FrameDecoder,
        send_timeout: float,
        transport: Transport,
    ) -> None:
        # A blocking socket with kernel timeouts (SO_RCVTIMEO / SO_SNDTIMEO) rather than
        # Python's settimeout(): in timeout mode CPython polls before every recv and send,
        # a large share of a lock-step round trip (docs/parts/perf-rpc.md). TLS goes through a
        # `TlsStream` instead: non-blocking, one ssl call at a time (`kvpool.rpc.tls`).
        self.tls = TlsStream(sock) if isinstance(sock, ssl.SSLSocket) else None
        if self.tls is None:
            sock.settimeout(None)
            set_kernel_timeout(sock, socket.SO_SNDTIMEO, send_timeout)
        self.sock = sock
        self.decoder = decoder
        self.transport: Transport = transport
        self.send_lock = threading.Lock()
        # Only the leader touches this: the SO_RCVTIMEO now set on the socket.
        self.recv_timeout = 0.0
        self.last_used = time.monotonic()
        #: The busy wait of the lock-step reply (`kvpool.rpc.spin`; None: recv blocks at once).
        self.poll: ReplyPoll | None = None
        # Guarded by the client's _lock:
        self.pending: dict[int, Call] = {}
        self.sleepers: dict[int, Call] = {}
        self.reading = False
        self.broken: BaseException | None = None

    def release_reading(self) -> None:
        """Give up the reading role (the client's lock held): wake a sleeping caller whose
        reply is still to come to take it over, or close the socket of a broken connection."""
        if not self.reading:
            return
        self.reading = False
        if self.broken is not None:
            self.sock.close()
        elif self.sleepers:
            successor = next(iter(self.sleepers.values()))
            assert successor.cond is not None
            successor.cond.notify()

    def read_own(
        self,
        request_id: int,
        deadline: float,
        decode: Callable[[bytes], Any],
        lock: threading.Lock,
    ) -> bytes | None:
        """The lock-step fast path of the leader (`RpcClient.call`), called holding the
        reading role: one ``recv``; when it holds exactly the reply to `request_id` (one whole
        frame, no error flag, `decode` takes it), file it in its `Call`, give up the role and
        answer None. Otherwise answer what was read (b"" when nothing was: the recv failed, or
        the kernel timeout needs resetting first), which the leader's loop then parses in
        full, as if it had read it itself."""
        if self.tls is not None or self.decoder._buf:  # (`buffered`, without its call)
            return b""
        remaining = deadline - time.monotonic()
        # A kernel timeout a little short is harmless here (an early wake-up goes to the
        # loop, which checks the deadline); one far too short or too long is reset there.
        if not 0 < remaining * 0.8 <= self.recv_timeout <= remaining * 1.25 + 0.002:
            return b""
        try:
            poll = self.poll
            got = poll.recv(self.sock, RECV_BYTES) if poll is not None else None
            data = self.sock.recv(RECV_BYTES) if got is None else got
        except OSError:
            return b""  # the loop reads again and handles what that says
        n = len(data)
        if n < HEADER_SIZE:
            return data
        length, rid = HEADER.unpack_from(data)
        if rid != request_id or length + 4 != n:
            return data
        try:
            value = decode(data[HEADER_SIZE:])
        except msgspec.DecodeError:
            return data  # the loop answers DESERIALIZE_FAIL for it
        with lock:
            call = self.pending.pop(request_id, None)
            if call is not None:  # (None: failed meanwhile by another thread; it says why)
                call.value = value
                call.done = True
            self.release_reading()
        return None


class Sent:
    """A request `RpcClient.send` sent, whose reply `RpcClient.receive` takes; `done` says
    whether the reply (or the failure) is already here."""

    __slots__ = ("at", "call", "conn")

    def __init__(self, conn: Channel, call: Call, at: float) -> None:
        self.conn = conn
        self.call = call
        self.at = at

    @property
    def done(self) -> bool:
        return self.call.done


_TIMEVAL = struct.Struct("@ll")


def set_kernel_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    """SO_RCVTIMEO / SO_SNDTIMEO on a blocking socket (never 0, which means "forever")."""
    seconds = max(seconds, 1e-3)
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(whole, int((seconds - whole) * 1e6)))


def as_rpc_error(exc: BaseException, *, fresh: bool = False) -> BaseException:
    """`exc` as a kvpool error; `fresh` makes a new instance for each thread that raises it
    (one exception object raised in several threads would share a traceback)."""
    if isinstance(exc, KVPoolError):
        return type(exc)(exc.message, exc.code) if fresh else exc
    return RpcError(str(exc))
