"""`WriterBase`: what every put path of the Writer shares (`kvpool.client.writer`).

The Writer's state (its node, data path, arenas, tenant, retry window, put statistics and the
cached-read / nowait hooks), the constants and rules of its retries, and the three steps every
path takes: write a value into its replicas (`_write_replicas`), revoke a put that failed
(`_revoke`), and steer a put started again away from a dead node's segments (`_avoiding`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from kvpool.client import dfs
from kvpool.client.arena import Arenas
from kvpool.client.datapath import DataPath
from kvpool.client.locations import Locations
from kvpool.client.node import NodeRuntime
from kvpool.client.pending import PendingCommits
from kvpool.client.replica import checksum, digest_or_checksum
from kvpool.client.replicate import DEFAULT_CONFIG
from kvpool.client.result import PutStatsRecorder
from kvpool.client.sharedcopy import CHUNKED_MIN
from kvpool.client.validation import check_replicate_config
from kvpool.codes import INVALID_PARAMS
from kvpool.errors import (
    ErrorCode,
    InvalidParams,
    KVPoolError,
    error_for_code,
)
from kvpool.protocol.messages import (
    BatchPutRevoke,
    PutRevoke,
    ReplicaDesc,
    ReplicaKind,
    ReplicaStatus,
    ReplicateConfigMsg,
    SegmentName,
    Stats,
    StatsReply,
    TenantId,
)
from kvpool.rpc.client import RpcClient
from kvpool.transfer.request import TransferOp, TransferRequest

__all__ = ["WriterBase"]

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
_OK: Final = ErrorCode.OK
_WRITE: Final = TransferOp.WRITE


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


class WriterBase:
    """The state and shared steps of the put paths of one Store (`kvpool.client.writer`). Thread-safe: it keeps no state of its
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

    def _write_replicas(
        self, replicas: Sequence[ReplicaDesc], mv: memoryview
    ) -> tuple[ErrorCode, int | None, list[str]]:
        """Write `mv` into every replica; the first failure (or OK), the value's checksum and
        the segments whose write failed."""
        if len(replicas) == 1 and mv.nbytes >= CHUNKED_MIN:  # one large replica, mapped here
            r = replicas[0]
            if r.kind is not _DFS and r.size == mv.nbytes:
                done = self._opened().copy_hashing(_WRITE, mv, r.segment, r.offset)
                if done is not None:
                    if done[0] != _OK:
                        return done[0], None, [str(r.segment)]
                    return _OK, done[1], []
        code = _check_replicas(replicas, mv.nbytes)
        if code != ErrorCode.OK:
            return code, None, []
        for d in replicas:
            # tiers: the master's DFS copy is a file, found by kind: a fresh put lists it
            # last, an in-place upsert answers the stored order (a promotion from DFS stored
            # the memory copy after it)
            if d.kind is _DFS:
                code = dfs.write(d, mv)
                if code != ErrorCode.OK or len(replicas) == 1:
                    return code, checksum(mv) if code == ErrorCode.OK else None, []
                replicas = [r for r in replicas if r is not d]
                break
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
            # Hash while writing the first replica: as it is copied when it is mapped here,
            # else (one replica, over TCP) while the node takes the payload and answers.
            first = replicas[0]
            data = self._opened()
            done = data.copy_hashing(TransferOp.WRITE, mv, first.segment, first.offset)
            if done is not None:
                codes, csum, rest = [done[0]], done[1], replicas[1:]
            elif len(replicas) == 1:
                code, digest = data.write_hashing(mv, first.segment, first.offset)
                if code != ErrorCode.OK:
                    return code, None, [str(first.segment)]
                return code, digest_or_checksum(digest, mv), []
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
