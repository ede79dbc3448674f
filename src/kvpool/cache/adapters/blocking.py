"""`BlockingAdapter`: submit-and-wait calls over any L2 adapter, for tools, tests and benchmarks.

The controllers drive adapters asynchronously; a benchmark or a script wants "store these and
tell me when done". This wrapper waits on the adapter's eventfds with `select.poll` and a
deadline (no busy loop, no sleep). Several threads may use one wrapper: store completions that
one waiter pops on behalf of another are kept until their owner asks, and waits use a short
poll slice so that a signal drained by another thread only costs one slice.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from kvpool.cache.adapters.base import L2Adapter, L2TaskId, StoreResult
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryObj
from kvpool.errors import ErrorCode, KVPoolError

__all__ = ["BlockingAdapter"]

T = TypeVar("T")
_SLICE_MS = 20


class BlockingAdapter:
    """Blocking store/lookup/load/unlock over `adapter` (which the caller still owns)."""

    def __init__(self, adapter: L2Adapter, *, timeout: float = 30.0) -> None:
        self.adapter = adapter
        self.timeout = timeout
        self._lock = threading.Lock()
        self._stores: dict[L2TaskId, StoreResult] = {}

    def _wait(self, fd: int, check: Callable[[], T | None], what: str) -> T:
        deadline = time.monotonic() + self.timeout
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            result = check()
            if result is not None:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                raise KVPoolError(
                    f"L2 {what} did not complete in {self.timeout} s", ErrorCode.RPC_TIMEOUT
                )
            if poller.poll(min(_SLICE_MS, max(1, int(left * 1000)))):
                # Another waiter may have drained it already; re-check either way.
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(fd)

    def store(self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]) -> StoreResult:
        tid = self.adapter.submit_store_task(keys, objects)

        def check() -> StoreResult | None:
            with self._lock:
                self._stores.update(self.adapter.pop_completed_store_tasks())
                return self._stores.pop(tid, None)

        return self._wait(self.adapter.get_store_event_fd(), check, "store")

    def lookup_and_lock(self, keys: Sequence[ObjectKey]) -> Bitmap:
        tid = self.adapter.submit_lookup_and_lock_task(keys)
        return self._wait(
            self.adapter.get_lookup_and_lock_event_fd(),
            lambda: self.adapter.query_lookup_and_lock_result(tid),
            "lookup",
        )

    def load(self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]) -> Bitmap:
        tid = self.adapter.submit_load_task(keys, objects)
        return self._wait(
            self.adapter.get_load_event_fd(), lambda: self.adapter.query_load_result(tid), "load"
        )

    def unlock(self, keys: Sequence[ObjectKey]) -> None:
        self.adapter.submit_unlock(keys)
