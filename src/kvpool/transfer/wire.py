"""The TCP data-plane wire format, and buffered socket I/O that lands payloads in place.

Every message is a fixed little-endian header; payload bytes follow it raw, so the server can
`recv_into` a write's payload straight into segment memory and `sendmsg` a read's payload
straight out of it, with no copy in between.

    request  (32 bytes + name): magic b"KVT1" | op u8 (1 READ, 2 WRITE) | flags u8 (0)
                                | name_len u16 | req_id u64 | offset u64 | length u64
                                | segment name (UTF-8, name_len bytes)
                                | WRITE only: `length` payload bytes
    response (24 bytes):        magic b"KVR1" | status i32 (an ErrorCode) | req_id u64
                                | length u64 (payload bytes that follow: `length` of an OK
                                  READ, otherwise 0)

A connection carries requests one after another and the server answers in order, so a client
may pipeline. A refused WRITE (unknown segment, out of bounds) still has its payload drained so
the connection stays in step; a malformed header closes the connection.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Callable, Sequence
from typing import Final

__all__ = [
    "MAX_NAME",
    "REQ",
    "REQ_MAGIC",
    "RESP",
    "RESP_MAGIC",
    "SocketReader",
    "send_parts",
]

REQ: Final = struct.Struct("<4sBBHQQQ")
RESP: Final = struct.Struct("<4siQQ")
REQ_MAGIC: Final = b"KVT1"
RESP_MAGIC: Final = b"KVR1"
MAX_NAME: Final = 1024
#: What a receive raises when a kernel receive timeout passed with nothing. A server's TLS
#: socket waits in Python's timeout mode instead (its `recv_into` would otherwise retry inside
#: the ssl module for ever), so for a reader with `patience` a `TimeoutError` is that too.
_NOTHING_YET: Final = (BlockingIOError, ssl.SSLWantReadError)
_NOTHING_YET_TLS: Final = (BlockingIOError, ssl.SSLWantReadError, TimeoutError)
#: Parts up to this many bytes in all go out on a TLS socket joined, as one record.
_TLS_JOIN_BYTES: Final = 256 << 10


class SocketReader:
    """Reads a socket through a small buffer, but lands large payloads directly in place.

    Headers of pipelined messages arrive together, so one `recv_into` serves many of them;
    payload bytes already buffered are copied out, and the rest is received straight into the
    destination view.

    Stalls (the server's sockets): a blocking socket with a kernel receive timeout
    (SO_RCVTIMEO, no poll() per call) raises `BlockingIOError` when nothing arrived within it.
    Inside a message that is a stall: after `patience` of them in a row without a byte the read
    fails with `TimeoutError`. Between messages (`fill(..., between=True)` with nothing
    buffered) it is the peer going quiet, and the `BlockingIOError` reaches the caller. With
    `patience` 0 (a socket in Python's timeout mode, as the client's) nothing changes.

    Pace: a peer that sends a byte now and then is never stalled, and could hold the reader for
    ever. With `min_rate` (bytes/s) set, one read that moves less than `grace` s plus its
    bytes at `min_rate` fails with `TimeoutError` too; the clock is read once per 32 receives
    or waits, so a fast read never pays for it.
    """

    __slots__ = (
        "_buf",
        "_end",
        "_quiet",
        "_start",
        "_view",
        "grace",
        "min_rate",
        "patience",
        "sock",
    )

    def __init__(
        self,
        sock: socket.socket,
        capacity: int = 1 << 16,
        patience: int = 0,
        min_rate: int = 0,
        grace: float = 0.0,
    ) -> None:
        self.sock = sock
        self._buf = bytearray(capacity)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self.patience = patience
        # With patience (a server's reader) a TLS socket's tick timeout is a quiet tick; a
        # client's TimeoutError is its real timeout and reaches the caller.
        self._quiet = _NOTHING_YET_TLS if patience else _NOTHING_YET
        self.min_rate = min_rate
        self.grace = grace

    def reset(self, sock: socket.socket) -> None:
        """Read `sock` from now on, with nothing buffered (a worker's reader, reused)."""
        self.sock = sock
        self._start = self._end = 0

    def _stalled(self, stalls: int) -> int:
        """Count one timed-out wait inside a message; raise once `patience` ran out."""
        stalls += 1
        if stalls >= self.patience:
            raise TimeoutError("peer sent nothing for too long in the middle of a message")
        return stalls

    def _paced(self, started: float, moved: int) -> float:
        """The pace check (see the class docstring): when this read started being measured;
        raises `TimeoutError` when `moved` bytes since then are too few."""
        now = time.monotonic()
        if not started:
            return now
        if now - started > self.grace + moved / self.min_rate:
            raise TimeoutError(
                f"peer moved {moved} bytes in {now - started:.1f} s, "
                f"slower than {self.min_rate} bytes/s"
            )
        return started

    @property
    def buffered(self) -> int:
        return self._end - self._start

    def preload(self, data: bytes) -> None:
        """Buffer `data` as if just received (call after `reset`): the part of a message a
        previous reader of this socket had received."""
        n = len(data)
        self._view[:n] = data
        self._start, self._end = 0, n

    def peek(self, n: int) -> memoryview:
        """The next `n` buffered bytes, left in the buffer (call `fill(n)` first)."""
        return self._view[self._start : self._start + n]

    def fill(self, n: int, between: bool = False, partial: bool = False) -> bool:
        """Buffer at least `n` bytes. False on a clean EOF before any of them arrived;
        ConnectionError on EOF in the middle. With `between` (a message boundary) and nothing
        buffered, a timed-out wait raises `BlockingIOError` (see the class docstring); with
        `partial` too, it does so whatever is buffered (the caller keeps the part)."""
        if self._end - self._start >= n:
            return True
        if len(self._buf) - self._start < n:
            # Compact: move what is buffered to the front (rare: headers are small).
            left = self._end - self._start
            self._view[:left] = self._view[self._start : self._end]
            self._start, self._end = 0, left
            if n > len(self._buf):
                raise ValueError(f"cannot buffer {n} bytes")
        stalls = events = 0
        started = 0.0
        while self._end - self._start < n:
            events += 1
            if not events & 31 and self.min_rate:
                started = self._paced(started, self._end)
            try:
                got = self.sock.recv_into(self._view[self._end :])
            except self._quiet:
                if (between and (partial or self._end == self._start)) or not self.patience:
                    raise BlockingIOError from None
                stalls = self._stalled(stalls)
                continue
            stalls = 0
            if got == 0:
                if self._end == self._start:
                    return False
                raise ConnectionError("peer closed the connection in the middle of a message")
            self._end += got
        return True

    def take(self, n: int) -> memoryview:
        """The next `n` buffered bytes (call `fill(n)` first); valid until the next read."""
        view = self._view[self._start : self._start + n]
        self._start += n
        if self._start == self._end:
            self._start = self._end = 0
        return view

    def read_into(self, dst: memoryview, give_up: Callable[[], bool] | None = None) -> int:
        """Fill `dst` completely: buffered bytes first, then straight from the socket; returns
        the bytes filled. With `give_up`, a stall (see the class docstring) after which it
        returns True ends the read early, with the bytes filled so far."""
        n = dst.nbytes
        have = min(self._end - self._start, n)
        if have:
            dst[:have] = self._view[self._start : self._start + have]
            self._start += have
            if self._start == self._end:
                self._start = self._end = 0
        pos = have
        recv_into = self.sock.recv_into
        stalls = events = 0
        started = 0.0
        while pos < n:
            events += 1
            if not events & 31 and self.min_rate:
                started = self._paced(started, pos)
            try:
                got = recv_into(dst[pos:])
            except self._quiet:
                if give_up is not None and give_up():
                    return pos
                if not self.patience:
                    raise BlockingIOError from None
                stalls = self._stalled(stalls)
                continue
            stalls = 0
            if got == 0:
                raise ConnectionError(f"peer closed the connection after {pos} of {n} bytes")
            pos += got
        return pos

    def discard(
        self, n: int, scratch: memoryview, give_up: Callable[[], bool] | None = None
    ) -> int:
        """Read and drop `n` bytes (a refused write's payload); returns how many are left to
        drop: 0, or more when `give_up` ended it early (as in `read_into`)."""
        have = min(self._end - self._start, n)
        self._start += have
        if self._start == self._end:
            self._start = self._end = 0
        n -= have
        total = n
        stalls = events = 0
        started = 0.0
        while n > 0:
            events += 1
            if not events & 31 and self.min_rate:
                started = self._paced(started, total - n)
            try:
                got = self.sock.recv_into(scratch[: min(n, scratch.nbytes)])
            except self._quiet:
                if give_up is not None and give_up():
                    return n
                if not self.patience:
                    raise BlockingIOError from None
                stalls = self._stalled(stalls)
                continue
            stalls = 0
            if got == 0:
                raise ConnectionError("peer closed the connection inside a payload")
            n -= got
        return 0


def send_parts(
    sock: socket.socket,
    parts: Sequence[bytes | memoryview],
    total: int = -1,
    min_rate: int = 0,
    grace: float = 0.0,
) -> None:
    """Send every part in order with scatter-gather `sendmsg`, looping over partial sends.

    `total` (the byte count of all parts, when the caller knows it) lets the common case, one
    complete `sendmsg`, return without walking the parts. With `min_rate` (bytes/s), a send
    that after a partial `sendmsg` moves less than `grace` s plus its bytes at `min_rate`
    fails with `TimeoutError` (a peer that reads a little now and then; see `SocketReader`).
    """
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg on TLS: records of joined parts
        _send_tls(sock, parts, total, grace)
        return
    sent = sock.sendmsg(parts)
    if sent == total:
        return
    started = time.monotonic() if min_rate else 0.0
    moved = 0
    pending = [memoryview(p) for p in parts]
    while pending:
        while sent:
            head = pending[0]
            if sent >= head.nbytes:
                sent -= head.nbytes
                pending.pop(0)
            else:
                pending[0] = head[sent:]
                sent = 0
        while pending and pending[0].nbytes == 0:
            pending.pop(0)
        if pending:
            sent = sock.sendmsg(pending)
            moved += sent
            if min_rate and time.monotonic() - started > grace + moved / min_rate:
                raise TimeoutError(f"peer took {moved} bytes slower than {min_rate} bytes/s")


def _send_tls(
    sock: ssl.SSLSocket, parts: Sequence[bytes | memoryview], total: int, grace: float
) -> None:
    """Send `parts` on a TLS socket: small ones joined (one record instead of many), large
    ones each as they are (the encryption copies them anyway). A server's TLS socket waits in
    timeout mode with a short tick (see `SocketReader`); a send may wait `grace` (the stall
    timeout) for the peer to read, then raises `TimeoutError`, a stalled send."""
    tick = sock.gettimeout()
    if grace and tick is not None and tick < grace:
        sock.settimeout(grace)
        try:
            _send_tls_parts(sock, parts, total)
        finally:
            sock.settimeout(tick)
        return
    _send_tls_parts(sock, parts, total)


def _send_tls_parts(sock: ssl.SSLSocket, parts: Sequence[bytes | memoryview], total: int) -> None:
    if total < 0:
        total = sum(memoryview(p).nbytes for p in parts)
    if total <= _TLS_JOIN_BYTES:
        sock.sendall(b"".join(parts))
        return
    small: list[bytes | memoryview] = []
    for part in parts:
        if memoryview(part).nbytes < 4096:
            small.append(part)
            continue
        if small:
            sock.sendall(b"".join(small))
            small.clear()
        sock.sendall(part)
    if small:
        sock.sendall(b"".join(small))
