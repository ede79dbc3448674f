"""The physical limits kvpool is measured against: memcpy, and a raw loopback TCP socket.

* `MemcpyDriver` ("limit/memcpy"): a "store" that is one pre-faulted numpy arena in this
  process; put and get are one `numpy.copyto` each. No store between processes can beat it, so
  it is the ceiling for kvpool's shared-memory path.
* `SocketDriver` ("limit/socket"): a server process that holds a pre-faulted arena and does
  nothing but `recv_into` it (put, answered by one byte) and `sendall` out of it (get), over
  one loopback TCP connection with TCP_NODELAY. That is the least any TCP store must do per
  operation: one round trip and the bytes, so it is the ceiling for kvpool's TCP path.

Both keep the key → offset map on the client side (a bump allocator cleared by `reset`), so they
do no lookups and no metadata round trips at all. Run `python -m kvpool.bench.peers.limits
CAPACITY` to start the socket server by hand; it prints `listening on 127.0.0.1:PORT`.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvpool.bench.peers.base import BenchError, Driver
from kvpool.bench.peers.workload import page_aligned
from kvpool.children import Child
from kvpool.override import override

__all__ = ["MemcpyDriver", "SocketDriver", "serve"]

# A request: op (1 = put, 2 = get), 3 pad bytes, count (u32); then `count` (offset, size)
# entries; then, for a put, the `count` values back to back. A put is answered by one byte, a
# get by the values back to back. One request carries a whole batch, so a batch costs one
# round trip and (with scatter/gather I/O) a few system calls, the least any TCP store can do.
_HEADER = struct.Struct("<B3xI")
_ENTRY = struct.Struct("<QQ")
_PUT = 1
_GET = 2
_ACK = b"\x01"
_IOV_MAX = 512  # stay under the kernel's IOV_MAX (1024) per sendmsg / recvmsg_into


def _request(op: int, places: Sequence[tuple[int, int]]) -> bytes:
    return _HEADER.pack(op, len(places)) + b"".join(_ENTRY.pack(o, n) for o, n in places)


def _send_all(sock: socket.socket, buffers: Sequence[bytes | memoryview]) -> None:
    """Gather-write every buffer, however the kernel splits it."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def _recv_all(sock: socket.socket, buffers: Sequence[memoryview]) -> None:
    """Scatter-read into every buffer until all are full."""
    views = [b for b in buffers if len(b)]
    while views:
        got = sock.recvmsg_into(views[:_IOV_MAX])[0]
        if got == 0:
            raise ConnectionError("peer closed the connection mid-message")
        while got and views:
            if got >= len(views[0]):
                got -= len(views.pop(0))
            else:
                views[0] = views[0][got:]
                got = 0


def _prefaulted(capacity: int) -> npt.NDArray[np.uint8]:
    # First-touch page faults are far slower than a copy into touched memory; touching the
    # arena once up front keeps them out of every timed copy.
    # Page-aligned, as the values and get buffers are (see workload.page_aligned).
    arena = page_aligned(capacity)
    arena.fill(0)
    return arena


class _Offsets:
    """Client-side key → (offset, size) map: a bump allocator over `capacity` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._next = 0
        self._where: dict[str, tuple[int, int]] = {}

    def place(self, key: str, size: int) -> int:
        if self._next + size > self.capacity:
            raise BenchError(f"limit arena full: {self._next} + {size} > {self.capacity}")
        off = self._next
        self._next += size
        self._where[key] = (off, size)
        return off

    def find(self, key: str) -> tuple[int, int]:
        try:
            return self._where[key]
        except KeyError:
            raise BenchError(f"limit: key {key!r} was never put") from None

    def clear(self) -> None:
        self._next = 0
        self._where.clear()


class MemcpyDriver(Driver):
    system = "limit"
    path = "memcpy"

    def __init__(self) -> None:
        super().__init__()
        self._arena: npt.NDArray[np.uint8] | None = None
        self._offsets = _Offsets(0)

    @override
    def apis(self, op: str, batched: bool) -> tuple[str, ...]:
        return ("numpy.copyto",)

    @override
    def setup(self, capacity: int) -> None:
        self._arena = _prefaulted(capacity)
        self._offsets = _Offsets(capacity)

    def _mem(self) -> npt.NDArray[np.uint8]:
        if self._arena is None:
            raise BenchError("limit/memcpy used before setup")
        return self._arena

    @override
    def put(self, key: str, value: memoryview) -> None:
        off = self._offsets.place(key, len(value))
        np.copyto(self._mem()[off : off + len(value)], np.frombuffer(value, dtype=np.uint8))

    @override
    def get(self, key: str, out: memoryview) -> memoryview:
        off, size = self._offsets.find(key)
        np.copyto(np.frombuffer(out, dtype=np.uint8, count=size), self._mem()[off : off + size])
        return out[:size]

    @override
    def batch_put(self, keys: Sequence[str], values: Sequence[memoryview]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.put(key, value)

    @override
    def batch_get(self, keys: Sequence[str], outs: Sequence[memoryview]) -> list[memoryview]:
        return [self.get(key, out) for key, out in zip(keys, outs, strict=True)]

    @override
    def reset(self) -> None:
        self._offsets.clear()

    @override
    def teardown(self) -> None:
        self._arena = None


class SocketDriver(Driver):
    system = "limit"
    path = "socket"

    def __init__(self) -> None:
        super().__init__()
        self._child: Child | None = None
        self._sock: socket.socket | None = None
        self._offsets = _Offsets(0)
        self._ack = bytearray(1)

    @override
    def apis(self, op: str, batched: bool) -> tuple[str, ...]:
        return ("sendmsg/recv",)

    @override
    def setup(self, capacity: int) -> None:
        self._offsets = _Offsets(capacity)
        self._child = Child(
            [sys.executable, "-m", "kvpool.bench.peers.limits", str(capacity)],
            name="socket-limit-server",
        )
        m = self._child.wait_line(r"listening on (\S+):(\d+)", timeout=60)
        self._sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=60)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _conn(self) -> socket.socket:
        if self._sock is None:
            raise BenchError("limit/socket used before setup")
        return self._sock

    @override
    def put(self, key: str, value: memoryview) -> None:
        self.batch_put((key,), (value,))

    @override
    def get(self, key: str, out: memoryview) -> memoryview:
        return self.batch_get((key,), (out,))[0]

    @override
    def batch_put(self, keys: Sequence[str], values: Sequence[memoryview]) -> None:
        sock = self._conn()
        places = [
            (self._offsets.place(k, len(v)), len(v)) for k, v in zip(keys, values, strict=True)
        ]
        _send_all(sock, [_request(_PUT, places), *values])
        _recv_all(sock, [memoryview(self._ack)])

    @override
    def batch_get(self, keys: Sequence[str], outs: Sequence[memoryview]) -> list[memoryview]:
        sock = self._conn()
        places = [self._offsets.find(key) for key in keys]
        _send_all(sock, [_request(_GET, places)])
        views = [out[:n] for (_, n), out in zip(places, outs, strict=True)]
        _recv_all(sock, views)
        return views

    @override
    def reset(self) -> None:
        self._offsets.clear()

    @override
    def teardown(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._child is not None:
            self._child.stop()
            self._child = None


def serve(capacity: int, host: str = "127.0.0.1") -> None:
    """The socket-limit server: one connection at a time, until killed (SIGTERM)."""
    arena = memoryview(_prefaulted(capacity).data).cast("B")
    header = bytearray(_HEADER.size)
    with socket.socket() as listener:
        listener.bind((host, 0))
        listener.listen(1)
        print(f"listening on {host}:{listener.getsockname()[1]}", flush=True)
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # The client left, or sent garbage: drop it and wait for the next.
                with contextlib.suppress(ConnectionError, ValueError):
                    _serve_connection(conn, arena, header)


def _serve_connection(conn: socket.socket, arena: memoryview, header: bytearray) -> None:
    while True:
        _recv_all(conn, [memoryview(header)])
        op, count = _HEADER.unpack(header)
        entries = bytearray(count * _ENTRY.size)
        _recv_all(conn, [memoryview(entries)])
        views = []
        for i in range(count):
            off, size = _ENTRY.unpack_from(entries, i * _ENTRY.size)
            if off + size > len(arena):
                raise ValueError("request outside the arena")  # refused, never served
            views.append(arena[off : off + size])
        if op == _PUT:
            _recv_all(conn, views)
            conn.sendall(_ACK)
        elif op == _GET:
            _send_all(conn, views)
        else:
            raise ValueError(f"unknown op {op}")


if __name__ == "__main__":
    serve(int(sys.argv[1]))
