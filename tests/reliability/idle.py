"""Many idle sockets at a server, from a second loopback address, always closed by their owner.

Idle peers connect from 127.0.0.2 (Linux routes all of 127/8 to loopback), so the per-IP cap
they run into is not the one of the Store and `kvpool status` the tests run from 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import resource
import select
import socket
import time
from collections.abc import Iterator

import msgspec

from kvpool.protocol.framing import ERROR_FLAG, HEADER, ErrorReply

__all__ = ["IdleSockets", "idle_sockets"]

IDLE_HOST = "127.0.0.2"
_ERR = msgspec.msgpack.Decoder(ErrorReply)


def _ensure_fd_room(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 512:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1024), hard))


class IdleSockets:
    """`count` connected sockets that send nothing (or `send` once), and what each got back."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []
        self.received: dict[int, bytes] = {}
        self.closed: set[int] = set()

    def connect(self, address: tuple[str, int], count: int, send: bytes = b"") -> None:
        _ensure_fd_room(len(self.socks) + count)
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.socks.append(s)
            s.bind((IDLE_HOST, 0))
            s.settimeout(10)
            s.connect(address)
            if send:
                s.sendall(send)
            s.setblocking(False)

    def close(self) -> None:
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()
        self.socks.clear()

    def poll(self, timeout: float = 0.0) -> int:
        """Read what arrived (bounded by one pass); returns how many sockets the peer closed."""
        poller = select.poll()
        for i, s in enumerate(self.socks):
            if i not in self.closed:
                poller.register(s.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        by_fd = {s.fileno(): i for i, s in enumerate(self.socks)}
        for fd, _ in poller.poll(timeout * 1000):
            i = by_fd[fd]
            try:
                data = self.socks[i].recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                self.received[i] = self.received.get(i, b"") + data
            else:
                self.closed.add(i)
        return len(self.closed)

    def wait_all_closed(self, timeout: float) -> float:
        """Seconds until the server closed every socket (AssertionError past `timeout`)."""
        start = time.monotonic()
        while self.poll(0.1) < len(self.socks):
            if time.monotonic() - start > timeout:
                raise AssertionError(
                    f"{len(self.socks) - len(self.closed)} of {len(self.socks)} idle sockets "
                    f"still open after {timeout} s"
                )
        return time.monotonic() - start

    def error_codes(self) -> list[int]:
        """The code of the first ErrorReply each socket got (sockets that got none: left out)."""
        codes = []
        for data in self.received.values():
            pos = 0
            while len(data) - pos >= HEADER.size:
                length, rid = HEADER.unpack_from(data, pos)
                end = pos + 4 + length
                if end > len(data):
                    break
                if rid & ERROR_FLAG:
                    codes.append(_ERR.decode(data[pos + HEADER.size : end]).code)
                    break
                pos = end
        return codes


@contextlib.contextmanager
def idle_sockets(address: tuple[str, int], count: int, send: bytes = b"") -> Iterator[IdleSockets]:
    idle = IdleSockets()
    try:
        idle.connect(address, count, send)
        yield idle
    finally:
        idle.close()
