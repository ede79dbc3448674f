"""The TCP transport, client side: pooled connections per peer, pipelining, striping.

A batch for one peer becomes a list of pieces. Small batches run on one connection, pipelined
(up to `window` requests in flight, answers in order). A batch of at least `stripe_bytes` is cut
into chunks of at most `chunk_bytes` and spread over up to `streams` connections that run in
parallel, one worker thread each (the caller's thread runs one of them in blocking mode). READ
payloads are received straight into the caller's buffer; WRITE payloads are sent straight out
of it (`sendmsg` of header + buffer), so the client side makes no copy either.

Deadlock rule for pipelining: a WRITE payload is never sent while READ answers are still
unread, because the server may be blocked sending a READ payload we are not reading while we
block sending a payload it is not reading.

Failure model: a connection that breaks, times out or is aborted fails every piece of its lane
that has not completed with TRANSFER_FAIL and is closed, never reused. A connection or peer
failure also tells the engine (`on_peer_failure`) so it drops what it cached about that peer.

Deadlines are progress-based: every socket call may wait at most `io_timeout` (the engine's
stall timeout, a few seconds) without a byte moving, so a frozen peer fails a request in
seconds while a large transfer that keeps moving is never cut; the request's own deadline
bounds the whole. A server that refuses a connection (its connection caps) answers request id
0 with the reason, which fails the lane with that reason. Pooled connections idle for
`max_idle_age` are closed (at the next check-in for that peer) rather than kept: the server
closes idle ones after a while (`kvpool.transfer.limits`), and reusing one it closed costs a
retry on a fresh connection (see `_run_lane`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Protocol

from kvpool.errors import ErrorCode
from kvpool.override import override
from kvpool.transfer.base import MemoryRegion, Transport
from kvpool.transfer.future import TransferFuture
from kvpool.transfer.location import parse_endpoint
from kvpool.transfer.proof import CHALLENGE, CHALLENGE_MAGIC, HELLO, KeySource, data_proof
from kvpool.transfer.request import TransferOp
from kvpool.transfer.wire import REQ, REQ_MAGIC, RESP, RESP_MAGIC, SocketReader, send_parts

__all__ = ["Piece", "TcpTransport"]

log = logging.getLogger(__name__)

_READ: Final = int(TransferOp.READ)
_WRITE: Final = int(TransferOp.WRITE)


@dataclass(slots=True)
class Piece:
    """A contiguous part of one request: `length` bytes of `view` ⇄ segment `name` @ `offset`."""

    index: int
    op: int
    view: memoryview
    name: bytes
    offset: int
    length: int


class _Conn:
    __slots__ = ("broken", "endpoint", "idle_since", "next_id", "reader", "sock", "timeout")

    def __init__(self, sock: socket.socket, endpoint: str, timeout: float) -> None:
        self.sock = sock
        self.endpoint = endpoint
        # Set once: settimeout() costs two fcntl() calls, so a lane changes it only when its
        # deadline is nearer than this (and check-in restores it).
        self.timeout = timeout
        sock.settimeout(timeout)
        self.reader = SocketReader(sock)
        self.next_id = 1
        self.broken = False
        self.idle_since = 0.0

    def abort(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _ProtocolError(ConnectionError):
    pass


class _Refused(ConnectionRefusedError):
    """The server refused the connection (request id 0 answered with a code)."""


class LaneSink(Protocol):
    """What a lane reports to: a `TransferFuture`, or `_OneResult` for one inline piece."""

    @property
    def aborted(self) -> bool: ...

    def complete(self, index: int, code: ErrorCode, message: str = "") -> None: ...

    def add_abort_hook(self, key: int, hook: Callable[[], None]) -> bool: ...

    def remove_abort_hook(self, key: int) -> None: ...


class _OneResult:
    """A `LaneSink` for one piece run inline: no lock, no event (only the calling thread
    touches it), nothing to abort from outside."""

    __slots__ = ("code", "message")

    def __init__(self) -> None:
        self.code = ErrorCode.TRANSFER_FAIL
        self.message = "not run"

    @property
    def aborted(self) -> bool:
        return False

    def complete(self, index: int, code: ErrorCode, message: str = "") -> None:
        self.code = code
        self.message = message

    def add_abort_hook(self, key: int, hook: Callable[[], None]) -> bool:
        return True

    def remove_abort_hook(self, key: int) -> None:
        pass


class TcpTransport(Transport):
    """Moves pieces to and from peers' `TransferServer`s."""

    name = "tcp"

    def __init__(
        self,
        *,
        streams: int = 4,
        stripe_bytes: int = 4 << 20,
        chunk_bytes: int = 4 << 20,
        window: int = 32,
        connect_timeout: float = 5.0,
        io_timeout: float = 60.0,
        on_peer_failure: Callable[[str], None] | None = None,
        max_idle_age: float = 50.0,
        data_key: KeySource | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.streams = max(1, streams)
        #: TLS of every connection (a client context, `kvpool.rpc.tls`; None: plain TCP).
        self.tls = tls
        #: The key a new connection proves when a server challenges (`kvpool.transfer.proof`).
        self.data_key = data_key
        self.stripe_bytes = stripe_bytes
        self.chunk_bytes = max(1 << 16, chunk_bytes)
        self.window = max(1, window)
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout
        # Idle connections kept per peer. Every thread that transfers concurrently needs its
        # own; keeping too few makes busy clients connect and close per request, which costs a
        # handshake each time and piles up TIME_WAIT sockets until ephemeral ports run out.
        self.max_idle = max(16, 2 * self.streams)
        #: Seconds a pooled connection may idle and still be reused (below the servers' idle
        #: timeout, `ServerLimits.idle_timeout`).
        self.max_idle_age = max_idle_age
        self._on_peer_failure = on_peer_failure
        self._idle: dict[str, list[_Conn]] = {}
        self._active: set[_Conn] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._pool = ThreadPoolExecutor(
            max_workers=max(4, 4 * self.streams), thread_name_prefix="kvpool-tcp"
        )

    # ---- Transport -----------------------------------------------------------------------

    @override
    def register_memory(self, region: MemoryRegion) -> None:
        """Nothing to pin: sockets read and write any mapped memory."""

    @override
    def unregister_memory(self, region: MemoryRegion) -> None:
        """Nothing was pinned."""

    @override
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle = [c for conns in self._idle.values() for c in conns]
            self._idle.clear()
            active = list(self._active)
        for c in idle:
            c.close()
        for c in active:  # wake lanes blocked on a slow peer; they fail their pieces
            c.abort()
        # Queued lanes still run, fail fast ("transport closed") and complete their futures.
        self._pool.shutdown(wait=True)

    # ---- running a batch -----------------------------------------------------------------

    def run(
        self,
        endpoint: str,
        pieces: list[Piece],
        future: TransferFuture,
        deadline: float,
        inline: bool,
    ) -> None:
        """Start (inline: run) the pieces for `endpoint`; completions go to `future`."""
        total = pieces[0].length if len(pieces) == 1 else sum(p.length for p in pieces)
        if self.streams > 1 and total >= self.stripe_bytes:
            pieces = self._split(pieces, future)
            lanes: list[list[Piece]] = [[] for _ in range(min(self.streams, len(pieces)))]
            loads = [0] * len(lanes)
            for p in sorted(pieces, key=lambda p: -p.length):
                k = loads.index(min(loads))
                lanes[k].append(p)
                loads[k] += p.length
            for lane in lanes:
                lane.sort(key=lambda p: (p.index, p.offset))
        else:
            lanes = [pieces]
        first = 1 if inline else 0
        for lane in lanes[first:]:
            try:
                self._pool.submit(self._run_lane, endpoint, lane, future, deadline, False)
            except RuntimeError:  # pool shut down: the engine is closing
                self._fail(lane, 0, future, "transfer engine is closed")
        if inline:
            self._run_lane(endpoint, lanes[0], future, deadline, True)

    def exchange_one(
        self,
        endpoint: str,
        p: Piece,
        deadline: float,
        meanwhile: Callable[[], None] | None = None,
    ) -> tuple[ErrorCode, str]:
        """Run one piece in the calling thread; returns its code and, on failure, why.

        The same protocol and failure handling as a one-piece lane, without the future. A
        WRITE calls `meanwhile` (if given) once its payload is sent, before it waits for the
        server's answer: work that then costs no time of its own (the writer hashes the value
        there). It may be called again when a stale pooled connection is retried; it must not
        raise (if it does, the connection is closed and the exception propagates)."""
        future = _OneResult()
        self._run_lane(endpoint, [p], future, deadline, True, meanwhile=meanwhile)
        return future.code, future.message

    def _split(self, pieces: list[Piece], future: TransferFuture) -> list[Piece]:
        out: list[Piece] = []
        counts: dict[int, int] = {}
        step = self.chunk_bytes
        for p in pieces:
            if p.length <= step:
                out.append(p)
                counts[p.index] = counts.get(p.index, 0) + 1
                continue
            for start in range(0, p.length, step):
                n = min(step, p.length - start)
                out.append(
                    Piece(p.index, p.op, p.view[start : start + n], p.name, p.offset + start, n)
                )
                counts[p.index] = counts.get(p.index, 0) + 1
        for index, n in counts.items():
            future.set_pieces(index, n)
        return out

    def _run_lane(
        self,
        endpoint: str,
        lane: list[Piece],
        future: LaneSink,
        deadline: float,
        inline: bool,
        *,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        """Run one lane on one connection. A pooled connection the peer has closed meanwhile
        fails before any answer arrives; then the lane is retried once on a fresh connection
        (reads and writes of the same bytes to the same place are idempotent), which is
        cheaper than checking every pooled connection with a poll() before use."""
        if future.aborted:
            self._fail(lane, 0, future, "aborted")
            return
        progress = [0]
        for attempt in (0, 1):
            try:
                conn, reused = self._checkout(endpoint, deadline, fresh=attempt > 0)
            except OSError as exc:
                self._fail(lane, progress[0], future, f"cannot connect to {endpoint}: {exc}")
                self._peer_failed(endpoint)
                return
            # Only a lane run by a pool thread can be aborted from outside (by wait's timeout
            # or cancel()); an inline lane is bounded by its socket timeout instead.
            key = id(conn)
            if not inline and not future.add_abort_hook(key, conn.abort):
                self._fail(lane, 0, future, "aborted")
                self._checkin(conn)
                return
            try:
                remaining = deadline - time.monotonic()
                if remaining < 0.9 * conn.timeout:  # (a nearly equal deadline is not worth it)
                    conn.timeout = max(remaining, 0.001)
                    conn.sock.settimeout(conn.timeout)
                self._pipeline(conn, lane, future, progress, meanwhile)
                return
            except (OSError, ConnectionError) as exc:
                conn.broken = True
                stale = reused and progress[0] == 0 and attempt == 0
                if stale and not future.aborted and not isinstance(exc, TimeoutError):
                    log.debug("pooled connection to %s was stale (%r); retrying", endpoint, exc)
                    continue
                why = "aborted" if future.aborted else f"connection to {endpoint} failed: {exc!r}"
                self._fail(lane, progress[0], future, why)
                if not future.aborted and not isinstance(exc, TimeoutError):
                    self._peer_failed(endpoint)
                return
            finally:
                if not inline:
                    future.remove_abort_hook(key)
                if conn.broken:
                    with self._lock:
                        self._active.discard(conn)
                    conn.close()
                else:
                    self._checkin(conn)

    def _pipeline(
        self,
        conn: _Conn,
        lane: list[Piece],
        future: LaneSink,
        progress: list[int],
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        sock = conn.sock
        if len(lane) == 1:  # the common small case (one KV get or put), without the pipeline
            p = lane[0]
            req_id = conn.next_id
            conn.next_id += 1
            hdr = REQ.pack(REQ_MAGIC, p.op, 0, len(p.name), req_id, p.offset, p.length) + p.name
            if p.op == _WRITE:
                send_parts(sock, [hdr, p.view], len(hdr) + p.length)
                if meanwhile is not None:
                    try:
                        meanwhile()  # while the server takes the last bytes and answers
                    except BaseException:
                        conn.broken = True  # its answer is left unread: never reuse it
                        raise
            else:
                sock.sendall(hdr)
            self._receive(conn, deque(((p, req_id),)), future, progress)
            return
        in_flight: deque[tuple[Piece, int]] = deque()
        reads_in_flight = 0
        headers: list[bytes | memoryview] = []  # READ headers not sent yet: one sendmsg later
        for p in lane:
            if future.aborted:
                raise ConnectionAbortedError("aborted")
            req_id = conn.next_id
            conn.next_id += 1
            hdr = REQ.pack(REQ_MAGIC, p.op, 0, len(p.name), req_id, p.offset, p.length) + p.name
            if p.op == _WRITE:
                if headers:
                    send_parts(sock, headers)
                    headers = []
                while reads_in_flight:
                    reads_in_flight -= self._receive(conn, in_flight, future, progress)
                send_parts(sock, [hdr, p.view], len(hdr) + p.length)
            else:
                headers.append(hdr)
                reads_in_flight += 1
            in_flight.append((p, req_id))
            if len(in_flight) >= self.window:
                if headers:
                    send_parts(sock, headers)
                    headers = []
                # Drain to half the window, so the next headers go out together (one sendmsg
                # for several requests, and the server answers them with one sendmsg too).
                while len(in_flight) > self.window // 2:
                    reads_in_flight -= self._receive(conn, in_flight, future, progress)
        if headers:
            send_parts(sock, headers)
        while in_flight:
            self._receive(conn, in_flight, future, progress)

    @staticmethod
    def _receive(
        conn: _Conn,
        in_flight: deque[tuple[Piece, int]],
        future: LaneSink,
        progress: list[int],
    ) -> int:
        """Read one answer; returns 1 when it answered a READ, else 0."""
        p, req_id = in_flight[0]
        if not conn.reader.fill(RESP.size):
            raise ConnectionResetError("peer closed the connection")
        magic, status, rid, length = RESP.unpack(conn.reader.take(RESP.size))
        if rid == 0 and status != 0 and magic == RESP_MAGIC:
            raise _Refused(
                f"{conn.endpoint} refused the connection: {ErrorCode.of(status).name} "
                "(too many connections)"
            )
        if magic != RESP_MAGIC or rid != req_id:
            raise _ProtocolError(f"bad answer (magic {magic!r}, id {rid}, expected {req_id})")
        if status == 0:
            if p.op == _READ:
                if length != p.length:
                    raise _ProtocolError(f"READ answered {length} bytes, asked {p.length}")
                conn.reader.read_into(p.view)
            in_flight.popleft()
            progress[0] += 1
            future.complete(p.index, ErrorCode.OK)
        else:
            if length:
                raise _ProtocolError(f"error answer with {length} payload bytes")
            in_flight.popleft()
            progress[0] += 1
            code = ErrorCode.of(status)
            future.complete(
                p.index,
                code,
                f"{conn.endpoint} refused {p.name.decode(errors='replace')}"
                f"@{p.offset}+{p.length}: {code.name}",
            )
        return 1 if p.op == _READ else 0

    @staticmethod
    def _fail(lane: list[Piece], start: int, future: LaneSink, why: str) -> None:
        for p in lane[start:]:
            future.complete(p.index, ErrorCode.TRANSFER_FAIL, why)

    # ---- connections ---------------------------------------------------------------------

    def _checkout(self, endpoint: str, deadline: float, fresh: bool) -> tuple[_Conn, bool]:
        """A connection to `endpoint` (pooled unless `fresh`) and whether it was pooled."""
        with self._lock:
            if self._closed:
                raise OSError(errno.ESHUTDOWN, "transport closed")
            conns = self._idle.get(endpoint)
            if conns and not fresh:
                # The newest: checkin drops those idle past max_idle_age, oldest first.
                conn = conns.pop()
                self._active.add(conn)
                return conn, True
        host, port = parse_endpoint(endpoint)
        timeout = max(min(self.connect_timeout, deadline - time.monotonic()), 0.001)
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:  # the handshake within the connect timeout
                sock = self.tls.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        conn = _Conn(sock, endpoint, self.io_timeout)
        if not self._track(conn):
            conn.close()
            raise OSError(errno.ESHUTDOWN, "transport closed")
        key = self.data_key() if self.data_key is not None else None
        if key is not None:
            try:
                self._prove(conn, key)
            except BaseException:
                with self._lock:
                    self._active.discard(conn)
                conn.close()
                raise
        return conn, False

    @staticmethod
    def _prove(conn: _Conn, key: bytes) -> None:
        """Answer the server's challenge with the data key. A refusal by its caps is left
        buffered for the first answer to report (`_receive`)."""
        reader = conn.reader
        conn.sock.sendall(HELLO)
        if not reader.fill(len(CHALLENGE_MAGIC)):
            raise ConnectionResetError(f"{conn.endpoint} closed the connection at once")
        if bytes(reader.peek(len(RESP_MAGIC))) == RESP_MAGIC:
            return
        if not reader.fill(CHALLENGE.size):
            raise ConnectionResetError(f"{conn.endpoint} closed the connection at once")
        magic, nonce = CHALLENGE.unpack(reader.take(CHALLENGE.size))
        if magic != CHALLENGE_MAGIC:
            raise _ProtocolError(f"{conn.endpoint} sent no data-plane challenge ({magic!r})")
        conn.sock.sendall(data_proof(key, nonce))

    def _track(self, conn: _Conn) -> bool:
        """Count `conn` as in use (close() aborts it); False when the transport closed."""
        with self._lock:
            if self._closed:
                return False
            self._active.add(conn)
            return True

    def _checkin(self, conn: _Conn) -> None:
        if conn.timeout != self.io_timeout:  # a short deadline lowered it for one lane
            conn.timeout = self.io_timeout
            conn.sock.settimeout(self.io_timeout)
        with self._lock:
            self._active.discard(conn)
            stale: list[_Conn] = []
            kept = False
            if not self._closed:
                now = time.monotonic()
                conns = self._idle.setdefault(conn.endpoint, [])
                # The oldest are first: drop those the server may have closed by now.
                while conns and conns[0].idle_since < now - self.max_idle_age:
                    stale.append(conns.pop(0))
                if len(conns) < self.max_idle:
                    conn.idle_since = now
                    conns.append(conn)
                    kept = True
        for c in stale:
            c.close()
        if not kept:
            conn.close()

    def _peer_failed(self, endpoint: str) -> None:
        with self._lock:
            conns = self._idle.pop(endpoint, [])
        for c in conns:
            c.close()
        if self._on_peer_failure is not None:
            self._on_peer_failure(endpoint)

    def drop_peer(self, endpoint: str) -> None:
        """Close the idle connections to `endpoint` (its owner is gone or moved)."""
        with self._lock:
            conns = self._idle.pop(endpoint, [])
        for c in conns:
            c.close()
