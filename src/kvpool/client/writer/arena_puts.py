"""`ArenaPuts`: puts written into an arena the master lent and made readable by one commit.

A put (`_put_arena`) or batch (`_put_batch_arena`) of small values with one replica cuts its
ranges from an arena (`kvpool.client.arena`), writes there and sends one PutCommit or
BatchPutCommit; `write_mode="nowait"` sends the commit and checks its answer later
(`_send_commit`, `kvpool.client.pending`). Large batches are copied and committed in parts
(`_parts`), each commit sent before the next part is copied. What an arena cannot take goes
through the PutStart paths (`kvpool.client.writer.batches`, `.started`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Final

from kvpool.client.arena import Arena, Arenas
from kvpool.client.pending import Pending
from kvpool.client.replica import digest_or_checksum
from kvpool.client.validation import check_count
from kvpool.client.writer.base import _MEMORY, _PROCESSING, _refused
from kvpool.client.writer.batches import BatchPuts
from kvpool.codes import (
    INVALID_WRITE,
    OBJECT_ALREADY_EXISTS,
    OK,
)
from kvpool.errors import (
    ErrorCode,
    KVPoolError,
)
from kvpool.protocol.messages import (
    BatchPutCommit,
    BatchReply,
    PutCommit,
    ReplicaDesc,
    ReplicateConfigMsg,
    Reply,
)
from kvpool.rpc.client import RpcClient, Sent
from kvpool.transfer.request import TransferOp

__all__ = ["ArenaPuts"]

log = logging.getLogger(__name__)


_PART_BYTES: Final = 2 << 20
"""A batch of more value bytes than this is copied and committed in parts of about this size
(at most `_MAX_PARTS`), each commit sent before the next part is copied."""
_MAX_PARTS: Final = 8


def _parts(sizes: list[int]) -> list[list[int]]:
    """The indexes of a batch in consecutive parts of about `_PART_BYTES` (one part when the
    batch is smaller than two)."""
    total = sum(sizes)
    if total < 2 * _PART_BYTES or len(sizes) < 2:
        return [list(range(len(sizes)))]
    target = max(_PART_BYTES, -(-total // _MAX_PARTS))
    parts: list[list[int]] = [[]]
    filled = 0
    for i, n in enumerate(sizes):
        if filled >= target:
            parts.append([])
            filled = 0
        parts[-1].append(i)
        filled += n
    return parts


class ArenaPuts(BatchPuts):
    """The arena put paths of the Writer (module docstring)."""

    __slots__ = ()

    def _put_arena(
        self, arenas: Arenas, key: str, mv: memoryview, cfg: ReplicateConfigMsg
    ) -> int | None:
        """`put` through an arena: 1 stored, 0 the key existed, None when it must take
        PutStart."""
        got = arenas.take([mv.nbytes])
        if got is None:
            return None
        arena, (off,) = got
        try:
            place = ReplicaDesc(
                0, _MEMORY, _PROCESSING, arena.segment, off, mv.nbytes, arena.endpoint
            )
            code, csum, _ = self._write_replicas([place], mv)
            if code != ErrorCode.OK:
                log.debug("write into arena %s failed (%s); using PutStart", arena.segment, code)
                arenas.abandon(arena)
                return None
            commit = PutCommit(
                self._node.client_id, key, mv.nbytes, arena.arena_id, off, csum, cfg, self.tenant
            )
            if self.pending is not None:
                self._send_commit(commit, arenas, arena, [key], [(off, mv.nbytes, csum)])
                return 1
            sent = time.monotonic()
            answer = self._node.rpc.call_as(commit, Reply).code
            if answer in (OK, OBJECT_ALREADY_EXISTS):  # the master renewed the lease
                arenas.confirm(arena, sent)
        finally:
            arenas.done(arena)
        if answer == OK:
            if self.locations is not None and csum is not None:
                self.locations.remember(key, arena.segment, off, mv.nbytes, csum)
            return 1
        if answer == OBJECT_ALREADY_EXISTS:
            return 0
        if answer == INVALID_WRITE:  # the master no longer knows the arena
            arenas.drop(arena)
            return None
        raise _refused(answer, key, cfg)

    def _send_commit(
        self,
        commit: PutCommit | BatchPutCommit,
        arenas: Arenas,
        arena: Arena,
        keys: list[str],
        where: Sequence[tuple[int, int, int | None]],
    ) -> None:
        """Send `commit` without waiting (`write_mode="nowait"`): its answer is checked later
        (`kvpool.client.pending`). The places written are remembered (cached mode) only once
        the master answered OK for their key: a commit refused (the key held another value)
        must not be read back, and the Store's own lookups until then go to the master on the
        same connection, after the commit."""
        pending = self.pending
        assert pending is not None
        locations = self.locations
        epoch = locations.epoch if locations is not None else 0
        sent = self._node.rpc.send(commit)
        segment = arena.segment
        if len(keys) == 1:  # (a single put: no zip, no comprehension)
            o, n, c = where[0]
            places = {keys[0]: (segment, o, n, c)} if c is not None else None
        else:
            places = {
                k: (segment, o, n, c)
                for k, (o, n, c) in zip(keys, where, strict=True)
                if c is not None
            }
        pending.add(
            Pending(sent, keys, arenas, arena, locations=locations, places=places, epoch=epoch)
        )

    def _put_batch_arena(
        self,
        arenas: Arenas,
        keys: list[str],
        views: list[memoryview],
        cfg: ReplicateConfigMsg,
    ) -> list[ErrorCode] | None:
        """`batch_put` through one arena and one BatchPutCommit; None when the whole batch
        must take PutStart. Keys whose write failed or whose arena the master forgot are put
        again through PutStart."""
        sizes = [mv.nbytes for mv in views]
        got = arenas.take(sizes)
        if got is None:
            return None
        arena: Arena = got[0]
        offs = got[1]
        ok = ErrorCode.OK
        n = len(keys)
        rpc = self._node.rpc
        # Large batches overlap the copy of one part with the commit of the one before: each
        # part's BatchPutCommit is sent (`RpcClient.send`) before the next part is copied, and
        # the answers are taken at the end (nowait mode: later, `kvpool.client.pending`).
        parts = _parts(sizes) if type(rpc) is RpcClient else [list(range(n))]
        codes: list[ErrorCode] = [ok] * n
        out: list[ErrorCode] = [ok] * n
        answers: list[tuple[list[int], list[int], Sent]] = []
        try:
            data = self._opened()
            for part in parts:
                whole = len(part) == n
                pviews = views if whole else [views[i] for i in part]
                poffs = offs if whole else [offs[i] for i in part]
                got_p, digests = data.move_many(
                    TransferOp.WRITE, pviews, [arena.segment] * len(part), poffs, True
                )
                if whole:  # the common case, as plain as it was before parts
                    codes, out = list(got_p), list(got_p)
                    good = [i for i in range(n) if got_p[i] == ok]
                    sums = [digest_or_checksum(digests[i], views[i]) for i in good]
                else:
                    for i, c in zip(part, got_p, strict=True):
                        codes[i] = out[i] = c
                    mine = [j for j in range(len(part)) if got_p[j] == ok]
                    good = [part[j] for j in mine]
                    sums = [digest_or_checksum(digests[j], pviews[j]) for j in mine]
                if len(good) != len(part):
                    arenas.abandon(arena)
                if not good:
                    continue
                every = len(good) == n
                commit = BatchPutCommit(
                    self._node.client_id,
                    arena.arena_id,
                    keys if every else [keys[i] for i in good],
                    sizes if every else [sizes[i] for i in good],
                    offs if every else [offs[i] for i in good],
                    sums,
                    cfg,
                    self.tenant,
                )
                if self.pending is not None:
                    wrote = [keys[i] for i in good]
                    where = [(offs[i], sizes[i], sums[j]) for j, i in enumerate(good)]
                    self._send_commit(commit, arenas, arena, wrote, where)  # answered later
                elif len(parts) > 1:
                    answers.append((good, sums, rpc.send(commit)))
                else:
                    sent = time.monotonic()
                    reply = rpc.call_as(commit, BatchReply)
                    self._committed(arenas, arena, keys, sizes, offs, good, sums, reply, sent, out)
            for good, sums, pending in answers:
                reply = rpc.receive(pending)
                if not isinstance(reply, BatchReply):
                    raise KVPoolError(
                        f"BatchPutCommit answered with {type(reply).__name__}",
                        ErrorCode.DESERIALIZE_FAIL,
                    )
                self._committed(
                    arenas, arena, keys, sizes, offs, good, sums, reply, pending.at, out
                )
        finally:
            arenas.done(arena)
        # Again through PutStart: what was never written, and what the master refused only
        # because it forgot the arena. Any other answer is the key's own.
        forgot = ErrorCode.INVALID_WRITE
        again = [i for i in range(n) if codes[i] != ok or out[i] == forgot]
        if any(out[i] == forgot for i in again):
            arenas.drop(arena)
        if again:
            redo = self._put_batch_retrying(
                [keys[i] for i in again], [views[i] for i in again], cfg, upsert=False
            )
            for i, c in zip(again, redo, strict=True):
                out[i] = c
        return out

    def _committed(  # noqa: PLR0917
        self,
        arenas: Arenas,
        arena: Arena,
        keys: list[str],
        sizes: list[int],
        offs: list[int],
        good: list[int],
        sums: list[int],
        reply: BatchReply,
        sent: float,
        out: list[ErrorCode],
    ) -> None:
        """Apply a BatchPutCommit's answer for the keys `good` (sent at `sent`) to `out`."""
        got_codes = reply.codes
        if any(c in (OK, OBJECT_ALREADY_EXISTS) for c in got_codes):
            arenas.confirm(arena, sent)
        check_count("BatchPutCommit", len(got_codes), len(good))
        for i, c in zip(good, got_codes, strict=True):
            out[i] = ErrorCode.of(c) if c else ErrorCode.OK
        if self.locations is not None:
            stored = [j for j, c in enumerate(got_codes) if c == OK]
            self.locations.remember_many(
                [keys[good[j]] for j in stored],
                [(arena.segment, offs[good[j]], sizes[good[j]], sums[j]) for j in stored],
            )
