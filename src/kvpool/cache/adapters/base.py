"""The L2 adapter contract (seed 003 "L1 — Contract"): asynchronous store, lookup-and-lock, load.

An adapter does I/O only; the controllers decide when and what. Every operation follows
submit → eventfd → query:

    task = adapter.submit_load_task(keys, objects)      # returns at once, never blocks on I/O
    poll(adapter.get_load_event_fd())                    # the adapter writes the fd when done
    os.eventfd_read(fd)                                  # one signal may cover several tasks
    bitmap = adapter.query_load_result(task)             # None until done; non-None once

Invariants every implementation keeps (the conformance suite in tests/cache/adapters checks them):

1. The three eventfds are distinct, from each other and from every other adapter's: they are
   fresh kernel objects per adapter and op (`EventFd`), so the controllers' fd → adapter maps
   can never misroute.
2. Task ids are unique per adapter (the controllers key tasks by (adapter index, task id)).
3. `query_*` results are one-shot: non-None exactly once per task; None for pending or unknown
   ids. `pop_completed_store_tasks` reports each finished store exactly once.
4. `submit_unlock` is fire-and-forget: the caller never retries, so the adapter must make it
   succeed eventually (retrying internally). Unlocking a key that is not locked is harmless.
5. Store errors are per task (`StoreResult`); lookup and load errors are per key (`Bitmap`):
   bit i set means keys[i] was found and locked / loaded byte-exactly into objects[i].
   A load never reports success for bytes it could not verify.
6. Buffers belong to the caller: store reads `objects[i].buffer`, load writes it, and the caller
   keeps them (locked in L1) until the task completes.
7. Thread-safe: the store controller thread and the prefetch controller thread call the same
   adapter at once.
8. `close()` is idempotent, waits for (or abandons) in-flight work, releases every lock the
   adapter holds, and closes the eventfds. Submits after close raise `StoreClosed`.

What may block: nothing but `close()` (which may wait for in-flight I/O to finish).
Which thread calls what: StoreController → submit_store_task / pop_completed_store_tasks;
PrefetchController → submit_lookup_and_lock_task / query_lookup_and_lock_result /
submit_load_task / query_load_result / submit_unlock; the owner (StorageManager) → close.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType, Self

from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryObj
from kvpool.errors import InvalidParams

__all__ = [
    "EventFd",
    "L2Adapter",
    "L2TaskId",
    "StoreResult",
    "check_task_args",
    "drain_event_fd",
]


L2TaskId = NewType("L2TaskId", int)


@dataclass(frozen=True, slots=True)
class StoreResult:
    """Outcome of one store task: all keys stored, or the task failed (coarse-grained)."""

    ok: bool
    bytes_written: int = 0
    error: str = ""

    def __bool__(self) -> bool:
        return self.ok


class EventFd:
    """One eventfd (non-blocking, close-on-exec) owned by the object that created it."""

    __slots__ = ("_closed", "_fd", "_lock")

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        return self._fd

    def notify(self) -> None:
        """Add 1 to the counter (wakes pollers); a no-op after close."""
        with self._lock:
            if not self._closed:
                os.eventfd_write(self._fd, 1)

    def drain(self) -> int:
        """Read and reset the counter; 0 when it was not signalled."""
        with self._lock:
            if self._closed:
                return 0
            try:
                return os.eventfd_read(self._fd)
            except BlockingIOError:
                return 0

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._fd)

    @property
    def closed(self) -> bool:
        return self._closed


def drain_event_fd(fd: int) -> int:
    """Read and reset an eventfd someone else owns; 0 if it was not signalled or is closed."""
    try:
        return os.eventfd_read(fd)
    except OSError:  # BlockingIOError (not signalled) or EBADF (closed under us)
        return 0


def check_task_args(keys: Sequence[ObjectKey], objects: Sequence[MemoryObj] | None = None) -> None:
    """The precondition checks every adapter's submit methods share."""
    for k in keys:
        if not isinstance(k, ObjectKey):
            raise InvalidParams(f"expected ObjectKey, got {type(k).__name__} {k!r}")
    if objects is not None:
        if len(objects) != len(keys):
            raise InvalidParams(f"{len(keys)} keys but {len(objects)} objects")
        for o in objects:
            if not isinstance(o, MemoryObj):
                raise InvalidParams(f"expected MemoryObj, got {type(o).__name__}")


class L2Adapter(ABC):
    """Asynchronous I/O to one L2 store. See the module docstring for the contract."""

    @abstractmethod
    def get_store_event_fd(self) -> int:
        """Signalled when store tasks complete."""

    @abstractmethod
    def get_lookup_and_lock_event_fd(self) -> int:
        """Signalled when lookup-and-lock tasks complete."""

    @abstractmethod
    def get_load_event_fd(self) -> int:
        """Signalled when load tasks complete."""

    @abstractmethod
    def submit_store_task(
        self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]
    ) -> L2TaskId:
        """Start storing objects[i] under keys[i]. Raises InvalidParams / StoreClosed only."""

    @abstractmethod
    def pop_completed_store_tasks(self) -> dict[L2TaskId, StoreResult]:
        """Every store task finished since the last call, each reported exactly once."""

    @abstractmethod
    def submit_lookup_and_lock_task(self, keys: Sequence[ObjectKey]) -> L2TaskId:
        """Start checking which keys exist, locking those found against L2 eviction."""

    @abstractmethod
    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        """Found-and-locked bitmap once done (one-shot); None while pending or unknown."""

    @abstractmethod
    def submit_unlock(self, keys: Sequence[ObjectKey]) -> None:
        """Release one lookup lock per key; must eventually succeed; never raises for I/O."""

    @abstractmethod
    def submit_load_task(self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]) -> L2TaskId:
        """Start copying the value of keys[i] into objects[i] (sizes must match)."""

    @abstractmethod
    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        """Loaded bitmap once done (one-shot); None while pending or unknown."""

    @abstractmethod
    def close(self) -> None:
        """Finish or abandon in-flight work, release every lock, close the eventfds. Idempotent."""

    def event_fds(self) -> tuple[int, int, int]:
        """(store, lookup, load) fds."""
        return (
            self.get_store_event_fd(),
            self.get_lookup_and_lock_event_fd(),
            self.get_load_event_fd(),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
