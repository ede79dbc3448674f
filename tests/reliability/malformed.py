"""Malformed traffic for the leak and limit tests: every kind of bad input a server must shed
without keeping a byte of it, sent over real loopback sockets in bounded loops."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Callable, Iterator

from kvpool.protocol import messages as m
from kvpool.protocol.framing import FrameEncoder, encode_frame
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello
from kvpool.transfer.wire import REQ, REQ_MAGIC

__all__ = ["RPC_KINDS", "TRANSFER_KINDS", "rss_anon", "send_and_drain", "thread_count"]

_ENC = FrameEncoder()
_LEN = struct.Struct("<I")
#: A payload large enough that a leaked copy of it per connection shows in the RSS.
BIG = 1 << 20


def rss_anon(pid: int) -> int:
    """Bytes of anonymous memory `pid` holds (RssAnon: heap, not its shared segments)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon for {pid}")


def thread_count(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError(f"no Threads for {pid}")


def _hello() -> bytes:
    return _ENC.encode(0, Hello(PROTOCOL_VERSION, "kvpool", "leak-test"))


def _echo(rid: int) -> bytes:
    return _ENC.encode(rid, m.Echo(b"x" * BIG))


RPC_KINDS: dict[str, Callable[[], bytes]] = {
    # An echo, then a length prefix below the minimum: the stream breaks after a good frame.
    "bad-length": lambda: _hello() + _echo(1) + _LEN.pack(3) + b"\0" * 8,
    # An echo, then half a frame and the connection ends.
    "truncated": lambda: _hello() + _echo(1) + _LEN.pack(BIG) + b"\1" * 8 + b"y" * (BIG // 2),
    # An echo, then a length prefix beyond the frame limit.
    "oversized": lambda: _hello() + _echo(1) + _LEN.pack(0xFFFFFFF0) + b"\2" * 8,
    # A frame whose payload is not msgpack at all.
    "garbage": lambda: _hello() + encode_frame(1, b"\xc1" * BIG),
    # A valid frame of a message that is not a request.
    "wrong-type": lambda: _hello() + _ENC.encode(1, m.EchoReply(b"z" * BIG)),
    # Half a handshake, then the connection ends.
    "half-hello": lambda: _hello()[:7],
    # A huge first frame that is not a Hello.
    "no-hello": lambda: _echo(0),
}


def _transfer_req(
    op: int, name: bytes, offset: int, length: int, magic: bytes = REQ_MAGIC
) -> bytes:
    return REQ.pack(magic, op, 0, len(name), 1, offset, length) + name


def transfer_kinds(segment: str) -> dict[str, Callable[[], bytes]]:
    name = segment.encode()
    return {
        "bad-magic": lambda: _transfer_req(1, name, 0, 8, magic=b"XXXX") + b"q" * BIG,
        "truncated-header": lambda: _transfer_req(1, name, 0, 8)[:20],
        "bad-op": lambda: _transfer_req(9, name, 0, 8),
        "long-name": lambda: REQ.pack(REQ_MAGIC, 1, 0, 0xFFFF, 1, 0, 8),
        "unknown-segment-write": lambda: _transfer_req(2, b"nope", 0, BIG) + b"w" * BIG,
        "out-of-bounds-read": lambda: _transfer_req(1, name, 1 << 50, 8),
        "truncated-write": lambda: _transfer_req(2, name, 0, BIG) + b"w" * (BIG // 2),
    }


TRANSFER_KINDS = transfer_kinds


@contextlib.contextmanager
def _socket(address: tuple[str, int]) -> Iterator[socket.socket]:
    sock = socket.create_connection(address, timeout=10)
    try:
        yield sock
    finally:
        sock.close()


def send_and_drain(address: tuple[str, int], data: bytes) -> None:
    """Send `data`, half-close, and read whatever comes back until the server closes."""
    with _socket(address) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while sock.recv(1 << 16):
                pass


def kinds_list(kinds: dict[str, Callable[[], bytes]]) -> list[tuple[str, bytes]]:
    return [(k, make()) for k, make in kinds.items()]
