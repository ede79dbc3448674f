"""`StartedPuts`: one key put through PutStart / write / PutEnd (`kvpool.client.writer`).

A put that cannot take an arena, or whose arena failed it, is started at the master, written
into every replica and ended with its checksum (`_put_started`); a write that failed on a
dead node's segment is revoked and started again elsewhere (`_put_again`); a master that is
making room is asked again after its hint (`_start_when_room`).
"""

from __future__ import annotations

import itertools
import logging
import time

from kvpool.client import dfs
from kvpool.client.writer.base import (
    _RETRYABLE,
    _SWITCH_HINT_MS,
    MAX_PUT_RETRIES,
    WriterBase,
    _hint_s,
    _just_switched,
    _refused,
)
from kvpool.codes import (
    NO_AVAILABLE_HANDLE,
    OBJECT_ALREADY_EXISTS,
    OK,
)
from kvpool.errors import (
    ErrorCode,
    NoSpace,
    NotLeader,
    error_for_code,
    raise_for_code,
)
from kvpool.protocol.messages import (
    PutEnd,
    PutStart,
    PutStartReply,
    ReplicateConfigMsg,
    Reply,
    UpsertStart,
)

__all__ = ["StartedPuts"]

log = logging.getLogger(__name__)


class StartedPuts(WriterBase):
    """The per-key PutStart / PutEnd path of the Writer (module docstring)."""

    __slots__ = ()

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
