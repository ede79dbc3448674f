"""`RpcClient`: the synchronous, thread-safe control-plane client.

One connection, shared by every thread that calls. Each call gets a fresh request id, sends
its frame (one ``sendall``) and waits for the reply with that id, so calls from several threads
pipeline on the one connection and replies may come back in any order.

Who reads the socket: a leader/follower scheme, not a reader thread. The first caller that
needs a reply while nobody is reading becomes the *leader*: it reads the socket itself and
hands the replies it finds for other calls to their threads (condition variables), until its
own reply arrives; then it passes the reading role to one waiting follower. With one caller
(the lock-step case) the path is one ``sendall`` and a blocking ``recv`` in the calling thread:
no thread switch at all, which a dedicated reader thread would add to every call (measured in
docs/parts/perf-rpc.md). Having no thread of its own also means the client leaks none.

Transport: the client dials the server's TCP address (through TLS when given a context) and
moves to the server's abstract Unix socket when the `Welcome` names one and the ``unix`` option
allows; the `Connector` (`kvpool.rpc.connector`) opens every connection and says how. Calls,
faults, timeouts and pipelining are the same on either transport; `transport` says which one is
in use. Each connection is a `Channel` (`kvpool.rpc.channel`), replaced after a fault.

Fork: a child process forked while a client exists drops the parent's connection (without
disturbing it) and connects anew on its first call, so a client made before ``fork()`` (as
multiprocessing and inference-engine workers do) keeps working on both sides.

Faults: a broken connection fails every call in flight with `RpcError` (RPC_FAIL) and the next
call reconnects, handshake included. A call that runs past its timeout raises `RpcError`
(RPC_TIMEOUT) and forgets its request id, so its late reply is dropped when it arrives (ids are
never reused). An `ErrorReply` raises the exception of its code (`kvpool.errors.error_for_code`);
a reply that does not decode raises `KVPoolError` (DESERIALIZE_FAIL). Neither breaks the
connection.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, Union

import msgspec

from kvpool.errors import (
    ErrorCode,
    InvalidParams,
    KVPoolError,
    RpcError,
    StoreClosed,
    error_for_code,
)
from kvpool.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    ERROR_FLAG,
    HEADER,
    MAX_REQUEST_ID,
    MIN_FRAME_LENGTH,
    ErrorReply,
    Frame,
    FrameError,
    FrameTooLarge,
)
from kvpool.protocol.handshake import PROTOCOL_VERSION
from kvpool.protocol.invalidation import PUSH_REQUEST_ID
from kvpool.rpc.channel import (
    RECV_BYTES,
    Call,
    Channel,
    Sent,
    Transport,
    as_rpc_error,
    set_kernel_timeout,
)
from kvpool.rpc.connector import Connector, check_timeout, parse_address, unix_enabled
from kvpool.rpc.server import union_members
from kvpool.rpc.spin import DEFAULT_REPLY_POLL_S, ReplyPoll, check_window

__all__ = ["RpcClient", "Sent", "Transport", "parse_address", "unix_enabled"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: call_many keeps the request bytes sent and not yet answered under this (at least one request
#: is in flight), so that it never waits on socket buffers the peer cannot drain while we do
#: not read.
_WINDOW_BYTES: Final = 1 << 20
#: The same bound on a Unix socket, whose buffers stay at the kernel's ~208 KiB (TCP's grow to
#: MiBs): a burst larger than both ends can buffer would block in sendall while the server,
#: its replies unread, has stopped reading, until the send timeout.
_UNIX_WINDOW_BYTES: Final = 96 << 10
_DEFAULT_WINDOW: Final = 128


class RpcClient:
    """A thread-safe client of one `RpcServer`.

    ``response_type`` is the reply Struct type or ``Union`` of them. ``timeout`` (seconds) is
    the default for connecting and for each call. ``unix`` lets the client move to the server's
    Unix socket when it advertises one (see the module docstring). Use as a context manager or
    call `close()`.
    """

    def __init__(
        self,
        address: str,
        *,
        response_type: Any,
        cluster_id: str = "kvpool",
        client_name: str = "",
        timeout: float = 5.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        auth: bytes = b"",
        protocol_version: int = PROTOCOL_VERSION,
        idle_check_after: float = 0.1,
        unix: bool = True,
        token: bytes | None = None,
        tls: ssl.SSLContext | None = None,
        reply_poll: float = DEFAULT_REPLY_POLL_S,
    ) -> None:
        host, port = parse_address(address)
        poll = check_window("reply_poll", reply_poll)
        #: The busy wait of lock-step replies on a Unix socket (`kvpool.rpc.spin`; None: off).
        self._reply_poll = ReplyPoll(poll) if poll > 0 else None
        self.timeout = float(check_timeout(timeout))
        if not isinstance(idle_check_after, int | float) or idle_check_after < 0:
            raise InvalidParams(f"idle_check_after: {idle_check_after!r} must be >= 0 seconds")
        #: A call on a connection idle this long first checks (one non-blocking peek) that the
        #: server has not closed it meanwhile, and reconnects instead of failing if it has. A
        #: server restart or a service-side close then costs no failed call; back-to-back calls
        #: skip the check, so the lock-step path keeps its two syscalls.
        self.idle_check_after = float(idle_check_after)
        #: Opens the connections and keeps what their handshakes said (`kvpool.rpc.connector`).
        self._connector = Connector(
            address,
            host,
            port,
            cluster_id=cluster_id,
            client_name=client_name,
            timeout=self.timeout,
            max_frame_bytes=max_frame_bytes,
            auth=auth,
            protocol_version=protocol_version,
            unix=unix_enabled(unix),
            token=token,
            tls=tls,
        )
        #: The token proven when the server challenges (None: none; a challenge then fails).
        self.token = token
        #: TLS for the TCP connection (`kvpool.rpc.tls`; None: plain TCP).
        self.tls = tls
        #: Whether connecting may move to the server's Unix socket (``unix`` and the env).
        self.unix = self._connector.unix
        self.cluster_id = cluster_id
        self.client_name = client_name
        self.protocol_version = protocol_version
        self.max_frame_bytes = max_frame_bytes
        members = union_members(response_type)
        try:
            self._decode = msgspec.msgpack.Decoder(
                Union[members]  # noqa: UP007 - members is a runtime tuple
            ).decode
        except TypeError as exc:
            raise InvalidParams(
                f"response_type: msgspec cannot decode {response_type!r}: {exc}"
            ) from exc
        self._decode_error = msgspec.msgpack.Decoder(ErrorReply).decode
        self._encode = msgspec.msgpack.Encoder().encode
        self._lock = threading.Lock()
        self._connect_lock = threading.Lock()
        self._conn: Channel | None = None
        self._ids = itertools.count(1)
        self._closed = False
        #: `retarget`s that moved the client so far, and time.monotonic() of the last one:
        #: a caller that noted `epoch` before a request knows whether its master may have
        #: changed since (an HA leader switch).
        self.epoch = 0
        self.retargeted_at = 0.0
        _live_clients.add(self)

    # -- what the handshakes said (kept by the connector) ----------------------------------

    @property
    def address(self) -> str:
        """The server's ``"host:port"`` (`retarget` moves it)."""
        return self._connector.address

    @property
    def server_name(self) -> str:
        """The name in the last `Welcome` ("" before the first connection)."""
        return self._connector.server_name

    @property
    def auth_tenant(self) -> str:
        """The tenant of the token the server accepted ("" without credentials)."""
        return self._connector.auth_tenant

    @property
    def auth_role(self) -> str:
        """The role of the token the server accepted ("" without credentials)."""
        return self._connector.auth_role

    @property
    def data_key(self) -> bytes | None:
        """The data-plane key the master handed this client (None: no credentials)."""
        return self._connector.data_key

    @property
    def server_term(self) -> int:
        """The leader term in the last `Welcome` (0: not an HA master, or not leading)."""
        return self._connector.server_term

    @property
    def min_term(self) -> int:
        """The highest leader term seen (set by the caller from discovery too): a server whose
        Welcome carries a non-zero term below it is a deposed leader and is refused with
        `NotLeader` (NOT_LEADER)."""
        return self._connector.min_term

    @min_term.setter
    def min_term(self, term: int) -> None:
        self._connector.min_term = term

    # -- public API -------------------------------------------------------------------------

    def call(self, request: Any, timeout: float | None = None) -> Any:
        """Send `request` and return its reply. Thread-safe; concurrent calls pipeline."""
        now = time.monotonic()
        deadline = now + (self.timeout if timeout is None else check_timeout(timeout))
        payload = self._payload(request)
        conn = self._conn
        if conn is None or (now - conn.last_used > self.idle_check_after and not conn.pending):
            # (`_usable_conn`'s checks, made only when they can find something)
            conn = self._usable_conn(now) or self._connect(deadline)
        else:
            conn.last_used = now
        with self._lock:
            if conn.broken is not None:
                raise as_rpc_error(conn.broken, fresh=True)
            request_id = next(self._ids)
            call = Call(request_id)
            conn.pending[request_id] = call
            # Claim the reading role now if it is free: the lock-step path then takes the lock
            # only twice per call (here, and when its reply is filed).
            lead = not conn.reading
            conn.reading = True
        try:
            self._send(conn, HEADER.pack(len(payload) + MIN_FRAME_LENGTH, request_id) + payload)
        except BaseException:
            if lead:
                self._release(conn)
            raise
        if lead:
            first = conn.read_own(request_id, deadline, self._decode, self._lock)
            if first is not None:
                self._lead(conn, call, deadline, first)
        else:
            self._wait(conn, call, deadline)
        if call.error is not None:
            raise call.take_error()  # no local keeps it: the traceback's frame makes no cycle
        return call.value

    def call_as(self, request: Any, reply_type: type[T], timeout: float | None = None) -> T:
        """`call`, checking that the reply is a `reply_type` (for typed callers)."""
        reply = self.call(request, timeout)
        if not isinstance(reply, reply_type):
            raise KVPoolError(
                f"{type(request).__name__} answered with {type(reply).__name__}, "
                f"expected {reply_type.__name__}",
                ErrorCode.DESERIALIZE_FAIL,
            )
        return reply

    def call_many(
        self,
        requests: Sequence[Any],
        timeout: float | None = None,
        *,
        window: int = _DEFAULT_WINDOW,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Replies to `requests`, in order, keeping up to `window` of them in flight.

        `timeout` bounds the whole batch. The first failing request's exception is raised
        after every reply has been collected, unless `return_exceptions` puts exceptions in
        the list in place of replies.
        """
        if not isinstance(window, int) or window < 1:
            raise InvalidParams(f"window: {window!r} must be at least 1")
        now = time.monotonic()
        deadline = now + (self.timeout if timeout is None else check_timeout(timeout))
        payloads = [self._payload(r) for r in requests]
        results: list[Any] = [None] * len(payloads)
        first_error: BaseException | None = None
        conn = (self._usable_conn(now) or self._connect(deadline)) if payloads else None
        inflight: list[tuple[int, Call]] = []
        head = 0  # next index of `inflight` to collect
        sent = 0
        # Refill once half the window has come back: one sendall per half window rather than
        # one per reply collected. The request bytes sent and not yet answered stay under
        # `cap` (at least one request goes out), so a burst never waits on socket buffers
        # the server cannot drain while its replies go unread.
        refill_at = window // 2
        cap = _UNIX_WINDOW_BYTES if conn is not None and conn.transport == "unix" else _WINDOW_BYTES
        pending = 0  # request bytes sent and not yet answered
        while True:
            if sent < len(payloads) and len(inflight) - head <= refill_at and pending < cap:
                assert conn is not None
                frames: list[bytes] = []
                nbytes = 0
                with self._lock:
                    broken = conn.broken
                    while (
                        broken is None
                        and sent < len(payloads)
                        and len(inflight) - head < window
                        and (len(inflight) == head or pending + nbytes < cap)
                    ):
                        request_id = next(self._ids)
                        call = Call(request_id)
                        conn.pending[request_id] = call
                        inflight.append((sent, call))
                        payload = payloads[sent]
                        frames.append(
                            HEADER.pack(len(payload) + MIN_FRAME_LENGTH, request_id) + payload
                        )
                        nbytes += len(payload)
                        sent += 1
                if broken is not None:
                    # Nothing more can be sent: the rest fail like the connection did.
                    err = as_rpc_error(broken, fresh=True)
                    for i in range(sent, len(payloads)):
                        results[i] = err
                    first_error = first_error or err
                    sent = len(payloads)
                pending += nbytes
                if frames:
                    # On failure every call in flight has failed with the connection.
                    with contextlib.suppress(RpcError):
                        self._send(conn, frames[0] if len(frames) == 1 else b"".join(frames))
                continue
            if head >= len(inflight):
                break
            assert conn is not None
            index, call = inflight[head]
            head += 1
            pending -= len(payloads[index])
            self._wait(conn, call, deadline)
            if call.error is not None:
                results[index] = call.error
                first_error = first_error or call.error
            else:
                results[index] = call.value
        if first_error is not None and not return_exceptions:
            raise first_error
        return results

    # -- unwaited calls: send now, take the reply later (kvpool.client.pending) -------------

    def send(self, request: Any) -> Sent:
        """Send `request` and return at once; `receive` takes its reply later. Until then the
        reply is filed by whichever call reads the socket, or waits in the socket. Raises only
        what sending raises (a broken connection: `RpcError`)."""
        now = time.monotonic()
        payload = self._payload(request)
        conn = self._usable_conn(now) or self._connect(now + self.timeout)
        with self._lock:
            if conn.broken is not None:
                raise as_rpc_error(conn.broken, fresh=True)
            request_id = next(self._ids)
            call = Call(request_id)
            conn.pending[request_id] = call
        self._send(conn, HEADER.pack(len(payload) + MIN_FRAME_LENGTH, request_id) + payload)
        return Sent(conn, call, now)

    #: Called (in the reading thread, outside the client's lock) with the payload of every
    #: frame the server pushes unasked (`kvpool.protocol.invalidation`); None: dropped.
    on_push: Callable[[bytes], None] | None = None

    def current_connection(self) -> object | None:
        """The connection in use (an opaque token: another one after a reconnect), or None."""
        return self._conn

    def poll(self) -> None:
        """Read what the server sent so far without waiting, when nobody else is reading:
        pushes go to `on_push`, replies to their calls. One non-blocking recv."""
        conn = self._conn
        if conn is None:
            return
        with self._lock:
            if conn.reading or conn.broken is not None:
                return
            conn.reading = True
        try:
            try:
                if conn.tls is not None:  # (an SSLSocket takes no recv flags)
                    got = conn.tls.recv(RECV_BYTES, 0.0)
                    if got is None:
                        return
                    data = got
                else:
                    data = conn.sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
                if not data:
                    raise ConnectionResetError("closed by the server")
                frames = conn.decoder.feed(data)
            except (BlockingIOError, InterruptedError):
                return
            except (OSError, FrameError) as exc:
                self._fail(conn, RpcError(f"connection to {self.address} failed: {exc}"))
                return
            frames = self._pushed(frames)
            outcomes = [(rid, *self._decode_reply(rid, payload)) for rid, payload in frames]
            with self._lock:
                for rid, value, error in outcomes:
                    call = conn.pending.pop(rid & MAX_REQUEST_ID, None)
                    if call is None:
                        continue
                    call.value, call.error, call.done = value, error, True
                    if call.cond is not None:
                        conn.sleepers.pop(call.request_id, None)
                        call.cond.notify()
        finally:
            self._release(conn)

    def _pushed(self, frames: list[Frame]) -> list[Frame]:
        """`frames` without the pushed ones, which go to `on_push`."""
        on_push = self.on_push
        if on_push is None or all(rid != PUSH_REQUEST_ID for rid, _ in frames):
            return frames
        rest = []
        for rid, payload in frames:
            if rid == PUSH_REQUEST_ID:
                try:
                    on_push(payload)
                except Exception:  # a listener's bug must not break the connection
                    log.exception("push listener failed")
            else:
                rest.append((rid, payload))
        return rest

    def receive(self, sent: Sent, timeout: float | None = None) -> Any:
        """The reply to the request of `sent` (`send`), waiting at most `timeout` (default:
        the client's) counted from when it was sent; raises as `call` does."""
        deadline = sent.at + (self.timeout if timeout is None else check_timeout(timeout))
        call = sent.call
        if not call.done:
            self._wait(sent.conn, call, deadline)
        if call.error is not None:
            raise call.take_error()
        return call.value

    def connect(self) -> None:
        """Connect and handshake now rather than on the first call (raises like a call)."""
        if self._conn is None:
            self._connect(time.monotonic() + self.timeout)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (calls then raise `StoreClosed`)."""
        return self._closed

    def reconnect(self) -> None:
        """Drop the current connection, keeping the client: calls in flight on it fail with
        `RpcError` (RPC_FAIL), and the next call connects anew (handshake included), while
        concurrent callers wait for that connection (`_connect` is serialised). Unlike
        replacing the client with a new one and closing this one, no caller can meet a
        closed client. No-op after `close()`."""
        with self._connect_lock:
            if self._closed:
                return
            conn = self._conn
        if conn is not None:
            self._fail(conn, RpcError(f"connection to {self.address} replaced"))

    def retarget(self, address: str) -> bool:
        """Point the client at `address` (an HA leader moved there), keeping the object:
        calls in flight on the old connection fail with `RpcError` (RPC_FAIL), and the next
        call connects to `address`. Whether anything changed (False: the same address, or the
        client is closed). `InvalidParams` for an address that is not "host:port"."""
        host, port = parse_address(address)
        with self._connect_lock:
            if self._closed or address == self.address:
                return False
            old = self.address
            self._connector.move(address, host, port)
            self.epoch += 1
            self.retargeted_at = time.monotonic()
            conn = self._conn
        log.info("RPC client moves from %s to %s", old, address)
        if conn is not None:
            self._fail(conn, RpcError(f"connection to {old} replaced: the leader is at {address}"))
        return True

    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and conn.broken is None

    @property
    def transport(self) -> Transport | None:
        """What the current connection runs over, "unix" or "tcp"; None when not connected."""
        conn = self._conn
        return conn.transport if conn is not None and conn.broken is None else None

    def close(self) -> None:
        """Close the connection; calls in flight fail with RpcError, later calls raise
        `StoreClosed`. Idempotent."""
        with self._connect_lock:
            self._closed = True
            conn = self._conn
        if conn is not None:
            self._fail(conn, RpcError(f"client of {self.address} closed"))

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connection -------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's connection (the child connects anew).

        The socket is the parent's too, so it is only closed here (which drops this process's
        descriptor), never shut down; the locks may have been held by a parent thread at the
        moment of the fork, so they are replaced.
        """
        self._lock = threading.Lock()
        self._connect_lock = threading.Lock()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.sock.close()

    def _usable_conn(self, now: float) -> Channel | None:
        """The current connection, unless it was found closed by the server while idle."""
        conn = self._conn
        if conn is None:
            return None
        if now - conn.last_used > self.idle_check_after and not conn.pending:
            try:
                # Nothing yet means alive. EOF, an error, or data although nothing is pending
                # (a server's parting ErrorReply as it closes an idle connection; at worst a
                # late reply to a call that timed out) means: start a fresh connection.
                # (socket.socket's recv: an SSLSocket takes no flags; raw bytes tell as well)
                socket.socket.recv(conn.sock, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                closed = True
            except BlockingIOError:
                closed = False
            except OSError:
                closed = True
            if closed:
                log.info("connection to %s was closed while idle; reconnecting", self.address)
                self._fail(conn, RpcError(f"{self.address} closed the idle connection"))
                return None
        conn.last_used = now
        return conn

    def _connect(self, deadline: float) -> Channel:
        with self._connect_lock:
            if self._closed:
                raise StoreClosed(f"client of {self.address} is closed")
            conn = self._conn
            if conn is not None:
                return conn
            conn = self._connector.open(deadline)
            if conn.transport == "unix":  # (over TCP the reply may be a host away)
                conn.poll = self._reply_poll
            self._conn = conn
            return conn

    def _fail(self, conn: Channel, exc: BaseException) -> None:
        """Mark `conn` broken: fail its calls, wake their threads, shut the socket."""
        with self._lock:
            if conn.broken is not None:
                return
            # Kept untraced: a traced exception would hold the failing frame, whose locals
            # hold this connection (a cycle a process that freezes its heap never frees).
            conn.broken = as_rpc_error(exc, fresh=True)
            if self._conn is conn:
                self._conn = None
            conn.sleepers.clear()
            for call in conn.pending.values():
                call.error = as_rpc_error(exc, fresh=True)
                call.done = True
                if call.cond is not None:
                    call.cond.notify()
            conn.pending.clear()
            close_now = not conn.reading
        # Wakes a leader blocked in recv (it then closes the socket) and any sender.
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)
        if close_now:
            conn.sock.close()

    # -- the call path ----------------------------------------------------------------------

    def _payload(self, request: Any) -> bytes:
        if self._closed:
            raise StoreClosed(f"client of {self.address} is closed")
        try:
            payload = self._encode(request)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidParams(f"cannot encode {type(request).__name__}: {exc}") from exc
        if len(payload) + MIN_FRAME_LENGTH > self.max_frame_bytes:
            raise FrameTooLarge(len(payload) + MIN_FRAME_LENGTH, self.max_frame_bytes)
        return payload

    def _send(self, conn: Channel, data: bytes) -> None:
        try:
            with conn.send_lock:
                if conn.tls is not None:
                    conn.tls.sendall(data, self.timeout)
                else:
                    conn.sock.sendall(data)
        except OSError as exc:
            # A partial frame may have gone out: the stream is unusable either way.
            err = RpcError(f"sending to {self.address} failed: {exc}")
            self._fail(conn, err)
            raise err from exc

    def _wait(self, conn: Channel, call: Call, deadline: float) -> None:
        """Return once `call` is done (reply, error or timeout recorded in it), leading the
        reading of the socket whenever nobody else is."""
        lock = self._lock
        with lock:
            while not call.done:
                if not conn.reading:
                    conn.reading = True
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._time_out(conn, call)
                    return
                if call.cond is None:
                    call.cond = threading.Condition(lock)
                conn.sleepers[call.request_id] = call
                call.cond.wait(remaining)
                conn.sleepers.pop(call.request_id, None)
            else:
                return
        self._lead(conn, call, deadline)

    def _lead(self, conn: Channel, call: Call, deadline: float, first: bytes = b"") -> None:
        """Read the socket for everyone until `call` is done, then pass the role on; `first`
        is what the caller already read from the socket (`_read_own`), parsed first.

        The caller holds the reading role (``conn.reading``); every way out gives it back.
        """
        sock = conn.sock
        lock = self._lock
        feed = conn.decoder.feed
        try:
            while True:
                if first:
                    data, first = first, b""
                    try:
                        frames = feed(data)
                    except FrameError as exc:
                        self._fail(conn, RpcError(f"connection to {self.address} failed: {exc}"))
                        self._release(conn)
                        return
                    if frames:
                        if self._file(conn, call, frames):
                            return
                        continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    with lock:
                        if not call.done:
                            self._time_out(conn, call)
                        self._release_locked(conn)
                    return
                # Reset the kernel timeout only when it would wake us far too late or far too
                # early, so the lock-step path usually makes no extra syscall.
                tls = conn.tls
                if tls is None and not remaining <= conn.recv_timeout <= remaining * 1.25 + 0.002:
                    set_kernel_timeout(sock, socket.SO_RCVTIMEO, remaining)
                    conn.recv_timeout = remaining
                try:
                    if tls is not None:
                        got = tls.recv(RECV_BYTES, remaining)
                        if got is None:
                            continue  # nothing yet: the loop checks the deadline
                        data = got
                    else:
                        data = sock.recv(RECV_BYTES)
                    if not data:
                        raise ConnectionResetError("closed by the server")
                    frames = feed(data)
                except (BlockingIOError, TimeoutError):
                    continue  # SO_RCVTIMEO expired: the loop checks the deadline
                except (OSError, FrameError) as exc:
                    self._fail(conn, RpcError(f"connection to {self.address} failed: {exc}"))
                    self._release(conn)
                    return
                if frames and self._file(conn, call, frames):
                    return
        except BaseException:
            self._release(conn)  # KeyboardInterrupt and the like: never keep the role
            raise

    def _file(self, conn: Channel, call: Call, frames: list[Frame]) -> bool:
        """Deliver the replies in `frames` to their calls (the leader's own `call` among them,
        perhaps); True when the leader is done reading (its reply came, and the role was
        passed on, or the stream broke)."""
        if self.on_push is not None:
            frames = self._pushed(frames)
        outcomes = [(rid, *self._decode_reply(rid, payload)) for rid, payload in frames]
        with self._lock:
            pending = conn.pending
            for rid, value, error in outcomes:
                other = pending.pop(rid & MAX_REQUEST_ID, None)
                if other is None:
                    continue  # late reply to a call that timed out: dropped
                other.value = value
                other.error = error
                other.done = True
                if other is not call and other.cond is not None:
                    # Out of the sleepers at once: a sleeper already answered must
                    # never be picked as the next reader (it would just return, and
                    # the callers still waiting would have no one reading for them).
                    conn.sleepers.pop(other.request_id, None)
                    other.cond.notify()
            broken = conn.decoder.error
            if call.done and broken is None:
                self._release_locked(conn)
                return True
        if broken is not None:
            # The frames before the break were delivered; the rest cannot be.
            self._fail(conn, RpcError(f"bad frame from {self.address}: {broken}"))
            self._release(conn)
            return True
        return False

    def _release(self, conn: Channel) -> None:
        with self._lock:
            self._release_locked(conn)

    def _release_locked(self, conn: Channel) -> None:
        """Give up the reading role (caller holds self._lock; `Channel.release_reading`)."""
        conn.release_reading()

    def _decode_reply(self, rid: int, payload: bytes) -> tuple[Any, BaseException | None]:
        try:
            if rid & ERROR_FLAG:
                reply = self._decode_error(payload)
                return None, error_for_code(reply.code, reply.message)
            return self._decode(payload), None
        except msgspec.DecodeError as exc:
            return None, KVPoolError(
                f"reply from {self.address} does not decode: {exc}", ErrorCode.DESERIALIZE_FAIL
            )

    def _time_out(self, conn: Channel, call: Call) -> None:
        # Caller holds self._lock. Forgetting the id is what drops the late reply.
        conn.pending.pop(call.request_id, None)
        call.error = RpcError(
            f"no reply from {self.address} in time (request {call.request_id})",
            ErrorCode.RPC_TIMEOUT,
        )
        call.done = True


#: Every client alive in this process, so a forked child can drop the parent's connections.
_live_clients: weakref.WeakSet[RpcClient] = weakref.WeakSet()


def _forget_connections_in_child() -> None:
    for client in list(_live_clients):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_forget_connections_in_child)
