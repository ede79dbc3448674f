"""`MasterServer`: the master service behind an `RpcServer`, plus its background tasks.

Everything runs on the one event loop that called `start()`: requests are served inline by
`MasterService` (a dict lookup on the request's type, then the handler), and three background
tasks take turns with them:

* the **monitor**, every `monitor_interval` (1 s): freezes what the garbage collector has
  seen so far (`gc.freeze()`: the metadata is acyclic, so collections need only look at what
  is new), expires clients silent for `client_ttl`,
  releases stale PutStarts and parked replicas, and, when a segment went away, sweeps the
  replicas of dead segments out of the metadata `sweep_batch` objects per loop turn;
* the **reclaim tick**, every `reclaim_interval`: `hooks.tick(now)` (kswapd's chance to act);
* RemoveAll / RemoveByRegex run as tasks that give the loop a turn every few thousand objects,
  so a million-object removal never stalls the requests behind it.

`close()` stops the tasks, then the RPC server (which closes every connection); it is
idempotent, and `kvpool master` calls it on SIGINT / SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from kvpool.master.config import MasterConfig
from kvpool.master.hooks import ReclaimHooks
from kvpool.master.service import MasterService
from kvpool.protocol.messages import Message, RemoveAll, RemoveByRegex, Request
from kvpool.rpc.server import Connection, RpcServer

__all__ = ["MasterServer"]

log = logging.getLogger(__name__)


class MasterServer:
    """One master: service, RPC server and background tasks (owned, closed by `close()`)."""

    def __init__(
        self,
        config: MasterConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        hooks: ReclaimHooks | None = None,
        server_name: str = "kvpool-master",
    ) -> None:
        self.config = config if config is not None else MasterConfig()
        self.service = MasterService(self.config, clock=clock, hooks=hooks)
        self._handlers: dict[type[Any], Callable[[Any], Any]] = dict(self.service.handlers)
        self._handlers[RemoveAll] = self._remove_all
        self._handlers[RemoveByRegex] = self._remove_by_regex
        self.rpc = RpcServer(
            self._handle,
            request_type=Request,
            host=self.config.host,
            port=self.config.port,
            cluster_id=self.config.cluster_id,
            server_name=server_name,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        return self.rpc.address

    @property
    def endpoint(self) -> str:
        return self.rpc.endpoint

    async def start(self) -> None:
        """Bind (an `OSError` when the address is taken) and start the background tasks."""
        await self.rpc.start()
        self._tasks = [
            asyncio.create_task(self._monitor(), name="master-monitor"),
            asyncio.create_task(self._reclaim_ticks(), name="master-reclaim-tick"),
        ]

    async def close(self) -> None:
        """Stop the background tasks and the RPC server. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.rpc.close()

    async def __aenter__(self) -> MasterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ requests

    def _handle(self, request: Any, conn: Connection) -> Any:
        return self._handlers[type(request)](request)

    async def _remove_all(self, req: RemoveAll) -> Message:
        return await _chunked(self.service.remove_matching(req.tenant, None, req.force))

    def _remove_by_regex(self, req: RemoveByRegex) -> Any:
        try:
            rx = re.compile(req.pattern)
        except re.error:
            return self.service.remove_by_regex(req)  # answers INVALID_PARAMS at once
        return _chunked(self.service.remove_matching(req.tenant, rx, req.force))

    # ------------------------------------------------------------------ background

    async def _monitor(self) -> None:
        svc = self.service
        interval = self.config.monitor_interval
        while True:
            await asyncio.sleep(interval)
            # Move everything that survived the last interval out of the collector's sight.
            # The metadata (a million slotted records) holds no reference cycles and is freed
            # by reference counting; without this, each full collection walks all of it, which
            # measured 1-4 us per stored object amortised over a fill, and long pauses.
            gc.freeze()
            try:
                svc.expire_clients()
                svc.release_stale()
                if svc.sweep_needed:
                    removed = 0
                    for so_far in svc.sweep_dead():
                        removed = so_far
                        await asyncio.sleep(0)  # let requests in between chunks
                    if removed:
                        log.info("swept %d objects left without a live replica", removed)
            except Exception:
                # A bug here must not silently end liveness checking for the master's lifetime.
                log.exception("master monitor step failed")

    async def _reclaim_ticks(self) -> None:
        svc = self.service
        interval = self.config.reclaim_interval
        while True:
            await asyncio.sleep(interval)
            try:
                svc.hooks.tick(svc.now())
            except Exception:
                log.exception("reclaim tick failed")


async def _chunked(steps: Iterator[Message | None]) -> Message:
    """Run a chunked service operation, yielding to the loop between its chunks."""
    for step in steps:
        if step is not None:
            return step
        await asyncio.sleep(0)
    raise AssertionError("a chunked operation ended without a reply")
