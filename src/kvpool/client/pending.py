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
]

log = logging.getLogger(__name__)

DEFAULT_PENDING_LIMIT: Final = 64
"""Commits in flight at most; past it a put waits for the oldest answer."""
_STORED: Final = [ErrorCode.OK]


class DeferredPutError(KVPoolError):
    """A put that did not wait for its commit failed; `key` names it, `code` says why."""

    def __init__(self, code: ErrorCode, key: str, message: str) -> None:
        super().__init__(f"{key!r}: deferred put failed: {message}", code)
        self.key = key


class Pending:
    """One commit on the wire into `arena` (a PutCommit of one key, or a BatchPutCommit) and
    what its answer settles: `check(reply, error)` returns the per-key codes of the answer
    (one per key) and does the bookkeeping: an answer that renewed the arena's lease confirms
    it, one that says the master forgot the arena drops it, the places written (`places`: key
    -> (segment, offset, size, checksum)) of the keys stored are remembered unless something
    was forgotten since the commit was sent (`epoch`: a removal seen meanwhile may concern
    them), and the places of keys not stored are forgotten."""

    __slots__ = ("arena", "arenas", "epoch", "keys", "locations", "places", "sent")

    def __init__(
        self,
        sent: Sent,
        keys: list[str],
        arenas: Arenas,
        arena: Arena,
        *,
        locations: Locations | None,
        places: Mapping[str, tuple[str, int, int, int]] | None = None,
        epoch: int = 0,
    ) -> None:
        self.sent = sent
        self.keys = keys
        self.arenas = arenas
        self.arena = arena
        self.locations = locations
        self.places = places
        self.epoch = epoch

    def check(self, reply: object | None, error: KVPoolError | None) -> list[ErrorCode]:
        """The per-key codes of `reply` (or of `error`), with the bookkeeping above."""
        keys, locations, places = self.keys, self.locations, self.places
        n = len(keys)
        if n == 1 and error is None and type(reply) is Reply and not reply.code:
            # The common answer of a single put, stored: what the general path below does
            # for it, without its lists.
            self.arenas.confirm(self.arena, self.sent.at)
            if locations is not None and places:
                place = places.get(keys[0])
                if place is not None:
                    locations.remember(keys[0], *place, epoch=self.epoch)
            return [ErrorCode.OK]
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
            self.arenas.confirm(self.arena, self.sent.at)
        if ErrorCode.INVALID_WRITE in codes:
            self.arenas.drop(self.arena)
        if locations is not None:
            if places:
                stored = [k for k, c in zip(keys, codes, strict=True) if c == ErrorCode.OK]
                known = [k for k in stored if k in places]
                if known:
                    locations.remember_many(known, [places[k] for k in known], epoch=self.epoch)
            failed = [k for k, c in zip(keys, codes, strict=True) if c != ErrorCode.OK]
            if failed:
                locations.forget_many(failed)
        return codes


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
            if codes == _STORED:
                continue
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
