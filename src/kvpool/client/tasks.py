"""Replica copy/move tasks, the node's side: `TaskExecutor`, and the Store's task API.

The master never touches bytes (see `kvpool.master.tasks` and docs/parts/master.md): a copy or
a move of a replica is a task that it assigns to the client owning the source segment (or to a
live client with a segment on the source's host), with the destination ranges already
allocated. This module is what such a client runs:

* `TaskExecutor`: a daemon thread per node (a `kvpool node`, or a `Store` with a segment). It
  sends `FetchTasks(client_id, max_tasks)` every `poll_interval` (50 ms: pool-mode eviction
  swaps objects out through tasks while a put may be waiting for the space), and at once when
  a Ping answers `pending_tasks > 0` or a task just finished (there may be more). For each
  task it holds the source's mapping (the source is on this host by the master's choice; a
  source it cannot map is first read into a buffer through the engine), checks the bytes
  against the object's checksum (xxh3_64, when the writer recorded one: a corrupt source must
  not be copied into a healthy-looking replica), writes them to every target through the
  `DataPath` (memcpy / mapped shm on this host, TCP to other hosts), and reports
  `MarkTaskComplete(ok, message)` once. A report the master answers with
  OBJECT_NO_REPLICATION_TASK (the task already ended: timed out, object removed) is normal.
* `TaskAPI`: the Store's methods that create and query tasks (`create_copy_task`,
  `create_move_task`, `query_task`), `batch_replica_clear`, and the replica descriptors
  (`get_replica_desc`, `batch_get_replica_desc`) that the Mooncake-compatible API exposes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from kvpool.client.datapath import DataPath
from kvpool.client.node import NodeRuntime
from kvpool.client.replica import checksum
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, raise_for_code
from kvpool.protocol.messages import (
    BatchGetReplicaList,
    BatchReplicaClear,
    BatchReplicaClearReply,
    BatchReplicaListReply,
    ClientId,
    CreateCopyTask,
    CreateMoveTask,
    FetchTasks,
    FetchTasksReply,
    GetReplicaList,
    MarkTaskComplete,
    QueryTask,
    QueryTaskReply,
    ReplicaDesc,
    ReplicaListReply,
    ReplicaTask,
    Reply,
    SegmentName,
    TaskReply,
    TaskStatus,
    TaskType,
    TenantId,
)
from kvpool.transfer.request import TransferOp

__all__ = ["TaskAPI", "TaskExecutor", "TaskInfo", "TaskStats"]

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S: Final = 0.05
REPORT_BYTES: Final = 1 << 20
"""Completed tasks are reported at least every this many bytes copied (and at the end of a
fetch), so that a batch of large copies does not hold back the first one's report."""
MAX_IDLE_BACKOFF_S: Final = 2.0
"""Longest wait between fetches while the master keeps refusing them (an older master without
tasks, or one that is down); the heartbeat handles reconnects."""


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


@dataclass(slots=True)
class TaskStats:
    """What a `TaskExecutor` did (read by tests and status lines)."""

    fetches: int = 0
    succeeded: int = 0
    failed: int = 0
    bytes_copied: int = 0
    fetch_errors: int = 0


class TaskExecutor:
    """Fetches and runs the replica tasks the master assigns to `node` (module docstring).

    `data` moves the bytes; its engine must have this process's own segments attached
    (`attach_local`) so that a source here is copied with memcpy. Thread-safe: `wake()` may be
    called from any thread (the heartbeat calls it); `run_once()` is what the thread loops on
    and is public for tests.
    """

    def __init__(
        self,
        node: NodeRuntime,
        data: DataPath,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        max_tasks: int = 16,
        verify_checksum: bool = True,
    ) -> None:
        if poll_interval <= 0:
            raise InvalidParams(f"task poll interval must be > 0 s, got {poll_interval}")
        if max_tasks < 1:
            raise InvalidParams(f"max_tasks must be >= 1, got {max_tasks}")
        self.node = node
        self.data = data
        self.poll_interval = poll_interval
        self.max_tasks = max_tasks
        self.verify_checksum = verify_checksum
        self.stats = TaskStats()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one fetch-and-run at a time
        self._thread = threading.Thread(
            target=self._run, name=f"kvpool-tasks-{node.client_id[:8]}", daemon=True
        )

    def start(self) -> TaskExecutor:
        self._thread.start()
        return self

    def wake(self) -> None:
        """Fetch now instead of at the next poll (the master said tasks are pending)."""
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (a task being copied finishes and is reported first). Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        delay = self.poll_interval
        while not self._stop.is_set():
            # Cleared before fetching: a wake() that arrives during the fetch is not lost.
            self._wake.clear()
            try:
                ran = self.run_once()
                delay = self.poll_interval
            except Exception as exc:
                # The master is unreachable or does not know FetchTasks: back off quietly,
                # the heartbeat owns reconnecting. Anything else is a bug: say so, go on.
                self.stats.fetch_errors += 1
                if not isinstance(exc, KVPoolError):
                    log.exception("task executor: unexpected failure")
                elif self.stats.fetch_errors == 1:
                    log.warning("FetchTasks failed (will keep trying): %s", exc)
                ran = 0
                delay = min(delay * 2, MAX_IDLE_BACKOFF_S)
            if ran:
                continue  # a full or busy queue: fetch again at once
            self._wake.wait(delay)

    def run_once(self) -> int:
        """Fetch up to `max_tasks` tasks and run each; returns how many were run. Raises
        the RPC's error when the fetch itself fails.

        Reports go out pipelined (`call_many`), after every REPORT_BYTES copied and at the
        end: one round trip per report was most of a small move (400 x 64 KiB moves:
        2.1k/s reporting one by one).
        """
        with self._lock:
            if self.node.closed:
                return 0
            reply = self.node.rpc.call_as(
                FetchTasks(self.node.client_id, self.max_tasks), FetchTasksReply
            )
            self.stats.fetches += 1
            if reply.code == ErrorCode.CLIENT_NOT_FOUND:
                return 0  # not registered (yet, or again): the heartbeat remounts
            raise_for_code(reply.code, "FetchTasks")
            done: list[MarkTaskComplete] = []
            copied = 0
            for task in reply.tasks:  # all of them: a fetched task is ours to report
                done.append(self._run_task(task))
                copied += task.size * len(task.targets)
                if copied >= REPORT_BYTES:
                    self._report(done)
                    done, copied = [], 0
            self._report(done)
            return len(reply.tasks)

    def _run_task(self, task: ReplicaTask) -> MarkTaskComplete:
        try:
            message = self._copy(task)
        except KVPoolError as exc:
            message = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug must fail the task, not kill the thread
            log.exception("task %s (%s) crashed", task.task_id, task.key)
            message = f"internal error: {exc!r}"
        ok = message == ""
        if ok:
            self.stats.succeeded += 1
            self.stats.bytes_copied += task.size * len(task.targets)
        else:
            self.stats.failed += 1
            log.warning(
                "task %s (%s of %r) failed: %s",
                task.task_id,
                task.task_type.name,
                task.key,
                message,
            )
        return MarkTaskComplete(self.node.client_id, task.task_id, ok, message)

    def _report(self, reports: list[MarkTaskComplete]) -> None:
        if not reports:
            return
        try:
            replies = self.node.rpc.call_many(reports, return_exceptions=True)
        except KVPoolError as exc:
            # The master fails the tasks by itself (timeout, or when we expire).
            log.warning("reporting %d task(s) failed: %s", len(reports), exc)
            return
        for report, reply in zip(reports, replies, strict=True):
            if not isinstance(reply, Reply):
                log.warning("reporting task %s failed: %s", report.task_id, reply)
            elif reply.code == ErrorCode.OBJECT_NO_REPLICATION_TASK:
                log.info(
                    "task %s had already ended at the master (timeout, removal)", report.task_id
                )
            elif reply.code != ErrorCode.OK:
                log.warning(
                    "MarkTaskComplete %s answered %s", report.task_id, ErrorCode.of(reply.code)
                )

    def _copy(self, task: ReplicaTask) -> str:
        """Copy the task's source to every target; returns "" on success, else why not."""
        src = task.source
        size = task.size
        if src.size < size or any(t.size < size for t in task.targets):
            return f"a replica is smaller than the object ({size} bytes)"
        if not task.targets:
            return "no targets"
        self.data.learn(task.segments)
        engine = self.data.engine
        hold = None
        with contextlib.ExitStack() as stack:
            try:
                hold = stack.enter_context(engine.hold_segment(src.segment))
            except KVPoolError:
                hold = None  # not mappable here: read it through the engine
            if hold is not None:
                mem = hold.buffer
                if src.offset + size > mem.nbytes:
                    return f"source range {src.offset}+{size} is outside {src.segment}"
                view = mem[src.offset : src.offset + size]
                # Released before the hold (callbacks run last-in first-out): a slice that
                # outlived the hold would keep the mapping from being unmapped.
                stack.callback(view.release)
            else:
                buf = bytearray(size)
                view = memoryview(buf)
                code = self.data.move_many(
                    TransferOp.READ, [view], [src.segment], [src.offset], False
                )[0][0]
                if code != ErrorCode.OK:
                    return f"reading the source on {src.segment} failed: {code.name}"
            if self.verify_checksum and task.checksum is not None:
                got = checksum(view)
                if got != task.checksum:
                    return (
                        f"source bytes on {src.segment} hash to {got:#018x}, the object's "
                        f"checksum is {task.checksum:#018x}"
                    )
            targets = task.targets
            codes, _ = self.data.move_many(
                TransferOp.WRITE,
                [view] * len(targets),
                [t.segment for t in targets],
                [t.offset for t in targets],
                False,
            )
        bad = [(t.segment, c) for t, c in zip(targets, codes, strict=True) if c != ErrorCode.OK]
        if bad:
            return "writing " + ", ".join(f"{seg}: {code.name}" for seg, code in bad) + " failed"
        return ""


class TaskAPI:
    """The Store's replica-task and replica-descriptor methods (mixed into `Store`)."""

    _node: NodeRuntime
    tenant: TenantId

    def _open(self) -> DataPath:  # provided by Store
        raise NotImplementedError

    def create_copy_task(self, key: str, targets: Sequence[str]) -> str:
        """Ask the master to copy `key`'s bytes to one new replica on each of `targets`
        (segment names); returns the task id. The copy runs on the node that owns the
        source replica; follow it with `query_task`. Raises the master's refusal
        (ObjectNotFound, NoSpace, OBJECT_HAS_REPLICATION_TASK, ...)."""
        self._open()
        key = _segment(key, "key")
        names = [SegmentName(_segment(t, "targets")) for t in _list(targets, "targets")]
        rep = self._node.rpc.call_as(CreateCopyTask(key, names, self.tenant), TaskReply)
        raise_for_code(rep.code, f"copy task for {key!r}")
        return rep.task_id

    def create_move_task(self, key: str, source: str, target: str) -> str:
        """Ask the master to move `key`'s replica on segment `source` to segment `target`;
        returns the task id. The source stays readable until the task succeeds."""
        self._open()
        msg = CreateMoveTask(
            _segment(key, "key"),
            SegmentName(_segment(source, "source")),
            SegmentName(_segment(target, "target")),
            self.tenant,
        )
        rep = self._node.rpc.call_as(msg, TaskReply)
        raise_for_code(rep.code, f"move task for {key!r}")
        return rep.task_id

    def query_task(self, task_id: str) -> TaskInfo:
        """The state of a task (TASK_NOT_FOUND once the master has forgotten it)."""
        self._open()
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

    def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        """Drop the replicas of this client's own objects among `keys` whose lease has
        expired (all of them, or only those on `segment_name`); returns the keys cleared."""
        self._open()
        ks = [_segment(k, "keys") for k in _list(keys, "keys")]
        msg = BatchReplicaClear(
            ks, ClientId(self._node.client_id), SegmentName(segment_name), self.tenant
        )
        rep = self._node.rpc.call_as(msg, BatchReplicaClearReply)
        raise_for_code(rep.code, "BatchReplicaClear")
        return list(rep.cleared)

    def get_replica_desc(self, key: str) -> list[ReplicaDesc]:
        """The replicas of `key` (segment, offset, size, status, endpoint, ...); empty when the
        key does not exist or is still being written. Grants a read lease, like a get."""
        self._open()
        key = _segment(key, "key")
        rep = self._node.rpc.call_as(GetReplicaList(key, self.tenant), ReplicaListReply)
        return _descs(key, rep)

    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDesc]]:
        """`get_replica_desc` of every key, in one round trip."""
        self._open()
        ks = [_segment(k, "keys") for k in _list(keys, "keys")]
        if not ks:
            return {}
        rep = self._node.rpc.call_as(BatchGetReplicaList(ks, self.tenant), BatchReplicaListReply)
        if len(rep.results) != len(ks):
            raise KVPoolError(
                f"BatchGetReplicaList answered {len(rep.results)} results for {len(ks)} keys",
                ErrorCode.RPC_FAIL,
            )
        return {k: _descs(k, r) for k, r in zip(ks, rep.results, strict=True)}


def _descs(key: str, rep: ReplicaListReply) -> list[ReplicaDesc]:
    if rep.code in (ErrorCode.OBJECT_NOT_FOUND, ErrorCode.REPLICA_IS_NOT_READY):
        return []
    raise_for_code(rep.code, key)
    return list(rep.replicas)


def _list(values: object, what: str) -> Sequence[object]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidParams(f"{what}: expected a list of str, got {type(values).__name__}")
    return values


def _segment(value: object, what: str) -> str:
    """A non-empty str (a key or a segment name), else INVALID_PARAMS naming `what`."""
    if not isinstance(value, str) or not value:
        raise InvalidParams(f"{what}: expected non-empty str, got {value!r}")
    return value
