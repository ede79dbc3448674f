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
from typing import Any, Final, Literal

from kvpool.errors import KVPoolError, RpcError
from kvpool.protocol.framing import FrameDecoder
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
        # Guarded by the client's _lock:
        self.pending: dict[int, Call] = {}
        self.sleepers: dict[int, Call] = {}
        self.reading = False
        self.broken: BaseException | None = None


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
