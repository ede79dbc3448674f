"""kvpool.cache: the engine-side tiered storage manager of seed 003 (LMCache v1 style).

An inference engine keeps KV chunks in local memory (L1, `L1Manager`) and, through a
`StorageManager`, replicates them to and prefetches them from any number of L2 stores
(filesystem, Redis, S3, the kvpool pool, plugins) behind the asynchronous `L2Adapter` contract
(submit → eventfd → query). See README.md in this package for the layers, threads and the
invariants with where each is enforced. Adapters are imported only when configured.
"""

from __future__ import annotations

from kvpool.cache.adapters.base import L2Adapter, L2TaskId, StoreResult
from kvpool.cache.adapters.registry import (
    AdapterConfig,
    adapter_types,
    create_adapter,
    register_adapter,
)
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.config import StorageManagerConfig, storage_manager_options
from kvpool.cache.keys import DEFAULT_CHUNK_SIZE, ObjectKey, TokenHasher, compute_kv_rank
from kvpool.cache.l1 import L1Config, L1Listener, L1Manager, L1Result, L1Status
from kvpool.cache.manager import PrefetchHandle, StorageManager
from kvpool.cache.memory import MemoryLayout, MemoryObj
from kvpool.cache.policy import (
    PrefetchPolicy,
    StorePolicy,
    register_prefetch_policy,
    register_store_policy,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "AdapterConfig",
    "Bitmap",
    "L1Config",
    "L1Listener",
    "L1Manager",
    "L1Result",
    "L1Status",
    "L2Adapter",
    "L2TaskId",
    "MemoryLayout",
    "MemoryObj",
    "ObjectKey",
    "PrefetchHandle",
    "PrefetchPolicy",
    "StorageManager",
    "StorageManagerConfig",
    "StorePolicy",
    "StoreResult",
    "TokenHasher",
    "adapter_types",
    "compute_kv_rank",
    "create_adapter",
    "register_adapter",
    "register_prefetch_policy",
    "register_store_policy",
    "storage_manager_options",
]
