"""`Connector`: how an `RpcClient` (`kvpool.rpc.client`) opens, proves and loses its connection.

Opening a TCP connection and its handshake (Hello / Welcome, the token's proof when the server
challenges, a deposed leader refused by its term), moving to the server's abstract Unix socket
when it names one, checking an idle connection before use, and failing a connection (every
waiting call gets the fault; the next call connects anew). `RpcClient` extends it with the call
path; the state both use is set by `RpcClient.__init__` and declared here. `_Conn` and `_Call`
are the connection's and one call's bookkeeping.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from kvpool.errors import (
    ErrorCode,
    KVPoolError,
    NotLeader,
    RpcError,
    StoreClosed,
    Unauthenticated,
    error_for_code,
)
from kvpool.protocol.framing import (
    ERROR_FLAG,
    HEADER,
    MIN_FRAME_LENGTH,
    ErrorReply,
    FrameDecoder,
    FrameError,
)
from kvpool.protocol.handshake import (
    HANDSHAKE_REQUEST_ID,
    Hello,
    Proof,
    Welcome,
    auth_proof,
    check_unix_welcome,
    is_abstract_unix_address,
    token_key_id,
)

__all__ = ["Connector", "Transport"]

log = logging.getLogger(__name__)

_RECV_BYTES: Final = 64 << 10


#: Which socket a connected client talks over.
Transport = Literal["tcp", "unix"]


class _Call:
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


class _Conn:
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
        # a large share of a lock-step round trip (docs/parts/perf-rpc.md).
        sock.settimeout(None)
        _set_kernel_timeout(sock, socket.SO_SNDTIMEO, send_timeout)
        self.sock = sock
        self.decoder = decoder
        self.transport: Transport = transport
        self.send_lock = threading.Lock()
        # Only the leader touches this: the SO_RCVTIMEO now set on the socket.
        self.recv_timeout = 0.0
        self.last_used = time.monotonic()
        # Guarded by the client's _lock:
        self.pending: dict[int, _Call] = {}
        self.sleepers: dict[int, _Call] = {}
        self.reading = False
        self.broken: BaseException | None = None


class Connector:
    """The connection half of `RpcClient` (module docstring); not used alone."""

    address: str
    token: bytes | None
    _host: str
    _port: int
    timeout: float
    idle_check_after: float
    unix: bool
    cluster_id: str
    client_name: str
    protocol_version: int
    _hello: Hello
    max_frame_bytes: int
    _decode_error: Callable[[bytes], ErrorReply]
    _encode: Callable[[Any], bytes]
    _lock: threading.Lock
    _connect_lock: threading.Lock
    _conn: _Conn | None
    _closed: bool
    server_name: str
    auth_tenant: str
    auth_role: str
    server_term: int
    min_term: int

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

    def _usable_conn(self, now: float) -> _Conn | None:
        """The current connection, unless it was found closed by the server while idle."""
        conn = self._conn
        if conn is None:
            return None
        if now - conn.last_used > self.idle_check_after and not conn.pending:
            try:
                # Nothing yet means alive. EOF, an error, or data although nothing is pending
                # (a server's parting ErrorReply as it closes an idle connection; at worst a
                # late reply to a call that timed out) means: start a fresh connection.
                conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
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

    def _connect(self, deadline: float) -> _Conn:
        with self._connect_lock:
            if self._closed:
                raise StoreClosed(f"client of {self.address} is closed")
            conn = self._conn
            if conn is not None:
                return conn
            conn = self._open(deadline)
            self._conn = conn
            return conn

    def _open(self, deadline: float) -> _Conn:
        """Dial TCP and handshake; move to the server's Unix socket when it names one."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RpcError(f"timed out before connecting to {self.address}", ErrorCode.RPC_TIMEOUT)
        try:
            sock = socket.create_connection((self._host, self._port), timeout=remaining)
        except TimeoutError as exc:
            raise RpcError(
                f"connecting to {self.address} timed out", ErrorCode.RPC_TIMEOUT
            ) from exc
        except OSError as exc:
            raise RpcError(f"cannot connect to {self.address}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            sock.close()
            raise RpcError(f"cannot connect to {self.address}: {exc}") from exc
        welcome, decoder = self._handshake(sock, deadline, self.address)
        self.server_name = welcome.server_name
        self.auth_tenant, self.auth_role = welcome.tenant, welcome.role
        if welcome.term:
            if welcome.term < self.min_term:
                sock.close()
                raise NotLeader(
                    f"{self.address} answered as leader of term {welcome.term}, "
                    f"older than term {self.min_term} seen before",
                    ErrorCode.NOT_LEADER,
                )
            self.min_term = welcome.term
        self.server_term = welcome.term
        if self.unix and welcome.unix_address:
            try:
                unix = self._open_unix(welcome.unix_address, deadline)
            except BaseException:  # KeyboardInterrupt and the like: leave nothing open
                sock.close()
                raise
            if unix is not None:
                sock.close()  # no request went over it: the server just sees it close
                return _Conn(unix[0], unix[1], self.timeout, "unix")
        return _Conn(sock, decoder, self.timeout, "tcp")

    def _open_unix(self, name: str, deadline: float) -> tuple[socket.socket, FrameDecoder] | None:
        """A handshaken connection to the server's Unix socket `name`, or None (keep TCP)."""
        if not is_abstract_unix_address(name):
            log.warning(
                "%s advertises %r, not an abstract Unix socket: using TCP", self.address, name
            )
            return None
        # At most half of what is left: when this attempt fails, the call still has time
        # to run on the TCP connection.
        now = time.monotonic()
        budget = (deadline - now) / 2
        if budget <= 0:
            return None
        unix_deadline = now + budget
        where = f"{self.address} (unix {name[1:]!r})"
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:  # EMFILE and the like: the TCP connection still serves
            log.warning("no Unix socket for %s (%s): using TCP", where, exc)
            return None
        try:
            sock.settimeout(budget)
            sock.connect(name)
        except OSError as exc:
            sock.close()
            # ECONNREFUSED: another host or network namespace (the expected case), or a server
            # that closed its listener; either way TCP serves.
            log.debug("%s unreachable (%s): using TCP", where, exc)
            return None
        except BaseException:  # an interrupt: leave nothing open
            sock.close()
            raise
        try:
            _, decoder = self._handshake(sock, unix_deadline, where, unix_address=name)
        except KVPoolError as exc:
            log.warning("handshake with %s failed (%s): using TCP", where, exc)
            return None
        return sock, decoder

    def _handshake(
        self, sock: socket.socket, deadline: float, where: str, *, unix_address: str = ""
    ) -> tuple[Welcome, FrameDecoder]:
        """Send the Hello on `sock` and check the Welcome (for the Unix socket `unix_address`
        when given); `sock` is closed on any failure, which raises as a connect does."""
        try:
            decoder = FrameDecoder(self.max_frame_bytes)
            frames: list[tuple[int, bytes]] = []
            welcome = self._exchange(
                sock,
                decoder=decoder,
                frames=frames,
                deadline=deadline,
                where=where,
                message=self._hello,
            )
            for _ in range(2):
                problem = check_unix_welcome(
                    welcome,
                    cluster_id=self.cluster_id,
                    unix_address=unix_address,  # "" over TCP: the plain checks only
                    protocol_version=self.protocol_version,
                )
                if problem is not None:
                    raise problem
                if not welcome.challenge:
                    break
                proof = self._proof(welcome.challenge, where)
                welcome = self._exchange(
                    sock,
                    decoder=decoder,
                    frames=frames,
                    deadline=deadline,
                    where=where,
                    message=proof,
                )
            else:
                raise RpcError(f"{where} challenged the proof of its own challenge")
        except FrameError as exc:
            sock.close()
            raise RpcError(f"bad frame from {where} during the handshake: {exc}") from exc
        except KVPoolError:
            sock.close()
            raise
        except TimeoutError as exc:
            sock.close()
            raise RpcError(f"handshake with {where} timed out", ErrorCode.RPC_TIMEOUT) from exc
        except (OSError, msgspec.DecodeError) as exc:
            sock.close()
            raise RpcError(f"handshake with {where} failed: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        return welcome, decoder

    def _exchange(
        self,
        sock: socket.socket,
        *,
        decoder: FrameDecoder,
        frames: list[tuple[int, bytes]],
        deadline: float,
        where: str,
        message: Hello | Proof,
    ) -> Welcome:
        """Send one handshake frame and read the `Welcome` that answers it (raising the
        refusal when the server refuses)."""
        payload = self._encode(message)
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        sock.sendall(HEADER.pack(len(payload) + MIN_FRAME_LENGTH, HANDSHAKE_REQUEST_ID) + payload)
        while not frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            data = sock.recv(_RECV_BYTES)
            if not data:
                raise ConnectionError("server closed the connection during the handshake")
            frames.extend(decoder.feed(data))
        request_id, payload = frames.pop(0)
        if request_id & ERROR_FLAG:
            refusal = self._decode_error(payload)
            raise error_for_code(refusal.code, f"{where} refused: {refusal.message}")
        return msgspec.msgpack.decode(payload, type=Welcome)

    def _proof(self, challenge: bytes, where: str) -> Proof:
        return _proof_for(self.token, challenge, self.cluster_id, self.client_name, where)

    def _fail(self, conn: _Conn, exc: BaseException) -> None:
        """Mark `conn` broken: fail its calls, wake their threads, shut the socket."""
        with self._lock:
            if conn.broken is not None:
                return
            # Kept untraced: a traced exception would hold the failing frame, whose locals
            # hold this connection (a cycle a process that freezes its heap never frees).
            conn.broken = _as_rpc_error(exc, fresh=True)
            if self._conn is conn:
                self._conn = None
            conn.sleepers.clear()
            for call in conn.pending.values():
                call.error = _as_rpc_error(exc, fresh=True)
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


def _proof_for(
    token: bytes | None, challenge: bytes, cluster_id: str, client_name: str, where: str
) -> Proof:
    """The answer to `challenge` (shared with the async client)."""
    if not token:
        raise Unauthenticated(
            f"{where} requires a token: pass token=..., --token-file, or set KVPOOL_AUTH_TOKEN"
        )
    return Proof(token_key_id(token), auth_proof(token, challenge, cluster_id, client_name))


_TIMEVAL = struct.Struct("@ll")


def _set_kernel_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    """SO_RCVTIMEO / SO_SNDTIMEO on a blocking socket (never 0, which means "forever")."""
    seconds = max(seconds, 1e-3)
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(whole, int((seconds - whole) * 1e6)))


def _as_rpc_error(exc: BaseException, *, fresh: bool = False) -> BaseException:
    """`exc` as a kvpool error; `fresh` makes a new instance for each thread that raises it
    (one exception object raised in several threads would share a traceback)."""
    if isinstance(exc, KVPoolError):
        return type(exc)(exc.message, exc.code) if fresh else exc
    return RpcError(str(exc))
