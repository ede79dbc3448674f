"""The RPC server: an asyncio Protocol that turns frames into handler calls and replies.

`RpcServer` knows no service. It is given the request union (msgspec types) and a handler
``handler(request, conn)`` that returns the reply Struct, or an awaitable of it. The server

* answers the handshake itself (`kvpool.protocol.handshake`); given a `TokenTable`
  (``tokens``), it challenges every connection, TCP and Unix alike, and serves nothing before a
  valid `Proof` (UNAUTHENTICATED and close otherwise); the proven `Principal` is
  ``conn.principal`` for the handler to authorize with;
* listens on TCP and, unless told not to (``unix=False``), also on a Linux abstract Unix socket
  with a unique name that the `Welcome` advertises, so that clients on the same host (in the
  same network namespace) can move over to it: same connections, same handshake, same rules,
  only a cheaper round trip (docs/parts/perf-rpc.md). Abstract names leave no file to clean
  up. If the Unix socket cannot be bound, the server logs it and serves TCP alone.
* decodes each request with one ``msgspec.msgpack.Decoder`` built once for the union, so
  decoding is validation;
* calls the handler inline; a reply returned directly is written at once, an awaitable runs as a
  task, so a slow request never blocks the requests behind it on the same connection;
* coalesces replies: all replies produced while handling one chunk of input, and all task
  replies finishing in the same loop iteration, leave in a single ``transport.write``;
* turns faults into `ErrorReply` frames (see `kvpool.protocol` for the codes) and keeps
  serving; only a broken frame boundary (oversized or too-short length prefix) or a failed
  handshake closes the connection, after its error reply;
* applies back-pressure: while the transport's write buffer is above its high-water mark (a
  peer that sends but does not read), or while a connection has ``max_inflight`` handler tasks
  running, the connection is neither served nor read further, so memory stays bounded;
* lets handler tasks finish when their client goes away (the reply is dropped), so a service
  never sees a request cancelled half-way; only `RpcServer.close()` cancels them. A peer that
  half-closes still gets the replies it is owed before the server closes its side;
* bounds what peers can hold (docs/parts/limits.md): a connection must complete its handshake
  within ``handshake_timeout`` and is closed after ``idle_timeout`` without a byte received
  (clients ping every second, so a live one is never idle that long); at most
  ``max_connections`` connections in all (fewer when the file-descriptor limit is lower,
  `kvpool.fdlimit`) and ``max_connections_per_peer`` from one remote IP are served, and one
  more is answered with an `ErrorReply` (UNAVAILABLE_IN_CURRENT_STATUS) and closed. Before its
  handshake a connection may send frames of at most 64 KiB (BUFFER_OVERFLOW beyond). Such
  events are logged at most once per kind per interval (`kvpool.logs`);
* polls instead of sleeping while a connection's frames come less than ``busy_poll`` apart
  (`kvpool.rpc.spin`: a sleeping loop costs each sender the wake-up of its vCPU), and backs
  off while its thread waits for the CPU.

Nothing a connection leaves behind may be cyclic garbage: `kvpool master` runs ``gc.freeze()``
every second, so a cycle that outlives a second is never collected. A connection keeps no
raised exception (`FrameDecoder.error` is untraced) and drops its buffers when it is lost.

Each accepted connection is a `Connection` (`kvpool.rpc.connection`): the handshake, serving,
coalescing and back-pressure above are its part; listening, admission, the sweep and `close()`
are the server's.

Threading: every method runs on the loop that ran `start()`, and so does the handler. Use
`ServerThread` (`kvpool.rpc.thread`) to run a server on its own loop in a background thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import secrets
import socket
import ssl
import types
from collections.abc import Callable
from typing import Any, Final, Union, get_args, get_origin

import msgspec

from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, StoreClosed
from kvpool.fdlimit import connection_cap, fd_soft_limit
from kvpool.logs import RateLimitedLog
from kvpool.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameEncoder
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello, Proof
from kvpool.rpc.auth import TokenTable
from kvpool.rpc.connection import Connection, ConnectionId
from kvpool.rpc.spin import DEFAULT_BUSY_POLL_S, BusyPoll, check_window

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_PEER",
    "Connection",
    "ConnectionId",
    "Handler",
    "RpcServer",
    "union_members",
]

log = logging.getLogger(__name__)
#: Repeated per-connection events (refusals, timeouts): a line per kind per 10 s.
limited_log = RateLimitedLog(log, 10.0)

#: ``handler(request, conn)`` → reply Struct, or an awaitable of one.
Handler = Callable[[Any, Connection], Any]

_CLOSE_GRACE_S: Final = 2.0
#: Connections the kernel queues for accept() on each listener (as the transfer server's).
LISTEN_BACKLOG: Final = 1024
#: Defaults of the connection limits (docs/parts/limits.md).
DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 5.0
DEFAULT_IDLE_TIMEOUT_S: Final = 300.0
DEFAULT_MAX_CONNECTIONS: Final = 16384
DEFAULT_MAX_CONNECTIONS_PER_PEER: Final = 1024
_UNSAFE_IN_NAME: Final = re.compile(r"[^A-Za-z0-9._-]")


def union_members(tp: Any) -> tuple[Any, ...]:
    """The members of a ``Union[...]`` / ``A | B`` type, or ``(tp,)`` for a single type."""
    if get_origin(tp) is Union or isinstance(tp, types.UnionType):
        return get_args(tp)
    return (tp,)


class RpcServer:
    """A control-plane server for one request union and one handler.

    ``request_type`` is a msgspec Struct type or a ``Union`` of them (tagged). ``cluster_id``
    must match the clients' Hello. ``max_frame_bytes`` bounds what a peer may send in one frame.
    The handler runs on this server's event loop; it must not block it. ``unix`` (default on)
    adds the abstract Unix socket listener (`unix_address`) next to the TCP one.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        request_type: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        cluster_id: str = "kvpool",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        server_name: str = "kvpool",
        protocol_version: int = PROTOCOL_VERSION,
        max_inflight: int = 4096,
        unix: bool = True,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER,
        term: Callable[[], int] | None = None,
        tokens: TokenTable | None = None,
        tls: ssl.SSLContext | None = None,
        busy_poll: float = DEFAULT_BUSY_POLL_S,
    ) -> None:
        if not callable(handler):
            raise InvalidParams(f"handler: {handler!r} is not callable")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidParams(f"port: {port!r} is not a TCP port")
        if not isinstance(cluster_id, str) or not cluster_id or len(cluster_id) > 256:
            raise InvalidParams(f"cluster_id: {cluster_id!r} must be a non-empty string")
        if not isinstance(max_inflight, int) or max_inflight < 1:
            raise InvalidParams(f"max_inflight: {max_inflight!r} must be a positive integer")
        for name, seconds in (
            ("handshake_timeout", handshake_timeout),
            ("idle_timeout", idle_timeout),
        ):
            if not isinstance(seconds, int | float) or not seconds > 0:
                raise InvalidParams(f"{name}: {seconds!r} must be a positive number of seconds")
        for name, count in (
            ("max_connections", max_connections),
            ("max_connections_per_peer", max_connections_per_peer),
        ):
            if not isinstance(count, int) or count < 1:
                raise InvalidParams(f"{name}: {count!r} must be a positive integer")
        #: Seconds the loop keeps polling after a frame while frames come that close
        #: together (`kvpool.rpc.spin`; 0: it always sleeps until the next one).
        self.busy_poll = check_window("busy_poll", busy_poll)
        #: The loop's busy polling, made by `start` (None: off, or not started).
        self.busy: BusyPoll | None = None
        #: Seconds a new connection has to send its Hello.
        self.handshake_timeout = float(handshake_timeout)
        #: Seconds without a byte received after which a connection is closed.
        self.idle_timeout = float(idle_timeout)
        #: Connections served at once, in all (the descriptor limit may lower it at `start`).
        self.max_connections = max_connections
        #: Connections served at once from one remote IP (all Unix-socket peers count as one).
        self.max_connections_per_peer = max_connections_per_peer
        self._per_peer: dict[str, int] = {}
        self._refused = 0
        self._handler = handler
        #: Handler tasks one connection may have running before the server stops reading it.
        self.max_inflight = max_inflight
        self.host = host
        self.port = port
        self.cluster_id = cluster_id
        self.server_name = server_name
        #: The leader term put in each `Welcome` (an HA master's; None: always 0).
        self.term = term
        #: The tokens connections must prove one of (None: no credentials, no challenge).
        self.tokens = tokens
        #: Connections refused for a missing or wrong proof since start.
        self.auth_failures = 0
        #: TLS of the TCP listener (`kvpool.rpc.tls`; None: plain). The Unix socket stays plain.
        self.tls = tls
        self.protocol_version = protocol_version
        self.max_frame_bytes = max_frame_bytes
        #: Whether `start()` also listens on an abstract Unix socket.
        self.unix = bool(unix)
        members = union_members(request_type)
        try:
            self._request_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
                Union[members]  # noqa: UP007 - members is a runtime tuple
            )
        except TypeError as exc:
            raise InvalidParams(
                f"request_type: msgspec cannot decode {request_type!r}: {exc}"
            ) from exc
        self._hello_decoder = msgspec.msgpack.Decoder(Hello)
        self._proof_decoder = msgspec.msgpack.Decoder(Proof)
        # Replies of any service are encoded; the encoder also checks the peer's frame limit.
        self._encoder = FrameEncoder(max_frame_bytes)
        #: The bare msgpack encoder of replies, for the connections' hot path (which adds the
        #: header and checks the frame limit itself).
        self._encode_payload = msgspec.msgpack.Encoder().encode
        self._server: asyncio.Server | None = None
        self._unix_server: asyncio.Server | None = None
        self._unix_address = ""
        self._connections: dict[ConnectionId, Connection] = {}
        self._conn_ids = itertools.count(1)
        self._all_gone: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._address: tuple[str, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    async def start(self) -> None:
        """Bind and listen (an `OSError` when the address is taken). Idempotent."""
        if self._closed:
            raise StoreClosed("server was closed")
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        if self.busy_poll > 0:
            self.busy = BusyPoll(loop, self.busy_poll)
        self._all_gone = asyncio.Event()
        self._all_gone.set()
        cap = connection_cap(self.max_connections)
        if cap < self.max_connections:
            log.warning(
                "%s: serving at most %d connections, not %d (file-descriptor limit %d)",
                self.server_name,
                cap,
                self.max_connections,
                fd_soft_limit(),
            )
            self.max_connections = cap
        # The kernel's queue of connections not yet accepted: asyncio's default (100) makes a
        # burst of connects (a flood, many clients starting at once) wait for SYN retransmits.
        self._server = await loop.create_server(
            self._new_connection,
            self.host,
            self.port,
            backlog=LISTEN_BACKLOG,
            ssl=self.tls,
            ssl_handshake_timeout=self.handshake_timeout if self.tls is not None else None,
        )
        sock = self._server.sockets[0]
        host, port = sock.getsockname()[:2]
        self._address = (str(host), int(port))
        log.info("%s listening on %s:%d", self.server_name, host, port)
        if self.unix:
            await self._start_unix(loop)
        self._sweeper = loop.call_later(self._sweep_period(), self._sweep)

    def _sweep_period(self) -> float:
        return min(1.0, max(0.05, min(self.handshake_timeout, self.idle_timeout) / 4))

    def _sweep(self) -> None:
        """Close connections past the handshake or idle limit; runs every `_sweep_period`."""
        loop = self._loop
        if self._closed or loop is None:
            return
        try:
            self._expire_quiet(loop.time())
        except Exception:  # a bug here must not end the sweeping for the server's lifetime
            log.exception("%s: connection sweep failed", self.server_name)
        self._sweeper = loop.call_later(self._sweep_period(), self._sweep)

    def _expire_quiet(self, now: float) -> None:
        expired: list[tuple[Connection, ErrorCode, str]] = []
        for conn in self._connections.values():
            if conn._seen:
                conn._seen = False
                conn._last_seen = now
                if conn.handshaken:
                    continue
            if not conn.handshaken:
                # _last_seen is the connection's start until the sweep sees data, and a peer
                # that keeps sending but never a complete Hello is still cut at the limit.
                if now - conn._opened >= self.handshake_timeout:
                    expired.append(
                        (
                            conn,
                            ErrorCode.RPC_TIMEOUT,
                            f"no handshake in {self.handshake_timeout:g} s",
                        )
                    )
            elif now - conn._last_seen >= self.idle_timeout and not conn._inflight:
                expired.append((conn, ErrorCode.RPC_TIMEOUT, f"idle for {self.idle_timeout:g} s"))
        for conn, code, why in expired:
            # A peer that never completes its handshake is suspect; an idle one merely left.
            limited_log.log(
                logging.INFO if conn.handshaken else logging.WARNING,
                "idle" if conn.handshaken else "no-handshake",
                "closing connection %s from %s: %s",
                conn.conn_id,
                conn.peer,
                why,
            )
            conn._expire(code, why)

    def _admit(self, conn: Connection, key: str) -> str | None:
        """Count `conn` against its peer and the total, or say why it is refused."""
        n = self._per_peer.get(key, 0)
        if len(self._connections) >= self.max_connections:
            why = f"too many connections ({self.max_connections} in all)"
        elif n >= self.max_connections_per_peer:
            why = f"too many connections from {key} ({self.max_connections_per_peer})"
        else:
            self._per_peer[key] = n + 1
            conn._peer_key = key
            self._connections[conn.conn_id] = conn
            return None
        self._refused += 1
        limited_log.warning("refused", "%s refusing a connection: %s", self.server_name, why)
        return why

    async def _start_unix(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen on a fresh abstract Unix socket too; on failure log and serve TCP alone."""
        name = self._new_unix_name()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Bound here rather than through create_unix_server(path=...), so neither loop
            # (asyncio's nor uvloop's) treats the name as a file to unlink.
            sock.bind(name)
            self._unix_server = await loop.create_unix_server(
                lambda: self._new_connection(unix=True), sock=sock, backlog=LISTEN_BACKLOG
            )
        except OSError as exc:
            sock.close()
            log.warning("%s: no Unix socket (%s); same-host clients use TCP", self.server_name, exc)
            return
        self._unix_address = name
        log.info("%s listening on abstract Unix socket %r", self.server_name, name)

    def _new_unix_name(self) -> str:
        """A fresh abstract socket name: readable (cluster, pid) for ``ss -xlp``, and unique
        (the random part), so a client can never mistake another server's socket for this
        one's. The cluster id may be long or odd; sun_path holds 108 bytes."""
        cluster = _UNSAFE_IN_NAME.sub("_", self.cluster_id)[:40]
        return f"\0kvpool-rpc/{cluster}/{os.getpid()}/{secrets.token_hex(8)}"

    def _new_connection(self, *, unix: bool = False) -> Connection:
        assert self._all_gone is not None
        self._all_gone.clear()
        return Connection(self, ConnectionId(next(self._conn_ids)), unix=unix)

    def _connection_gone(self, conn: Connection) -> None:
        self._connections.pop(conn.conn_id, None)
        key, conn._peer_key = conn._peer_key, None
        if key is not None:
            n = self._per_peer.get(key, 0) - 1
            if n > 0:
                self._per_peer[key] = n
            else:
                self._per_peer.pop(key, None)
        if not self._connections and self._all_gone is not None:
            self._all_gone.set()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) actually bound; valid after `start()`."""
        if self._address is None:
            raise StoreClosed("server not started")
        return self._address

    @property
    def endpoint(self) -> str:
        """``"host:port"``, the form clients take."""
        host, port = self.address
        return f"{host}:{port}"

    @property
    def unix_address(self) -> str:
        """The abstract Unix socket name (leading NUL included) the `Welcome` advertises; ""
        when the server listens on none (``unix=False``, not started, or the bind failed)."""
        return self._unix_address

    @property
    def connection_count(self) -> int:
        """Connections currently open (handshaken or not)."""
        return len(self._connections)

    def connections(self) -> list[Connection]:
        return list(self._connections.values())

    @property
    def refused_connections(self) -> int:
        """Connections refused by the connection caps since start."""
        return self._refused

    async def close(self) -> None:
        """Stop listening, close every connection, cancel running handlers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        server, self._server = self._server, None
        unix_server, self._unix_server = self._unix_server, None
        self._unix_address = ""
        if server is None:
            return
        server.close()
        if unix_server is not None:
            unix_server.close()
        for conn in list(self._connections.values()):
            conn.close()
        if self._all_gone is not None and self._connections:
            try:
                await asyncio.wait_for(self._all_gone.wait(), _CLOSE_GRACE_S)
            except TimeoutError:
                for conn in list(self._connections.values()):
                    conn.abort()
                # abort() reports connection_lost on the next iteration; wait for it, bounded.
                for _ in range(100):
                    if not self._connections:
                        break
                    await asyncio.sleep(0)
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CLOSE_GRACE_S)
        await server.wait_closed()
        if unix_server is not None:
            await unix_server.wait_closed()

    # -- reply encoding (shared by connections) ---------------------------------------------

    def _encode_reply(self, request_id: int, reply: Any) -> bytes:
        try:
            return self._encoder.encode(request_id, reply)
        except KVPoolError as exc:  # FrameTooLarge: the reply exceeds the frame limit
            log.error("reply to request %d not sent: %s", request_id, exc)
            return self._encoder.encode_error(request_id, exc.code, exc.message)
        except (TypeError, ValueError, OverflowError) as exc:
            log.error(
                "handler reply %r to request %d cannot be encoded: %s", reply, request_id, exc
            )
            return self._encoder.encode_error(
                request_id, ErrorCode.SERIALIZE_FAIL, f"reply cannot be encoded: {exc}"
            )

    def _handler_error(self, request_id: int, request: Any, exc: Exception) -> bytes:
        if isinstance(exc, KVPoolError):
            # The service chose a code: pass it on rather than hiding it behind INTERNAL_ERROR.
            log.info("%s failed: %s", type(request).__name__, exc)
            return self._encoder.encode_error(request_id, exc.code, exc.message)
        log.exception("handler failed on %s", type(request).__name__)
        return self._encoder.encode_error(
            request_id, ErrorCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"
        )
