"""`MooncakeDistributedStoreAsync`: every method also as a coroutine, `async_<name>`.

Mooncake's `mooncake.async_store` offers this for asyncio programs (its own test scripts use
it): `await store.async_put(key, value)` runs `store.put(key, value)` in the event loop's
default executor, so the loop is never blocked by a transfer. Same here, over the compat store.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from kvpool.compat.mooncake.store import MooncakeDistributedStore

__all__ = ["MooncakeDistributedStoreAsync"]

_PREFIX = "async_"


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """MooncakeDistributedStore plus `async_<method>` for each of its methods."""

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        # Only called for attributes that do not exist, so the sync methods are untouched.
        if not name.startswith(_PREFIX):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        sync = getattr(self, name[len(_PREFIX) :], None)
        if not callable(sync):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        @functools.wraps(sync)
        async def run(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(sync, *args, **kwargs))

        setattr(self, name, run)  # built once per name and instance
        return run
