"""`TaskExecutor`: the replica copy/move tasks that the master assigns to this node, run here.

The master never touches bytes (see `kvpool.master.tasks` and docs/parts/master.md): a copy or
a move of a replica is a task that it assigns to the client owning the source segment (or to a
live client with a segment on the source's host), with the destination ranges already
allocated. `TaskExecutor` is what such a client runs: a daemon thread per node (a `kvpool
node`, or a `Store` with a segment). It sends `FetchTasks(client_id, max_tasks)` every
`poll_interval` (50 ms by default: pool-mode eviction swaps objects out through tasks while a put
may be waiting for the space), and at once when a Ping answers `pending_tasks > 0` or a task just
finished (there may be more). For each task it holds the source's mapping (the source is on this
host by the master's choice; a source it cannot map is first read into a buffer through the
engine), checks the bytes against the object's checksum (xxh3_64, when the writer recorded one: a
corrupt source must not be copied into a healthy-looking replica), writes them to every target
through the `DataPath` (memcpy / mapped shm on this host, TCP to other hosts), and reports
`MarkTaskComplete(ok, message, bad_source)` once (`bad_source`: the source failed the
checksum, so the master may drop it and repair the object from another replica). A report the
master answers with OBJECT_NO_REPLICATION_TASK (the task already ended: timed out, object
removed) is normal.

A client that sees the DFS directory (this process named it: `kvpool node --dfs-root`,
`Store(dfs_root=)`) says so in each FetchTasks: the master then gives it promotions whose
source is a DFS file (docs/parts/tiers.md, "The DFS tier"), which it reads with
`kvpool.client.dfs.read`, checks and writes to the targets.

Creating and querying tasks is the Store's side, a plain control call (`kvpool.client.control`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kvpool.client import dfs
from kvpool.client.datapath import DataPath
from kvpool.client.node import NodeRuntime
from kvpool.client.replica import checksum
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, raise_for_code
from kvpool.protocol.messages import (
    FetchTasks,
    FetchTasksReply,
    MarkTaskComplete,
    ReplicaKind,
    ReplicaTask,
    Reply,
    SegmentName,
)
from kvpool.transfer.request import TransferOp

__all__ = ["DEFAULT_POLL_INTERVAL_S", "TaskExecutor", "TaskStats"]

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S: Final = 0.05
REPORT_BYTES: Final = 1 << 20
"""Completed tasks are reported at least every this many bytes copied (and at the end of a
fetch), so that a batch of large copies does not hold back the first one's report."""
MAX_IDLE_BACKOFF_S: Final = 2.0
"""Longest wait between fetches while the master keeps refusing them (an older master without
tasks, or one that is down); the heartbeat handles reconnects."""


class _BadSource(Exception):
    """The source's bytes do not match the object's checksum (ends `_copy`; the task fails
    with `bad_source` set)."""


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
        self.on_written: Callable[[ReplicaTask], None] | None = None
        """Called after a task's bytes were written to every target, before it is reported
        (a disk tier journals its targets there; raising fails the task)."""
        self.on_disk_freed: Callable[[list[tuple[SegmentName, int]]], None] | None = None
        """Called with the disk-tier ranges the master freed (a disk tier journals them)."""
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
        end: one round trip per report was most of a small move (docs/parts/client.md).
        """
        with self._lock:
            if self.node.closed:
                return 0
            # Seeing the DFS directory (this process named where it is) makes this node one
            # that promotes objects from their DFS files (`_copy_from_dfs`).
            sees_dfs = dfs.local_root() is not None
            reply = self.node.rpc.call_as(
                FetchTasks(self.node.client_id, self.max_tasks, sees_dfs), FetchTasksReply
            )
            self.stats.fetches += 1
            if reply.code == ErrorCode.CLIENT_NOT_FOUND:
                return 0  # not registered (yet, or again): the heartbeat remounts
            raise_for_code(reply.code, "FetchTasks")
            if reply.disk_freed and self.on_disk_freed is not None:
                # Before the tasks: a range freed there may be written again by one of them.
                self.on_disk_freed(reply.disk_freed)
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
        bad_source = False
        try:
            message = self._copy(task)
        except _BadSource as exc:
            message, bad_source = str(exc), True
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
        # A source that fails its checksum is reported as such: the master drops it (when
        # another replica is readable) and repairs the object from a good one.
        return MarkTaskComplete(self.node.client_id, task.task_id, ok, message, bad_source)

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
        """Copy the task's source to every target; returns "" on success, else why not
        (raises `_BadSource` for a source that fails the checksum)."""
        src = task.source
        size = task.size
        if src.size < size or any(t.size < size for t in task.targets):
            return f"a replica is smaller than the object ({size} bytes)"
        if not task.targets:
            return "no targets"
        if src.kind == ReplicaKind.DFS:
            return self._copy_from_dfs(task)
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
                    raise _BadSource(
                        f"source bytes on {src.segment} hash to {got:#018x}, the object's "
                        f"checksum is {task.checksum:#018x}"
                    )
            return self._write_targets(task, view)

    def _write_targets(self, task: ReplicaTask, view: memoryview) -> str:
        """Write the checked bytes `view` to every target of `task`; "" or why not."""
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
        if self.on_written is not None:
            self.on_written(task)
        return ""

    def _copy_from_dfs(self, task: ReplicaTask) -> str:
        """A promotion from a DFS file (docs/parts/tiers.md, "The DFS tier"): the file is read
        (hashed as it comes in) into a buffer, checked, and written to the targets."""
        view = memoryview(bytearray(task.size))
        want = self.verify_checksum and task.checksum is not None
        code, got = dfs.read(task.source, view, want)
        if code != ErrorCode.OK:
            return f"reading the DFS file of {task.key!r} failed: {code.name}"
        if want and got != task.checksum:
            raise _BadSource(
                f"the DFS file of {task.key!r} hashes to {got:#018x}, the object's checksum "
                f"is {task.checksum:#018x}"
            )
        self.data.learn([i for i in task.segments if i.kind != ReplicaKind.DFS])
        return self._write_targets(task, view)
