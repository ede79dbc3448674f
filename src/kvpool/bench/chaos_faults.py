"""The faults and the data of `kvpool bench chaos`: values derived from keys, malformed frames,
idle sockets.

Everything here is bounded (a count and a deadline) and aims at loopback addresses only; the
scenario in `kvpool.bench.chaos` decides when each fault happens.

* **Values.** `value_for(key)` is a pure function of the key (its size log-uniform between the
  bounds, its bytes from a generator seeded by the key's xxh3), so a reader anywhere can check
  any value byte for byte without remembering what was written.
* **Malformed frames.** `malformed_burst` opens many short connections to a control-plane port
  and sends on each one kind of garbage (random bytes before any handshake, random bytes after a
  valid `Hello`, a truncated frame, an oversized length prefix, a length below the header, an
  undecodable payload), then closes, half of them with a reset.
* **Idle sockets.** `IdleFlood` connects many sockets to the given ports and sends nothing; it
  counts the sockets the server closed while they were held, then closes the rest.
"""

from __future__ import annotations

import contextlib
import math
import random
import resource
import socket
import struct
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np
import xxhash

from kvpool.protocol.framing import HEADER, encode_frame
from kvpool.protocol.handshake import HANDSHAKE_REQUEST_ID, PROTOCOL_VERSION, Hello

__all__ = [
    "MALFORMED_KINDS",
    "IdleFlood",
    "ValueShape",
    "malformed_burst",
    "raise_fd_limit",
]

KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class ValueShape:
    """Sizes of the values: log-uniform in [min_size, max_size] bytes, chosen by the key."""

    min_size: int = 4 * KiB
    max_size: int = 1 * MiB

    def size_of(self, key: str) -> int:
        u = xxhash.xxh3_64_intdigest(key.encode(), seed=1) / 2.0**64
        lo, hi = math.log(self.min_size), math.log(self.max_size)
        return min(self.max_size, max(self.min_size, round(math.exp(lo + u * (hi - lo)))))

    def value_for(self, key: str) -> bytes:
        """The one value `key` ever holds (its bytes a pure function of the key)."""
        rng = np.random.default_rng(xxhash.xxh3_64_intdigest(key.encode()))
        return rng.bytes(self.size_of(key))

    def mean_size(self) -> float:
        """The expected size (of the continuous log-uniform distribution)."""
        lo, hi = self.min_size, self.max_size
        return (hi - lo) / math.log(hi / lo) if hi > lo else float(lo)


def raise_fd_limit(wanted: int) -> None:
    """Raise this process's soft limit on open files to `wanted` (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# ---------------------------------------------------------------- malformed frames

MALFORMED_KINDS: tuple[str, ...] = (
    "random_before_hello",
    "random_after_hello",
    "truncated_frame",
    "oversized_length",
    "oversized_before_hello",
    "short_length",
    "garbage_payload",
)
"""One kind of garbage per connection, in turn."""

_LENGTH = struct.Struct("<I")


def _hello_frame(cluster_id: str) -> bytes:
    payload = msgspec.msgpack.encode(Hello(PROTOCOL_VERSION, cluster_id, "chaos-malformed"))
    return encode_frame(HANDSHAKE_REQUEST_ID, payload)


def _garbage(kind: str, rng: random.Random, hello: bytes) -> bytes:
    noise = rng.randbytes(rng.randint(1, 512))
    if kind == "random_before_hello":
        return noise
    if kind == "random_after_hello":
        return hello + noise
    if kind == "truncated_frame":  # the header promises more than ever comes
        return hello + HEADER.pack(1000, 7) + noise[:20]
    if kind == "oversized_length":
        return hello + _LENGTH.pack(0xFFFFFFFF) + noise[:16]
    if kind == "oversized_before_hello":
        return _LENGTH.pack(0xFFFFFFF0) + noise[:16]
    if kind == "short_length":  # below the 8 bytes of the request id
        return hello + _LENGTH.pack(3) + noise[:3]
    if kind == "garbage_payload":  # a whole frame whose payload is no message
        return hello + encode_frame(9, b"\xc1" + noise)
    raise ValueError(kind)


@dataclass(slots=True)
class BurstResult:
    """What a malformed burst did: connections per outcome, and its duration."""

    connections: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    """`answered` (the server sent something back), `silent`, `refused`, `reset`."""
    seconds: float = 0.0


def malformed_burst(
    host: str, port: int, count: int, deadline_s: float, *, seed: int = 13, cluster_id: str = ""
) -> BurstResult:
    """`count` short connections to `host:port`, each sending one kind of garbage, for at most
    `deadline_s` seconds; every other one is closed with a reset (SO_LINGER 0)."""
    rng = random.Random(seed)
    hello = _hello_frame(cluster_id or "kvpool")
    out = BurstResult()
    t0 = time.monotonic()
    for i in range(count):
        if time.monotonic() - t0 > deadline_s:
            break
        kind = MALFORMED_KINDS[i % len(MALFORMED_KINDS)]
        out.connections += 1
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
        except OSError:
            out.outcomes["refused"] += 1
            continue
        try:
            sock.sendall(_garbage(kind, rng, hello))
            sock.settimeout(0.05)  # a short look for an answer, not a wait
            try:
                got = sock.recv(4096)
                out.outcomes["answered" if got else "closed"] += 1
            except TimeoutError:
                out.outcomes["silent"] += 1
            if i % 2:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            out.outcomes["reset"] += 1
        finally:
            sock.close()
    out.seconds = time.monotonic() - t0
    return out


# ---------------------------------------------------------------- idle sockets


class IdleFlood:
    """Idle connections to some loopback ports, held open until `close()` (idempotent)."""

    def __init__(self) -> None:
        self._socks: list[tuple[str, socket.socket]] = []
        self.opened: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.closed_by_server: Counter[str] = Counter()

    def open(self, label: str, address: tuple[str, int], count: int, deadline_s: float) -> None:
        """Connect `count` sockets to `address` (within `deadline_s`), sending nothing."""
        t0 = time.monotonic()
        for _ in range(count):
            if time.monotonic() - t0 > deadline_s:
                break
            try:
                sock = socket.create_connection(address, timeout=1.0)
            except OSError:
                self.failed[label] += 1
                continue
            sock.setblocking(False)
            self._socks.append((label, sock))
            self.opened[label] += 1

    def count_closed_by_server(self) -> None:
        """Count (once each) the held sockets the server has closed or reset meanwhile."""
        keep = []
        for label, sock in self._socks:
            try:
                data = sock.recv(1, socket.MSG_PEEK)
                gone = data == b""
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            if gone:
                self.closed_by_server[label] += 1
                sock.close()
            else:
                keep.append((label, sock))
        self._socks = keep

    def close(self) -> None:
        socks, self._socks = self._socks, []
        for _, sock in socks:
            with contextlib.suppress(OSError):
                sock.close()

    def labels(self) -> Sequence[str]:
        return sorted(set(self.opened) | set(self.failed))
