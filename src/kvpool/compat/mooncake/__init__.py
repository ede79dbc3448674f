"""Mooncake Store's Python API on a kvpool pool: change an import, keep the program.

::

    # from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    from kvpool.compat.mooncake import MooncakeDistributedStore, ReplicateConfig

Modules (each imports only those above it):

    config.py       MooncakeConfig (MOONCAKE_* variables, JSON file), Mooncake's size units
    replicate.py    ReplicateConfig, SoftPinAction, ReplicaStatus, ObjectDataType → kvpool config
    memory.py       PointerRegistry (raw pointers resolved only inside registered memory),
                    BufferHandle, MooncakeHostMemAllocator
    descriptors.py  ReplicaDescriptor, Descriptor, QueryTaskResponse, 128-bit task ids
    setup.py        setup()'s two argument forms, validated
    lmcache_url.py  the master of LMCache's mooncakestore:// URL, for setup(dict) from LMCache
    numa.py         bind_to_numa_node
    names.py        segment names, Mooncake's ("host:port") ↔ kvpool's ("<endpoint>/<n>")
    calls.py        argument checks as pybind11 makes them; `answers`, the one decorator that
                    turns a closed store and faults into each call's Mooncake answer
    base.py         StoreBase: a store's state and the writes and reads its calls share
    writes.py       the put calls          reads.py     the get calls
    replicas.py     replica descriptors, copy and move tasks
    sessions.py     put and get sessions (ranged writes and reads in phases)
    segments.py     segments mounted after setup
    tensor.py       Mooncake's tensor object format (304-byte header + data), the tensor calls
    tensor_tp.py    the tensor-parallel (`*_with_tp*`), safetensors and CUDA tensor calls
    tensor_parallel.py  ParallelAxis, TensorParallelism, ReadTarget, `*_with_parallelism*`
    transfer_engine.py  the shim's `mooncake.engine.TransferEngine` (host memory over TCP)
    dummy.py        the link of a `setup_dummy` store to its standalone client
    store.py        MooncakeDistributedStore: the families above, plus setup, close, removal
    async_store.py  MooncakeDistributedStoreAsync (async_<method> coroutines)

docs/compat.md lists what matches Mooncake, what differs on purpose, and what is missing.
"""

from __future__ import annotations

from kvpool.compat.mooncake.async_store import MooncakeDistributedStoreAsync
from kvpool.compat.mooncake.config import MooncakeConfig
from kvpool.compat.mooncake.descriptors import (
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    QueryTaskResponse,
    ReplicaDescriptor,
)
from kvpool.compat.mooncake.memory import BufferHandle, MooncakeHostMemAllocator
from kvpool.compat.mooncake.numa import bind_to_numa_node
from kvpool.compat.mooncake.replicate import (
    ObjectDataType,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
)
from kvpool.compat.mooncake.store import MooncakeDistributedStore
from kvpool.compat.mooncake.tensor_parallel import ParallelAxis, ReadTarget, TensorParallelism

__all__ = [
    "BufferHandle",
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "MooncakeConfig",
    "MooncakeDistributedStore",
    "MooncakeDistributedStoreAsync",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "ParallelAxis",
    "QueryTaskResponse",
    "ReadTarget",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TaskStatus",
    "TaskType",
    "TensorParallelism",
    "bind_to_numa_node",
]
