"""`ThreadedAdapter`: the L2 contract on top of a blocking key-value `Backend`, run on workers.

Files, Redis, S3 and the kvpool pool all offer blocking put/get/exists calls. This class turns
one of them into an asynchronous adapter: each submitted task runs on a small thread pool owned
by the adapter, records its result under the adapter's lock, and writes the op's eventfd.

* Values are stored as self-checking records (`record.py`), so every load verifies key, size
  and checksum before a byte reaches the caller's buffer.
* Lookup locks are a per-process refcount: these stores have no lock of their own. The lock
  keeps this process's own `delete` off a key between lookup and load; another process may
  still remove it, in which case the load reports that key as failed (the prefix shortens,
  nothing wrong is returned). Unlock is an in-memory decrement, so it cannot fail.
* A backend exception fails the whole store task, or every key of a lookup/load batch; it is
  logged once per task and never escapes to the controller thread.
* `close()` stops taking tasks, cancels queued ones, waits for running ones (bounded by each
  backend's I/O timeouts), drops every lock, closes the backend and then the eventfds.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import count

from kvpool.cache.adapters.base import (
    EventFd,
    L2Adapter,
    L2TaskId,
    StoreResult,
    check_task_args,
)
from kvpool.cache.adapters.keylocks import KeyLocks
from kvpool.cache.adapters.record import RecordError, decode_into, encode_parts
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryObj
from kvpool.errors import InvalidParams, StoreClosed
from kvpool.override import override

__all__ = ["Backend", "ThreadedAdapter"]

logger = logging.getLogger(__name__)

Record = tuple[bytes, memoryview]  # (header ‖ key, payload) as record.encode_parts makes it


class Backend(ABC):
    """Blocking I/O to one store. Called from the adapter's worker threads, several at once.

    Methods raise on faults (connection lost, permission denied); an absent key is an outcome
    (False / None), not an exception.
    """

    @abstractmethod
    def put_many(self, items: Sequence[tuple[ObjectKey, Record]]) -> None:
        """Store each record (header part then payload part) so that a reader sees either the
        whole new record, the whole old one, or nothing; never a partial one."""

    @abstractmethod
    def get_many(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        """The stored record of each key, None where absent."""

    @abstractmethod
    def exists_many(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Whether each key has a record."""

    @abstractmethod
    def delete_many(self, keys: Sequence[ObjectKey]) -> None:
        """Remove the records (absent keys are fine)."""

    @abstractmethod
    def close(self) -> None:
        """Release connections and handles. Idempotent."""


class ThreadedAdapter(L2Adapter):
    """See the module docstring."""

    def __init__(self, backend: Backend, *, name: str, workers: int = 4) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
            raise InvalidParams(f"{name}: workers must be an int in [1, 256], got {workers!r}")
        self._backend = backend
        self._name = name
        self._lock = threading.Lock()
        self._ids = count(1)
        self._stores: dict[L2TaskId, StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._locks = KeyLocks()
        self._closed = False
        self._fds = (EventFd(), EventFd(), EventFd())
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"kvpool-l2-{name}")

    @property
    def backend(self) -> Backend:
        return self._backend

    @override
    def get_store_event_fd(self) -> int:
        return self._fds[0].fileno()

    @override
    def get_lookup_and_lock_event_fd(self) -> int:
        return self._fds[1].fileno()

    @override
    def get_load_event_fd(self) -> int:
        return self._fds[2].fileno()

    def _submit(self, fn: Callable[[L2TaskId], None]) -> L2TaskId:
        with self._lock:
            if self._closed:
                raise StoreClosed(f"L2 adapter {self._name} is closed")
            tid = L2TaskId(next(self._ids))
            # Submitting under the lock orders it before close()'s shutdown: no task slips in
            # after the pool stopped.
            self._pool.submit(fn, tid)
        return tid

    # -- store ------------------------------------------------------------------------------

    @override
    def submit_store_task(
        self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]
    ) -> L2TaskId:
        check_task_args(keys, objects)
        keys, objects = list(keys), list(objects)
        return self._submit(lambda tid: self._run_store(tid, keys, objects))

    def _run_store(self, tid: L2TaskId, keys: list[ObjectKey], objects: list[MemoryObj]) -> None:
        try:
            items = [(k, encode_parts(k, o.buffer)) for k, o in zip(keys, objects, strict=True)]
            self._backend.put_many(items)
            result = StoreResult(True, sum(o.size for o in objects))
        except Exception as exc:  # any backend fault fails this task only
            logger.warning("%s: store of %d keys failed: %s", self._name, len(keys), exc)
            result = StoreResult(False, 0, f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._stores[tid] = result
        self._fds[0].notify()

    @override
    def pop_completed_store_tasks(self) -> dict[L2TaskId, StoreResult]:
        with self._lock:
            done, self._stores = self._stores, {}
        return done

    # -- lookup and lock --------------------------------------------------------------------

    @override
    def submit_lookup_and_lock_task(self, keys: Sequence[ObjectKey]) -> L2TaskId:
        check_task_args(keys)
        keys = list(keys)
        return self._submit(lambda tid: self._run_lookup(tid, keys))

    def _run_lookup(self, tid: L2TaskId, keys: list[ObjectKey]) -> None:
        try:
            found = Bitmap.from_bools(self._backend.exists_many(keys))
        except Exception as exc:
            logger.warning("%s: lookup of %d keys failed: %s", self._name, len(keys), exc)
            found = Bitmap(len(keys))
        with self._lock:
            if self._closed:
                found = Bitmap(len(keys))  # close() released every lock; take none now
            self._locks.lock_found(keys, found)
            self._lookups[tid] = found
        self._fds[1].notify()

    @override
    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._lookups.pop(task_id, None)

    @override
    def submit_unlock(self, keys: Sequence[ObjectKey]) -> None:
        check_task_args(keys)
        with self._lock:
            self._locks.unlock(keys)

    # -- load -------------------------------------------------------------------------------

    @override
    def submit_load_task(self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]) -> L2TaskId:
        check_task_args(keys, objects)
        keys, objects = list(keys), list(objects)
        return self._submit(lambda tid: self._run_load(tid, keys, objects))

    def _run_load(self, tid: L2TaskId, keys: list[ObjectKey], objects: list[MemoryObj]) -> None:
        loaded = Bitmap(len(keys))
        try:
            records = self._backend.get_many(keys)
        except Exception as exc:
            logger.warning("%s: load of %d keys failed: %s", self._name, len(keys), exc)
            records = [None] * len(keys)
        bad = 0
        for i, (k, o, rec) in enumerate(zip(keys, objects, records, strict=True)):
            if rec is None:
                continue
            try:
                decode_into(k, rec, o.buffer)
            except RecordError as exc:
                bad += 1
                if bad == 1:
                    logger.warning("%s: refusing a stored value: %s", self._name, exc)
                continue
            loaded.set(i)
        with self._lock:
            self._loads[tid] = loaded
        self._fds[2].notify()

    @override
    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._loads.pop(task_id, None)

    # -- extras -----------------------------------------------------------------------------

    def delete(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Remove keys that no lookup holds locked (blocking); True where removal was attempted."""
        check_task_args(keys)
        with self._lock:
            ok = [not self._locks.is_locked(k) for k in keys]
        self._backend.delete_many([k for k, free in zip(keys, ok, strict=True) if free])
        return ok

    def locked_keys(self) -> dict[ObjectKey, int]:
        with self._lock:
            return self._locks.held()

    @override
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._locks.clear()
        try:
            self._backend.close()
        finally:
            for fd in self._fds:
                fd.close()
