"""`mock`: the in-memory reference implementation of the L2 adapter contract.

Every task completes inside its submit call (the result is recorded and the eventfd written
before submit returns), which is allowed by the contract and makes the mock deterministic. It
keeps real lookup locks: `delete` refuses a locked key, and `locked_keys()` shows what is held,
so controller tests can prove that every lock they take is released. Values are private copies:
a caller changing its buffer after a store completes does not change what L2 holds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

from kvpool.cache.adapters.base import (
    EventFd,
    L2Adapter,
    L2TaskId,
    StoreResult,
    check_task_args,
)
from kvpool.cache.adapters.keylocks import KeyLocks
from kvpool.cache.adapters.registry import AdapterConfig, register_adapter
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryObj
from kvpool.config import parse_size
from kvpool.errors import StoreClosed
from kvpool.override import override

__all__ = ["MockAdapter", "MockAdapterConfig"]


@dataclass(frozen=True)
class MockAdapterConfig(AdapterConfig):
    capacity_bytes: int | str = 0
    """Bytes the mock may hold (0: unlimited); a store that would pass it fails."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "capacity_bytes", parse_size(self.capacity_bytes, name="mock.capacity_bytes")
        )


class MockAdapter(L2Adapter):
    """In-memory L2. Thread-safe through one lock; completes tasks inline."""

    def __init__(self, config: MockAdapterConfig | None = None) -> None:
        self._capacity = int((config or MockAdapterConfig()).capacity_bytes)
        self._lock = threading.Lock()
        self._data: dict[ObjectKey, bytes] = {}
        self._locks = KeyLocks()
        self._ids = count(1)
        self._stores: dict[L2TaskId, StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._fds = (EventFd(), EventFd(), EventFd())
        self._closed = False

    # -- fds --------------------------------------------------------------------------------

    @override
    def get_store_event_fd(self) -> int:
        return self._fds[0].fileno()

    @override
    def get_lookup_and_lock_event_fd(self) -> int:
        return self._fds[1].fileno()

    @override
    def get_load_event_fd(self) -> int:
        return self._fds[2].fileno()

    def _task(self) -> L2TaskId:
        if self._closed:
            raise StoreClosed("the mock L2 adapter is closed")
        return L2TaskId(next(self._ids))

    # -- operations -------------------------------------------------------------------------

    @override
    def submit_store_task(
        self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]
    ) -> L2TaskId:
        check_task_args(keys, objects)
        with self._lock:
            tid = self._task()
            values = [bytes(o.buffer) for o in objects]
            new = sum(len(v) for k, v in zip(keys, values, strict=True) if k not in self._data)
            used = sum(len(v) for v in self._data.values())
            if self._capacity and used + new > self._capacity:
                self._stores[tid] = StoreResult(False, 0, "mock L2 is full")
            else:
                for k, v in zip(keys, values, strict=True):
                    self._data[k] = v
                self._stores[tid] = StoreResult(True, sum(len(v) for v in values))
        self._fds[0].notify()
        return tid

    @override
    def pop_completed_store_tasks(self) -> dict[L2TaskId, StoreResult]:
        with self._lock:
            done, self._stores = self._stores, {}
        return done

    @override
    def submit_lookup_and_lock_task(self, keys: Sequence[ObjectKey]) -> L2TaskId:
        check_task_args(keys)
        with self._lock:
            tid = self._task()
            found = Bitmap.from_bools(k in self._data for k in keys)
            self._locks.lock_found(keys, found)
            self._lookups[tid] = found
        self._fds[1].notify()
        return tid

    @override
    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._lookups.pop(task_id, None)

    @override
    def submit_unlock(self, keys: Sequence[ObjectKey]) -> None:
        check_task_args(keys)
        with self._lock:
            self._locks.unlock(keys)

    @override
    def submit_load_task(self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]) -> L2TaskId:
        check_task_args(keys, objects)
        with self._lock:
            tid = self._task()
            loaded = Bitmap(len(keys))
            for i, (k, o) in enumerate(zip(keys, objects, strict=True)):
                v = self._data.get(k)
                if v is not None and len(v) == o.size:
                    o.buffer[:] = v
                    loaded.set(i)
            self._loads[tid] = loaded
        self._fds[2].notify()
        return tid

    @override
    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._loads.pop(task_id, None)

    @override
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._locks.clear()
        for fd in self._fds:
            fd.close()

    # -- reference-implementation extras (used by tests and the L2 side of policies) -------

    def delete(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Remove keys that are not lookup-locked; True where removed."""
        with self._lock:
            out = []
            for k in keys:
                ok = k in self._data and not self._locks.is_locked(k)
                if ok:
                    del self._data[k]
                out.append(ok)
            return out

    def locked_keys(self) -> dict[ObjectKey, int]:
        with self._lock:
            return self._locks.held()

    def stored_keys(self) -> set[ObjectKey]:
        with self._lock:
            return set(self._data)

    def raw_value(self, key: ObjectKey) -> bytes | None:
        with self._lock:
            return self._data.get(key)


def _factory(config: MockAdapterConfig) -> MockAdapter:
    return MockAdapter(config)


register_adapter("mock", MockAdapterConfig, _factory)
