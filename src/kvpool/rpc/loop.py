"""Event loops for kvpool servers: uvloop when it is installed, asyncio's own loop otherwise.

uvloop answers more round trips per second than asyncio's own loop for a Protocol server (the
RPC figures in docs/performance.md are measured with it), but it stays optional (the ``fast``
extra). Setting the environment
variable ``KVPOOL_UVLOOP=0`` forces the standard loop, for comparisons and for debugging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from kvpool.config import env

__all__ = ["new_event_loop", "run", "uvloop_available"]

T = TypeVar("T")


def uvloop_available() -> bool:
    """Whether `new_event_loop` will return a uvloop loop."""
    if env("UVLOOP", "1") == "0":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop of the fastest kind available; the caller owns and closes it."""
    if uvloop_available():
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a loop from `new_event_loop` (for `kvpool master` and friends)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
