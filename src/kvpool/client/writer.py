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

A replica's node died (`_put_again`, `_put_batch_retrying`)
    The master keeps placing replicas on a killed node's segments until it expires the node
    (client_ttl). A put whose write fails there (TRANSFER_FAIL, SEGMENT_NOT_FOUND) is revoked
    and started again, at most MAX_PUT_RETRIES times within the Store's rpc_timeout, with the
    other live segments preferred and `replica_num` capped at them (then it is stored
    degraded, which `Store.put_ex` and `PutStats` report). A put naming preferred segments
    keeps its failure. The protocol has no field to exclude a segment; preferring the others
    keeps a dead one out whenever enough live segments have room.

The master is making room (`_start_when_room`, `_put_batch_when_room`)
    A pool-mode master that finds a segment's free bytes only in pieces moves neighbours out
    of one range and answers NO_AVAILABLE_HANDLE with `retry_after_ms`: the put (or the
    batch's keys so refused) is started again after each hint, within the Store's rpc_timeout
    of the first refusal. An answer without a hint fails the put at once, as before.

A batch answer with a number of entries other than the keys asked is a fault of the master or
of the connection: it raises `RpcError` (RPC_FAIL); after a BatchPutEnd, once the batch's keys
are revoked (the master refuses for those it did complete).

The leader of an HA cluster changed during a put (`kvpool.client.leader`)
    The failover client settles a PutEnd or PutCommit whose outcome is unknown by asking the
    new leader (complete with this put's checksum: done). When the new leader does not hold the
    put (the settled end raises LEADER_CHANGED, or the client was retargeted between PutStart
    and PutEnd and the end was refused), `put_one` starts it again from PutStart within the
    Store's retry window; the failed attempt was revoked, so nothing is applied twice. A batch
    that spanned a switch puts its keys answered OBJECT_NOT_FOUND, ILLEGAL_CLIENT,
    LEADER_CHANGED or NO_AVAILABLE_HANDLE again (`_put_batch_after_switch`). For
    `_SWITCH_GRACE_S` after a switch a PutStart answered NO_AVAILABLE_HANDLE without a hint is
    asked again every 50 ms (the nodes are remounting at the new leader).

The inputs are checked by the Store (`kvpool.client.validation`); the Writer takes flat views.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from kvpool.client import dfs
from kvpool.client.arena import Arena, Arenas
from kvpool.client.datapath import CHUNKED_MIN, DataPath
from kvpool.client.locations import Locations
from kvpool.client.node import NodeRuntime
from kvpool.client.pending import Pending, PendingCommits, commit_check
from kvpool.client.replica import checksum, digest_or_checksum
from kvpool.client.replicate import DEFAULT_CONFIG, ReplicateConfig
from kvpool.client.result import PutStatsRecorder
from kvpool.client.validation import check_count, check_replicate_config
from kvpool.codes import (
    INVALID_PARAMS,
    INVALID_WRITE,
    NO_AVAILABLE_HANDLE,
    OBJECT_ALREADY_EXISTS,
    OK,
)
from kvpool.errors import (
    ErrorCode,
    InvalidParams,
    KVPoolError,
    NoSpace,
    NotLeader,
    error_for_code,
    raise_for_code,
)
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
    SegmentName,
    Stats,
    StatsReply,
    TenantId,
    UpsertStart,
)
from kvpool.rpc.client import RpcClient, Sent
from kvpool.transfer.request import TransferOp, TransferRequest

__all__ = ["Writer"]

log = logging.getLogger(__name__)

_DFS: Final = ReplicaKind.DFS
_DEFAULT_MSG: Final = DEFAULT_CONFIG.to_msg()
"""The wire form of the default config (frozen), made once rather than on every put."""
_MEMORY: Final = ReplicaKind.MEMORY
MAX_PUT_RETRIES: Final = 3
"""A put whose write to a replica's segment failed is started again at most this many times
(within the Store's rpc_timeout of its first start)."""
_RETRYABLE: Final = frozenset({ErrorCode.TRANSFER_FAIL, ErrorCode.SEGMENT_NOT_FOUND})
"""Write failures that another segment may not have: the segment's owner died or left."""
_PROCESSING: Final = ReplicaStatus.PROCESSING


_SWITCH_GRACE_S: Final = 10.0
"""(A node that missed the etcd watch finds the new leader after three failed pings a second
apart, then remounts: a few seconds, more on a loaded machine.) For this long after a leader
switch, a PutStart answered NO_AVAILABLE_HANDLE without a hint
is asked again (the nodes are remounting at the new leader, whose segments are not yet placeable)
every `_SWITCH_HINT_MS`, within the usual retry window."""
_SWITCH_HINT_MS: Final = 50
_SWITCH_REDO: Final = frozenset(
    {
        ErrorCode.OBJECT_NOT_FOUND,
        ErrorCode.ILLEGAL_CLIENT,
        ErrorCode.LEADER_CHANGED,
        ErrorCode.NO_AVAILABLE_HANDLE,
    }
)
"""Per-key answers of a batch that spanned a leader switch which mean "the new leader does not
hold this put" (or cannot place it yet): those keys are put again."""


def _just_switched(rpc: RpcClient) -> bool:
    """Whether `rpc` moved to a new leader less than `_SWITCH_GRACE_S` ago (never for a plain
    master: its client is never retargeted)."""
    return rpc.epoch > 0 and time.monotonic() - rpc.retargeted_at < _SWITCH_GRACE_S


def _hint_s(retry_after_ms: int) -> float:
    """A master's retry hint in seconds, kept within [1 ms, 1 s] whatever it said."""
    return min(1.0, max(0.001, retry_after_ms / 1000))


def _subset(cfg: ReplicateConfigMsg, picked: list[int]) -> ReplicateConfigMsg:
    """`cfg` for the keys `picked` (indexes into a batch) put again: their groups only."""
    if cfg.group_ids is None:
        return cfg
    return msgspec.structs.replace(cfg, group_ids=[cfg.group_ids[i] for i in picked])


def _arena_config(cfg: ReplicateConfigMsg) -> bool:
    """Whether a put with `cfg` may take an arena: one replica, placed by the master."""
    return (
        cfg.replica_num == 1
        and not cfg.preferred_segments
        and not cfg.prefer_alloc_in_same_node
        and not cfg.dfs_replica_num  # a DFS copy needs PutStart
    )


def _config_msg(config: object) -> ReplicateConfigMsg:
    """The wire form of a put's `config`, which must be a `ReplicateConfig` (InvalidParams
    naming the argument otherwise: a dict has no `to_msg`)."""
    checked = check_replicate_config(config)
    return _DEFAULT_MSG if checked is None else checked.to_msg()


def _refused(code: int, key: str, cfg: ReplicateConfigMsg) -> KVPoolError:
    """The exception for the master's refusal `code` of a put of `key` with `cfg`. The master
    answers INVALID_PARAMS without saying why; the config's values it checks against its own
    limits are named, so the caller can tell which one."""
    if code != INVALID_PARAMS:
        return error_for_code(ErrorCode.of(code), key)
    limits = [f"replica_num={cfg.replica_num} (the master's maximum: max_replicas)"]
    if cfg.soft_pin_ttl_ms is not None:
        limits.append(
            f"soft_pin_ttl_ms={cfg.soft_pin_ttl_ms} ({cfg.soft_pin_ttl_ms / 3.6e6:g} h; the "
            "master's maximum: kvpool master --max-kv-soft-pin-ttl, 24h by default)"
        )
    return InvalidParams(
        f"{key!r}: the master refused the put's config as invalid; it checks "
        + " and ".join(limits)
    )


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

    __slots__ = (
        "_arenas",
        "_node",
        "_opened",
        "_retry_window",
        "locations",
        "pending",
        "stats",
        "tenant",
    )

    def __init__(
        self,
        node: NodeRuntime,
        opened: Callable[[], DataPath],
        arenas: Arenas | None,
        tenant: TenantId,
        retry_window: float = 10.0,
    ) -> None:
        self._node = node
        self._opened = opened
        self._arenas = arenas
        self.tenant = tenant
        self._retry_window = retry_window
        self.stats = PutStatsRecorder()
        self.locations: Locations | None = None
        """Cached read mode: where arena puts wrote their values (`kvpool.client.locations`)."""
        self.pending: PendingCommits | None = None
        """`write_mode="nowait"`: arena puts send their commit and return (`client/pending.py`)."""

    # ------------------------------------------------------------------ one value

    def put_one(
        self, key: str, mv: memoryview, config: ReplicateConfig | None, *, upsert: bool
    ) -> int:
        """Put (or upsert) one value; the replicas written, 0 when the key existed (put only)."""
        self._opened()
        cfg = _DEFAULT_MSG if config is None else _config_msg(config)
        deadline = 0.0
        while True:
            try:
                return self._put_one(key, mv, cfg, upsert=upsert)
            except NotLeader as exc:
                # The leader changed and the new one does not hold this put (the failover
                # client checked; the attempt was revoked): put it again, from PutStart.
                if exc.code != ErrorCode.LEADER_CHANGED:
                    raise
                now = time.monotonic()
                deadline = deadline or now + self._retry_window
                if now >= deadline:
                    raise
                self.stats.retried()
                log.info("put of %r: %s; putting it again", key, exc.message)

    def _put_one(self, key: str, mv: memoryview, cfg: ReplicateConfigMsg, *, upsert: bool) -> int:
        if not upsert and _arena_config(cfg):
            arenas = self._arenas
            if arenas is not None and mv.nbytes <= arenas.max_value:
                done = self._put_arena(arenas, key, mv, cfg)
                if done is not None:
                    return done
        avoid: dict[str, ErrorCode] = {}
        got = self._put_started(key, mv, cfg, asked=cfg, upsert=upsert, avoid=avoid)
        if got is None:
            got = self._put_again(key, mv, cfg, upsert=upsert, avoid=avoid)
        if got < cfg.replica_num and got:
            self.stats.degraded(key, got, cfg.replica_num)
        return got

    def _put_again(
        self,
        key: str,
        mv: memoryview,
        cfg: ReplicateConfigMsg,
        *,
        upsert: bool,
        avoid: dict[str, ErrorCode],
    ) -> int:
        """A put whose write to a replica's segment failed (its node died; the master will
        expire it soon), started again elsewhere within the retry bounds; raises the last
        failure when they are spent. A put that names its segments chose its placement: it
        gets the failure at once."""
        deadline = time.monotonic() + self._retry_window
        for tries in itertools.count(1):
            if cfg.preferred_segments or tries > MAX_PUT_RETRIES or time.monotonic() >= deadline:
                if not cfg.preferred_segments:
                    self.stats.retry_failed()
                last = next(reversed(avoid.values()))
                raise error_for_code(
                    last,
                    f"{key!r}: writing its replicas failed on {sorted(avoid)} ({tries} "
                    f"attempt{'s' if tries > 1 else ''}); the put was revoked",
                )
            self.stats.retried()
            attempt = self._avoiding(cfg, set(avoid))
            try:
                got = self._put_started(
                    key, mv, attempt, asked=cfg, upsert=upsert, avoid=avoid, deadline=deadline
                )
            except NoSpace as exc:
                # No other segment can take it: the write's failure is what went wrong.
                self.stats.retry_failed()
                last = next(reversed(avoid.values()))
                raise error_for_code(
                    last,
                    f"{key!r}: writing its replicas failed on {sorted(avoid)} and no other "
                    f"segment could take the put ({exc.message}); the put was revoked",
                ) from exc
            if got is not None:
                return got
        raise AssertionError("unreachable")

    def _put_started(
        self,
        key: str,
        mv: memoryview,
        cfg: ReplicateConfigMsg,
        *,
        asked: ReplicateConfigMsg,
        upsert: bool,
        avoid: dict[str, ErrorCode],
        deadline: float | None = None,
    ) -> int | None:
        """One PutStart / write / PutEnd; the replicas written (0: the key existed), or None
        when a write to a replica's segment failed (those segments are added to `avoid` with
        the failure; the put was revoked and may start again). `asked` is the caller's config
        (for messages); `deadline` bounds waiting for room (None: one retry window from when
        the master first says it is making room)."""
        cid = self._node.client_id
        start = (UpsertStart if upsert else PutStart)(cid, key, mv.nbytes, cfg, self.tenant)
        rpc = self._node.rpc
        epoch = rpc.epoch
        rep = rpc.call_as(start, PutStartReply)
        if rep.code == NO_AVAILABLE_HANDLE and (rep.retry_after_ms > 0 or _just_switched(rpc)):
            rep = self._start_when_room(start, rep, deadline)
        if rep.code == OBJECT_ALREADY_EXISTS and not upsert:
            return 0
        if rep.code:
            raise _refused(rep.code, key, asked)
        # The put's name at the master: a late PutEnd or PutRevoke of it can then never
        # finish or undo a later put of the key that took it over.
        token = [rep.replicas[0].replica_id] if rep.replicas else None
        try:
            code, csum, failed = self._write_replicas(rep.replicas, mv)
            end = OK
            if code == ErrorCode.OK:
                done = PutEnd(cid, key, csum, self.tenant, token[0] if token else None)
                end = self._node.rpc.call_as(done, Reply).code
        except BaseException:
            # Whatever escaped (a concurrent close(), KeyboardInterrupt, a fault of the data
            # path or of the PutEnd), the PutStart must not linger: for
            # put_start_discard_timeout it would make a retried put answer "already exists"
            # and hold its space. A PutEnd the master did carry out is not undone: the revoke
            # of a complete object is refused.
            self._revoke([key], token, park=True)
            dfs.remove_failed(rep.replicas)
            raise
        if code != ErrorCode.OK:
            # A node may have taken part of the bytes and still write them (frozen, not
            # dead): the master keeps the ranges parked rather than handing them out at once.
            self._revoke([key], token, park=True)
            dfs.remove_failed(rep.replicas)
            if code in _RETRYABLE and failed:
                for seg in failed:
                    avoid[seg] = code
                return None
            raise error_for_code(code, f"{key!r}: writing its replicas failed; the put was revoked")
        if end != OK:
            self._revoke([key], token)
            dfs.remove_failed(rep.replicas)  # a preempted put's master removed it before our rename
            if rpc.epoch != epoch:
                # PutStart and PutEnd went to different leaders: the new one did not hold the
                # put (not replicated to it); put_one starts it again there.
                raise NotLeader(
                    f"{key!r}: the leader changed between PutStart and PutEnd, and the new "
                    f"leader refused the PutEnd (code {end}); the put was revoked",
                    ErrorCode.LEADER_CHANGED,
                )
            raise_for_code(end, f"{key!r}: PutEnd failed; the put was revoked")
        return len(rep.replicas)

    def _start_when_room(
        self, start: PutStart | UpsertStart, rep: PutStartReply, deadline: float | None
    ) -> PutStartReply:
        """The master is making room (pool mode: moving a range's neighbours away) and said
        when to ask again: ask again after each hint, until `deadline` (None: the Store's
        retry window from now); the last answer."""
        if deadline is None:
            deadline = time.monotonic() + self._retry_window
        tries = 0
        rpc = self._node.rpc
        while rep.code == NO_AVAILABLE_HANDLE and (rep.retry_after_ms > 0 or _just_switched(rpc)):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, _hint_s(rep.retry_after_ms or _SWITCH_HINT_MS)))
            tries += 1
            rep = self._node.rpc.call_as(start, PutStartReply)
        log.debug(
            "put of %r asked again %d time(s) while room was made: %d", start.key, tries, rep.code
        )
        return rep

    def _avoiding(self, cfg: ReplicateConfigMsg, avoid: set[str]) -> ReplicateConfigMsg:
        """`cfg` (which names no preferred segments) for a put started again: the segments in
        `avoid`, and the other segments of their nodes, excluded, so that the master places
        the replicas elsewhere even before it notices that a node died. `replica_num` stays
        as asked: with fewer segments left the master stores fewer replicas (the put is
        degraded, not failed) and copies the object up to its count later. The nodes'
        other segments come from the master's list; without it only `avoid` is excluded."""
        names = set(avoid)
        try:
            stats = self._node.rpc.call_as(Stats(), StatsReply)
        except KVPoolError as exc:
            log.debug("Stats for a put's retry failed: %s", exc)
        else:
            dead = {s.endpoint for s in stats.segments if s.name in avoid}
            names.update(s.name for s in stats.segments if s.endpoint in dead)
        return msgspec.structs.replace(
            cfg, exclude_segments=[SegmentName(n) for n in sorted(names)]
        )

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
        (`kvpool.client.pending`). The places written are remembered at once (cached mode),
        and forgotten if the commit fails."""
        pending = self.pending
        assert pending is not None
        sent = self._node.rpc.send(commit)
        locations = self.locations
        if locations is not None:
            locations.remember_many(
                [k for k, w in zip(keys, where, strict=True) if w[2] is not None],
                [(arena.segment, o, n, c) for o, n, c in where if c is not None],
            )
        check = commit_check(arenas, arena, keys, locations, sent.at)
        pending.add(Pending(sent, keys, check))

    def _write_replicas(
        self, replicas: Sequence[ReplicaDesc], mv: memoryview
    ) -> tuple[ErrorCode, int | None, list[str]]:
        """Write `mv` into every replica; the first failure (or OK), the value's checksum and
        the segments whose write failed."""
        code = _check_replicas(replicas, mv.nbytes)
        if code != ErrorCode.OK:
            return code, None, []
        if replicas[-1].kind == _DFS:  # tiers: the master's DFS copy comes last, a file
            code = dfs.write(replicas[-1], mv)
            if code != ErrorCode.OK or len(replicas) == 1:
                return code, checksum(mv) if code == ErrorCode.OK else None, []
            replicas = replicas[:-1]
        csum: int | None = None
        codes: list[ErrorCode] = []
        if len(replicas) == 1 and mv.nbytes < CHUNKED_MIN:
            # The common small put: copied here when the segment is mapped (hashed while in
            # the cache), by the engine otherwise.
            r = replicas[0]
            got, digests = self._opened().move_many(
                TransferOp.WRITE, [mv], [r.segment], [r.offset], True
            )
            if got[0] != ErrorCode.OK:
                return got[0], None, [str(r.segment)]
            return got[0], digest_or_checksum(digests[0], mv), []
        rest = replicas
        if mv.nbytes >= CHUNKED_MIN:
            # Hash while writing the first replica, when it is mapped here.
            first = replicas[0]
            done = self._opened().copy_hashing(TransferOp.WRITE, mv, first.segment, first.offset)
            if done is not None:
                codes, csum, rest = [done[0]], done[1], replicas[1:]
        reqs = [TransferRequest(TransferOp.WRITE, mv, r.segment, r.offset) for r in rest]
        codes += self._opened().transfer(reqs)
        failed = [str(r.segment) for r, c in zip(replicas, codes, strict=True) if c != ErrorCode.OK]
        if failed:
            return next(c for c in codes if c != ErrorCode.OK), None, failed
        if csum is None:
            csum = checksum(mv)
        return ErrorCode.OK, csum, []

    def _revoke(self, keys: list[str], ids: list[int] | None = None, *, park: bool = False) -> None:
        """Best effort: free what PutStart took (`park`: keep it allocated until the master's
        release timeout, for ranges a node may still write). `ids`, one per key, name the
        puts (the first replica id each PutStart answered), so a put of the same key that
        took over meanwhile is left alone. If the master cannot be reached it revokes the
        put itself (put_start_discard_timeout, or when this client expires); what it
        answers for each key (a key already complete, already revoked) changes nothing."""
        cid = self._node.client_id
        try:
            if len(keys) == 1:
                one = ids[0] if ids else None
                self._node.rpc.call(PutRevoke(cid, keys[0], self.tenant, one, park))
            elif keys:
                self._node.rpc.call(BatchPutRevoke(cid, keys, self.tenant, ids or [], park))
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
            cfg = _config_msg(config)
            config.check_batch(len(keys))
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
        return self._put_batch_retrying(keys, views, cfg, upsert=upsert)

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
            if len(replicas) < want:
                short.append(i)
            view = views[i]
            head = True
            for d in replicas:
                places.append(view)
                segs.append(d.segment)
                offs.append(d.offset)
                owner.append(i)
                first.append(head)
                head = False
        try:
            codes, digests = self._opened().move_many(TransferOp.WRITE, places, segs, offs, first)
            sums: dict[int, int] = {}
            for i, head, taken in zip(owner, first, digests, strict=True):
                if head:
                    sums[i] = digest_or_checksum(taken, views[i])
        except BaseException:
            self._revoke([keys[i] for i in started], _put_ids(rep, started), park=True)
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
        if good:
            self._end_batch(keys, good, sums, out, _put_ids(rep, good))
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
    ) -> None:
        """BatchPutEnd of the keys `good` (all written; `ids` name their puts); a key whose
        end failed is revoked and answers why in `out`."""
        good_keys = keys if len(good) == len(keys) else [keys[i] for i in good]
        sum_list = [sums[i] for i in good]
        end = BatchPutEnd(self._node.client_id, good_keys, sum_list, self.tenant, ids)
        try:
            codes = self._node.rpc.call_as(end, BatchReply).codes
            check_count("BatchPutEnd", len(codes), len(good))
        except BaseException:
            self._revoke(good_keys, ids)  # the complete ones refuse it: only the others go
            raise
        failed: list[str] = []
        failed_ids: list[int] = []
        for i, c, put_id in zip(good, codes, ids, strict=True):
            if c:
                out[i] = ErrorCode.of(c)
                failed.append(keys[i])
                failed_ids.append(put_id)
        if failed:
            self._revoke(failed, failed_ids)


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


def _put_ids(rep: BatchPutStartReply, which: list[int]) -> list[int]:
    """The put ids (first replica ids) of the started keys `which` of a BatchPutStart; -1 for
    a key whose answer named no replica (never a replica's id: the master checks nothing
    it could match)."""
    results = rep.results
    return [results[i].replicas[0].replica_id if results[i].replicas else -1 for i in which]
