"""Mooncake's `ReplicateConfig` and enums, and their translation to kvpool's `ReplicateConfig`.

Mooncake's config is a mutable object whose fields are set one by one (`cfg.replica_num = 2`),
with pybind11's conversions: a negative number for an unsigned field raises TypeError, an
unknown attribute raises AttributeError. This class behaves the same way, prints the same
`str()`, and also accepts the field Mooncake had until v0.3.12 (`with_soft_pin: bool`), which
integrations written against older wheels still set.

`to_native()` builds kvpool's frozen, validated `kvpool.client.ReplicateConfig` (cached until a
field changes, since one config object is usually reused for every put). Fields kvpool has no
tier for are refused as Mooncake refuses them on a build without the tier: NVMe-oF replicas with
INVALID_PARAMS, DFS replicas with DFS_SERVICE_UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import IntEnum
from typing import Any

from kvpool.client import ReplicateConfig as NativeReplicateConfig
from kvpool.client import SoftPinAction
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError

__all__ = [
    "ObjectDataType",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TaskStatus",
    "TaskType",
]


class ReplicaStatus(IntEnum):
    """A replica's state (Mooncake's `ReplicaStatus`, same numbers)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ObjectDataType(IntEnum):
    """What an object holds: a tag only, never used for placement (Mooncake's numbers)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class TaskType(IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(IntEnum):
    # The wheel's numbers and member order (SUCCESS is 3, FAILED 2; kvpool's native
    # TaskStatus numbers them the other way round).
    PENDING = 0
    PROCESSING = 1
    SUCCESS = 3
    FAILED = 2


_U64 = 1 << 64
_UNSIGNED = ("replica_num", "nof_replica_num", "dfs_replica_num")
_BOOLS = ("with_hard_pin", "prefer_alloc_in_same_node")
_LISTS = ("preferred_segments", "preferred_nof_segments")


def _unsigned(name: str, value: object) -> int:
    # pybind11 refuses what does not convert to an unsigned C++ integer with TypeError.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64:
        raise TypeError(f"{name}: incompatible value {value!r} (expected an unsigned int)")
    return value


def _str_list(name: str, value: object) -> list[str]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{name}: expected a list of str, got {type(value).__name__}")
    out = list(value)
    if not all(isinstance(x, str) for x in out):
        raise TypeError(f"{name}: expected a list of str, got {out!r}")
    return out


class ReplicateConfig:
    """How a put is replicated and protected (Mooncake's `ReplicateConfig`, field by field)."""

    __slots__ = (
        "_native",
        "data_type",
        "dfs_replica_num",
        "group_ids",
        "nof_replica_num",
        "prefer_alloc_in_same_node",
        "preferred_nof_segments",
        "preferred_segment",
        "preferred_segments",
        "replica_num",
        "soft_pin_action",
        "soft_pin_ttl_ms",
        "with_hard_pin",
    )

    _native: NativeReplicateConfig | None
    replica_num: int
    nof_replica_num: int
    dfs_replica_num: int
    soft_pin_action: SoftPinAction
    soft_pin_ttl_ms: int | None
    with_hard_pin: bool
    preferred_segments: list[str]
    preferred_segment: str
    preferred_nof_segments: list[str]
    prefer_alloc_in_same_node: bool
    data_type: ObjectDataType
    group_ids: list[str] | None

    def __init__(self, **fields: Any) -> None:
        self.replica_num = 1
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms = None
        self.with_hard_pin = False
        self.preferred_segments = []
        self.preferred_segment = ""
        self.preferred_nof_segments = []
        self.prefer_alloc_in_same_node = False
        self.data_type = ObjectDataType.UNKNOWN
        self.group_ids = None
        for name, value in fields.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _UNSIGNED:
            value = _unsigned(name, value)
        elif name == "soft_pin_ttl_ms":
            value = None if value is None else _unsigned(name, value)
        elif name == "soft_pin_action":
            value = SoftPinAction(value)
        elif name == "data_type":
            value = ObjectDataType(value)
        elif name in _BOOLS:
            value = bool(value)
        elif name in _LISTS:
            value = _str_list(name, value)
        elif name == "group_ids":
            value = None if value is None else _str_list(name, value)
        elif name == "preferred_segment" and not isinstance(value, str):
            raise TypeError(f"preferred_segment: expected a str, got {type(value).__name__}")
        object.__setattr__(self, name, value)
        if name != "_native":
            object.__setattr__(self, "_native", None)

    @property
    def with_soft_pin(self) -> bool:
        """Mooncake ≤ v0.3.12's field: True pins the object (soft_pin_action=ENABLE)."""
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, value: bool) -> None:
        self.soft_pin_action = SoftPinAction.ENABLE if value else SoftPinAction.PRESERVE

    def __str__(self) -> str:
        ttl = "default" if self.soft_pin_ttl_ms is None else str(self.soft_pin_ttl_ms)
        parts = [
            f"replica_num: {self.replica_num}",
            f"nof_replica_num: {self.nof_replica_num}",
            f"dfs_replica_num: {self.dfs_replica_num}",
            f"soft_pin_action: {self.soft_pin_action.name}",
            f"soft_pin_ttl_ms: {ttl}",
            f"with_hard_pin: {int(self.with_hard_pin)}",
            f"preferred_segments: [{', '.join(self.preferred_segments)}]",
        ]
        if self.preferred_segment:
            parts.append(f"preferred_segment (deprecated): {self.preferred_segment}")
        parts += [
            f"preferred_nof_segments: [{', '.join(self.preferred_nof_segments)}]",
            f"prefer_alloc_in_same_node: {int(self.prefer_alloc_in_same_node)}",
            f"data_type: {self.data_type.name}",
        ]
        if self.group_ids is not None:
            parts.append(f"group_ids: [{', '.join(self.group_ids)}]")
        return "ReplicateConfig: { " + ", ".join(parts) + " }"

    def to_native(self, segment_names: Callable[[list[str]], list[str]]) -> NativeReplicateConfig:
        """kvpool's config for this one; `segment_names` turns Mooncake segment names (a
        store's "host:port") into kvpool's. Raises the KVPoolError Mooncake's code stands for."""
        cached = self._native
        if cached is not None:
            return cached
        if self.nof_replica_num > 0:
            raise InvalidParams("nof_replica_num: kvpool has no NVMe-oF tier")
        if self.dfs_replica_num > 0:
            raise KVPoolError(
                "dfs_replica_num: no DFS tier is configured", ErrorCode.DFS_SERVICE_UNAVAILABLE
            )
        preferred = list(self.preferred_segments)
        if self.preferred_segment and self.preferred_segment not in preferred:
            preferred.append(self.preferred_segment)
        native = NativeReplicateConfig(
            replica_num=self.replica_num,
            soft_pin_action=self.soft_pin_action,
            soft_pin_ttl_ms=self.soft_pin_ttl_ms,
            with_hard_pin=self.with_hard_pin,
            preferred_segments=tuple(segment_names(preferred)),
            prefer_alloc_in_same_node=self.prefer_alloc_in_same_node,
            group_ids=tuple(self.group_ids) if self.group_ids is not None else None,
        )
        if not preferred:
            # Cached only without segment names: their translation depends on which stores
            # are open in this process at the time of the put.
            object.__setattr__(self, "_native", native)
        return native
