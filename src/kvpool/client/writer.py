"""`Writer`: the Store's put paths, one value or a batch, through an arena or PutStart.

PutStart / PutEnd (`put`, `upsert`, `put_from` and the batch forms)
    PutStart (or UpsertStart) at the master allocates the replicas → the value is written into
    every replica, all in one engine batch (in parallel) → PutEnd with the value's xxh3_64
    makes it readable. If any replica's write fails, or the PutEnd itself fails (an error
    answer, a lost connection), the Writer sends PutRevoke, which frees the space: a failed put
    leaves no trace (the revoke is best effort; the master revokes an abandoned PutStart by
    itself after put_start_discard_timeout). A put whose key exists answers False
    (insert-if-absent, as Mooncake); `upsert` overwrites. Batches use one BatchPutStart and one
    BatchPutEnd (plus one BatchPutRevoke for the keys whose writes or ends failed) for the
    whole batch and report each key's outcome as an `ErrorCode`.

One round trip instead of two (`kvpool.client.arena`)
    A put or batch_put of values up to a quarter of `arena_size` with one replica and nothing
    preferred cuts its ranges from an arena the master lent this Store, writes the values
    there, and sends one PutCommit (one BatchPutCommit for a batch) that makes them readable.
    An existing key answers False / OBJECT_ALREADY_EXISTS as before (its bytes were written
    for nothing). When the master has no arena to give (a full pool) or forgot the arena, the
    put takes PutStart/PutEnd.

A batch answer with a number of entries other than the keys asked is a fault of the master or
of the connection: it raises `RpcError` (RPC_FAIL); after a BatchPutEnd, once the batch's keys
are revoked (the master refuses for those it did complete).

The inputs are checked by the Store (`kvpool.client.validation`); the Writer takes flat views.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

from kvpool.client.arena import Arena, Arenas
from kvpool.client.datapath import CHUNKED_MIN, DataPath
from kvpool.client.node import NodeRuntime
from kvpool.client.replica import checksum, digest_or_checksum
from kvpool.client.replicate import DEFAULT_CONFIG, ReplicateConfig
from kvpool.client.validation import check_count
from kvpool.codes import INVALID_WRITE, OBJECT_ALREADY_EXISTS, OK
from kvpool.errors import ErrorCode, KVPoolError, error_for_code, raise_for_code
from kvpool.protocol.messages import (
    BatchPutCommit,
    BatchPutEnd,
    BatchPutRevoke,
    BatchPutStart,
    BatchPutStartReply,
    BatchReply,
    BatchUpsertStart,
    PutCommit,
    PutEnd,
    PutRevoke,
    PutStart,
    PutStartReply,
    ReplicaDesc,
    ReplicaKind,
    ReplicaStatus,
    ReplicateConfigMsg,
    Reply,
    TenantId,
    UpsertStart,
)
from kvpool.transfer.request import TransferOp, TransferRequest

__all__ = ["Writer"]

log = logging.getLogger(__name__)

_DEFAULT_MSG: Final = DEFAULT_CONFIG.to_msg()
"""The wire form of the default config (frozen), made once rather than on every put."""
_MEMORY: Final = ReplicaKind.MEMORY
_PROCESSING: Final = ReplicaStatus.PROCESSING


def _arena_config(cfg: ReplicateConfigMsg) -> bool:
    """Whether a put with `cfg` may take an arena: one replica, placed by the master."""
    return cfg.replica_num == 1 and not cfg.preferred_segments and not cfg.prefer_alloc_in_same_node


def _check_replicas(replicas: Sequence[ReplicaDesc], size: int) -> ErrorCode:
    if not replicas:
        return ErrorCode.NO_AVAILABLE_HANDLE
    for r in replicas:
        if r.size != size:
            return ErrorCode.INVALID_REPLICA
    return ErrorCode.OK


class Writer:
    """The put paths of one Store (module docstring). Thread-safe: it keeps no state of its
    own between calls; `opened` answers the Store's `DataPath`, or raises `StoreClosed`."""

    __slots__ = ("_arenas", "_node", "_opened", "tenant")

    def __init__(
        self,
        node: NodeRuntime,
        opened: Callable[[], DataPath],
        arenas: Arenas | None,
        tenant: TenantId,
    ) -> None:
        self._node = node
        self._opened = opened
        self._arenas = arenas
        self.tenant = tenant

    # ------------------------------------------------------------------ one value

    def put_one(
        self, key: str, mv: memoryview, config: ReplicateConfig | None, *, upsert: bool
    ) -> bool:
        """Put (or upsert) one value; True stored, False the key existed (put only)."""
        self._opened()
        cfg = _DEFAULT_MSG if config is None else config.to_msg()
        if not upsert and _arena_config(cfg):
            arenas = self._arenas
            if arenas is not None and mv.nbytes <= arenas.max_value:
                done = self._put_arena(arenas, key, mv, cfg)
                if done is not None:
                    return done
        rpc = self._node.rpc
        cid = self._node.client_id
        start = (UpsertStart if upsert else PutStart)(cid, key, mv.nbytes, cfg, self.tenant)
        rep = rpc.call_as(start, PutStartReply)
        if rep.code == OBJECT_ALREADY_EXISTS and not upsert:
            return False
        raise_for_code(rep.code, key)
        try:
            code, csum = self._write_replicas(rep.replicas, mv)
            end = OK
            if code == ErrorCode.OK:
                end = rpc.call_as(PutEnd(cid, key, csum, self.tenant), Reply).code
        except BaseException:
            # Whatever escaped (a concurrent close(), KeyboardInterrupt, a fault of the data
            # path or of the PutEnd), the PutStart must not linger: for
            # put_start_discard_timeout it would make a retried put answer "already exists"
            # and hold its space. A PutEnd the master did carry out is not undone: the revoke
            # of a complete object is refused.
            self._revoke([key])
            raise
        if code != ErrorCode.OK:
            self._revoke([key])
            raise error_for_code(code, f"{key!r}: writing its replicas failed; the put was revoked")
        if end != OK:
            self._revoke([key])
            raise_for_code(end, f"{key!r}: PutEnd failed; the put was revoked")
        return True

    def _put_arena(
        self, arenas: Arenas, key: str, mv: memoryview, cfg: ReplicateConfigMsg
    ) -> bool | None:
        """`put` through an arena: True / False as `put`, None when it must take PutStart."""
        got = arenas.take([mv.nbytes])
        if got is None:
            return None
        arena, (off,) = got
        try:
            place = ReplicaDesc(
                0, _MEMORY, _PROCESSING, arena.segment, off, mv.nbytes, arena.endpoint
            )
            code, csum = self._write_replicas([place], mv)
            if code != ErrorCode.OK:
                log.debug("write into arena %s failed (%s); using PutStart", arena.segment, code)
                arenas.abandon(arena)
                return None
            commit = PutCommit(
                self._node.client_id, key, mv.nbytes, arena.arena_id, off, csum, cfg, self.tenant
            )
            sent = time.monotonic()
            answer = self._node.rpc.call_as(commit, Reply).code
            if answer in (OK, OBJECT_ALREADY_EXISTS):  # the master renewed the lease
                arenas.confirm(arena, sent)
        finally:
            arenas.done(arena)
        if answer == OK:
            return True
        if answer == OBJECT_ALREADY_EXISTS:
            return False
        if answer == INVALID_WRITE:  # the master no longer knows the arena
            arenas.drop(arena)
            return None
        raise error_for_code(ErrorCode.of(answer), key)

    def _write_replicas(
        self, replicas: Sequence[ReplicaDesc], mv: memoryview
    ) -> tuple[ErrorCode, int | None]:
        """Write `mv` into every replica; the first failure (or OK) and the value's checksum."""
        code = _check_replicas(replicas, mv.nbytes)
        if code != ErrorCode.OK:
            return code, None
        csum: int | None = None
        codes: list[ErrorCode] = []
        if len(replicas) == 1 and mv.nbytes < CHUNKED_MIN:
            # The common small put: copied here when the segment is mapped (hashed while in
            # the cache), by the engine otherwise.
            r = replicas[0]
            got, digests = self._opened().move_many(
                TransferOp.WRITE, [mv], [r.segment], [r.offset], True
            )
            return got[0], digest_or_checksum(digests[0], mv)
        if mv.nbytes >= CHUNKED_MIN:
            # Hash while writing the first replica, when it is mapped here.
            first = replicas[0]
            done = self._opened().copy_hashing(TransferOp.WRITE, mv, first.segment, first.offset)
            if done is not None:
                codes, csum, replicas = [done[0]], done[1], replicas[1:]
        reqs = [TransferRequest(TransferOp.WRITE, mv, r.segment, r.offset) for r in replicas]
        codes += self._opened().transfer(reqs)
        if csum is None:
            csum = checksum(mv)
        return next((c for c in codes if c != ErrorCode.OK), ErrorCode.OK), csum

    def _revoke(self, keys: list[str]) -> None:
        """Best effort: free what PutStart took. If the master cannot be reached it revokes
        the put itself (put_start_discard_timeout, or when this client expires); what it
        answers for each key (a key already complete, already revoked) changes nothing."""
        rpc = self._node.rpc
        try:
            if len(keys) == 1:
                rpc.call(PutRevoke(self._node.client_id, keys[0], self.tenant))
            elif keys:
                rpc.call(BatchPutRevoke(self._node.client_id, keys, self.tenant))
        except KVPoolError as exc:
            log.warning("PutRevoke of %d key(s) failed: %s", len(keys), exc)

    # ------------------------------------------------------------------ batches

    def put_batch(
        self,
        keys: list[str],
        views: list[memoryview],
        config: ReplicateConfig | None,
        *,
        upsert: bool,
    ) -> list[ErrorCode]:
        """Put (or upsert) every (key, view); per key OK, OBJECT_ALREADY_EXISTS or why not."""
        self._opened()
        if not keys:
            return []
        if config is None:
            cfg = _DEFAULT_MSG
        else:
            config.check_batch(len(keys))
            cfg = config.to_msg()
        arenas = self._arenas
        if (
            not upsert
            and arenas is not None
            and _arena_config(cfg)
            and max(mv.nbytes for mv in views) <= arenas.max_value
        ):
            done = self._put_batch_arena(arenas, keys, views, cfg)
            if done is not None:
                return done
        return self._put_batch_started(keys, views, cfg, upsert=upsert)

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
        try:
            codes, digests = self._opened().move_many(
                TransferOp.WRITE, views, [arena.segment] * n, offs, True
            )
            out = list(codes)
            good = [i for i in range(n) if codes[i] == ok]
            if len(good) != n:
                arenas.abandon(arena)
            if good:
                every = len(good) == n
                sums = [digest_or_checksum(digests[i], views[i]) for i in good]
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
                sent = time.monotonic()
                got_codes = self._node.rpc.call_as(commit, BatchReply).codes
                if any(c in (OK, OBJECT_ALREADY_EXISTS) for c in got_codes):
                    arenas.confirm(arena, sent)
                check_count("BatchPutCommit", len(got_codes), len(good))
                for i, c in zip(good, got_codes, strict=True):
                    out[i] = ErrorCode.of(c) if c else ok
        finally:
            arenas.done(arena)
        # Again through PutStart: what was never written, and what the master refused only
        # because it forgot the arena. Any other answer is the key's own.
        forgot = ErrorCode.INVALID_WRITE
        again = [i for i in range(n) if codes[i] != ok or out[i] == forgot]
        if any(out[i] == forgot for i in again):
            arenas.drop(arena)
        if again:
            redo = self._put_batch_started(
                [keys[i] for i in again], [views[i] for i in again], cfg, upsert=False
            )
            for i, c in zip(again, redo, strict=True):
                out[i] = c
        return out

    def _put_batch_started(
        self,
        keys: list[str],
        views: list[memoryview],
        cfg: ReplicateConfigMsg,
        *,
        upsert: bool,
    ) -> list[ErrorCode]:
        """`batch_put` / `batch_upsert` through BatchPutStart and BatchPutEnd."""
        rpc = self._node.rpc
        cid = self._node.client_id
        sizes = [mv.nbytes for mv in views]
        kind = BatchUpsertStart if upsert else BatchPutStart
        rep = rpc.call_as(kind(cid, keys, sizes, cfg, self.tenant), BatchPutStartReply)
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
        want: list[bool] = []
        for i, r in enumerate(rep.results):
            if r.code:
                out[i] = ErrorCode.of(r.code)
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
                want.append(True)
                continue
            if not replicas or any(d.size != size for d in replicas):
                out[i] = _check_replicas(replicas, size)
                continue
            view = views[i]
            head = True
            for d in replicas:
                places.append(view)
                segs.append(d.segment)
                offs.append(d.offset)
                owner.append(i)
                want.append(head)
                head = False
        try:
            codes, digests = self._opened().move_many(TransferOp.WRITE, places, segs, offs, want)
            sums: dict[int, int] = {}
            for i, first, taken in zip(owner, want, digests, strict=True):
                if first:
                    sums[i] = digest_or_checksum(taken, views[i])
        except BaseException:
            self._revoke([keys[i] for i in started])
            raise
        for i, code in zip(owner, codes, strict=True):
            if code != ok and out[i] == ok:
                out[i] = code
        good = [i for i in started if out[i] == ok]
        if len(good) != len(started):
            self._revoke([keys[i] for i in started if out[i] != ok])
        if good:
            self._end_batch(keys, good, sums, out)
        return out

    def _end_batch(
        self, keys: list[str], good: list[int], sums: dict[int, int], out: list[ErrorCode]
    ) -> None:
        """BatchPutEnd of the keys `good` (all written); a key whose end failed is revoked and
        answers why in `out`."""
        good_keys = keys if len(good) == len(keys) else [keys[i] for i in good]
        end = BatchPutEnd(self._node.client_id, good_keys, [sums[i] for i in good], self.tenant)
        try:
            codes = self._node.rpc.call_as(end, BatchReply).codes
            check_count("BatchPutEnd", len(codes), len(good))
        except BaseException:
            self._revoke(good_keys)  # the complete ones refuse it: only the others go
            raise
        failed: list[str] = []
        for i, c in zip(good, codes, strict=True):
            if c:
                out[i] = ErrorCode.of(c)
                failed.append(keys[i])
        if failed:
            self._revoke(failed)
