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

import logging
import time

from kvpool.client.replicate import ReplicateConfig
from kvpool.client.writer.arena_puts import ArenaPuts
from kvpool.client.writer.arena_puts import _parts as _parts  # (tests/client/test_write_mode.py)
from kvpool.client.writer.base import _DEFAULT_MSG, _arena_config, _config_msg
from kvpool.errors import ErrorCode, NotLeader
from kvpool.protocol.messages import ReplicateConfigMsg

__all__ = ["Writer"]

log = logging.getLogger(__name__)


class Writer(ArenaPuts):
    """The put paths of one Store (package docstring), its entry points `put_one` and
    `put_batch`. Thread-safe: it keeps no state of its own between calls; `opened` answers
    the Store's `DataPath`, or raises `StoreClosed`. The paths live in the classes it
    extends, one module each: `base` (state, shared steps), `started` (PutStart / PutEnd of
    one key), `batches` (the batch forms), `arena_puts` (PutCommit into an arena)."""

    __slots__ = ()

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
