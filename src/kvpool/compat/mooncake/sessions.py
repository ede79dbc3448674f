"""Mooncake's put and get sessions, kept by the compatibility store (one table per store).

Mooncake's sessions split a batch into phases so an engine can move byte ranges of objects
piece by piece (reference/mooncake-store.md §1.3; the answers below were observed on the wheel):

* put: `batch_put_session_start(keys, sizes)` reserves each object (0, -705 when the key
  exists, -600 for a size of 0), `batch_put_from_multi_buffer_ranges` writes byte ranges from
  registered memory into it (bytes written per key; -600 without a session or past the size),
  `batch_put_session_end` makes the objects readable (bytes never written are zeros), and
  `batch_put_session_revoke` drops them; until the end the object does not exist for readers.
* get: `batch_get_session_start(keys)` looks each object up once (0, -704 missing),
  `batch_get_into_multi_buffer_ranges` reads byte ranges into registered memory (bytes read
  per key; -600 without a session or past the object's end), `batch_get_session_end` drops
  the session (0).

The native Store has no reservation without a write and reads whole objects, so here a put
session is a local buffer of the object's size, written into by the ranged puts and put into
the pool once at the end (space is taken then, not at the start); a get session reads each
object once at its start and serves the ranged gets from those bytes until it ends. The
answers are the same; docs/compat.md names the differences this makes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PutSession", "Sessions", "copy_from_ranges", "copy_into_ranges"]


@dataclass(slots=True)
class PutSession:
    """An object being assembled: its bytes and the config it will be put with."""

    data: bytearray
    config: Any


class Sessions:
    """The open put and get sessions of one store, by key. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._puts: dict[str, PutSession] = {}
        self._gets: dict[str, bytes | bytearray] = {}

    def has_put(self, key: str) -> bool:
        with self._lock:
            return key in self._puts

    def open_put(self, key: str, size: int, config: Any) -> bool:
        """Open a put session of `size` zero bytes; False when `key` already has one."""
        with self._lock:
            if key in self._puts:
                return False
            self._puts[key] = PutSession(bytearray(size), config)
            return True

    def put_session(self, key: str) -> PutSession | None:
        with self._lock:
            return self._puts.get(key)

    def close_put(self, key: str) -> PutSession | None:
        with self._lock:
            return self._puts.pop(key, None)

    def open_get(self, key: str, value: bytes | bytearray) -> None:
        with self._lock:
            self._gets[key] = value

    def get_session(self, key: str) -> bytes | bytearray | None:
        with self._lock:
            return self._gets.get(key)

    def close_get(self, key: str) -> None:
        with self._lock:
            self._gets.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._puts.clear()
            self._gets.clear()


def copy_into_ranges(value: bytes | bytearray, ranges: Sequence[tuple[memoryview, int]]) -> int:
    """Copy `len(dst)` bytes from offset `src` of `value` into each `(dst, src)`; the bytes
    copied, or -1 (and nothing copied) when a range falls outside `value`."""
    if any(src < 0 or src + dst.nbytes > len(value) for dst, src in ranges):
        return -1
    for dst, src in ranges:
        dst[:] = value[src : src + dst.nbytes]
    return sum(dst.nbytes for dst, _ in ranges)


def copy_from_ranges(data: bytearray, ranges: Sequence[tuple[memoryview, int]]) -> int:
    """Copy each `(src, dst)` into `data` at offset `dst`; the bytes copied, or -1 (and
    nothing copied) when a range falls outside `data`."""
    if any(dst < 0 or dst + src.nbytes > len(data) for src, dst in ranges):
        return -1
    for src, dst in ranges:
        data[dst : dst + src.nbytes] = src
    return sum(src.nbytes for src, _ in ranges)
