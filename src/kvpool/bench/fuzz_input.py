"""The inputs of `kvpool bench fuzz` and the sockets that carry them: one session a connection.

Everything here is bounded (a count, a size, a deadline) and aims at loopback addresses only;
the scenario in `kvpool.bench.fuzz` decides how many sessions go where.

* **Sessions** (no I/O): `master_session` and `transfer_session` draw one connection's input
  from a `random.Random`, so a run is a function of its seed. `MessageFactory` makes the
  valid-but-wrong master messages from the request and reply unions' own type descriptions
  (`msgspec.inspect`), so a message added to the protocol is fuzzed without a change here.
* **Wire**: `exchange` sends a session while reading its replies, half-closes and drains until
  the server closes (or a deadline); `Held` keeps half-open and flood connections open and
  counts those the servers close, and which of them were cap refusals.
"""

from __future__ import annotations

import contextlib
import errno
import math
import random
import select
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import msgspec.inspect as mi

from kvpool.bench.chaos_faults import MALFORMED_KINDS, _garbage
from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.framing import ERROR_FLAG, HEADER, FrameDecoder, encode_frame
from kvpool.protocol.handshake import HANDSHAKE_REQUEST_ID, PROTOCOL_VERSION, Hello
from kvpool.protocol.messages import (
    MountSegment,
    ReMountSegment,
    RemoveAll,
    RemoveByRegex,
    Request,
    Response,
    Stats,
    UnmountSegment,
)
from kvpool.rpc.server import union_members
from kvpool.transfer.wire import MAX_NAME, REQ, REQ_MAGIC, RESP, RESP_MAGIC

__all__ = [
    "CLUSTER",
    "FUZZ_SOURCE",
    "HELLO",
    "NEVER_VALID",
    "TAIL",
    "Held",
    "MessageFactory",
    "Session",
    "connect",
    "connect_many",
    "count_rpc_replies",
    "count_transfer_replies",
    "exchange",
    "master_session",
    "transfer_request",
    "transfer_session",
]

CLUSTER: Final = "kvpool"
#: Bytes at the end of the segment that in-bounds fuzz writes may touch.
TAIL: Final = 64 << 10
#: Where the fuzz connects from (the flood comes from another loopback address).
FUZZ_SOURCE: Final = "127.0.0.1"
_LEN: Final = struct.Struct("<I")


# ---------------------------------------------------------------- sessions (no I/O)


@dataclass(slots=True)
class Session:
    """One connection's worth of input: `data` sent at once, `frames` frames in it (a chunk
    of random bytes counts as one), `replies` the answers owed (-1: unknown), `hold`: keep the
    connection open without closing it (half-open)."""

    kind: str
    data: bytes
    frames: int
    replies: int = -1
    hold: bool = False
    hello: bool = False
    """Send a `Hello` first and wait for its answer, as a client does (`frames` and `replies`
    count it): the frames that follow are then read under the handshaken frame limit."""


_INTS: Final = (0, 1, -1, 7, 255, 1 << 31, (1 << 31) - 1, -(1 << 63), (1 << 63) - 1, (1 << 64) - 1)
_BAD_SIZES: Final = (0, -1, -4096, -(1 << 63), (1 << 63) - 1, (1 << 64) - 1)
_SIZE_FIELDS: Final = frozenset({"size", "sizes", "min_size"})
_ODD: Final[tuple[Any, ...]] = (
    None,
    True,
    1.5,
    math.nan,
    -1,
    "",
    b"\x00",
    [],
    {},
    {"k": [1, {}]},
    [[[[]]]],
)
#: Requests a client may legitimately send without credentials today; never sent well formed.
NEVER_VALID: Final = frozenset(
    {MountSegment, ReMountSegment, UnmountSegment, RemoveAll, RemoveByRegex}
)


def _str(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.5:
        return f"fz{rng.getrandbits(32):x}"
    if r < 0.6:
        return ""
    if r < 0.7:
        return "x" * rng.choice((255, 256, 4097, 70_000))
    if r < 0.8:
        return "\0/../\u202e\ud7ff" * rng.randint(1, 8)
    return rng.randbytes(rng.randint(1, 32)).decode("latin-1")


class MessageFactory:
    """Valid-but-wrong master messages, made from the unions' type descriptions.

    A field gets a value of its own type most of the time (out-of-range integers, odd strings,
    lists of any length), anything at all otherwise; size fields get sizes that must be refused.
    """

    def __init__(self, rng: random.Random, huge_batch: int) -> None:
        self.rng = rng
        self.huge_batch = huge_batch
        self.requests = [mi.type_info(t) for t in union_members(Request)]
        self.replies = [mi.type_info(t) for t in union_members(Response)]

    def message(self) -> bytes:
        rng = self.rng
        pool = self.replies if rng.random() < 0.1 else self.requests
        t = rng.choice(pool)
        assert isinstance(t, mi.StructType)
        arr = self._struct(t, 0)
        if t.cls in NEVER_VALID or rng.random() < 0.05:
            arr[0] = rng.choice((f"{t.tag}!", 7, None, "", "Hello"))
        elif rng.random() < 0.05:
            del arr[rng.randint(1, len(arr)) :]  # required fields missing (or not)
        return msgspec.msgpack.encode(arr)

    def _struct(self, t: mi.StructType, depth: int) -> list[Any]:
        return [t.tag, *(self._value(f.type, depth + 1, f.name in _SIZE_FIELDS) for f in t.fields)]

    def _value(self, t: mi.Type, depth: int, size: bool = False) -> Any:
        rng = self.rng
        if rng.random() < 0.08 or depth > 4:
            return rng.choice(_ODD)
        if isinstance(t, mi.IntType):
            return rng.choice(_BAD_SIZES if size else _INTS)
        if isinstance(t, mi.StrType):
            return _str(rng)
        if isinstance(t, mi.BytesType):
            return rng.randbytes(
                rng.choice((0, 1, 64, 4096, 1 << 20) if rng.random() < 0.1 else (0, 8))
            )
        if isinstance(t, mi.BoolType):
            return rng.random() < 0.5
        if isinstance(t, mi.FloatType):
            return rng.choice((0.0, -1.0, 1e308, math.inf, math.nan))
        if isinstance(t, mi.ListType | mi.SetType | mi.VarTupleType):
            r = rng.random()
            n = self.huge_batch if r < 0.002 else rng.choice((0, 1, 2, 3, 17))
            item = t.item_type
            if n > 100:
                return [f"fz{i}" if isinstance(item, mi.StrType) else -i for i in range(n)]
            return [self._value(item, depth + 1, size) for _ in range(n)]
        if isinstance(t, mi.UnionType):
            return self._value(rng.choice(t.types), depth, size)
        if isinstance(t, mi.StructType):
            return self._struct(t, depth)
        if isinstance(t, mi.EnumType):
            return rng.choice([*(m.value for m in t.cls), -1, 99])
        if isinstance(t, mi.LiteralType):
            return rng.choice(t.values)
        return None


def _hello(name: str = "fuzz") -> bytes:
    return encode_frame(
        HANDSHAKE_REQUEST_ID, msgspec.msgpack.encode(Hello(PROTOCOL_VERSION, CLUSTER, name))
    )


HELLO: Final = _hello()
_STATS: Final = msgspec.msgpack.encode(Stats())


def _request_id(rng: random.Random, i: int) -> int:
    r = rng.random()
    if r < 0.03:
        return HANDSHAKE_REQUEST_ID  # reserved for the Hello
    if r < 0.06:
        return ERROR_FLAG | i  # the reply flag
    return i + 1


def master_session(rng: random.Random, factory: MessageFactory, max_batch: int) -> Session:
    """One session at a master (see the module docstring)."""
    r = rng.random()
    if r < 0.25:
        kind = rng.choice(MALFORMED_KINDS)
        frames = 1 if kind.endswith("before_hello") else 2
        return Session(kind, _garbage(kind, rng, HELLO), frames)
    if r < 0.5:
        k = rng.randint(1, max_batch)
        body = b"".join(
            encode_frame(i + 1, rng.randbytes(rng.choice((0, 1, 5, 40, 300)))) for i in range(k)
        )
        return Session("garbage_payloads", body, 1 + k, 1 + k, hello=True)
    if r < 0.8:
        k = rng.randint(1, max_batch)
        body = b"".join(encode_frame(_request_id(rng, i), factory.message()) for i in range(k))
        return Session("wrong_messages", body, 1 + k, 1 + k, hello=True)
    if r < 0.85:
        return Session("request_before_hello", encode_frame(1, _STATS) + HELLO, 2, 1)
    if r < 0.9:
        again = HELLO + encode_frame(7, msgspec.msgpack.encode(Hello(PROTOCOL_VERSION, CLUSTER)))
        return Session("second_hello", again + encode_frame(1, _STATS), 4, 4, hello=True)
    if r < 0.95:
        other = _hello() if rng.random() < 0.5 else encode_frame(0, b"\x93\xa5Hello\x01\xa3bad")
        return Session("bad_hello", other.replace(b"kvpool", b"kvp00l"), 1, 1)
    held = rng.choice((b"", HELLO[: rng.randint(1, len(HELLO) - 1)], HELLO + HEADER.pack(64, 1)))
    return Session("half_open", held, 1 if held else 0, hold=True)


def transfer_request(op: int, name: bytes, offset: int, length: int, rid: int = 1) -> bytes:
    return REQ.pack(REQ_MAGIC, op, 0, len(name), rid, offset, length) + name


def transfer_session(rng: random.Random, segment: str, size: int, max_batch: int) -> Session:
    """One session at a transfer server (see the module docstring)."""
    name = segment.encode()
    tail = size - TAIL
    r = rng.random()
    if r < 0.1:
        return Session("random_bytes", rng.randbytes(rng.randint(1, 4096)), 1)
    if r < 0.2:
        cut = rng.randint(1, REQ.size + len(name) - 1)
        return Session("truncated_header", transfer_request(1, name, 0, 8)[:cut], 1)
    if r < 0.3:
        bad = rng.choice(
            (
                REQ.pack(b"KVR1", 1, 0, len(name), 1, 0, 8) + name,
                REQ.pack(REQ_MAGIC, rng.choice((0, 3, 255)), 0, len(name), 1, 0, 8) + name,
                REQ.pack(REQ_MAGIC, 1, 0, rng.randint(MAX_NAME + 1, 0xFFFF), 1, 0, 8),
            )
        )
        return Session("bad_header", bad, 1, 1)
    if r < 0.75:
        k = rng.randint(1, max_batch)
        parts = []
        for i in range(k):
            c = rng.random()
            if c < 0.25:
                parts.append(
                    transfer_request(rng.choice((1, 2)), _str(rng).encode()[:MAX_NAME], 0, 0, i)
                )
            elif c < 0.5:
                off = rng.choice((size, size + 1, (1 << 63), (1 << 64) - 1, tail))
                length = rng.choice((1, size, (1 << 64) - 1, (1 << 64) - off % (1 << 64)))
                parts.append(transfer_request(1, name, off, length % (1 << 64), i))
            elif c < 0.7:
                parts.append(transfer_request(1, name, tail + rng.randrange(TAIL), 0, i))
            elif c < 0.85:
                n = rng.randint(1, 4096)
                parts.append(transfer_request(1, name, rng.randrange(size - n), n, i))
            else:
                n = rng.randint(0, 2048)
                parts.append(transfer_request(2, b"fz-nope", 0, n, i) + rng.randbytes(n))
        return Session("wrong_requests", b"".join(parts), k, k)
    if r < 0.85:
        n = rng.randint(2, TAIL)
        off = tail + rng.randrange(TAIL - n + 1)
        data = transfer_request(2, name, off, n) + rng.randbytes(rng.randint(0, n - 1))
        return Session("truncated_write", data, 1)
    if r < 0.9:
        n = rng.randint(1, TAIL)
        data = transfer_request(2, name, tail, n) + rng.randbytes(n)
        return Session("tail_write", data, 1, 1)
    held = rng.choice(
        (
            b"",
            transfer_request(1, name, 0, 8)[: rng.randint(1, REQ.size - 1)],
            transfer_request(2, name, tail, 4096),
        )
    )
    return Session("half_open", held, 1 if held else 0, hold=True)


# ---------------------------------------------------------------- sessions on the wire


def connect(address: tuple[str, int], source: str) -> socket.socket:
    return socket.create_connection(address, timeout=5.0, source_address=(source, 0))


def connect_many(
    address: tuple[str, int], source: str, count: int, deadline_s: float, chunk: int = 0
) -> tuple[list[socket.socket], int]:
    """`count` connections to `address` from `source`, started at once (non-blocking) or
    `chunk` at a time (each chunk established before the next starts, so that a listen queue
    shorter than the burst does not turn it into SYN retransmits); returns those established
    within `deadline_s` and how many were not."""
    done: list[socket.socket] = []
    deadline = time.monotonic() + deadline_s
    step = chunk or count
    for first in range(0, count, step):
        done += _connect_batch(address, source, min(step, count - first), deadline)
        if chunk:
            time.sleep(0.005)  # a loop turn for the server to accept the chunk
    return done, count - len(done)


def _connect_batch(
    address: tuple[str, int], source: str, count: int, deadline: float
) -> list[socket.socket]:
    pending: dict[int, socket.socket] = {}
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((source, 0))
            sock.setblocking(False)
            sock.connect_ex(address)
        except OSError:
            sock.close()
            continue
        pending[sock.fileno()] = sock
    poller = select.poll()
    for fd in pending:
        poller.register(fd, select.POLLOUT)
    done: list[socket.socket] = []
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            sock = pending.pop(fd)
            poller.unregister(fd)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                sock.close()
            else:
                done.append(sock)
    for sock in pending.values():
        sock.close()
    return done


def exchange(
    address: tuple[str, int],
    data: bytes,
    deadline_s: float,
    source: str = FUZZ_SOURCE,
    hello: bool = False,
) -> tuple[str, bytearray]:
    """Send `data` while reading the replies, half-close, read until the server closes; with
    `hello`, first a `Hello` and its answer.

    Returns the outcome (`closed`: the server closed after answering, `reset`, `refused`:
    no connection, `timeout`: still open at the deadline) and the bytes received.
    """
    got = bytearray()
    try:
        sock = connect(address, source)
    except OSError:
        return "refused", got
    deadline = time.monotonic() + deadline_s
    view = memoryview(data)
    pos = 0
    outcome = "timeout"
    try:
        if hello:
            sock.settimeout(deadline_s)
            sock.sendall(HELLO)
            while len(got) < 4 or len(got) < 4 + _LEN.unpack_from(got)[0]:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return "closed", got
                got += chunk
        sock.setblocking(False)
        poller = select.poll()
        while time.monotonic() < deadline:
            want = select.POLLIN | (select.POLLOUT if pos < len(view) else 0)
            poller.register(sock, want)
            if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                continue
            with contextlib.suppress(BlockingIOError):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    outcome = "closed"
                    break
                got += chunk
            if pos < len(view):
                with contextlib.suppress(BlockingIOError):
                    pos += sock.send(view[pos : pos + (1 << 20)])
                if pos == len(view):
                    sock.shutdown(socket.SHUT_WR)
    except OSError as exc:
        outcome = "reset" if exc.errno in (errno.ECONNRESET, errno.EPIPE) else "error"
    finally:
        sock.close()
    return outcome, got


def count_rpc_replies(data: bytes | bytearray) -> int:
    decoder = FrameDecoder(0xFFFFFFFF)
    try:
        return len(decoder.feed(bytes(data)))
    except KVPoolError:
        return -1


def count_transfer_replies(data: bytes | bytearray) -> int:
    pos = n = 0
    while len(data) - pos >= RESP.size:
        pos += RESP.size + RESP.unpack_from(data, pos)[3]
        n += 1
    return n if pos == len(data) else -1


_TRANSFER_REFUSAL: Final = RESP.pack(RESP_MAGIC, int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS), 0, 0)


def _refusal(data: bytes) -> bool:
    """Whether `data`, all a server sent before closing, is a connection-cap refusal (the
    master's ErrorReply says so; the transfer server's is one UNAVAILABLE response header)."""
    return b"too many connections" in data or data == _TRANSFER_REFUSAL


def _gone(sock: socket.socket) -> bytes | None:
    """What the server sent on `sock` once it closed or reset it; None while it is open
    (non-blocking)."""
    got = b""
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return got
            got += chunk
    except BlockingIOError:
        return None
    except OSError:
        return got


class Held:
    """Connections kept open until the servers close them, or `close()` (idempotent)."""

    def __init__(self) -> None:
        self._socks: list[tuple[str, socket.socket]] = []
        self.opened: Counter[str] = Counter()
        self.closed_by_server: Counter[str] = Counter()
        self.closed_by_us: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    def add(self, label: str, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._socks.append((label, sock))
        self.opened[label] += 1

    def count(self, label: str) -> int:
        return sum(1 for lbl, _ in self._socks if lbl == label)

    def sweep(self) -> int:
        """Forget (and count) those the servers closed; how many are still open."""
        keep = []
        for label, sock in self._socks:
            last = _gone(sock)
            if last is None:
                keep.append((label, sock))
                continue
            self.closed_by_server[label] += 1
            if _refusal(last):
                self.refused[label] += 1
            sock.close()
        self._socks = keep
        return len(keep)

    def take(self, other: Held) -> None:
        """Hold `other`'s open connections from now on, and count what it counted."""
        self._socks += other._socks
        other._socks = []
        for mine, theirs in (
            (self.opened, other.opened),
            (self.closed_by_server, other.closed_by_server),
            (self.closed_by_us, other.closed_by_us),
            (self.refused, other.refused),
        ):
            mine.update(theirs)
            theirs.clear()

    def close_some(self, label: str, fraction: float) -> int:
        """Close `fraction` of the open ones of `label` ourselves; how many."""
        mine = [s for s in self._socks if s[0] == label]
        drop = mine[: int(len(mine) * fraction)]
        for _, sock in drop:
            sock.close()
        self.closed_by_us[label] += len(drop)
        ids = {id(s) for s in drop}
        self._socks = [s for s in self._socks if id(s) not in ids]
        return len(drop)

    def close(self) -> None:
        socks, self._socks = self._socks, []
        for _, sock in socks:
            sock.close()
