"""Mooncake's replica calls: replica descriptors, copy and move tasks, clearing replicas.

The answers have the wheel's shapes (descriptors.py): descriptors name segments as stores name
themselves (`get_hostname()`, names.py), task ids are `(high, low)` pairs of 64-bit ints, a
refused task is `((0, 0), code)`, a task's times are epoch milliseconds of this host.
"""

from __future__ import annotations

import time
from typing import Final

from kvpool.client import Store
from kvpool.codes import (
    INVALID_PARAMS,
    OK,
    REPLICA_NOT_FOUND,
    SEGMENT_NOT_FOUND,
    UNAVAILABLE_IN_CURRENT_STATUS,
)
from kvpool.compat.mooncake import names
from kvpool.compat.mooncake.base import StoreBase
from kvpool.compat.mooncake.calls import answers, as_code, check_key, check_keys, check_names
from kvpool.compat.mooncake.descriptors import (
    NO_ID,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    QueryTaskResponse,
    ReplicaDescriptor,
    uuid_hex,
    uuid_pair,
)
from kvpool.compat.mooncake.replicate import ReplicaStatus, TaskStatus, TaskType
from kvpool.protocol.messages import ReplicaDesc, ReplicaKind

__all__ = ["Replicas"]

TaskAnswer = tuple[tuple[int, int], int]

_BAD_SEGMENT: Final = (SEGMENT_NOT_FOUND, REPLICA_NOT_FOUND)
"""Refusals Mooncake calls a bad argument (-600, checked on the wheel): a segment that does not
exist, a move source that holds no replica of the key."""


def _refused_task(code: int, *_: object) -> TaskAnswer:
    return NO_ID, INVALID_PARAMS if code in _BAD_SEGMENT else code


def _no_replicas(code: int, *_: object) -> list[ReplicaDescriptor]:
    return []


def _no_replicas_of(code: int, keys: list[str], *_: object) -> dict[str, list[ReplicaDescriptor]]:
    return {k: [] for k in keys}


class Replicas(StoreBase):
    """The replica and task calls of `MooncakeDistributedStore`."""

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """The replicas of `key` ([] when missing, still being written, or on any failure);
        grants a read lease, as a get does."""
        return self._replica_desc(check_key(key))

    @answers(_no_replicas)
    def _replica_desc(self, store: Store, key: str) -> list[ReplicaDescriptor]:
        return [_replica_descriptor(d) for d in store.get_replica_desc(key)] if key else []

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]:
        """get_replica_desc of every key, in one round trip: key → its replicas."""
        return self._batch_replica_desc(check_keys(keys))

    @answers(_no_replicas_of)
    def _batch_replica_desc(
        self, store: Store, keys: list[str]
    ) -> dict[str, list[ReplicaDescriptor]]:
        out: dict[str, list[ReplicaDescriptor]] = {k: [] for k in keys}
        valid = [k for k in dict.fromkeys(keys) if k]
        if valid:
            for k, descs in store.batch_get_replica_desc(valid).items():
                out[k] = [_replica_descriptor(d) for d in descs]
        return out

    def create_copy_task(self, key: str, targets: list[str]) -> TaskAnswer:
        """Copy `key` to one new replica on each target segment (store hostnames, as
        `get_hostname()` and `Descriptor.transport_endpoint` name them): `(task id, 0)`, or
        `((0, 0), code)`. The copy runs in the store that owns the source replica."""
        return self._copy_task(check_key(key), check_names(targets, "targets"))

    @answers(_refused_task)
    def _copy_task(self, store: Store, key: str, targets: list[str]) -> TaskAnswer:
        segments = names.pool_names(targets)
        if not key or not segments:
            return NO_ID, INVALID_PARAMS
        return uuid_pair(store.create_copy_task(key, segments)), OK

    def create_move_task(self, key: str, source: str, target: str) -> TaskAnswer:
        """Move `key`'s replica on segment `source` to segment `target`: `(task id, 0)`, or
        `((0, 0), code)`."""
        k = check_key(key)
        src, dst = check_names([source, target], "source and target")
        return self._move_task(k, src, dst)

    @answers(_refused_task)
    def _move_task(self, store: Store, key: str, source: str, target: str) -> TaskAnswer:
        s, t = names.pool_names([source])[:1], names.pool_names([target])[:1]
        if not key or not s or not t or s == t:
            return NO_ID, INVALID_PARAMS
        return uuid_pair(store.create_move_task(key, s[0], t[0])), OK

    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        """A task's state: `(QueryTaskResponse, 0)`, or `(None, code)` (-1400 for a task the
        master does not know). `task_id` is the `(high, low)` pair create_*_task answered."""
        hex_id = uuid_hex(task_id)
        store = self._store
        if store is None:
            return None, UNAVAILABLE_IN_CURRENT_STATUS
        try:
            info = store.query_task(hex_id)
        except Exception as exc:
            return None, as_code(exc)
        # The master's times are on its own clock; Mooncake answers epoch milliseconds, so
        # they are placed on this host's wall clock by the task's age.
        created_ms = int(time.time() * 1000 - info.age_s * 1000)
        updated_ms = created_ms + int((info.updated_s - info.created_s) * 1000)
        return (
            QueryTaskResponse(
                id=uuid_pair(info.task_id),
                type=TaskType.REPLICA_MOVE
                if info.task_type.name == "MOVE"
                else TaskType.REPLICA_COPY,
                status=TaskStatus[info.status.name],
                created_at_ms_epoch=created_ms,
                last_updated_at_ms_epoch=updated_ms,
                assigned_client=uuid_pair(info.executor),
                message=info.message,
            ),
            OK,
        )

    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """Drop the replicas of this store's own objects among `keys` whose lease has expired
        (all of them, or only those on `segment_name`); the keys cleared ([] on failure)."""
        ks = check_keys(keys)
        if not isinstance(segment_name, str):
            raise TypeError("segment_name: expected str")
        store = self._store
        valid = [k for k in dict.fromkeys(ks) if k]
        if store is None or not valid:
            return []
        segments = names.pool_names([segment_name]) if segment_name else [""]
        cleared: dict[str, None] = {}
        try:
            for segment in segments:
                cleared.update(dict.fromkeys(store.batch_replica_clear(valid, segment)))
        except Exception as exc:
            as_code(exc)  # logged when unexpected; the keys cleared so far are the answer
        return list(cleared)


def _replica_descriptor(desc: ReplicaDesc) -> ReplicaDescriptor:
    status = ReplicaStatus(int(desc.status))
    if desc.kind == ReplicaKind.MEMORY:
        where = Descriptor(desc.size, desc.offset, names.mooncake_name(desc.segment))
        return ReplicaDescriptor(status, MemoryDescriptor(where))
    disk = DiskDescriptor(desc.segment, desc.size)
    return ReplicaDescriptor(status, None, disk, desc.kind == ReplicaKind.LOCAL_DISK)
