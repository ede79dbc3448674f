"""Fixtures of the transfer tests: a real peer process that owns a segment, and engines that
are always closed."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import pytest

from kvpool.transfer import SegmentLocation, TransferEngine
from kvtest.procs import Proc

PEER_RE = (
    r"listening on (?P<endpoint>\S+) segment (?P<name>\S+) size (?P<size>\d+) "
    r"shm_path (?P<shm>\S+) host_id (?P<host>\S+)"
)


@dataclass
class Peer:
    """A `python -m kvpool.transfer.serve` child: its process and its segment's location."""

    proc: Proc
    location: SegmentLocation

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_peer(name: str = "peer", size: str = "16MiB", fill: bool = True) -> Peer:
    args = [sys.executable, "-m", "kvpool.transfer.serve", "--name", name, "--size", size]
    if fill:
        args.append("--fill")
    proc = Proc(args, name=f"serve {name}")
    try:
        m = proc.wait_for_line(PEER_RE, timeout=30)
    except BaseException:
        proc.stop()
        raise
    loc = SegmentLocation(m["name"], int(m["size"]), m["host"], m["endpoint"], m["shm"])
    return Peer(proc, loc)


def pattern(offset: int, n: int) -> bytes:
    """What a `--fill` peer holds at [offset, offset+n): byte i is i % 251."""
    return (np.arange(offset, offset + n, dtype=np.uint64) % 251).astype(np.uint8).tobytes()


@pytest.fixture
def spawn_peer() -> Iterator[Callable[..., Peer]]:
    """spawn_peer(name="peer", size="16MiB", fill=True): a peer process, stopped at the end."""
    peers: list[Peer] = []

    def spawn(name: str = "peer", size: str = "16MiB", fill: bool = True) -> Peer:
        p = start_peer(name, size, fill)
        peers.append(p)
        return p

    try:
        yield spawn
    finally:
        for p in peers:
            p.proc.stop()


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    """One filled peer per test module (tests that write to it use their own offsets:
    [5 MiB, 8 MiB) and [15 MiB, 16 MiB); the rest of the pattern stays intact)."""
    p = start_peer()
    try:
        yield p
    finally:
        p.proc.stop()


class _Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closeable)


@pytest.fixture
def closing() -> Iterator[Callable[[C], C]]:
    """closing(obj) -> obj, closed at teardown even when the test fails (close() is
    idempotent everywhere here, so a test may also close it itself)."""
    owned: list[_Closeable] = []

    def own(obj: C) -> C:
        owned.append(obj)
        return obj

    try:
        yield own
    finally:
        for obj in reversed(owned):
            obj.close()


@pytest.fixture
def fill_pattern() -> Callable[[int, int], bytes]:
    return pattern


@pytest.fixture
def make_engine() -> Iterator[Callable[..., TransferEngine]]:
    """make_engine(resolver or {name: location}, protocol, **kw): closed at the end."""
    engines: list[TransferEngine] = []

    def make(resolver: object, protocol: str = "auto", **kw: object) -> TransferEngine:
        if isinstance(resolver, dict):
            table = resolver

            def resolve(name: str) -> SegmentLocation:
                from kvpool.errors import SegmentError

                if name not in table:
                    raise SegmentError(f"no segment {name}")
                return table[name]  # type: ignore[no-any-return]

            fn = resolve
        else:
            fn = resolver  # type: ignore[assignment]
        eng = TransferEngine(fn, protocol, **kw)  # type: ignore[arg-type]
        engines.append(eng)
        return eng

    try:
        yield make
    finally:
        for e in engines:
            e.close()
