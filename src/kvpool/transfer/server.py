"""`TransferServer`: serves reads and writes of this process's segments over TCP.

One listener thread accepts; each connection gets its own worker thread that reads requests
(`kvpool.transfer.wire`) and answers them in order, receiving a write's payload straight into
the segment mapping (`recv_into` on a memoryview of it) and sending a read's payload straight
out of it (`sendmsg`). Blocking sockets and a thread per connection suit this: every byte-moving
call releases the GIL, and a client keeps a few long-lived connections per peer.

Every request is checked against the bounds of a segment mounted here and refused otherwise
(SEGMENT_NOT_FOUND / INVALID_PARAMS) without serving a byte. A malformed header, a peer that
half-closes or dies mid-payload ends only that connection. A transfer holds the segment's
mapping, so a segment removed and closed meanwhile is unmapped only when the transfer ends.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Final

from kvpool.errors import ErrorCode, InvalidParams, SegmentError
from kvpool.transfer.memory import SegmentMemory
from kvpool.transfer.request import TransferOp
from kvpool.transfer.wire import (
    MAX_NAME,
    REQ,
    REQ_MAGIC,
    RESP,
    RESP_MAGIC,
    SocketReader,
    send_parts,
)

__all__ = ["TransferServer"]

log = logging.getLogger(__name__)

_READ: Final = int(TransferOp.READ)
_WRITE: Final = int(TransferOp.WRITE)


class _Replies:
    """Answers not sent yet, and the segments their READ payloads hold."""

    __slots__ = ("bytes", "held", "parts", "sock")

    MAX_BYTES: Final = 1 << 20
    MAX_PARTS: Final = 128

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parts: list[bytes | memoryview] = []
        self.held: list[SegmentMemory] = []
        self.bytes = 0

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
            send_parts(self.sock, self.parts, self.bytes)
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


class TransferServer:
    """TCP server of the segments added with `add_segment`; listens from construction on."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, max_connections: int = 2048
    ) -> None:
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise InvalidParams(f"TransferServer: port {port!r} outside 0..65535")
        self._segments: dict[str, tuple[SegmentMemory, int]] = {}
        # The same entries keyed by the UTF-8 name as it arrives on the wire (no decode per
        # request); replaced as a whole under the lock, read without it.
        self._by_wire_name: dict[bytes, tuple[SegmentMemory, int]] = {}
        self._lock = threading.Lock()
        self._conns: dict[int, tuple[socket.socket, threading.Thread]] = {}
        self._max_connections = max_connections
        self._accepted = 0
        self._closed = False
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        bound = self._listener.getsockname()
        self.host = host
        self.port = int(bound[1])
        self.endpoint = (
            f"[{host}]:{self.port}" if family == socket.AF_INET6 else f"{host}:{self.port}"
        )
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"kvpool-xfer-accept-{self.port}", daemon=True
        )
        self._acceptor.start()
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
            self._reindex()

    def remove_segment(self, name: str) -> None:
        """Stop serving segment `name` (transfers already running finish); SEGMENT_NOT_FOUND
        when it is not served."""
        with self._lock:
            entry = self._segments.pop(name, None)
            self._reindex()
        if entry is None:
            raise SegmentError(f"segment {name} is not served here")
        entry[0].remove_close_hook(entry[1])

    def segment_names(self) -> list[str]:
        with self._lock:
            return sorted(self._segments)

    def _reindex(self) -> None:
        """Rebuild the wire-name index (call with the lock held)."""
        self._by_wire_name = {name.encode(): e for name, e in self._segments.items()}

    def _on_segment_close(self, mem: SegmentMemory) -> None:
        with self._lock:
            entry = self._segments.get(mem.name)
            if entry is not None and entry[0] is mem:
                del self._segments[mem.name]
                self._reindex()

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
            self._reindex()
        for mem, token in segments:
            mem.remove_close_hook(token)
        # shutdown() wakes a thread blocked in accept()/recv() on Linux; close() alone does not.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._acceptor.join(timeout=5)
        for sock, _ in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for _, thread in conns:
            thread.join(timeout=5)

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

    # ---- serving -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed or len(self._conns) >= self._max_connections:
                    log.warning("transfer server: refusing connection from %s", peer)
                    sock.close()
                    if self._closed:
                        return
                    continue
                self._accepted += 1
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # Blocking, no timeout: clients pool connections that idle between requests.
                # A peer that dies closes its socket (or keep-alive notices a dead host).
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                key = sock.fileno()
                thread = threading.Thread(
                    target=self._serve_connection,
                    args=(sock, key),
                    name=f"kvpool-xfer-conn-{self.port}-{key}",
                    daemon=True,
                )
                self._conns[key] = (sock, thread)
            thread.start()

    def _serve_connection(self, sock: socket.socket, key: int) -> None:
        out = _Replies(sock)
        try:
            self._serve(sock, SocketReader(sock), out)
        except (OSError, ConnectionError) as exc:
            log.debug("transfer connection ended: %s", exc)
        except Exception:
            log.exception("transfer connection failed")
        finally:
            out.drop()
            with self._lock:
                self._conns.pop(key, None)
            with contextlib.suppress(OSError):
                sock.close()

    def _serve(self, sock: socket.socket, reader: SocketReader, out: _Replies) -> None:
        """Serve requests until the peer closes. Answers to requests that arrived together are
        sent together: they wait in `out` while the next request is already buffered, and go
        out in one `sendmsg` before anything could block (a recv, or enough bytes queued)."""
        scratch: memoryview | None = None  # only a refused write needs it
        while True:
            if reader.buffered < REQ.size:
                out.flush()
                if not reader.fill(REQ.size):
                    return
            magic, op, _flags, name_len, req_id, offset, length = REQ.unpack(reader.take(REQ.size))
            if magic != REQ_MAGIC or op not in (_READ, _WRITE) or name_len > MAX_NAME:
                log.warning("transfer server: malformed request header; closing the connection")
                out.add(RESP.pack(RESP_MAGIC, int(ErrorCode.INVALID_PARAMS), req_id, 0))
                out.flush()
                return
            if reader.buffered < name_len:
                out.flush()
                if not reader.fill(name_len):
                    return
            code, mem = self._check(bytes(reader.take(name_len)), offset, length)
            if mem is None:
                if op == _WRITE:
                    if reader.buffered < length:
                        out.flush()
                    if scratch is None:
                        scratch = memoryview(bytearray(1 << 16))
                    reader.discard(length, scratch)
                out.add(RESP.pack(RESP_MAGIC, int(code), req_id, 0))
                continue
            if op == _READ:
                out.add(
                    RESP.pack(RESP_MAGIC, 0, req_id, length),
                    mem.mapping.view[offset : offset + length],
                    mem,
                )
            else:
                region: memoryview | None = None
                try:
                    if reader.buffered < length:
                        out.flush()
                    region = mem.mapping.view[offset : offset + length]
                    reader.read_into(region)
                finally:
                    # The slice goes first, also when the peer died mid-payload: a live slice
                    # makes the last release's unmap fail and leaves the mapping quarantined.
                    if region is not None:
                        region.release()
                    mem.mapping.release()
                out.add(RESP.pack(RESP_MAGIC, 0, req_id, 0))

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
