"""`mooncake.async_store` on kvpool: `MooncakeDistributedStoreAsync` (async_<method> coroutines)."""

from __future__ import annotations

from kvpool.compat.mooncake.async_store import MooncakeDistributedStoreAsync

__all__ = ["MooncakeDistributedStoreAsync"]
