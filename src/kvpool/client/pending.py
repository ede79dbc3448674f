"""`PendingCommits`: the commits of puts that did not wait for them (`write_mode="nowait"`).

In that mode an arena put (`kvpool.client.arena`) returns once its bytes are written into the
arena and its PutCommit (BatchPutCommit for a batch) is on the wire (`RpcClient.send`); the
answer is taken later. Each commit sent is queued here with its keys; the queue is bounded
(`limit`): a put that finds it full first takes the oldest answer (by then, usually all of
them have arrived: one read of the socket files them all).

When answers are taken: at the start of the next call on the Store (`settle`, which only takes
the answers already here), at `flush()` (every one, waiting), at `close()` (as flush), and
when the queue is full. A failed commit raises there, naming its key, as `DeferredPutError`
(the code of the failure); OBJECT_ALREADY_EXISTS is not a failure (the key has a value, as a
put answering False). A commit of a forgotten arena (INVALID_WRITE, after a master restart)
is a failure too: the value was written into space the master no longer lent, and the Store
cannot put it again because the caller's buffer is not kept.

What a caller may assume after a put returned: the bytes are in the pool's memory and the
commit was sent; another client's get may miss the key until the commit is carried out (a
round trip later, usually); this Store's own gets in cached read mode find it at once. What a
caller may not assume: that the key is stored (that is known at the next call, `flush()` or
`close()`), or that a failure will be reported on the call that caused it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from kvpool.client.arena import Arena, Arenas
from kvpool.client.locations import Locations
from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.messages import BatchReply, Reply
from kvpool.rpc.client import RpcClient, Sent

__all__ = [
    "DEFAULT_PENDING_LIMIT",
    "DeferredPutError",
    "Pending",
    "PendingCommits",
    "commit_check",
]

log = logging.getLogger(__name__)

DEFAULT_PENDING_LIMIT: Final = 64
"""Commits in flight at most; past it a put waits for the oldest answer."""


class DeferredPutError(KVPoolError):
    """A put that did not wait for its commit failed; `key` names it, `code` says why."""

    def __init__(self, code: ErrorCode, key: str, message: str) -> None:
        super().__init__(f"{key!r}: deferred put failed: {message}", code)
        self.key = key


@dataclass(slots=True)
class Pending:
    """One commit on the wire: its keys, and `check(reply)`, which returns the per-key codes
    of its answer (one per key) and does the bookkeeping (arena confirmation, forgetting
    places of keys that failed)."""

    sent: Sent
    keys: list[str]
    check: Callable[[object | None, KVPoolError | None], list[ErrorCode]]


class PendingCommits:
    """The bounded queue of unwaited commits of one Store (module docstring). Thread-safe."""

    __slots__ = ("_lock", "_queue", "_rpc", "failures", "limit")

    def __init__(self, rpc: Callable[[], RpcClient], limit: int = DEFAULT_PENDING_LIMIT) -> None:
        self._rpc = rpc
        self.limit = limit
        self._queue: deque[Pending] = deque()
        self._lock = threading.Lock()
        self.failures = 0

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, pending: Pending) -> None:
        """Queue a commit just sent; when the queue is full, first take the oldest answers
        (which may raise the failure of an earlier put)."""
        with self._lock:
            self._queue.append(pending)
            full = len(self._queue) > self.limit
        if full:
            self._take(wait_for=1)

    def settle(self) -> None:
        """Take the answers already here (no waiting); raise the first failure among them."""
        if self._queue and self._queue[0].sent.done:
            self._take(wait_for=0)

    def flush(self) -> None:
        """Take every answer, waiting for them; raise the first failure."""
        self._take(wait_for=len(self._queue) + self.limit)

    def _take(self, wait_for: int) -> None:
        """Take the answers at the head of the queue: the first `wait_for` waiting if need
        be, then those already here. Every answer taken is checked; the first failure is
        raised once they all are."""
        first: KVPoolError | None = None
        waited = 0
        while True:
            with self._lock:
                if not self._queue:
                    break
                head = self._queue[0]
                if waited >= wait_for and not head.sent.done:
                    break
                self._queue.popleft()
            waited += 1
            reply: object | None = None
            error: KVPoolError | None = None
            try:
                reply = self._rpc().receive(head.sent)
            except KVPoolError as exc:
                error = exc
            codes = head.check(reply, error)
            for key, code in zip(head.keys, codes, strict=True):
                if code in (ErrorCode.OK, ErrorCode.OBJECT_ALREADY_EXISTS):
                    continue
                self.failures += 1
                if first is None:
                    why = error.message if error is not None else code.name
                    first = DeferredPutError(code, key, why)
                else:
                    log.warning("deferred put of %r failed: %s", key, code.name)
        if first is not None:
            raise first


def commit_check(
    arenas: Arenas,
    arena: Arena,
    keys: list[str],
    locations: Locations | None,
    at: float,
    *,
    places: Mapping[str, tuple[str, int, int, int]] | None = None,
    epoch: int = 0,
) -> Callable[[object | None, KVPoolError | None], list[ErrorCode]]:
    """The `Pending.check` of a PutCommit (one key) or BatchPutCommit (several) into `arena`
    sent at `at`: the per-key codes of its answer; an answer that renewed the arena's lease
    confirms it, one that says the master forgot the arena drops it, and the remembered
    places of keys not stored are forgotten."""

    one = keys[0] if len(keys) == 1 else None
    place = places.get(one) if one is not None and places else None

    def check(reply: object | None, error: KVPoolError | None) -> list[ErrorCode]:
        if one is not None and error is None and type(reply) is Reply and not reply.code:
            # The common answer of a single put, stored: what the general path below does
            # for it, without its lists.
            arenas.confirm(arena, at)
            if locations is not None and place is not None:
                locations.remember(one, *place, epoch=epoch)
            return [ErrorCode.OK]
        n = len(keys)
        if error is not None:
            codes = [error.code] * n
        elif isinstance(reply, BatchReply) and len(reply.codes) == n:
            codes = [ErrorCode.of(c) if c else ErrorCode.OK for c in reply.codes]
        elif isinstance(reply, Reply) and n == 1:
            codes = [ErrorCode.of(reply.code) if reply.code else ErrorCode.OK]
        else:
            codes = [ErrorCode.RPC_FAIL] * n  # a malformed answer: nothing is known
        kept = (ErrorCode.OK, ErrorCode.OBJECT_ALREADY_EXISTS)
        if any(c in kept for c in codes):
            arenas.confirm(arena, at)
        if ErrorCode.INVALID_WRITE in codes:
            arenas.drop(arena)
        if locations is not None:
            if places:
                # The places of the keys stored (`places`: written, with a checksum), unless
                # something was forgotten since the commit was sent (`epoch`): a removal seen
                # meanwhile may concern them.
                stored = [k for k, c in zip(keys, codes, strict=True) if c == ErrorCode.OK]
                known = [k for k in stored if k in places]
                if known:
                    locations.remember_many(known, [places[k] for k in known], epoch=epoch)
            failed = [k for k, c in zip(keys, codes, strict=True) if c != ErrorCode.OK]
            if failed:
                locations.forget_many(failed)
        return codes

    return check
