"""`Invalidations`: the Store's end of the invalidation stream (`kvpool.protocol.invalidation`).

In cached read mode the Store subscribes on its master connection; the master then pushes the
keys of its tenant that are removed, evicted or replaced, and each push makes `Locations` (and
the hot cache) forget them, so a removal usually stops being visible here within a round trip
instead of the TTL (docs/parts/perf-store.md measures the window).

Pushes are read by whichever call reads the connection (any RPC of the Store, its heartbeat)
and, since cached reads send nothing, by `refresh`, which the remembered-place lookups call:
at most every `poll_interval` it reads what arrived without waiting (`RpcClient.poll`). It also
notices a new connection (a reconnect, a new leader): the old subscription is gone and pushes
may have been lost, so everything remembered is forgotten and the Store subscribes again (at
most once a second while the master cannot be reached; until it is subscribed again, what a
read remembers is forgotten by the next lookup a millisecond later). A master that refuses the subscription (an older one) leaves the Store with its
TTL alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from kvpool.errors import KVPoolError, RpcError
from kvpool.protocol.invalidation import Subscribe, decode_push
from kvpool.protocol.messages import Reply, TenantId
from kvpool.rpc.client import RpcClient

__all__ = ["DEFAULT_POLL_INTERVAL_S", "Invalidations"]

log = logging.getLogger(__name__)

_RETRY_S: Final = 1.0
"""After a failed Subscribe (no master), lookups do not try again for this long; meanwhile
they keep forgetting everything (reads ask the master, as in strict mode)."""

DEFAULT_POLL_INTERVAL_S: Final = 0.001
"""Seconds between two reads of the connection by cached lookups (one syscall each)."""


class Invalidations:
    """Subscribes a Store's connection and applies the pushes to `forget` / `clear`."""

    __slots__ = (
        "_clear",
        "_conn",
        "_forget",
        "_last",
        "_retry_at",
        "_rpc",
        "_tenant",
        "poll_interval",
        "pushes",
        "unsupported",
    )

    def __init__(
        self,
        rpc: Callable[[], RpcClient],
        tenant: TenantId,
        forget: Callable[[list[str]], None],
        clear: Callable[[], None],
        poll_interval: float = DEFAULT_POLL_INTERVAL_S,
    ) -> None:
        self._rpc = rpc
        self._tenant = tenant
        self._forget = forget
        self._clear = clear
        self.poll_interval = poll_interval
        self._conn: object | None = None
        self._last = 0.0
        self._retry_at = 0.0
        #: Pushes applied (tests and status read it).
        self.pushes = 0
        #: The master refused to subscribe: the TTL alone bounds staleness.
        self.unsupported = False

    def start(self) -> None:
        """Listen for pushes and subscribe (a failure is retried by `refresh`)."""
        self._rpc().on_push = self._on_push
        self._subscribe()

    def refresh(self) -> None:
        """Apply what the master pushed so far (at most every `poll_interval`); after a
        reconnect, forget everything and subscribe again."""
        now = time.monotonic()
        if now - self._last < self.poll_interval or self.unsupported:
            return
        self._last = now
        rpc = self._rpc()
        if rpc.current_connection() is not self._conn or self._conn is None:
            self._clear()
            if now >= self._retry_at:
                self._subscribe()
                if self._conn is None:  # the master is unreachable: not again for a while
                    self._retry_at = now + _RETRY_S
            return
        try:
            rpc.poll()
        except KVPoolError as exc:  # the next call reconnects; `refresh` then resubscribes
            log.debug("reading pushes failed: %s", exc)

    def _subscribe(self) -> None:
        rpc = self._rpc()
        rpc.on_push = self._on_push
        try:
            reply = rpc.call_as(Subscribe(self._tenant), Reply)
        except RpcError as exc:
            self._conn = None
            log.debug("subscribing to invalidations failed: %s", exc)
            return
        except KVPoolError as exc:  # refused (an older master): the TTL alone
            log.info(
                "the master does not push invalidations (%s); remembered places live "
                "until their TTL",
                exc,
            )
            self.unsupported = True
            return
        if reply.code != 0:
            log.info("the master refused the invalidation stream (code %d)", reply.code)
            self.unsupported = True
            return
        self._conn = rpc.current_connection()

    def _on_push(self, payload: bytes) -> None:
        msg = decode_push(payload)
        self.pushes += 1
        if msg is None or msg.everything:
            self._clear()
        elif msg.tenant == self._tenant:
            self._forget(msg.keys)
