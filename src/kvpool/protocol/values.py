"""The value types the master's messages are made of: ids, enums, and the Structs shared by
requests and replies (`SegmentInfo`, `ReplicaDesc`, `ReplicateConfigMsg`).

messages.py defines the messages themselves, describes the protocol's lifecycles, and
re-exports every name here, so `from kvpool.protocol.messages import ReplicaDesc` keeps working.
Moving a Struct between these modules changes nothing on the wire: a tag is the class name.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NewType

import msgspec

__all__ = [
    "DEFAULT_REPLICATE_CONFIG",
    "DEFAULT_TENANT",
    "ClientId",
    "ClientStatus",
    "HostId",
    "Message",
    "ReplicaDesc",
    "ReplicaKind",
    "ReplicaStatus",
    "ReplicateConfigMsg",
    "SegmentInfo",
    "SegmentName",
    "SoftPinAction",
    "TaskStatus",
    "TaskType",
    "TenantId",
    "TenantUsage",
]

ClientId = NewType("ClientId", str)
"""A client's own id: uuid4 hex, made by the client, stable for its lifetime."""
SegmentName = NewType("SegmentName", str)
"""A segment's pool-wide unique name (chosen by the node that mounts it)."""
HostId = NewType("HostId", str)
"""Identifies a machine (`kvpool.transfer.host_id()`); same host means shm is reachable."""
TenantId = NewType("TenantId", str)
"""Object namespace; keys of different tenants never collide."""

DEFAULT_TENANT = TenantId("default")


class ReplicaKind(IntEnum):
    """Where a replica's bytes live (Mooncake's ReplicaType numbers)."""

    MEMORY = 0
    DISK = 1
    LOCAL_DISK = 2
    NOF_SSD = 3
    DFS = 100


class ReplicaStatus(IntEnum):
    """A replica's state (Mooncake's numbers). PROCESSING → COMPLETE at PutEnd."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ClientStatus(IntEnum):
    """What a Ping tells the client: carry on, or mount everything again."""

    UNDEFINED = 0
    OK = 1
    NEED_REMOUNT = 2


class TaskType(IntEnum):
    """What a replica task does."""

    COPY = 0
    """Add replicas on the target segments; the source stays."""
    MOVE = 1
    """Replace the source replica by one on the target segment, then free the source."""


class TaskStatus(IntEnum):
    """A replica task's state (Mooncake's TaskStatus): PENDING until an executor fetches it,
    PROCESSING while it copies, then SUCCESS or FAILED (final)."""

    PENDING = 0
    PROCESSING = 1
    SUCCESS = 2
    FAILED = 3


class SoftPinAction(IntEnum):
    """Soft pin request of a put: keep the current pin, pin for a TTL, or unpin."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class Message(msgspec.Struct, tag=True, array_like=True):
    """Base of every master message: tagged with the class name, encoded as an array."""


class SegmentInfo(Message):
    """A memory segment as the pool sees it.

    `endpoint` is the `host:port` of the owner's transfer server; `shm_path` is what a same-host
    peer opens and maps ("" when not shareable); `client_id` is the owner (filled in by the
    master in replies; ignored in mount requests, where the request's client_id counts).
    `generation` is a random 64-bit number the node draws when it creates the segment's memory
    (0: none given): a remount naming a segment the master holds as silent restores it, with
    its objects, only when name and generation match (docs/parts/reliability.md).
    `kind` is the tier of the segment's bytes: MEMORY, or LOCAL_DISK for a node's disk tier
    (a preallocated file; never counted as memory, never chosen for a put: docs/parts/tiers.md).
    """

    name: SegmentName
    size: int
    host_id: HostId = HostId("")
    endpoint: str = ""
    shm_path: str = ""
    client_id: ClientId = ClientId("")
    generation: int = 0
    kind: ReplicaKind = ReplicaKind.MEMORY


class ReplicaDesc(Message):
    """One replica of an object: read or write `size` bytes at `offset` of `segment`."""

    replica_id: int
    kind: ReplicaKind
    status: ReplicaStatus
    segment: SegmentName
    offset: int
    size: int
    endpoint: str = ""


class ReplicateConfigMsg(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """How a put wants its object placed and kept (Mooncake's ReplicateConfig).

    `soft_pin_ttl_ms` is only allowed with ENABLE (None there means the master's default);
    `exclude_segments` (kvpool's own, last so older peers still decode) are never chosen;
    `group_ids` is an annotation, one per key of the request (or None), that never affects
    routing and cannot change while the object exists. Frozen (and so not a `Message`
    subclass) because one shared instance is the default of every put request.
    """

    replica_num: int = 1
    soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
    soft_pin_ttl_ms: int | None = None
    with_hard_pin: bool = False
    preferred_segments: list[SegmentName] = []
    prefer_alloc_in_same_node: bool = False
    group_ids: list[str] | None = None
    exclude_segments: list[SegmentName] = []
    """Segments that must get no replica of this put (a Store retrying a put whose write to
    them failed: their node died, and the master may not know yet)."""
    dfs_replica_num: int = 0
    """Replicas in the master's DFS directory (`--dfs-root`; 0 or 1), written by the client."""


DEFAULT_REPLICATE_CONFIG = ReplicateConfigMsg()


class TenantUsage(Message):
    """One tenant in a `StatsReply`: the bytes its replicas hold (memory, disk and DFS, each replica counted) and its quota (None: none)."""

    name: TenantId
    used: int
    quota: int | None = None
