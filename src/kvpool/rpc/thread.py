"""`ServerThread`: an `RpcServer` (or a service wrapping one) on its own loop in a thread.

For tests, benchmarks and for embedding a service (the master) in a process whose main thread is
synchronous. Anything with the `Serving` shape runs: ``await start()``, ``await close()``,
``address`` and ``endpoint`` (an `RpcServer`, or `MasterServer` which adds background tasks). The thread owns the loop: it creates it (uvloop when available), starts the server,
runs until `stop()`, then closes the server, cancels what is left and closes the loop. Other
threads reach the loop only through `submit()` / `call_soon()`, which hand work over safely.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final, Generic, Protocol, TypeVar

from kvpool.errors import KVPoolError, StoreClosed
from kvpool.rpc.loop import new_event_loop

__all__ = ["ServerThread", "Serving"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Serving(Protocol):
    """What `ServerThread` runs."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def address(self) -> tuple[str, int]: ...

    @property
    def endpoint(self) -> str: ...


S = TypeVar("S", bound=Serving)

_START_TIMEOUT_S: Final = 30.0


class ServerThread(Generic[S]):
    """Runs `server` in a daemon thread; `start()` returns once it listens.

    Use as a context manager or call `stop()` (idempotent); either joins the thread. Never
    call `stop()` from the server's own loop (it waits for that loop to finish).
    """

    def __init__(self, server: S, *, name: str = "kvpool-rpc-server") -> None:
        self.server = server
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._stopped = False

    def start(self) -> ServerThread[S]:
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            raise KVPoolError(f"{self.name} did not start in {_START_TIMEOUT_S} s")
        error, self._startup_error = self._startup_error, None
        if error is not None:
            self._thread.join()
            # Not kept: its traceback holds _run's frame, which holds this object (a cycle).
            raise error
        return self

    def _run(self) -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:
                self._startup_error = exc
                return
            self._loop = loop
            self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self.server.close())
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        except Exception:
            log.exception("%s failed", self.name)
        finally:
            self._loop = None
            asyncio.set_event_loop(None)
            loop.close()
            self._ready.set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise StoreClosed("server thread is not running")
        return self._loop

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    @property
    def endpoint(self) -> str:
        """``"host:port"`` for `RpcClient`."""
        return self.server.endpoint

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run `coro` on the server's loop; the future resolves in the calling thread's world."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run `fn()` on the server's loop soon (fire and forget)."""
        self.loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float = 10.0) -> None:
        """Close the server and every connection, stop the loop, join the thread. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self.server.close(), loop).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError):
                log.warning("%s: server close did not finish in %s s", self.name, timeout)
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.error("%s did not stop within %s s", self.name, timeout)

    def __enter__(self) -> ServerThread[S]:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
