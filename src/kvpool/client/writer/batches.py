"""`BatchPuts`: many keys put through one BatchPutStart and one BatchPutEnd (`kvpool.client.writer`).

`_put_batch_started` starts the whole batch, writes every replica in one engine batch and ends
the keys written; the keys whose write failed on a dead node's segment, that the master
refused while making room, or that a leader switch lost are started again within the Writer's
retry bounds (`_put_batch_retrying`, `_put_batch_when_room`, `_put_batch_after_switch`).

A key whose PutStart answer ends with a DFS replica (`dfs_replica_num=1`, or an upsert of an
object that has one) gets its file written (`kvpool.client.dfs.write`) before the batch's
memory writes; the DFS replica is no place of the engine batch. A file that fails fails its
key (revoked like a failed memory write), and the file of a key revoked, ended in vain or of
a batch that raised is removed (docs/parts/tiers.md, "The DFS tier").
"""

from __future__ import annotations

import logging
import time

from kvpool.client import dfs
from kvpool.client.replica import digest_or_checksum
from kvpool.client.validation import check_count
from kvpool.client.writer.base import (
    _RETRYABLE,
    _SWITCH_HINT_MS,
    _SWITCH_REDO,
    MAX_PUT_RETRIES,
    _check_replicas,
    _hint_s,
    _subset,
)
from kvpool.client.writer.started import StartedPuts
from kvpool.codes import NO_AVAILABLE_HANDLE
from kvpool.errors import ErrorCode
from kvpool.protocol.messages import (
    BatchPutEnd,
    BatchPutStart,
    BatchPutStartReply,
    BatchReply,
    BatchUpsertStart,
    ReplicaDesc,
    ReplicateConfigMsg,
)
from kvpool.transfer.request import TransferOp

__all__ = ["BatchPuts"]

log = logging.getLogger(__name__)


class BatchPuts(StartedPuts):
    """The batch PutStart / PutEnd paths of the Writer (module docstring)."""

    __slots__ = ()

    def _put_batch_retrying(
        self,
        keys: list[str],
        views: list[memoryview],
        cfg: ReplicateConfigMsg,
        *,
        upsert: bool,
    ) -> list[ErrorCode]:
        """`_put_batch_started`, then the keys whose write to a replica's segment failed are
        started again on other segments, as `put_one` does, within the same bounds."""
        avoid: set[str] = set()
        hints: list[int] = []
        rpc = self._node.rpc
        epoch = rpc.epoch
        out = self._put_batch_started(
            keys, views, cfg, cfg.replica_num, upsert=upsert, avoid=avoid, hints=hints
        )
        if hints:
            self._put_batch_when_room(keys, views, cfg, out, hints, upsert=upsert)
        if rpc.epoch != epoch:
            self._put_batch_after_switch(keys, views, cfg, out, upsert=upsert)
        if not avoid or cfg.preferred_segments:  # a placement the caller chose is kept
            return out
        deadline = time.monotonic() + self._retry_window
        for _ in range(MAX_PUT_RETRIES):
            again = [i for i, c in enumerate(out) if c in _RETRYABLE]
            if not again or time.monotonic() >= deadline:
                break
            self.stats.retried(len(again))
            redo = self._put_batch_started(
                [keys[i] for i in again],
                [views[i] for i in again],
                self._avoiding(_subset(cfg, again), avoid),
                cfg.replica_num,
                upsert=upsert,
                avoid=avoid,
            )
            for i, c in zip(again, redo, strict=True):
                out[i] = c
        left = sum(1 for c in out if c in _RETRYABLE)
        if left:
            self.stats.retry_failed(left)
        return out

    def _put_batch_after_switch(
        self,
        keys: list[str],
        views: list[memoryview],
        cfg: ReplicateConfigMsg,
        out: list[ErrorCode],
        *,
        upsert: bool,
    ) -> None:
        """The leader changed during the batch: keys the new leader did not hold (their end
        refused, or unsettled: revoked already) or could not place yet (its segments are being
        remounted) are put again there, within the retry bounds; `out` is updated."""
        deadline = time.monotonic() + self._retry_window
        for _ in range(MAX_PUT_RETRIES + 1):
            again = [i for i, c in enumerate(out) if c in _SWITCH_REDO]
            if not again or time.monotonic() >= deadline:
                return
            if any(out[i] == ErrorCode.NO_AVAILABLE_HANDLE for i in again):
                time.sleep(_SWITCH_HINT_MS / 1000)
            self.stats.retried(len(again))
            log.info("batch put: the leader changed; putting %d key(s) again", len(again))
            redo = self._put_batch_started(
                [keys[i] for i in again],
                [views[i] for i in again],
                _subset(cfg, again),
                cfg.replica_num,
                upsert=upsert,
                avoid=set(),
            )
            for i, c in zip(again, redo, strict=True):
                out[i] = c

    def _put_batch_when_room(
        self,
        keys: list[str],
        views: list[memoryview],
        cfg: ReplicateConfigMsg,
        out: list[ErrorCode],
        hints: list[int],
        *,
        upsert: bool,
    ) -> None:
        """The keys refused NO_AVAILABLE_HANDLE while the master made room (`hints`, its retry
        hints) started again after the longest hint, as `_start_when_room` does, within the
        Store's retry window; `out` gets their answers."""
        deadline = time.monotonic() + self._retry_window
        room = ErrorCode.NO_AVAILABLE_HANDLE
        while hints:
            again = [i for i, c in enumerate(out) if c == room]
            left = deadline - time.monotonic()
            if not again or left <= 0:
                break
            time.sleep(min(left, _hint_s(max(hints))))
            hints.clear()
            redo = self._put_batch_started(
                [keys[i] for i in again],
                [views[i] for i in again],
                _subset(cfg, again),
                cfg.replica_num,
                upsert=upsert,
                avoid=set(),
                hints=hints,
            )
            for i, c in zip(again, redo, strict=True):
                out[i] = c
            log.debug("%d key(s) of a batch asked again while room was made", len(again))

    def _put_batch_started(
        self,
        keys: list[str],
        views: list[memoryview],
        cfg: ReplicateConfigMsg,
        want: int,
        *,
        upsert: bool,
        avoid: set[str],
        hints: list[int] | None = None,
    ) -> list[ErrorCode]:
        """`batch_put` / `batch_upsert` through BatchPutStart and BatchPutEnd. Keys stored
        with fewer replicas than `want` are counted (`stats`); the segments whose writes
        failed in a way a retry elsewhere may cure are added to `avoid`; the retry hints of
        keys refused while the master makes room go to `hints`."""
        cid = self._node.client_id
        sizes = [mv.nbytes for mv in views]
        kind = BatchUpsertStart if upsert else BatchPutStart
        rep = self._node.rpc.call_as(kind(cid, keys, sizes, cfg, self.tenant), BatchPutStartReply)
        check_count("BatchPutStart", len(rep.results), len(keys))
        # One pass over the results builds the places to write (parallel lists: this loop
        # runs once per key of every batch); `want` marks each key's first replica, whose copy
        # is hashed while the value is in the cache.
        ok = ErrorCode.OK
        out = [ok] * len(keys)
        started: list[int] = []
        places: list[memoryview] = []
        segs: list[str] = []
        offs: list[int] = []
        owner: list[int] = []
        first: list[bool] = []
        short: list[int] = []
        dfs_of: dict[int, ReplicaDesc] = {}
        for i, r in enumerate(rep.results):
            if r.code:
                out[i] = ErrorCode.of(r.code)
                if r.retry_after_ms > 0 and hints is not None and r.code == NO_AVAILABLE_HANDLE:
                    hints.append(r.retry_after_ms)
                continue
            started.append(i)
            size = sizes[i]
            replicas = r.replicas
            if len(replicas) == 1:  # the common case, without the general loop below
                d = replicas[0]
                if d.size != size:
                    out[i] = ErrorCode.INVALID_REPLICA
                    continue
                places.append(views[i])
                segs.append(d.segment)
                offs.append(d.offset)
                owner.append(i)
                first.append(True)
                if want > 1:
                    short.append(i)
                continue
            if not replicas or any(d.size != size for d in replicas):
                out[i] = _check_replicas(replicas, size)
                continue
            # tiers: a DFS replica's file is written before the memory; found by kind, as an
            # in-place upsert answers the stored order (`dfs.split`)
            file, memory = dfs.split(replicas)
            if file is not None:
                dfs_of[i] = file
            if len(memory) < want:
                short.append(i)
            view = views[i]
            head = True
            for d in memory:
                places.append(view)
                segs.append(d.segment)
                offs.append(d.offset)
                owner.append(i)
                first.append(head)
                head = False
        try:
            for i, d in dfs_of.items():  # a failed file fails its key, as a failed write
                if out[i] == ok:
                    out[i] = dfs.write(d, views[i])
            codes, digests = self._opened().move_many(TransferOp.WRITE, places, segs, offs, first)
            sums: dict[int, int] = {}
            for i, head, taken in zip(owner, first, digests, strict=True):
                if head:
                    sums[i] = digest_or_checksum(taken, views[i])
        except BaseException:
            self._revoke([keys[i] for i in started], _put_ids(rep, started), park=True)
            for d in dfs_of.values():
                dfs.remove(d)
            raise
        for i, code, seg in zip(owner, codes, segs, strict=True):
            if code != ok:
                if out[i] == ok:
                    out[i] = code
                if code in _RETRYABLE:
                    avoid.add(seg)
        good = [i for i in started if out[i] == ok]
        if len(good) != len(started):
            bad = [i for i in started if out[i] != ok]
            self._revoke([keys[i] for i in bad], _put_ids(rep, bad), park=True)
            for i in bad:
                failed_file = dfs_of.get(i)
                if failed_file is not None:
                    dfs.remove(failed_file)
        if good:
            self._end_batch(keys, good, sums, out, _put_ids(rep, good), dfs_of=dfs_of)
        if short:
            stored = [i for i in short if out[i] == ok]
            if stored:
                i = stored[0]
                got = len(rep.results[i].replicas)
                self.stats.degraded(keys[i], got, want, len(stored))
        return out

    def _end_batch(
        self,
        keys: list[str],
        good: list[int],
        sums: dict[int, int],
        out: list[ErrorCode],
        ids: list[int],
        *,
        dfs_of: dict[int, ReplicaDesc] | None = None,
    ) -> None:
        """BatchPutEnd of the keys `good` (all written; `ids` name their puts); a key whose
        end failed is revoked and answers why in `out`, and its DFS file (`dfs_of`) removed."""
        good_keys = keys if len(good) == len(keys) else [keys[i] for i in good]
        sum_list = [sums[i] for i in good]
        end = BatchPutEnd(self._node.client_id, good_keys, sum_list, self.tenant, ids)
        try:
            codes = self._node.rpc.call_as(end, BatchReply).codes
            check_count("BatchPutEnd", len(codes), len(good))
        except BaseException:
            self._revoke(good_keys, ids)  # the complete ones refuse it: only the others go
            # A DFS file stays: whether its put completed is not known here; the master
            # removes the file of a put it revokes or frees (kvpool.master.dfs).
            raise
        failed: list[str] = []
        failed_ids: list[int] = []
        for i, c, put_id in zip(good, codes, ids, strict=True):
            if c:
                out[i] = ErrorCode.of(c)
                failed.append(keys[i])
                failed_ids.append(put_id)
                d = dfs_of.get(i) if dfs_of else None
                if d is not None:
                    dfs.remove(d)  # a preempted put's master removed it before our rename
        if failed:
            self._revoke(failed, failed_ids)


def _put_ids(rep: BatchPutStartReply, which: list[int]) -> list[int]:
    """The put ids (first replica ids) of the started keys `which` of a BatchPutStart; -1 for
    a key whose answer named no replica (never a replica's id: the master checks nothing
    it could match)."""
    results = rep.results
    return [results[i].replicas[0].replica_id if results[i].replicas else -1 for i in which]
