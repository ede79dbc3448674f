"""`mooncake.store` on kvpool: the names of Mooncake's module, from kvpool.compat.mooncake."""

from __future__ import annotations

from kvpool.compat.mooncake import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeConfig,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ObjectDataType,
    ParallelAxis,
    QueryTaskResponse,
    ReadTarget,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
    TensorParallelism,
    bind_to_numa_node,
)
from kvpool.compat.mooncake import tensor as _tensor

# Mooncake's private module functions over its tensor object format.
_serialize_tensor = _tensor.serialize_tensor
_deserialize_tensor = _tensor.deserialize_tensor
_tensor_metadata_size = _tensor.tensor_metadata_size

# Mooncake's module also exports each enum member at top level (pybind11 export_values()).
UNDEFINED, INITIALIZED, PROCESSING, COMPLETE, REMOVED, FAILED = list(ReplicaStatus)
(
    UNKNOWN,
    KVCACHE,
    TENSOR,
    WEIGHT,
    SAMPLE,
    ACTIVATION,
    GRADIENT,
    OPTIMIZER_STATE,
    METADATA,
    GENERAL,
) = list(ObjectDataType)
REPLICA_COPY, REPLICA_MOVE = list(TaskType)
PENDING, SUCCESS = TaskStatus.PENDING, TaskStatus.SUCCESS

__all__ = [
    "ACTIVATION",
    "COMPLETE",
    "FAILED",
    "GENERAL",
    "GRADIENT",
    "INITIALIZED",
    "KVCACHE",
    "METADATA",
    "OPTIMIZER_STATE",
    "PENDING",
    "PROCESSING",
    "REMOVED",
    "REPLICA_COPY",
    "REPLICA_MOVE",
    "SAMPLE",
    "SUCCESS",
    "TENSOR",
    "UNDEFINED",
    "UNKNOWN",
    "WEIGHT",
    "BufferHandle",
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "MooncakeConfig",
    "MooncakeDistributedStore",
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
