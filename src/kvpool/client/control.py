"""`Control`: the Store's calls that move no bytes, only ask or tell the master.

Queries (`exists`, `batch_exists`, `get_size`), removal (`remove`, `batch_remove`, `remove_all`,
`remove_by_regex`), replica tasks (`create_copy_task`, `create_move_task`, `query_task`: the
master assigns the copy to the node owning the source, whose `kvpool.client.tasks.TaskExecutor`
carries it out), `batch_replica_clear`, and the replica descriptors (`get_replica_desc`,
`batch_get_replica_desc`) that the Mooncake-compatible API exposes.

Each is one round trip; its answer's code becomes the exception of that code
(`raise_for_code`), a batch's per-key codes are returned, and a batch answer with a number of
entries other than the keys asked raises `RpcError` (RPC_FAIL).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kvpool.client.datapath import DataPath
from kvpool.client.node import NodeRuntime
from kvpool.client.validation import check_count, check_name, check_names
from kvpool.codes import OBJECT_NOT_FOUND, OK, REPLICA_IS_NOT_READY
from kvpool.errors import ErrorCode, InvalidParams, raise_for_code
from kvpool.protocol.messages import (
    BatchExistKey,
    BatchExistReply,
    BatchGetReplicaList,
    BatchRemove,
    BatchReplicaClear,
    BatchReplicaClearReply,
    BatchReplicaListReply,
    BatchReply,
    ClientId,
    CountReply,
    CreateCopyTask,
    CreateMoveTask,
    ExistKey,
    ExistReply,
    GetReplicaList,
    GetSize,
    QueryTask,
    QueryTaskReply,
    Remove,
    RemoveAll,
    RemoveByRegex,
    ReplicaDesc,
    ReplicaListReply,
    Reply,
    SegmentName,
    SizeReply,
    TaskReply,
    TaskStatus,
    TaskType,
    TenantId,
)

__all__ = ["Control", "TaskInfo"]

log = logging.getLogger(__name__)

_NO_FAULT = frozenset({OK, OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY})
"""Per-key answers of BatchExistKey that are outcomes, not faults."""


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What `Store.query_task` answers (the master's `QueryTaskReply`, without its code)."""

    task_id: str
    task_type: TaskType
    status: TaskStatus
    message: str
    key: str
    tenant: str
    executor: str
    created_s: float
    """On the master's clock: compare with `updated_s`, not with local time."""
    updated_s: float
    age_s: float
    """Seconds since the task was created."""

    @property
    def done(self) -> bool:
        """SUCCESS or FAILED: the task will not change any more."""
        return self.status in (TaskStatus.SUCCESS, TaskStatus.FAILED)


def _code(value: int) -> ErrorCode:
    """`ErrorCode.of`, without the enum lookup for the common OK (batches call it per key)."""
    return ErrorCode.OK if value == OK else ErrorCode.of(value)


def _descs(key: str, rep: ReplicaListReply) -> list[ReplicaDesc]:
    if rep.code in (ErrorCode.OBJECT_NOT_FOUND, ErrorCode.REPLICA_IS_NOT_READY):
        return []
    raise_for_code(rep.code, key)
    return list(rep.replicas)


class Control:
    """The control-plane calls of one Store (module docstring); the Store checks keys and
    patterns first, the task methods check their own arguments. Thread-safe; `opened`
    answers the Store's `DataPath`, or raises `StoreClosed`."""

    __slots__ = ("_node", "_opened", "tenant")

    def __init__(self, node: NodeRuntime, opened: Callable[[], DataPath], tenant: TenantId) -> None:
        self._node = node
        self._opened = opened
        self.tenant = tenant

    # ------------------------------------------------------------------ queries

    def exists(self, key: str) -> bool:
        self._opened()
        rep = self._node.rpc.call_as(ExistKey(key, self.tenant), ExistReply)
        raise_for_code(rep.code, key)
        return rep.exists

    def batch_exists(self, ks: list[str]) -> list[bool]:
        self._opened()
        if not ks:
            return []
        rep = self._node.rpc.call_as(BatchExistKey(ks, self.tenant), BatchExistReply)
        check_count("BatchExistKey", len(rep.results), len(ks))
        # One key's fault never sinks the batch: a key the master could not answer for does
        # not exist as far as a reader is concerned (it has no readable value now).
        out = [r.exists and r.code == OK for r in rep.results]
        bad = [(k, r.code) for k, r in zip(ks, rep.results, strict=True) if r.code not in _NO_FAULT]
        if bad:
            log.warning(
                "batch_exists: %d of %d keys answered an error (%r: %s); they answer False",
                len(bad),
                len(ks),
                bad[0][0],
                ErrorCode.of(bad[0][1]).name,
            )
        return out

    def get_size(self, key: str) -> int:
        self._opened()
        rep = self._node.rpc.call_as(GetSize(key, self.tenant), SizeReply)
        raise_for_code(rep.code, key)
        return rep.size

    # ------------------------------------------------------------------ removal

    def remove(self, key: str, force: bool) -> None:
        self._opened()
        rep = self._node.rpc.call_as(Remove(key, bool(force), self.tenant), Reply)
        raise_for_code(rep.code, key)

    def batch_remove(self, ks: list[str], force: bool) -> list[ErrorCode]:
        self._opened()
        if not ks:
            return []
        rep = self._node.rpc.call_as(BatchRemove(ks, bool(force), self.tenant), BatchReply)
        check_count("BatchRemove", len(rep.codes), len(ks))
        return [_code(c) for c in rep.codes]

    def remove_all(self, force: bool) -> int:
        self._opened()
        rep = self._node.rpc.call_as(RemoveAll(bool(force), self.tenant), CountReply)
        raise_for_code(rep.code, "RemoveAll")
        return rep.count

    def remove_by_regex(self, pattern: str, force: bool) -> int:
        self._opened()
        msg = RemoveByRegex(pattern, bool(force), self.tenant)
        rep = self._node.rpc.call_as(msg, CountReply)
        raise_for_code(rep.code, f"RemoveByRegex {pattern!r}")
        return rep.count

    # ------------------------------------------------------------------ replica tasks

    def create_copy_task(self, key: str, targets: object) -> str:
        self._opened()
        key = check_name(key, "key")
        names = [SegmentName(t) for t in check_names(targets, "targets")]
        rep = self._node.rpc.call_as(CreateCopyTask(key, names, self.tenant), TaskReply)
        raise_for_code(rep.code, f"copy task for {key!r}")
        return rep.task_id

    def create_move_task(self, key: str, source: str, target: str) -> str:
        self._opened()
        msg = CreateMoveTask(
            check_name(key, "key"),
            SegmentName(check_name(source, "source")),
            SegmentName(check_name(target, "target")),
            self.tenant,
        )
        rep = self._node.rpc.call_as(msg, TaskReply)
        raise_for_code(rep.code, f"move task for {key!r}")
        return rep.task_id

    def query_task(self, task_id: str) -> TaskInfo:
        self._opened()
        if not isinstance(task_id, str) or not task_id:
            raise InvalidParams(f"task_id: expected a non-empty str, got {task_id!r}")
        rep = self._node.rpc.call_as(QueryTask(task_id), QueryTaskReply)
        raise_for_code(rep.code, f"task {task_id}")
        return TaskInfo(
            task_id=rep.task_id,
            task_type=TaskType(rep.task_type),
            status=TaskStatus(rep.status),
            message=rep.message,
            key=rep.key,
            tenant=rep.tenant,
            executor=rep.executor,
            created_s=rep.created_s,
            updated_s=rep.updated_s,
            age_s=rep.age_s,
        )

    def batch_replica_clear(self, keys: object, segment_name: str) -> list[str]:
        self._opened()
        ks = check_names(keys, "keys")
        if not isinstance(segment_name, str):
            raise InvalidParams(f"segment_name: expected a str, got {segment_name!r}")
        msg = BatchReplicaClear(
            ks, ClientId(self._node.client_id), SegmentName(segment_name), self.tenant
        )
        rep = self._node.rpc.call_as(msg, BatchReplicaClearReply)
        raise_for_code(rep.code, "BatchReplicaClear")
        return list(rep.cleared)

    # ------------------------------------------------------------------ replica descriptors

    def get_replica_desc(self, key: str) -> list[ReplicaDesc]:
        self._opened()
        key = check_name(key, "key")
        rep = self._node.rpc.call_as(GetReplicaList(key, self.tenant), ReplicaListReply)
        return _descs(key, rep)

    def batch_get_replica_desc(self, keys: object) -> dict[str, list[ReplicaDesc]]:
        self._opened()
        ks = check_names(keys, "keys")
        if not ks:
            return {}
        rep = self._node.rpc.call_as(BatchGetReplicaList(ks, self.tenant), BatchReplicaListReply)
        check_count("BatchGetReplicaList", len(rep.results), len(ks))
        return {k: _descs(k, r) for k, r in zip(ks, rep.results, strict=True)}
