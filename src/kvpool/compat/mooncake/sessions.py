"""Mooncake's put and get sessions: the calls, and the table of open sessions of one store.

Mooncake's sessions split a batch into phases so an engine can move byte ranges of objects
piece by piece (docs/compat.md; the answers below were observed on the wheel):

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

from kvpool.client import Store
from kvpool.codes import (
    INVALID_PARAMS,
    INVALID_REPLICA,
    OBJECT_ALREADY_EXISTS,
    OBJECT_NOT_FOUND,
    OK,
    REPLICA_IS_NOT_READY,
    UNAVAILABLE_IN_CURRENT_STATUS,
)
from kvpool.compat.mooncake.base import StoreBase
from kvpool.compat.mooncake.calls import answers, check_keys, index, per_key
from kvpool.compat.mooncake.replicate import ReplicateConfig
from kvpool.errors import KVPoolError

__all__ = ["PutSession", "SessionCalls", "Sessions", "copy_from_ranges", "copy_into_ranges"]

NO_RANGES = INVALID_REPLICA
"""The wheel's answer to a ranged put that gives a key no ranges (-702)."""


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


class SessionCalls(StoreBase):
    """The session calls of `MooncakeDistributedStore` (module docstring)."""

    _sessions: Sessions

    def batch_put_session_start(
        self, keys: list[str], sizes: list[int], config: ReplicateConfig | None = None
    ) -> list[int]:
        """Start assembling one object of `sizes[i]` bytes per key: 0, -705 when the key exists
        or has a session, -600 for an empty key or a size of 0."""
        return self._put_session_start(check_keys(keys), [index(n) for n in sizes], config)

    @answers(per_key)
    def _put_session_start(
        self, store: Store, keys: list[str], sizes: list[int], config: ReplicateConfig | None
    ) -> list[int]:
        if len(keys) != len(sizes):
            return [INVALID_PARAMS] * len(keys)
        native = self._native(config)
        out = [INVALID_PARAMS if not k or n <= 0 else OK for k, n in zip(keys, sizes, strict=True)]
        ask = [k for i, k in enumerate(keys) if out[i] == OK and not self._sessions.has_put(k)]
        exists = dict(zip(ask, store.batch_exists(ask), strict=True)) if ask else {}
        for i, (k, n) in enumerate(zip(keys, sizes, strict=True)):
            if out[i] != OK:
                continue
            if exists.get(k, True) or not self._sessions.open_put(k, n, native):
                out[i] = OBJECT_ALREADY_EXISTS
        return out

    def batch_put_from_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_dst_offsets: list[list[int]],
    ) -> list[int]:
        """Within put sessions: copy `all_sizes[i][j]` registered bytes at
        `all_buffer_ptrs[i][j]` to offset `all_dst_offsets[i][j]` of key i's object; bytes
        written per key, -600 without a session, past the object's size, or for memory that
        is not registered."""
        ks = check_keys(keys)
        return self._put_ranges(
            ks, self._range_rows(len(ks), all_buffer_ptrs, all_sizes, all_dst_offsets)
        )

    @answers(per_key)
    def _put_ranges(
        self, store: Store, keys: list[str], rows: list[list[tuple[memoryview, int]] | None]
    ) -> list[int]:
        out = [INVALID_PARAMS] * len(keys)
        for i, k in enumerate(keys):
            session = self._sessions.put_session(k)
            ranges = rows[i]
            if session is None or ranges is None:
                continue
            if not ranges:
                out[i] = NO_RANGES
                continue
            got = copy_from_ranges(session.data, ranges)
            out[i] = got if got >= 0 else INVALID_PARAMS
        return out

    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        """Put each session's object into the pool, readable from now on: 0 per key, -600 for
        a key without a put session (the code of the put when it fails)."""
        return self._put_session_end(check_keys(keys))

    @answers(per_key)
    def _put_session_end(self, store: Store, keys: list[str]) -> list[int]:
        out = [INVALID_PARAMS] * len(keys)
        for i, k in enumerate(keys):
            session = self._sessions.close_put(k)
            if session is None:
                continue
            try:
                out[i] = OK if store.put(k, session.data, session.config) else OBJECT_ALREADY_EXISTS
            except KVPoolError as exc:
                out[i] = int(exc.code)
        return out

    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        """Drop put sessions unwritten: 0 per key, -600 for a key without one."""
        return self._put_session_revoke(check_keys(keys))

    @answers(per_key)
    def _put_session_revoke(self, store: Store, keys: list[str]) -> list[int]:
        return [INVALID_PARAMS if self._sessions.close_put(k) is None else OK for k in keys]

    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        """Look each object up once for the ranged gets that follow: 0, -704 when missing."""
        return self._get_session_start(check_keys(keys))

    @answers(per_key)
    def _get_session_start(self, store: Store, keys: list[str]) -> list[int]:
        out: list[int] = []
        for k, value in zip(keys, self._batch_values(store, keys), strict=True):
            if value is None:
                # An object of this store's own put session exists, but is not complete.
                out.append(REPLICA_IS_NOT_READY if self._sessions.has_put(k) else OBJECT_NOT_FOUND)
            else:
                self._sessions.open_get(k, value)
                out.append(OK)
        return out

    def batch_get_into_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_src_offsets: list[list[int]],
    ) -> list[int]:
        """Within get sessions: copy `all_sizes[i][j]` bytes from offset
        `all_src_offsets[i][j]` of key i's object to the registered memory at
        `all_buffer_ptrs[i][j]`; bytes read per key, -600 without a session, past the
        object's end, or for memory that is not registered."""
        ks = check_keys(keys)
        return self._get_ranges(
            ks, self._range_rows(len(ks), all_buffer_ptrs, all_sizes, all_src_offsets)
        )

    @answers(per_key)
    def _get_ranges(
        self, store: Store, keys: list[str], rows: list[list[tuple[memoryview, int]] | None]
    ) -> list[int]:
        out = [INVALID_PARAMS] * len(keys)
        for i, k in enumerate(keys):
            value = self._sessions.get_session(k)
            ranges = rows[i]
            if value is not None and ranges is not None:
                got = copy_into_ranges(value, ranges)
                out[i] = got if got >= 0 else INVALID_PARAMS
        return out

    def batch_get_session_end(self, keys: list[str]) -> int:
        """End get sessions (keys without one are ignored); 0."""
        ks = check_keys(keys)
        if self._store is None:
            return UNAVAILABLE_IN_CURRENT_STATUS
        for k in ks:
            self._sessions.close_get(k)
        return OK

    def _range_rows(
        self,
        n: int,
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_offsets: list[list[int]],
    ) -> list[list[tuple[memoryview, int]] | None]:
        """Per key, its (registered view, object offset) ranges; None for a key whose lists
        do not line up or name memory outside every registration (never dereferenced).
        Ranges of 0 bytes are dropped: they copy nothing (0 in the wheel too)."""
        ptrs = [[index(p) for p in row] for row in all_buffer_ptrs]
        sizes = [[index(z) for z in row] for row in all_sizes]
        offsets = [[index(o) for o in row] for row in all_offsets]
        if not n == len(ptrs) == len(sizes) == len(offsets):
            return [None] * n
        rows: list[list[tuple[memoryview, int]] | None] = []
        for prow, zrow, orow in zip(ptrs, sizes, offsets, strict=True):
            if not len(prow) == len(zrow) == len(orow):
                rows.append(None)
                continue
            row = [(p, z, o) for p, z, o in zip(prow, zrow, orow, strict=True) if z != 0]
            views = [self._pointers.find(p, z) for p, z, _ in row]
            if any(v is None for v in views):
                rows.append(None)
                continue
            rows.append([(v, o) for v, (_, _, o) in zip(views, row, strict=True) if v is not None])
        return rows
