"""What Mooncake's replica and task calls answer: descriptors, task responses, 128-bit ids.

* `get_replica_desc(key)` answers `ReplicaDescriptor`s: `.status` (a `ReplicaStatus`),
  `.is_memory_replica()`, `.get_memory_descriptor().buffer_descriptor` → `Descriptor(size,
  buffer_address, transport_endpoint)`. Asking a memory replica for its disk descriptor (or
  the reverse) raises RuntimeError, as pybind11's `std::get` does in the wheel.
* `create_copy_task` / `create_move_task` answer `(task id, code)`, `query_task(task id)`
  answers `(QueryTaskResponse | None, code)`. Mooncake's ids are UUIDs bound as pairs of
  unsigned 64-bit ints `(high, low)`; kvpool's task and client ids are UUID hex strings, so
  each maps to exactly one pair and back (`uuid_pair`, `uuid_hex`).

kvpool addresses a replica by segment and offset, not by a pointer in the owner's process, so
`Descriptor.buffer_address` is the replica's offset in its segment (docs/compat.md).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

from kvpool.compat.mooncake.replicate import ReplicaStatus, TaskStatus, TaskType

__all__ = [
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "QueryTaskResponse",
    "ReplicaDescriptor",
    "uuid_hex",
    "uuid_pair",
]

_U64 = (1 << 64) - 1
NO_ID: tuple[int, int] = (0, 0)
"""The id Mooncake answers with a failed create_*_task."""


def uuid_pair(hex_id: str) -> tuple[int, int]:
    """A UUID hex string (kvpool) as Mooncake's `(high, low)` pair; (0, 0) when not one."""
    try:
        value = int(hex_id, 16)
    except ValueError:
        return NO_ID
    if len(hex_id) != 32 or value < 0:
        return NO_ID
    return value >> 64, value & _U64


def uuid_hex(pair: object) -> str:
    """Mooncake's `(high, low)` pair as kvpool's UUID hex string; TypeError for anything
    else (pybind11 refuses an argument that is not `tuple[int, int]`)."""
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise TypeError(f"task_id: expected tuple[int, int], got {pair!r}")
    high, low = (operator.index(x) for x in pair)
    if not (0 <= high <= _U64 and 0 <= low <= _U64):
        raise TypeError(f"task_id: {pair!r} is not a pair of unsigned 64-bit ints")
    return f"{(high << 64) | low:032x}"


@dataclass(slots=True)
class Descriptor:
    """Where a memory replica's bytes are: `size` bytes at `buffer_address` (kvpool: the
    offset in the segment) of the store named `transport_endpoint`."""

    size: int = 0
    buffer_address: int = 0
    transport_endpoint: str = ""

    def __repr__(self) -> str:
        return (
            f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
            f"transport_endpoint={self.transport_endpoint}>"
        )


@dataclass(slots=True)
class MemoryDescriptor:
    buffer_descriptor: Descriptor = field(default_factory=Descriptor)


@dataclass(slots=True)
class DiskDescriptor:
    file_path: str = ""
    object_size: int = 0


@dataclass(slots=True)
class ReplicaDescriptor:
    """One replica of an object (what `get_replica_desc` lists)."""

    status: ReplicaStatus
    _memory: MemoryDescriptor | None = None
    _disk: DiskDescriptor | None = None
    _local_disk: bool = False

    def is_memory_replica(self) -> bool:
        return self._memory is not None

    def is_disk_replica(self) -> bool:
        return self._disk is not None and not self._local_disk

    def is_local_disk_replica(self) -> bool:
        return self._disk is not None and self._local_disk

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if self._memory is None:
            raise RuntimeError("Expected MemoryDescriptor")
        return self._memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        if self._disk is None:
            raise RuntimeError("Expected DiskDescriptor")
        return self._disk


@dataclass(slots=True)
class QueryTaskResponse:
    """A task's state, as Mooncake's `query_task` answers it."""

    id: tuple[int, int] = NO_ID
    type: TaskType = TaskType.REPLICA_COPY
    status: TaskStatus = TaskStatus.PENDING
    created_at_ms_epoch: int = 0
    last_updated_at_ms_epoch: int = 0
    assigned_client: tuple[int, int] = NO_ID
    message: str = ""

    def __repr__(self) -> str:
        return (
            f"QueryTaskResponse(id={self.id[0]}-{self.id[1]}, type={int(self.type)}, "
            f"status={int(self.status)}, created_at={self.created_at_ms_epoch}, "
            f"last_updated_at={self.last_updated_at_ms_epoch}, "
            f"assigned_client={self.assigned_client[0]}-{self.assigned_client[1]}, "
            f'message="{self.message}")'
        )
