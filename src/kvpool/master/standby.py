"""A standby's side of replication: the hot copy of the leader's metadata, and the puller.

`StandbyCopy` is what a standby holds: the records it received, replayed into a
`durable.Replay` (the same state a restart builds from a data directory), with the leader's
term and the stream position it reaches. With `--data-dir` it also writes them there: the
snapshot it bootstrapped from as `snapshot-<n>.kvp` (written to a temporary name, renamed when
complete), then the log after it as `log-<n>.kvp`, so that a standby restarted on its
directory, or promoted, reads exactly its copy (`Durability.recover`).

`Follower` pulls from the leader on the master's event loop (`FollowLog` long polls with an
`AsyncRpcClient`; `FetchSnapshot` to bootstrap, when it has no copy of the leader's term or
the leader says its position is gone). Each reply is applied before the next request, whose
position acknowledges it: an acknowledged record is in this process's memory (and in the OS,
with a data directory) before the leader answers the write.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from kvpool.errors import KVPoolError
from kvpool.master.durable import Replay
from kvpool.master.oplog import OpLog, file_header, frames, list_files
from kvpool.protocol.messages import (
    FetchSnapshot,
    FollowLog,
    LogReply,
    Response,
    SnapshotReply,
)
from kvpool.rpc.aio import AsyncRpcClient

__all__ = ["Follower", "StandbyCopy", "read_dir_term", "write_dir_term"]

_TERM_FILE = "ha-term"


def read_dir_term(data_dir: str | Path | None) -> int:
    """The leader term whose metadata `data_dir` holds (0: none recorded)."""
    if data_dir is None:
        return 0
    try:
        return int((Path(data_dir) / _TERM_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def write_dir_term(data_dir: str | Path, term: int) -> None:
    """Record that `data_dir` now holds the metadata of `term` (written, synced, renamed)."""
    path = Path(data_dir) / _TERM_FILE
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(f"{term}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


log = logging.getLogger(__name__)


class StandbyCopy:
    """The replayed state of the leader of `term`, complete up to `position`."""

    def __init__(self, data_dir: str | None, fsync_interval: float = 0.01) -> None:
        self.state = Replay()
        #: Term of the leader this copy follows (0: no complete copy).
        self.term = 0
        self.position = 0
        self.records = 0
        self._dir = Path(data_dir) if data_dir is not None else None
        self._fsync_interval = fsync_interval
        self._pending: Replay | None = None
        self._pending_start = 0
        self._tmp: tuple[Path, int] | None = None
        self._tmp_fd = -1
        self._log: OpLog | None = None
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)
        #: The term whose metadata the data directory holds (a restarted member's copy).
        self.disk_term = read_dir_term(self._dir)

    @property
    def complete(self) -> bool:
        return self.term > 0

    def objects(self) -> int:
        return len(self.state.objects)

    # -- bootstrap ---------------------------------------------------------------------

    def begin(self) -> None:
        """A snapshot starts: the current copy stays usable until it is complete."""
        self._abort_tmp()
        self._pending = Replay()
        if self._dir is not None:
            seq = _next_seq(self._dir)
            path = self._dir / f"snapshot-{seq:08d}.tmp"
            self._tmp_fd = os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644
            )
            self._tmp = (path, seq)
            _write_all(self._tmp_fd, file_header(b"S", seq))

    def add_snapshot(self, data: bytes) -> None:
        assert self._pending is not None
        _apply(self._pending, data)
        if self._tmp_fd >= 0:
            _write_all(self._tmp_fd, data)

    def end_snapshot(self, term: int, start: int) -> None:
        """The snapshot is complete: it becomes the copy, at stream position `start`."""
        assert self._pending is not None
        self.state = self._pending
        self._pending = None
        self.term = term
        self.position = start
        if self._tmp is not None:
            path, seq = self._tmp
            os.fsync(self._tmp_fd)
            os.close(self._tmp_fd)
            self._tmp_fd = -1
            self._tmp = None
            assert self._dir is not None
            os.replace(path, path.with_suffix(".kvp"))
            write_dir_term(self._dir, term)
            self.disk_term = term
            if self._log is not None:
                self._log.close()
            self._log = OpLog(self._dir, seq, self._fsync_interval)
            for kind in ("snapshot", "log"):
                for s, p in list_files(self._dir, kind):
                    if s < seq:
                        p.unlink(missing_ok=True)
        log.info(
            "standby copy of term %d complete: %d objects, %d segment(s), following from %d",
            term,
            len(self.state.objects),
            len(self.state.mounts),
            start,
        )

    # -- the log -----------------------------------------------------------------------

    def write_log(self, data: bytes) -> None:
        """Records received: into the log file (the OS has them on return), before the ack."""
        if self._log is not None:
            self._log.append_frames(data)
            self._log.flush()

    def add_log(self, position: int, data: bytes) -> None:
        """Apply records received (and written, `write_log`) at stream `position`."""
        assert position == self.position, (position, self.position)
        self.records += _apply(self.state, data)
        self.position += len(data)

    def sync_due(self) -> int | None:
        return self._log.sync_due() if self._log is not None else None

    def reset(self) -> None:
        """Forget the copy (it was used for a promotion, or the leader's term changed)."""
        self._abort_tmp()
        self.state = Replay()
        self._pending = None
        self.term = 0
        self.position = 0

    def close(self) -> None:
        """Sync and close the log file (idempotent); the files stay for `Durability`."""
        self._abort_tmp()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _abort_tmp(self) -> None:
        if self._tmp_fd >= 0:
            os.close(self._tmp_fd)
            self._tmp_fd = -1
        if self._tmp is not None:
            self._tmp[0].unlink(missing_ok=True)
            self._tmp = None


def _apply(state: Replay, data: bytes) -> int:
    """Apply the records of `data`; answers how many. The collector is off meanwhile: the
    records are acyclic and many (each collection would walk all the copy's objects; the
    master's monitor freezes what survives, `gc.freeze()`)."""
    was_enabled = gc.isenabled()
    gc.disable()
    n = 0
    try:
        apply = state.apply
        for rec in frames(data):
            apply(rec)
            n += 1
    finally:
        if was_enabled:
            gc.enable()
    return n


def _next_seq(data_dir: Path) -> int:
    seqs = [s for kind in ("snapshot", "log") for s, _ in list_files(data_dir, kind)]
    return max(seqs, default=0) + 1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    done = 0
    while done < len(data):
        done += os.write(fd, view[done:])


class Follower:
    """Keeps `copy` following the leader that `leader()` names ((address, term) or None)."""

    def __init__(
        self,
        member_id: str,
        cluster_id: str,
        copy: StandbyCopy,
        leader: Callable[[], tuple[str, int] | None],
        *,
        poll_ms: int = 500,
        timeout: float = 5.0,
        token: bytes | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        #: The token proven to a leader that has credentials (the first admin token).
        self.token = token
        #: TLS to the leader's listener (`kvpool.rpc.tls`; None: plain).
        self.tls = tls
        self.member_id = member_id
        self.cluster_id = cluster_id
        self.copy = copy
        self._leader = leader
        self._poll_ms = poll_ms
        self._timeout = timeout
        self._client: AsyncRpcClient | None = None
        self._address = ""
        self._highest_term = 0
        #: When the last reply was applied (monotonic); for status and tests.
        self.last_reply = 0.0

    async def run(self) -> None:
        """Follow until cancelled (a leader change, a failure: start over with the next)."""
        try:
            while True:
                target = self._leader()
                if target is None:
                    await asyncio.sleep(0.05)
                    continue
                try:
                    await self._step(*target)
                except (KVPoolError, OSError) as exc:
                    log.info("standby %s: leader %s: %s", self.member_id, target[0], exc)
                    await self._drop_client()
                    await asyncio.sleep(0.1)
                except Exception:
                    # A record this copy cannot apply (another version's), a bug: the copy is no
                    # longer trustworthy. Start over from a snapshot rather than stop following.
                    log.exception("standby %s: following %s failed", self.member_id, target[0])
                    self.copy.reset()
                    await self._drop_client()
                    await asyncio.sleep(1.0)
        finally:
            await self._drop_client()

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _connect(self, address: str) -> AsyncRpcClient:
        if self._client is None or self._address != address:
            await self._drop_client()
            self._client = AsyncRpcClient(
                address,
                response_type=Response,
                cluster_id=self.cluster_id,
                client_name=f"standby-{self.member_id}",
                timeout=self._timeout,
                token=self.token,
                tls=self.tls,
            )
            self._address = address
        return self._client

    def _current(self, address: str, term: int) -> bool:
        """Whether the leader is still the one asked (else a reply is not applied)."""
        return self._leader() == (address, term)

    async def _step(self, address: str, term: int) -> None:
        client = await self._connect(address)
        if self.copy.term != term:
            await self._bootstrap(client, address, term)
            return
        await self._follow(client, address, term)

    def _ask(self, client: AsyncRpcClient, term: int, position: int) -> asyncio.Task[LogReply]:
        return asyncio.ensure_future(
            client.call_as(
                FollowLog(self.member_id, term, position, self._poll_ms),
                LogReply,
                timeout=self._timeout + self._poll_ms / 1000,
            )
        )

    async def _follow(self, client: AsyncRpcClient, address: str, term: int) -> None:
        """Long-poll the log. Records received are written (data directory) and acknowledged
        by the next request, which leaves before they are applied: the apply, CPU work,
        overlaps the leader's next steps instead of lengthening every write's wait. A
        promotion runs on this loop, so it never sees them unapplied."""
        copy = self.copy
        pending = self._ask(client, term, copy.position)
        try:
            while True:
                reply = await pending
                if not self._current(address, term) or reply.term < self._highest_term:
                    return
                if reply.term != term or reply.snapshot_needed:
                    log.info("standby %s: the leader asks for a new bootstrap", self.member_id)
                    await self._bootstrap(client, address, term)
                    return
                if reply.data:
                    copy.write_log(reply.data)
                    pending = self._ask(client, term, reply.position + len(reply.data))
                    await asyncio.sleep(0)  # the ack leaves now
                    copy.add_log(reply.position, reply.data)
                else:
                    pending = self._ask(client, term, copy.position)
                self.last_reply = time.monotonic()
        finally:
            if not pending.done():
                pending.cancel()

    async def _bootstrap(self, client: AsyncRpcClient, address: str, term: int) -> None:
        copy = self.copy
        copy.begin()
        offset = 0
        started = time.monotonic()
        while True:
            reply = await client.call_as(
                FetchSnapshot(self.member_id, term, offset), SnapshotReply, timeout=self._timeout
            )
            if not self._current(address, term) or reply.code != 0 or reply.term != term:
                copy.begin()  # abandon; the next step starts over
                return
            if reply.data:
                copy.add_snapshot(reply.data)
            offset += len(reply.data)
            if reply.done:
                break
        self._highest_term = max(self._highest_term, term)
        copy.end_snapshot(term, reply.start)
        self.last_reply = time.monotonic()
        log.info(
            "standby %s bootstrapped from %s (term %d) in %.2f s: %d bytes of snapshot",
            self.member_id,
            address,
            term,
            time.monotonic() - started,
            offset,
        )
