"""The master's background reclaimer: one asyncio task running kswapd steps and pin expiry.

The master's event loop owns the metadata, so kswapd runs in that loop too, in bounded steps
(`ReclaimConfig.kswapd_step_bytes`, each isolating `isolate_batch` records at a time) with a
yield to the loop between steps: a put that arrives while kswapd works waits for at most one
step, never for a whole pass. The task sleeps on an event that the engine sets when a PutEnd
crosses the high watermark or an allocation fails, and otherwise wakes every `interval_s` to
expire soft pins (in deadline order, shard by shard) and to re-check the watermark (capacity
can shrink when a segment is unmounted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Generic

from kvpool.master.reclaim.engine import ReclaimEngine
from kvpool.master.reclaim.records import K
from kvpool.master.reclaim.softpin import SoftPinIndex

__all__ = ["Kswapd"]

log = logging.getLogger(__name__)


class Kswapd(Generic[K]):
    """Background reclaim and soft-pin expiry for one engine. `start()` inside the loop."""

    def __init__(
        self,
        engine: ReclaimEngine[K],
        *,
        soft_pins: SoftPinIndex[K] | None = None,
        on_pin_expired: Callable[[K, float], object] | None = None,
        interval_s: float = 1.0,
    ) -> None:
        self.engine = engine
        self.soft_pins = soft_pins
        self.on_pin_expired = on_pin_expired
        self.interval_s = interval_s
        self.wakeups = 0
        """Times the task woke up and looked for work (for tests and status)."""
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """Start the task in the running loop and hook the engine's wake-ups to it."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._event = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="kvpool-kswapd")
        self.engine.wakeup = self.wake

    def wake(self) -> None:
        """Ask the task to run now; safe from any thread."""
        if self._event is None or self._loop is None or self._closed:
            return
        if threading.get_ident() == self._loop_thread:
            self._event.set()
        else:
            self._loop.call_soon_threadsafe(self._event.set)

    async def close(self) -> None:
        """Stop the task; idempotent."""
        self._closed = True
        if self.engine.wakeup == self.wake:
            self.engine.wakeup = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        assert self._event is not None
        event = self._event
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=self.interval_s)
            event.clear()
            self.wakeups += 1
            try:
                if self.soft_pins is not None:
                    self.soft_pins.expire(self.engine.clock(), self.on_pin_expired)
                while self.engine.kswapd_wanted():
                    step = self.engine.kswapd_step()
                    if step.freed + step.pending == 0:
                        break
                    await asyncio.sleep(0)  # let requests in between steps
            except Exception:
                # A bug in a target must not kill background reclaim for good; log and go on.
                log.exception("kswapd step failed")
