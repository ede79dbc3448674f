"""`TransferServer`: serves reads and writes of this process's segments over TCP.

Threads, bounded whatever peers do (docs/parts/limits.md):

* one **poller** thread owns an epoll of the listener and of every connection that is idle
  (nothing buffered, no request running). It accepts (refusing past the caps with an
  UNAVAILABLE_IN_CURRENT_STATUS answer on request id 0, then a close), hands a connection that
  becomes readable to a worker, and closes connections past their first-request or idle limit;
* at most ``workers`` **worker** threads (started as needed) serve ready connections. A worker
  serves one connection while requests keep coming, reading requests (`kvpool.transfer.wire`)
  and answering them in order, receiving a write's payload straight into the segment mapping
  (`recv_into` on a memoryview of it) and sending a read's payload straight out of it
  (`sendmsg`; a large READ of a disk tier with `sendfile` from the tier's file, zero-copy from
  the page cache: `kvpool.transfer.serving.TierFile`). When the connection has been quiet for
  `_LINGER_S` (or at once, when other connections wait for a worker) it goes back to the
  poller. So N idle connections cost no
  thread, and a busy connection pays no hand-off per request (blocking calls, which release
  the GIL, on a socket whose kernel timeouts, SO_RCVTIMEO / SO_SNDTIMEO, cost no extra call).

A request that moves no byte for ``stall_timeout`` ends its connection: a frozen or vanished
client holds a worker for seconds. A request header that arrives in part never holds one: its
bytes go back to the poller with the connection (`Conn.partial`) until the rest comes, and the
connection is closed once the header is incomplete for ``stall_timeout`` (slowloris). Every request is checked against the bounds of a segment
mounted here and refused otherwise (SEGMENT_NOT_FOUND / INVALID_PARAMS) without serving a byte.
A malformed header, a peer that half-closes or dies mid-payload ends only that connection;
such events are logged at most once per kind per interval (`kvpool.logs`). A transfer holds
the segment's mapping, so a segment removed and closed meanwhile is unmapped only when the
transfer ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import logging
import os
import queue
import select
import socket
import ssl
import struct
import threading
import time
from typing import Final

from kvpool.errors import ErrorCode, InvalidParams, SegmentError
from kvpool.fdlimit import connection_cap
from kvpool.logs import RateLimitedLog
from kvpool.transfer.limits import ServerLimits, default_limits
from kvpool.transfer.memory import SegmentMemory
from kvpool.transfer.proof import (
    CHALLENGE,
    CHALLENGE_MAGIC,
    HELLO,
    NONCE_BYTES,
    PROOF,
    KeySource,
    data_proof,
)
from kvpool.transfer.request import TransferOp
from kvpool.transfer.serving import (
    Conn,
    PendingWrite,
    SendfilePolicy,
    ServeCounters,
    TierFile,
    Worker,
    kernel_timeout,
    serve_tier_read,
)
from kvpool.transfer.wire import (
    MAX_NAME,
    REQ,
    REQ_MAGIC,
    RESP,
    RESP_MAGIC,
    SocketReader,
)

__all__ = ["SendfilePolicy", "ServeCounters", "TransferServer"]

log = logging.getLogger(__name__)
limited_log = RateLimitedLog(log, 10.0)

_READ: Final = int(TransferOp.READ)
_WRITE: Final = int(TransferOp.WRITE)
#: How long a worker waits for the next request on a quiet connection before handing it back
#: to the poller, and the steps it waits in (the kernel receive timeout of served sockets):
#: after each step it hands the connection back at once if other connections wait for a worker.
_LINGER_S: Final = 0.5
_TICK_S: Final = 0.02
_IN: Final = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLONESHOT
#: The start of a request header: magic, op, flags, name length.
_HEAD: Final = struct.Struct("<4sBBH")
_REFUSED: Final = RESP.pack(RESP_MAGIC, int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS), 0, 0)


class TransferServer:
    """TCP server of the segments added with `add_segment`; listens from construction on.

    `limits` bounds what peers may hold (`ServerLimits`; the process default when None);
    `max_connections`, when given, overrides its total cap (kept for callers of old).
    `data_key`, when it returns a key at accept, makes a connection prove that key before it
    is served (`kvpool.transfer.proof`). `tls` (an `ssl.SSLContext` for servers) wraps every
    connection; the first worker to serve one makes its TLS handshake (within
    `stall_timeout`), and the challenge then goes inside TLS."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_connections: int | None = None,
        limits: ServerLimits | None = None,
        data_key: KeySource | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise InvalidParams(f"TransferServer: port {port!r} outside 0..65535")
        limits = limits if limits is not None else default_limits()
        if max_connections is not None:
            limits = dataclasses.replace(limits, max_connections=max_connections)
        self.limits = limits
        self._data_key = data_key
        #: TLS of every connection (a server context, `kvpool.rpc.tls`; None: plain TCP).
        self.tls = tls
        #: Which peers get `sendfile` for a large READ of a disk tier (plain TCP only).
        self.sendfile = SendfilePolicy.REMOTE
        self._max_connections = connection_cap(limits.max_connections)
        self._segments: dict[str, tuple[SegmentMemory, int]] = {}
        # The same entries keyed by the UTF-8 name as it arrives on the wire (no decode per
        # request); replaced as a whole under the lock, read without it.
        self._by_wire_name: dict[bytes, tuple[SegmentMemory, int]] = {}
        # Disk tiers' data files by wire name (`TierFile`: READs sent with sendfile), replaced
        # with `_by_wire_name`.
        self._tier_files: dict[str, TierFile] = {}
        self._files_by_wire: dict[bytes, TierFile] = {}
        self._lock = threading.Lock()
        self._conns: dict[int, Conn] = {}  # every open connection, by fd
        self._idle: dict[int, Conn] = {}  # those registered in the epoll (poller's own)
        self._per_peer: dict[str, int] = {}
        self._accepted = 0
        self._refused = 0
        self._counts: list[ServeCounters] = []  # one per worker that served (appended only)
        self._closed = False
        self._ready: queue.SimpleQueue[Conn | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._waiting_workers = 0  # workers blocked on _ready (under _lock)
        self._tick = min(_TICK_S, limits.stall_timeout)
        self._linger_ticks = max(1, round(_LINGER_S / self._tick))
        self._patience = max(1, round(limits.stall_timeout / self._tick))
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(1024)
            self._listener.setblocking(False)
            self._epoll.register(self._listener.fileno(), select.EPOLLIN)
            self._epoll.register(self._wake_r, select.EPOLLIN)
        except OSError:
            self._listener.close()
            self._epoll.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise
        bound = self._listener.getsockname()
        self.host = host
        self.port = int(bound[1])
        self.endpoint = (
            f"[{host}]:{self.port}" if family == socket.AF_INET6 else f"{host}:{self.port}"
        )
        self._poller = threading.Thread(
            target=self._poll_loop, name=f"kvpool-xfer-poll-{self.port}", daemon=True
        )
        self._poller.start()
        log.info("transfer server listening on %s", self.endpoint)

    # ---- segments ------------------------------------------------------------------------

    def add_segment(self, mem: SegmentMemory) -> None:
        """Serve `mem`; SEGMENT_ALREADY_EXISTS when a segment of that name is served."""
        with self._lock:
            if mem.name in self._segments:
                raise SegmentError(
                    f"segment {mem.name} is already served", ErrorCode.SEGMENT_ALREADY_EXISTS
                )
            token = mem.add_close_hook(self._on_segment_close)
            self._segments[mem.name] = (mem, token)
            tier = TierFile.of(mem)
            if tier is not None:
                self._tier_files[mem.name] = tier
            self._reindex()

    def remove_segment(self, name: str) -> None:
        """Stop serving segment `name` (transfers already running finish); SEGMENT_NOT_FOUND
        when it is not served."""
        with self._lock:
            entry = self._segments.pop(name, None)
            tier = self._tier_files.pop(name, None)
            self._reindex()
        if tier is not None:
            tier.drop()
        if entry is None:
            raise SegmentError(f"segment {name} is not served here")
        entry[0].remove_close_hook(entry[1])

    def segment_names(self) -> list[str]:
        with self._lock:
            return sorted(self._segments)

    def _reindex(self) -> None:
        """Rebuild the wire-name index (call with the lock held)."""
        self._by_wire_name = {name.encode(): e for name, e in self._segments.items()}
        self._files_by_wire = {name.encode(): f for name, f in self._tier_files.items()}

    def _on_segment_close(self, mem: SegmentMemory) -> None:
        with self._lock:
            entry = self._segments.get(mem.name)
            tier = None
            if entry is not None and entry[0] is mem:
                del self._segments[mem.name]
                tier = self._tier_files.pop(mem.name, None)
                self._reindex()
        if tier is not None:
            tier.drop()

    # ---- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop listening, end every connection, join every thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns.values())
            segments = list(self._segments.values())
            self._segments.clear()
            tiers = list(self._tier_files.values())
            self._tier_files.clear()
            self._reindex()
            workers = list(self._workers)
        for mem, token in segments:
            mem.remove_close_hook(token)
        for tier in tiers:
            tier.drop()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._poller.join(timeout=5)
        self._listener.close()
        # shutdown() wakes a worker blocked in recv()/sendmsg() on Linux; close() alone does not.
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        for _ in workers:
            self._ready.put(None)
        for thread in workers:
            thread.join(timeout=5)
        with self._lock:
            left = list(self._conns.values())
            self._conns.clear()
            self._idle.clear()
            self._per_peer.clear()
        for conn in left:
            conn.release_pending()
            with contextlib.suppress(OSError):
                conn.sock.close()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> TransferServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection_count(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._conns)

    @property
    def accepted_connections(self) -> int:
        """Connections accepted since start (a client that churns connections shows here)."""
        return self._accepted

    @property
    def refused_connections(self) -> int:
        """Connections refused by the caps since start."""
        return self._refused

    def counters(self) -> ServeCounters:
        """Requests, bytes and errors served since start, summed over the worker threads
        (each count read without a lock: a scrape may miss the last few requests)."""
        total = ServeCounters()
        for counts in list(self._counts):
            total.add(counts)
        return total

    def worker_count(self) -> int:
        """Worker threads started (at most `limits.workers`)."""
        with self._lock:
            return len(self._workers)

    # ---- the poller ----------------------------------------------------------------------

    def _poll_loop(self) -> None:
        limits = self.limits
        period = min(1.0, max(0.05, min(limits.first_request_timeout, limits.idle_timeout) / 4))
        listener_fd = self._listener.fileno()
        next_sweep = time.monotonic() + period
        accepting = True
        try:
            while True:
                events = self._epoll.poll(max(0.0, next_sweep - time.monotonic()))
                if self._closed:  # close() wrote to the wake pipe
                    return
                for fd, _ in events:
                    if fd == listener_fd:
                        accepting = self._accept_all()
                        if not accepting:  # out of descriptors: try again at the next sweep
                            self._epoll.modify(listener_fd, 0)
                    elif fd != self._wake_r:
                        with self._lock:
                            conn = self._idle.pop(fd, None)
                        if conn is not None:
                            self._dispatch(conn)
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + period
                    if not accepting:
                        accepting = True
                        self._epoll.modify(listener_fd, select.EPOLLIN)
        except Exception:
            log.exception("transfer server poller failed")

    def _accept_all(self) -> bool:
        """Accept every pending connection; False when out of descriptors."""
        while True:
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                limited_log.warning("accept", "transfer server cannot accept: %s", exc)
                return False
            peer = str(addr[0])
            now = time.monotonic()
            with self._lock:
                if self._closed:
                    sock.close()
                    return True
                n = self._per_peer.get(peer, 0)
                if len(self._conns) >= self._max_connections:
                    why = f"too many connections ({self._max_connections} in all)"
                elif n >= self.limits.max_connections_per_peer:
                    why = f"too many connections from {peer} ({n})"
                else:
                    why = ""
                    conn = Conn(sock, peer, now)
                    self._per_peer[peer] = n + 1
                    self._conns[conn.fd] = conn
                    self._idle[conn.fd] = conn
                    self._accepted += 1
                if why:
                    self._refused += 1
            if why:
                self._refuse(sock, why)
                continue
            try:
                sock.setblocking(True)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                # Kernel timeouts, not settimeout(): no poll() before every call. A receive
                # wakes every tick (to hand a quiet connection back, or to count a stall); a
                # send that moves nothing for stall_timeout ends the connection.
                kernel_timeout(sock, socket.SO_RCVTIMEO, self._tick)
                kernel_timeout(sock, socket.SO_SNDTIMEO, self.limits.stall_timeout)
                if self.tls is not None:
                    conn.tls = True  # the handshake (and the challenge) in a worker
                elif self._data_key is not None and self._data_key() is not None:
                    conn.nonce = os.urandom(NONCE_BYTES)
                    sock.send(CHALLENGE.pack(CHALLENGE_MAGIC, conn.nonce), socket.MSG_DONTWAIT)
                self._epoll.register(conn.fd, _IN)
            except (OSError, ValueError):
                self._drop(conn)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        limited_log.warning(
            "refused", "transfer server %s refusing a connection: %s", self.endpoint, why
        )
        with contextlib.suppress(OSError):
            sock.send(_REFUSED, socket.MSG_DONTWAIT)
        sock.close()

    def _sweep(self, now: float) -> None:
        """Close idle connections past their first-request or idle limit."""
        first, idle = self.limits.first_request_timeout, self.limits.idle_timeout
        expired: list[tuple[Conn, str]] = []
        stall = self.limits.stall_timeout
        with self._lock:
            for conn in self._idle.values():
                quiet = now - conn.last_active
                pending = conn.pending
                if conn.partial_since and now - conn.partial_since >= stall:
                    what = (
                        "a write's payload"
                        if pending
                        else "a TLS handshake"
                        if conn.tls
                        else "a request header"
                    )
                    expired.append((conn, f"{what} stalled for {stall:g} s"))
                elif pending and now - pending.started > stall + (
                    pending.total - pending.left
                ) / max(1, self.limits.min_rate):
                    expired.append((conn, "a write's payload slower than the minimum rate"))
                elif not conn.served and quiet >= first:
                    expired.append((conn, f"no request in {first:g} s"))
                elif conn.served and quiet >= idle:
                    expired.append((conn, f"idle for {idle:g} s"))
            for conn, _ in expired:
                del self._idle[conn.fd]
        for conn, why in expired:
            limited_log.log(
                logging.INFO if conn.served else logging.WARNING,
                "idle" if conn.served else "no-request",
                "transfer server closing a connection from %s: %s",
                conn.peer,
                why,
            )
            self._drop(conn)

    def _dispatch(self, conn: Conn) -> None:
        """Hand a readable connection to a worker, starting one if none is free."""
        self._ready.put(conn)
        with self._lock:
            if self._closed:
                return
            if self._ready.qsize() > self._waiting_workers and (
                len(self._workers) < self.limits.workers
            ):
                thread = threading.Thread(
                    target=self._work,
                    name=f"kvpool-xfer-{self.port}-{len(self._workers)}",
                    daemon=True,
                )
                try:
                    thread.start()
                except RuntimeError as exc:  # no thread to be had: the running ones serve it
                    limited_log.warning("no-thread", "transfer server: no new worker: %s", exc)
                    return
                self._workers.append(thread)

    def _rearm(self, conn: Conn) -> None:
        """Give a quiet connection back to the poller (or, when its TLS layer holds bytes
        that epoll cannot see, straight back to the workers)."""
        if isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():
            self._dispatch(conn)
            return
        conn.last_active = time.monotonic()
        with self._lock:
            if not self._closed and conn.fd in self._conns:
                self._idle[conn.fd] = conn
                try:
                    self._epoll.modify(conn.fd, _IN)
                    return
                except OSError:
                    self._idle.pop(conn.fd, None)
        self._drop(conn)

    def _drop(self, conn: Conn) -> None:
        """Forget and close a connection (idempotent)."""
        with self._lock:
            if self._conns.get(conn.fd) is conn:
                del self._conns[conn.fd]
                self._idle.pop(conn.fd, None)
                n = self._per_peer.get(conn.peer, 0) - 1
                if n > 0:
                    self._per_peer[conn.peer] = n
                else:
                    self._per_peer.pop(conn.peer, None)
                if not self._closed:
                    with contextlib.suppress(OSError, ValueError):
                        self._epoll.unregister(conn.fd)
        conn.release_pending()
        with contextlib.suppress(OSError):
            conn.sock.close()

    # ---- workers -------------------------------------------------------------------------

    def _work(self) -> None:
        state: Worker | None = None
        while True:
            with self._lock:
                self._waiting_workers += 1
            conn = self._ready.get()
            with self._lock:
                self._waiting_workers -= 1
            if conn is None:
                return
            if state is None:
                state = Worker(conn.sock, self._patience, self.limits)
                self._counts.append(state.counts)
            if self._serve_turn(conn, state):
                self._rearm(conn)
            else:
                self._drop(conn)

    def _serve_turn(self, conn: Conn, w: Worker) -> bool:
        """Serve `conn` until it is quiet (True: give it back) or ends (False: close it)."""
        conn.served = True
        if conn.tls:
            accepted = self._tls_accept(conn, w.counts)
            if accepted is not True:
                return accepted is None  # None: handed back mid-handshake
        w.reader.reset(conn.sock)
        if conn.partial:
            w.reader.preload(conn.partial)
            conn.partial = b""
        w.out.sock = conn.sock
        try:
            return self._serve(conn, w)
        except TimeoutError:
            w.counts.stalls += 1
            limited_log.info(
                "stall",
                "transfer server closing a connection from %s: no byte moved in %g s, or "
                "slower than %d bytes/s",
                conn.peer,
                self.limits.stall_timeout,
                self.limits.min_rate,
            )
        except (OSError, ConnectionError) as exc:
            w.counts.errors += 1
            log.debug("transfer connection ended: %s", exc)
        except Exception:
            w.counts.errors += 1
            log.exception("transfer connection failed")
        finally:
            w.out.drop()
        return False

    def _serve(self, conn: Conn, w: Worker) -> bool:
        """Serve requests until the peer closes (False) or goes quiet (True). Answers to
        requests that arrived together are sent together: they wait in `out` while the next
        request is already buffered, and go out in one `sendmsg` before anything could block
        (a recv, or enough bytes queued)."""
        reader, out = w.reader, w.out
        if conn.pending is not None and not self._receive(conn, w, conn.pending):
            return True
        while True:
            if reader.buffered < self._wanted(reader, conn):
                out.flush()
                waited = self._await_request(conn, reader)
                if waited is not None:
                    return waited
            conn.partial_since = 0.0
            if conn.nonce is not None:
                if not self._proven(conn, reader.take(len(HELLO) + PROOF.size), w.counts):
                    return False  # not a byte for a connection that did not prove the key
                continue
            magic, op, _flags, name_len, req_id, offset, length = REQ.unpack(reader.take(REQ.size))
            if magic != REQ_MAGIC or op not in (_READ, _WRITE) or name_len > MAX_NAME:
                limited_log.warning(
                    "malformed",
                    "transfer server: malformed request header from %s; closing the connection",
                    conn.peer,
                )
                w.counts.refused += 1
                out.add(RESP.pack(RESP_MAGIC, int(ErrorCode.INVALID_PARAMS), req_id, 0))
                out.flush()
                return False
            if reader.buffered < name_len:
                out.flush()
                if not reader.fill(name_len):
                    return False
            name = bytes(reader.take(name_len))
            code, mem = self._check(name, offset, length)
            if mem is None:
                w.counts.refused += 1
                if op == _WRITE and length:
                    # Its payload is drained so the stream stays in step, then it is refused.
                    if reader.buffered < length:
                        out.flush()
                    drain = PendingWrite(req_id, None, 0, length, length, time.monotonic(), code)
                    if not self._receive(conn, w, drain):
                        return True
                    continue
                out.add(RESP.pack(RESP_MAGIC, int(code), req_id, 0))
                continue
            counts = w.counts
            if op == _READ:
                tier = self._files_by_wire.get(name)
                if tier is not None:
                    zero_copy = self.tls is None and self.sendfile.allows(conn.loopback)
                    serve_tier_read(w, tier, mem, req_id, offset, length, zero_copy)
                    continue
                counts.reads += 1
                counts.read_bytes += length
                out.add(
                    RESP.pack(RESP_MAGIC, 0, req_id, length),
                    mem.mapping.view[offset : offset + length],
                    mem,
                )
            else:
                if reader.buffered < length:
                    out.flush()
                # The common case in place (no PendingWrite): the whole payload arrives.
                region = mem.mapping.view[offset : offset + length]
                try:
                    got = reader.read_into(region, self._others_wait)
                except BaseException:
                    region.release()  # the slice first: see `_receive`
                    mem.mapping.release()
                    raise
                region.release()
                if got < length:  # stalled while others wait: the rest in the poller
                    now = time.monotonic()
                    conn.pending = PendingWrite(
                        req_id, mem, offset + got, length - got, length, now
                    )
                    conn.partial_since = now
                    out.flush()
                    return True
                mem.mapping.release()
                counts.writes += 1
                counts.write_bytes += length
                out.add(RESP.pack(RESP_MAGIC, 0, req_id, 0))

    def _receive(self, conn: Conn, w: Worker, p: PendingWrite) -> bool:
        """Receive what is left of a WRITE's payload (into its segment, or dropped when the
        write was refused) and queue its answer: True. False when the peer stopped sending
        while other connections wait for a worker: the write waits in `conn.pending`, with
        the connection, in the poller (the sweep closes it after `stall_timeout` without a
        byte, or below `min_rate`), and the next worker resumes it."""
        conn.pending = p  # its owner from now on: a connection that ends releases the mapping
        reader = w.reader
        if p.mem is None:
            if w.scratch is None:
                w.scratch = memoryview(bytearray(1 << 16))
            left = reader.discard(p.left, w.scratch, self._others_wait)
            p.left = left
        else:
            region = p.mem.mapping.view[p.offset : p.offset + p.left]
            try:
                got = reader.read_into(region, self._others_wait)
            finally:
                # The slice goes first, also when the peer died mid-payload: a live slice
                # makes the last release's unmap fail and leaves the mapping quarantined.
                region.release()
            p.offset += got
            p.left -= got
        if p.left:
            conn.partial_since = time.monotonic()  # the sweep's stall clock: the last byte
            w.out.flush()
            return False
        conn.pending = None
        conn.partial_since = 0.0
        if p.mem is not None:
            p.mem.mapping.release()
            w.counts.writes += 1
            w.counts.write_bytes += p.total
        w.out.add(RESP.pack(RESP_MAGIC, int(p.code), p.req_id, 0))
        return True

    def _others_wait(self) -> bool:
        """Whether connections wait for a worker (a stalled payload then gives way)."""
        return self._ready.qsize() > 0

    def _tls_accept(self, conn: Conn, counts: ServeCounters) -> bool | None:
        """Make (or go on with) the TLS handshake of a new connection, then send the challenge
        inside TLS: True. False when it failed or took longer than `stall_timeout` from its
        start (nothing was served). None when the peer went quiet mid-handshake while other
        connections wait for a worker: it goes back to the poller (a handshake never holds a
        worker that others need), whose sweep closes it at the same deadline."""
        assert self.tls is not None
        try:
            sock = conn.sock
            if not isinstance(sock, ssl.SSLSocket):
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                conn.sock = sock  # it owns the descriptor now
                # Timeout mode, one tick per wait: on a blocking socket the ssl module retries
                # a read that the kernel timeout ended, for ever (see `SocketReader`).
                sock.settimeout(self._tick)
                conn.partial_since = time.monotonic()
            deadline = conn.partial_since + self.limits.stall_timeout
            while True:
                try:
                    sock.do_handshake()
                    break
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, TimeoutError):
                    if time.monotonic() > deadline:
                        raise TimeoutError("TLS handshake too slow") from None
                    if self._ready.qsize():
                        return None
            conn.tls = False
            conn.partial_since = 0.0
            if self._data_key is not None and self._data_key() is not None:
                conn.nonce = os.urandom(NONCE_BYTES)
                sock.sendall(CHALLENGE.pack(CHALLENGE_MAGIC, conn.nonce))
        except (OSError, ValueError) as exc:
            counts.unproven += 1
            limited_log.warning(
                "tls",
                "transfer server %s closing a connection from %s: TLS handshake failed: %s",
                self.endpoint,
                conn.peer,
                exc,
            )
            return False
        return True

    def _proven(self, conn: Conn, proof: memoryview, counts: ServeCounters) -> bool:
        """Whether `proof` answers the connection's challenge with the data key now in force."""
        nonce, conn.nonce = conn.nonce, None
        key = self._data_key() if self._data_key is not None else None
        if (
            key is not None
            and nonce is not None
            and hmac.compare_digest(HELLO + data_proof(key, nonce), bytes(proof))
        ):
            return True
        counts.unproven += 1
        limited_log.warning(
            "unproven",
            "transfer server %s closing a connection from %s: it did not prove the data key",
            self.endpoint,
            conn.peer,
        )
        return False

    @staticmethod
    def _wanted(reader: SocketReader, conn: Conn) -> int:
        """Bytes of the next request that must be buffered before a worker commits to it: its
        header, and its segment name unless the header is malformed (then the header alone,
        which is refused as it is); the proof first on a connection not proven yet."""
        if conn.nonce is not None:
            return len(HELLO) + PROOF.size
        if reader.buffered < REQ.size:
            return REQ.size
        magic, op, _flags, name_len = _HEAD.unpack_from(reader.peek(_HEAD.size))
        if magic != REQ_MAGIC or op not in (_READ, _WRITE) or name_len > MAX_NAME:
            return REQ.size
        return REQ.size + int(name_len)

    def _await_request(self, conn: Conn, reader: SocketReader) -> bool | None:
        """Wait for the next request's header and name: None once buffered, True to hand the
        connection back to the poller (quiet for the linger, or others wait for a worker; a
        partial header goes with it in `conn.partial`), False when the peer closed.

        A partial header never holds a worker: a peer that sends a few bytes of a header and
        stops (slowloris) would otherwise keep a worker for `stall_timeout`, and `workers` such
        connections, renewed, would starve every other client. Its deadline runs from its
        first byte, in the worker and in the poller's sweep alike."""
        quiet = 0
        while True:
            if reader.buffered:
                now = time.monotonic()
                if not conn.partial_since:
                    conn.partial_since = now
                elif now - conn.partial_since >= self.limits.stall_timeout:
                    raise TimeoutError("a request header incomplete for too long")
            if self._ready.qsize() or quiet >= self._linger_ticks:
                # Others wait for a worker, or this one was quiet for the linger.
                if reader.buffered:
                    conn.partial = bytes(reader.take(reader.buffered))
                return True
            try:
                if not reader.fill(self._wanted(reader, conn), between=True, partial=True):
                    return False
            except BlockingIOError:
                quiet += 1
                continue
            if reader.buffered >= self._wanted(reader, conn):
                return None

    def _check(
        self, name: bytes, offset: int, length: int
    ) -> tuple[ErrorCode, SegmentMemory | None]:
        """The segment to serve (held: release it), or why the request is refused."""
        entry = self._by_wire_name.get(name)  # one dict read: atomic, no lock needed
        if entry is None:
            return ErrorCode.SEGMENT_NOT_FOUND, None
        mem = entry[0]
        if offset > mem.size or length > mem.size - offset:
            return ErrorCode.INVALID_PARAMS, None
        if not mem.mapping.acquire():
            return ErrorCode.SEGMENT_NOT_FOUND, None
        return ErrorCode.OK, mem
