"""PinnedRegions: zero-copy puts and gets between an engine's memory and the pool.

Engines describe their KV pages as raw addresses and sizes (`tensor.data_ptr()` plus a byte
count: SGLang's `get_page_buffer_meta`, LMCache's `MemoryObj.data_ptr`). An engine backend
registers the big host buffers those pages live in once (`register`, which is
`Store.register_buffer`); afterwards a batch whose pages all lie inside registered memory goes
through `Store.batch_put_from` / `batch_get_into`: each page is copied once, straight between
the engine's buffer and pool memory. Pages outside registered memory still work: a put writes
from the page's own memory (`batch_put`, also one copy), a get reads into a fresh buffer and
copies it over (two copies).

Per key the outcome is a value, never an exception: `put` answers True when the key is stored
(now or before: the pool keeps the first value of a key, and KV pages under one key are equal),
`get` the bytes read or a negative `ErrorCode` value. A fault of the pool (master unreachable,
store closed) is logged and answers False / a negative code for every key, as the engines treat
a failed page as a cache miss.
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import threading
from collections.abc import Sequence

import numpy as np

from kvpool.client import Store
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError

__all__ = ["PinnedRegions", "view_at"]

log = logging.getLogger(__name__)

_STORED = (ErrorCode.OK, ErrorCode.OBJECT_ALREADY_EXISTS)


def view_at(addr: int, length: int) -> memoryview:
    """A writable byte view of `length` bytes at `addr` (the caller vouches they are mapped)."""
    if addr <= 0 or length <= 0:
        raise InvalidParams(f"memory: {length} bytes at {addr:#x} is not a region")
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


def _check_batch(keys: Sequence[str], addrs: Sequence[int], sizes: Sequence[int]) -> None:
    if not len(keys) == len(addrs) == len(sizes):
        raise InvalidParams(f"{len(keys)} keys, {len(addrs)} addresses and {len(sizes)} sizes")


class PinnedRegions:
    """The memory an engine backend registered with its Store, and batch I/O against it.

    Thread-safe: the engines call from several threads (SGLang's prefetch and backup threads,
    LMCache's event loop and its `to_thread` workers)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._starts: list[int] = []  # sorted, with _ends[i] the end of the region at _starts[i]
        self._ends: list[int] = []
        self._views: list[memoryview] = []  # _views[i]: the bytes of region i

    def register(self, addr: int, length: int) -> bool:
        """Register `length` bytes at `addr` for zero-copy I/O. False when they already lie
        inside a registered region (nothing to do); a partial overlap is INVALID_PARAMS."""
        if addr <= 0 or length <= 0:
            raise InvalidParams(f"register: {length} bytes at {addr:#x} is not a region")
        with self._lock:
            if self._covered(addr, length):
                return False
            i = bisect.bisect_right(self._starts, addr)
            if (i > 0 and self._ends[i - 1] > addr) or (
                i < len(self._starts) and self._starts[i] < addr + length
            ):
                raise InvalidParams(f"register: {length} bytes at {addr:#x} overlap a region")
            self._store.register_buffer(addr, length)
            self._starts.insert(i, addr)
            self._ends.insert(i, addr + length)
            # numpy's export of the region: slices of it cost the Store's address checks less
            # than slices of a ctypes array's view.
            region = np.frombuffer(view_at(addr, length), dtype=np.uint8)
            self._views.insert(i, region.data)
            return True

    def covers(self, addr: int, length: int) -> bool:
        """Whether `length` bytes at `addr` lie inside one registered region."""
        with self._lock:
            return self._covered(addr, length)

    def _covered(self, addr: int, length: int) -> bool:
        i = bisect.bisect_right(self._starts, addr) - 1
        return i >= 0 and addr + length <= self._ends[i]

    def _view(self, addr: int, length: int) -> memoryview | None:
        """A slice of the registered region holding `length` bytes at `addr`, else None."""
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0 or addr + length > self._ends[i] or length <= 0:
            return None
        start = addr - self._starts[i]
        return self._views[i][start : start + length]

    def _views_of(self, addrs: Sequence[int], sizes: Sequence[int]) -> list[memoryview | None]:
        with self._lock:
            return [self._view(a, n) for a, n in zip(addrs, sizes, strict=True)]

    def close(self) -> None:
        """Unregister every region (best effort: the Store may be closed already)."""
        with self._lock:
            starts, self._starts, self._ends, self._views = self._starts, [], [], []
        for addr in starts:
            try:
                self._store.unregister_buffer(addr)
            except KVPoolError as exc:
                log.debug("unregister %#x: %s", addr, exc)

    # ------------------------------------------------------------------ batch I/O

    def put(self, keys: Sequence[str], addrs: Sequence[int], sizes: Sequence[int]) -> list[bool]:
        """Store each page (`sizes[i]` bytes at `addrs[i]`) under `keys[i]`; per key whether
        the pool holds it now. A key named twice is written once."""
        _check_batch(keys, addrs, sizes)
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        order = list(first.values())
        ks = [keys[i] for i in order]
        inside = self._views_of([addrs[i] for i in order], [sizes[i] for i in order])
        try:
            if all(v is not None for v in inside):
                codes = self._store.batch_put_from(ks, inside)
            else:
                views = [view_at(addrs[i], sizes[i]) for i in order]
                codes = self._store.batch_put(ks, views)
        except KVPoolError as exc:
            log.warning("put of %d keys failed: %s", len(ks), exc)
            return [False] * len(keys)
        stored = {k: c in _STORED for k, c in zip(ks, codes, strict=True)}
        return [stored[k] for k in keys]

    def get(self, keys: Sequence[str], addrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """Read each key into its page (at most `sizes[i]` bytes at `addrs[i]`); per key the
        bytes read, or a negative `ErrorCode` value (OBJECT_NOT_FOUND, INVALID_PARAMS for a
        value larger than its page, ...)."""
        _check_batch(keys, addrs, sizes)
        if not keys:
            return []
        inside = self._views_of(addrs, sizes)
        out = [int(ErrorCode.INTERNAL_ERROR)] * len(keys)
        try:
            direct = [i for i, v in enumerate(inside) if v is not None]
            if direct:
                got = self._store.batch_get_into(
                    [keys[i] for i in direct], [inside[i] for i in direct]
                )
                for i, n in zip(direct, got, strict=True):
                    out[i] = int(n)
            copied = [i for i, v in enumerate(inside) if v is None]
            if copied:
                values = self._store.batch_get_ex([keys[i] for i in copied])
                for i, value in zip(copied, values, strict=True):
                    out[i] = self._copy_in(value, addrs[i], sizes[i])
        except KVPoolError as exc:
            log.warning("get of %d keys failed: %s", len(keys), exc)
            return [int(exc.code) or int(ErrorCode.INTERNAL_ERROR)] * len(keys)
        return out

    @staticmethod
    def _copy_in(value: bytearray | ErrorCode, addr: int, size: int) -> int:
        if isinstance(value, ErrorCode):
            return int(value)
        if len(value) > size:
            return int(ErrorCode.INVALID_PARAMS)
        view_at(addr, len(value))[:] = value
        return len(value)

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a readable value (False for all when the pool is unreachable)."""
        if not keys:
            return []
        try:
            return self._store.batch_exists(list(keys))
        except KVPoolError as exc:
            log.warning("exists of %d keys failed: %s", len(keys), exc)
            return [False] * len(keys)
