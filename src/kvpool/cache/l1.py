"""L1: the engine's local memory of KV chunks, with read/write locks, TTLs and LRU eviction.

The L1 manager owns every `MemoryObj` and all of their state under one `threading.Lock`; each
public method is one critical section, so a batch of keys is handled atomically.

States of a key:

    (absent) --reserve_write--> WRITING --finish_write--> READY (readable, evictable when unlocked)
                                   |  \\--finish_write_and_reserve_read--> READY + read lock
                                   \\--abort_write / write TTL expiry--> (absent)

* A WRITING object is invisible to readers (`reserve_read` answers NOT_READY) and never evicted
  until its write TTL runs out: a crashed writer cannot pin memory forever.
* Read locks are a count with one TTL, refreshed by each `reserve_read`; once it runs out the
  count is treated as zero (a crashed reader cannot pin memory forever either).
* Temporary objects (the prefetch controller's landing buffers) are freed when their last reader
  finishes, never announced to listeners, so they are never stored to L2.
* `finish_write_and_reserve_read` turns a write lock into a read lock inside one critical
  section: there is no moment in which the object is unlocked and evictable (seed 003 inv. 8).
* Eviction is LRU over unlocked READY objects only, run on allocation whenever the used bytes
  would pass `eviction_watermark * capacity`; allocation fails with OUT_OF_MEMORY only when the
  bytes would pass the capacity itself and nothing unlocked is left to evict.

Listeners are called inside the L1 lock (so they see events in order). They must be
non-blocking and must never call back into the manager (seed 003 inv. 6): a listener that does
gets `ListenerReentryError` instead of a deadlock.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import numpy as np

from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryLayout, MemoryObj
from kvpool.errors import InvalidParams, KVPoolError, StoreClosed

__all__ = [
    "L1Config",
    "L1Listener",
    "L1Manager",
    "L1Result",
    "L1Status",
    "L1Usage",
    "ListenerReentryError",
]

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


class L1Status(Enum):
    """Per-key outcome of an L1 operation (expected outcomes, not faults)."""

    OK = "ok"
    EXISTS = "exists"  # reserve_write: the key is already in L1 (being written or readable)
    NOT_FOUND = "not_found"  # the key is not in L1
    NOT_READY = "not_ready"  # reserve_read: the key is still being written
    LOCKED = "locked"  # delete: the key is read- or write-locked
    OUT_OF_MEMORY = "out_of_memory"  # reserve_write: no room even after eviction
    WRONG_STATE = "wrong_state"  # finish_write of a readable key, finish_read without a lock, ...


class L1Result(NamedTuple):
    status: L1Status
    obj: MemoryObj | None


@dataclass(frozen=True, slots=True)
class L1Usage:
    used_bytes: int
    capacity_bytes: int
    objects: int
    writing: int
    read_locked: int
    temporary: int
    recycled_bytes: int = 0
    """Memory of dropped objects kept for reuse (counted against the capacity)."""


@dataclass(frozen=True, slots=True)
class L1Config:
    """Settings of the L1 manager."""

    capacity_bytes: int = 1 << 30
    """Bytes of KV chunks L1 may hold (the sum of object sizes)."""
    write_ttl_s: float = 600.0
    """Seconds after which an unfinished write reservation is abandoned and its memory freed."""
    read_ttl_s: float = 300.0
    """Seconds after the last reserve_read on a key after which its read locks are void."""
    eviction_watermark: float = 0.8
    """Fraction of capacity above which allocation first evicts unlocked LRU objects."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.capacity_bytes, bool)
            or not isinstance(self.capacity_bytes, int)
            or self.capacity_bytes < 1
        ):
            raise InvalidParams(
                f"L1Config.capacity_bytes must be an int >= 1, got {self.capacity_bytes!r}"
            )
        if not self.write_ttl_s > 0 or not self.read_ttl_s > 0:
            raise InvalidParams(
                f"L1Config TTLs must be > 0 s, got write {self.write_ttl_s!r}, read {self.read_ttl_s!r}"
            )
        if not 0.0 < self.eviction_watermark <= 1.0:
            raise InvalidParams(
                f"L1Config.eviction_watermark must be in (0, 1], got {self.eviction_watermark!r}"
            )


class ListenerReentryError(KVPoolError, RuntimeError):
    """A listener called the L1 manager from inside a callback (which would deadlock)."""


class L1Listener:
    """Callbacks from inside the L1 lock: append and signal only; never call the manager."""

    def on_keys_write_finished(self, keys: list[ObjectKey]) -> None:
        """Non-temporary keys that became READY through finish_write (the L1 → L2 trigger)."""

    def on_keys_removed(self, keys: list[ObjectKey]) -> None:
        """Keys that left L1 (deleted, evicted, freed or abandoned)."""


class _Recycler:
    """Arrays of dropped objects, reused for new objects of the same size.

    Fresh memory costs a page fault per 4 KiB on first touch (docs/performance.md, L2 section,
    has the measured speed), so allocating every chunk anew caps L1 at page-fault speed; reusing the
    arrays of dropped objects removes that. Reuse is only safe when nothing can still reach the
    old array: an adapter still reading or writing it (a store task, a load abandoned at
    shutdown), or an engine still holding the object or a view of it. Every such holder keeps a
    Python reference to the array (MemoryObj, memoryview, numpy view, torch.frombuffer), so an
    array is taken only when the recycler's own references are the only ones left; others wait.
    Recycled bytes count against the L1 capacity and are released first when room is needed.
    """

    __slots__ = ("_arrays", "_unshared", "bytes")

    def __init__(self) -> None:
        self._arrays: dict[int, list[np.ndarray[Any, np.dtype[np.uint8]]]] = {}
        self.bytes = 0
        # How many references getrefcount reports for an array that only the recycler holds,
        # seen the way `take` sees a candidate (list slot, local name, call argument). Measured
        # on the running interpreter rather than assumed, since interpreters differ in which
        # stack references they count; anything above it means someone else holds the array.
        probe = [np.empty(1, dtype=np.uint8)]
        arr = probe[0]
        self._unshared = sys.getrefcount(arr)

    def put(self, array: np.ndarray[Any, np.dtype[np.uint8]]) -> None:
        self._arrays.setdefault(array.nbytes, []).append(array)
        self.bytes += array.nbytes

    def take(self, size: int) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
        """An unshared array of `size` bytes, or None (the caller allocates)."""
        candidates = self._arrays.get(size)
        if not candidates:
            return None
        for i in range(len(candidates) - 1, -1, -1):  # newest first: the warmest in cache
            arr = candidates[i]
            if sys.getrefcount(arr) <= self._unshared:
                del candidates[i]
                self.bytes -= size
                return arr
        return None

    def trim(self, room: int) -> None:
        """Release recycled arrays until they hold at most `room` bytes."""
        for size in list(self._arrays):
            arrays = self._arrays[size]
            while arrays and self.bytes > room:
                arrays.pop()
                self.bytes -= size
            if not arrays:
                del self._arrays[size]
            if self.bytes <= room:
                return


class _Entry:
    __slots__ = ("obj", "read_deadline", "readers", "temporary", "write_deadline", "writing")

    def __init__(self, obj: MemoryObj, temporary: bool, write_deadline: float) -> None:
        self.obj = obj
        self.temporary = temporary
        self.writing = True
        self.write_deadline = write_deadline
        self.readers = 0
        self.read_deadline = 0.0


class L1Manager:
    """See the module docstring. Thread-safe; every method is one critical section."""

    def __init__(self, config: L1Config | None = None, *, clock: Clock = time.monotonic) -> None:
        self._config = config or L1Config()
        self._clock = clock
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._entries: OrderedDict[ObjectKey, _Entry] = OrderedDict()  # LRU order: oldest first
        self._used = 0
        self._listeners: list[L1Listener] = []
        self._closed = False
        self._recycler = _Recycler()
        self.evicted_count = 0
        self.expired_count = 0

    @property
    def config(self) -> L1Config:
        return self._config

    # -- plumbing ---------------------------------------------------------------------------

    def register_listener(self, listener: L1Listener) -> None:
        self._guard()
        with self._lock:
            self._listeners.append(listener)

    def unregister_listener(self, listener: L1Listener) -> None:
        self._guard()
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _guard(self) -> None:
        if getattr(self._tls, "in_listener", False):
            raise ListenerReentryError("an L1 listener called the L1 manager from its callback")
        if self._closed:
            raise StoreClosed("L1Manager is closed")

    @staticmethod
    def _check_keys(keys: Sequence[ObjectKey]) -> None:
        for k in keys:
            if not isinstance(k, ObjectKey):
                raise InvalidParams(f"expected ObjectKey, got {type(k).__name__} {k!r}")

    def _notify(self, written: list[ObjectKey], removed: list[ObjectKey]) -> None:
        """Call listeners; runs with self._lock held."""
        if not (written or removed) or not self._listeners:
            return
        self._tls.in_listener = True
        try:
            for listener in self._listeners:
                if written:
                    listener.on_keys_write_finished(list(written))
                if removed:
                    listener.on_keys_removed(list(removed))
        finally:
            self._tls.in_listener = False

    def _readers(self, e: _Entry, now: float) -> int:
        if e.readers and now > e.read_deadline:
            logger.warning(
                "read locks on %s expired after %.0f s; releasing them",
                e.obj.key,
                self._config.read_ttl_s,
            )
            e.readers = 0
            self.expired_count += 1
        return e.readers

    def _write_expired(self, e: _Entry, now: float) -> bool:
        return e.writing and now > e.write_deadline

    def _drop(self, key: ObjectKey, removed: list[ObjectKey]) -> None:
        e = self._entries.pop(key)
        self._used -= e.obj.size
        self._recycler.put(e.obj.array)
        removed.append(key)

    def _evict(self, target_used: float, now: float, removed: list[ObjectKey]) -> None:
        """Drop unlocked LRU objects (and abandoned ones) until used <= target_used."""
        for key in list(self._entries):  # bounded: one pass over a snapshot
            if self._used <= target_used:
                return
            e = self._entries[key]
            if self._write_expired(e, now):
                logger.warning("write reservation of %s expired; freeing it", key)
                self.expired_count += 1
                self._drop(key, removed)
            elif not e.writing and self._readers(e, now) == 0:
                self.evicted_count += 1
                self._drop(key, removed)

    # -- writes -----------------------------------------------------------------------------

    def reserve_write(
        self, keys: Sequence[ObjectKey], layout: MemoryLayout, *, temporary: bool = False
    ) -> list[L1Result]:
        """Allocate a write-locked object per key. EXISTS if the key is in L1; OUT_OF_MEMORY if
        there is no room even after evicting every unlocked object."""
        self._guard()
        self._check_keys(keys)
        if not isinstance(layout, MemoryLayout):
            raise InvalidParams(f"reserve_write needs a MemoryLayout, got {layout!r}")
        size = layout.nbytes
        cap = self._config.capacity_bytes
        out: list[L1Result] = []
        removed: list[ObjectKey] = []
        with self._lock:
            now = self._clock()
            for key in keys:
                e = self._entries.get(key)
                if e is not None:
                    if self._write_expired(e, now):
                        self.expired_count += 1
                        self._drop(key, removed)
                    else:
                        out.append(L1Result(L1Status.EXISTS, None))
                        continue
                if self._used + size > self._config.eviction_watermark * cap:
                    self._evict(self._config.eviction_watermark * cap - size, now, removed)
                if self._used + size > cap:
                    out.append(L1Result(L1Status.OUT_OF_MEMORY, None))
                    continue
                # Room for the new object's memory: recycled arrays count against the capacity.
                self._recycler.trim(cap - self._used - size)
                obj = MemoryObj(key, layout, self._recycler.take(size))
                self._entries[key] = _Entry(obj, temporary, now + self._config.write_ttl_s)
                self._used += size
                out.append(L1Result(L1Status.OK, obj))
            self._notify([], removed)
        return out

    def _finish(self, keys: Sequence[ObjectKey], read_lock: bool) -> list[L1Result]:
        self._guard()
        self._check_keys(keys)
        out: list[L1Result] = []
        written: list[ObjectKey] = []
        removed: list[ObjectKey] = []
        with self._lock:
            now = self._clock()
            for key in keys:
                e = self._entries.get(key)
                if e is None:
                    out.append(L1Result(L1Status.NOT_FOUND, None))
                    continue
                if not e.writing:
                    out.append(L1Result(L1Status.WRONG_STATE, None))
                    continue
                if self._write_expired(e, now):
                    # The reservation was abandoned: its bytes may be half-written, never admit it.
                    self.expired_count += 1
                    self._drop(key, removed)
                    out.append(L1Result(L1Status.NOT_FOUND, None))
                    continue
                e.writing = False
                if read_lock:
                    e.readers = 1
                    e.read_deadline = now + self._config.read_ttl_s
                elif not e.temporary:
                    written.append(key)
                self._entries.move_to_end(key)
                out.append(L1Result(L1Status.OK, e.obj))
            self._notify(written, removed)
        return out

    def finish_write(self, keys: Sequence[ObjectKey]) -> list[L1Status]:
        """WRITING → READY; listeners hear of the non-temporary keys (and store them to L2)."""
        return [r.status for r in self._finish(keys, read_lock=False)]

    def finish_write_and_reserve_read(self, keys: Sequence[ObjectKey]) -> list[L1Result]:
        """WRITING → READY with one read lock, atomically (no eviction window). Listeners are not
        told: these objects came from L2 and must not be stored back."""
        return self._finish(keys, read_lock=True)

    def abort_write(self, keys: Sequence[ObjectKey]) -> list[L1Status]:
        """Discard write reservations without admitting them (failed loads, failed writes)."""
        self._guard()
        self._check_keys(keys)
        out: list[L1Status] = []
        removed: list[ObjectKey] = []
        with self._lock:
            for key in keys:
                e = self._entries.get(key)
                if e is None:
                    out.append(L1Status.NOT_FOUND)
                elif not e.writing:
                    out.append(L1Status.WRONG_STATE)
                else:
                    self._drop(key, removed)
                    out.append(L1Status.OK)
            self._notify([], removed)
        return out

    # -- reads ------------------------------------------------------------------------------

    def reserve_read(self, keys: Sequence[ObjectKey]) -> list[L1Result]:
        """Add one read lock per key (refreshing its TTL). NOT_FOUND / NOT_READY otherwise."""
        self._guard()
        self._check_keys(keys)
        out: list[L1Result] = []
        with self._lock:
            now = self._clock()
            for key in keys:
                e = self._entries.get(key)
                if e is None:
                    out.append(L1Result(L1Status.NOT_FOUND, None))
                elif e.writing:
                    out.append(L1Result(L1Status.NOT_READY, None))
                else:
                    e.readers = self._readers(e, now) + 1
                    e.read_deadline = now + self._config.read_ttl_s
                    self._entries.move_to_end(key)
                    out.append(L1Result(L1Status.OK, e.obj))
        return out

    def reserve_read_prefix(self, keys: Sequence[ObjectKey]) -> list[MemoryObj]:
        """Read-lock keys in order up to the first one that is not readable; one critical section."""
        self._guard()
        self._check_keys(keys)
        out: list[MemoryObj] = []
        with self._lock:
            now = self._clock()
            for key in keys:
                e = self._entries.get(key)
                if e is None or e.writing:
                    break
                e.readers = self._readers(e, now) + 1
                e.read_deadline = now + self._config.read_ttl_s
                self._entries.move_to_end(key)
                out.append(e.obj)
        return out

    def read_locked(self, keys: Sequence[ObjectKey]) -> list[MemoryObj]:
        """The objects of keys the caller already holds read locks on (adds no lock)."""
        self._guard()
        self._check_keys(keys)
        out: list[MemoryObj] = []
        with self._lock:
            now = self._clock()
            for key in keys:
                e = self._entries.get(key)
                if e is None or e.writing or self._readers(e, now) == 0:
                    raise InvalidParams(f"{key} is not read-locked in L1")
                out.append(e.obj)
        return out

    def finish_read(self, keys: Sequence[ObjectKey]) -> list[L1Status]:
        """Release one read lock per key; a temporary object is freed with its last reader."""
        self._guard()
        self._check_keys(keys)
        out: list[L1Status] = []
        removed: list[ObjectKey] = []
        with self._lock:
            now = self._clock()
            for key in keys:
                e = self._entries.get(key)
                if e is None:
                    out.append(L1Status.NOT_FOUND)
                    continue
                if e.writing or self._readers(e, now) == 0:
                    out.append(L1Status.WRONG_STATE)
                    continue
                e.readers -= 1
                if e.readers == 0 and e.temporary:
                    self._drop(key, removed)
                out.append(L1Status.OK)
            self._notify([], removed)
        return out

    # -- other ------------------------------------------------------------------------------

    def delete(self, keys: Sequence[ObjectKey]) -> list[L1Status]:
        """Remove unlocked keys; LOCKED while read- or write-locked."""
        self._guard()
        self._check_keys(keys)
        out: list[L1Status] = []
        removed: list[ObjectKey] = []
        with self._lock:
            now = self._clock()
            for key in keys:
                e = self._entries.get(key)
                if e is None:
                    out.append(L1Status.NOT_FOUND)
                elif (e.writing and not self._write_expired(e, now)) or self._readers(e, now):
                    out.append(L1Status.LOCKED)
                else:
                    self._drop(key, removed)
                    out.append(L1Status.OK)
            self._notify([], removed)
        return out

    def contains(self, key: ObjectKey) -> bool:
        """Whether `key` is READY in L1 (takes no lock on it)."""
        self._guard()
        with self._lock:
            e = self._entries.get(key)
            return e is not None and not e.writing

    def readable(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Whether each key is READY in L1 (one critical section; takes no locks)."""
        self._guard()
        self._check_keys(keys)
        with self._lock:
            out = []
            for key in keys:
                e = self._entries.get(key)
                out.append(e is not None and not e.writing)
            return out

    def read_lock_count(self, key: ObjectKey) -> int:
        """Live read locks on `key` (0 when absent)."""
        self._guard()
        with self._lock:
            e = self._entries.get(key)
            return 0 if e is None else self._readers(e, self._clock())

    def is_writing(self, key: ObjectKey) -> bool:
        self._guard()
        with self._lock:
            e = self._entries.get(key)
            return e is not None and e.writing

    def sweep(self) -> int:
        """Free abandoned write reservations and temporary objects whose readers expired."""
        self._guard()
        removed: list[ObjectKey] = []
        with self._lock:
            now = self._clock()
            for key in list(self._entries):
                e = self._entries[key]
                if self._write_expired(e, now):
                    self.expired_count += 1
                    self._drop(key, removed)
                elif e.temporary and not e.writing and self._readers(e, now) == 0:
                    self._drop(key, removed)
            self._notify([], removed)
        return len(removed)

    def usage(self) -> L1Usage:
        self._guard()
        with self._lock:
            now = self._clock()
            entries = list(self._entries.values())
            return L1Usage(
                used_bytes=self._used,
                capacity_bytes=self._config.capacity_bytes,
                objects=len(entries),
                writing=sum(1 for e in entries if e.writing),
                read_locked=sum(1 for e in entries if self._readers(e, now)),
                temporary=sum(1 for e in entries if e.temporary),
                recycled_bytes=self._recycler.bytes,
            )

    def keys(self) -> list[ObjectKey]:
        """Every key in L1, least recently used first."""
        self._guard()
        with self._lock:
            return list(self._entries)

    def close(self) -> None:
        """Drop every object and lock. Idempotent."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            self._entries.clear()
            self._used = 0
            self._recycler.trim(0)
            self._listeners.clear()
