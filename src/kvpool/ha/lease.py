"""`LeaseKeeper`: one etcd lease kept alive on a thread, with a local deadline that is safe.

The fencing rule of kvpool's HA rests here. etcd expires a lease `TTL` seconds after the last
keepalive *it received*; this process cannot know when that was, but it knows when it *sent*
the request, which was earlier. So after every successful keepalive sent at `t`, the lease is
surely alive on etcd until `t + TTL`, and the keeper's local deadline is

    deadline = t + TTL - safety_margin

(the margin covers the two clocks running at slightly different rates and the time the caller
takes between asking `valid()` and acting on the answer). `valid()` compares the clock with that
deadline on every call, so it turns false on time even when the keeper's thread is stuck in a
request to an etcd that does not answer, or the whole process was stopped and has just resumed.
When the deadline passes, or etcd answers that the lease is gone, the keeper is *lost* for good:
`on_lost(reason)` runs once on the keeper's thread, and nothing revives it (a holder that wants
the role back grants a new lease and earns it again).

Thread: one per granted lease (`lease-keeper-<name>`), renewing every `keepalive_interval` and,
after a failed attempt, every `retry_interval` until the deadline. Each request's timeout is cut
to the time left before the deadline, so `on_lost` is late by at most a few milliseconds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvpool.errors import InvalidParams
from kvpool.ha.coordinator import Coordinator, CoordinatorError, Lease

__all__ = ["LeaseConfig", "LeaseKeeper"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    """Timing of one lease (seconds); None derives a field from `ttl` as noted."""

    ttl: int = 5
    """Lease TTL asked of etcd (whole seconds; etcd raises anything below its minimum, ~2 s)."""
    keepalive_interval: float | None = None
    """Time between keepalives (default `ttl / 3`)."""
    safety_margin: float | None = None
    """How long before etcd could expire the lease this process stops trusting it (`ttl / 5`)."""
    request_timeout: float | None = None
    """Longest wait for one etcd request (default `keepalive_interval / 2`)."""
    retry_interval: float | None = None
    """Pause after a failed keepalive before the next try (default `keepalive_interval / 4`)."""

    def __post_init__(self) -> None:
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, int) or self.ttl < 1:
            raise InvalidParams(f"lease ttl: expected whole seconds >= 1, got {self.ttl!r}")
        for name in ("keepalive_interval", "safety_margin", "request_timeout", "retry_interval"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InvalidParams(f"lease {name}: expected seconds > 0, got {value!r}")
        if self.interval + self.margin >= self.ttl:
            raise InvalidParams(
                f"lease timing: keepalive_interval ({self.interval:.3g} s) + safety_margin "
                f"({self.margin:.3g} s) must be below the ttl ({self.ttl} s), or one late "
                "keepalive would end the lease"
            )

    @property
    def interval(self) -> float:
        return self.keepalive_interval if self.keepalive_interval is not None else self.ttl / 3

    @property
    def margin(self) -> float:
        return self.safety_margin if self.safety_margin is not None else self.ttl / 5

    @property
    def timeout(self) -> float:
        return self.request_timeout if self.request_timeout is not None else self.interval / 2

    @property
    def retry(self) -> float:
        return self.retry_interval if self.retry_interval is not None else self.interval / 4


class LeaseKeeper:
    """Grants one lease (`grant`) and keeps it alive until `revoke`, `close` or its loss.

    `on_lost(reason)` runs once, on the keeper's thread, when the lease is lost (deadline
    passed, or etcd no longer knows it); never after `revoke` or `close`. `clock` is the
    monotonic clock the deadline is kept in.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        config: LeaseConfig,
        *,
        name: str = "lease",
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._coord = coordinator
        self.config = config
        self.name = name
        self._on_lost = on_lost
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.lost = threading.Event()
        """Set once the lease is lost, revoked or closed: it is never valid again."""
        self.lost_reason = ""
        self.lease: Lease | None = None
        self._deadline = -math.inf
        self._ttl = float(config.ttl)
        self._thread: threading.Thread | None = None

    @property
    def deadline(self) -> float:
        """The clock reading until which the lease is surely alive on etcd."""
        return self._deadline

    def valid(self) -> bool:
        """Whether the lease is surely alive on etcd now (cheap; any thread)."""
        return not self.lost.is_set() and self._clock() < self._deadline

    def grant(self) -> Lease:
        """Grant the lease and start keeping it alive; `CoordinatorError` if etcd refuses or
        cannot be reached. Call once."""
        if self.lease is not None or self.lost.is_set():
            raise InvalidParams(f"lease keeper {self.name}: grant() called twice")
        sent = self._clock()
        lease = self._coord.grant(self.config.ttl, timeout=self.config.timeout)
        # etcd may raise the TTL to its minimum; the smaller of the two is what we can trust.
        self._ttl = float(min(self.config.ttl, lease.ttl or self.config.ttl))
        with self._lock:
            self.lease = lease
            self._deadline = sent + self._ttl - self.config.margin
        self._thread = threading.Thread(
            target=self._run, name=f"lease-keeper-{self.name}", daemon=True
        )
        self._thread.start()
        return lease

    def _run(self) -> None:
        lease = self.lease
        assert lease is not None
        next_at = self._clock() + self.config.interval
        while True:
            now = self._clock()
            if now >= self._deadline:
                self._lose(f"no keepalive succeeded before the local deadline (lease {lease.id})")
                return
            if self._stop.wait(max(0.0, min(next_at, self._deadline) - now)):
                return
            sent = self._clock()
            left = self._deadline - sent
            if left <= 0:
                continue
            try:
                ttl = self._coord.keepalive(lease.id, timeout=min(self.config.timeout, left))
            except CoordinatorError as exc:
                log.info("lease %s (%d): keepalive failed: %s", self.name, lease.id, exc.message)
                next_at = self._clock() + self.config.retry
                continue
            if self._stop.is_set():
                return
            if ttl <= 0:
                self._lose(f"etcd no longer knows lease {lease.id}")
                return
            with self._lock:
                self._deadline = max(
                    self._deadline, sent + min(self._ttl, float(ttl)) - self.config.margin
                )
            next_at = sent + self.config.interval

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self.lost.is_set():
                return
            self.lost_reason = reason
            self.lost.set()
        log.warning("lease %s lost: %s", self.name, reason)
        if self._on_lost is not None and not self._stop.is_set():
            self._on_lost(reason)

    def _halt(self, reason: str) -> None:
        self._stop.set()
        with self._lock:
            if not self.lost.is_set():
                self.lost_reason = reason
                self.lost.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.config.timeout + 5)

    def revoke(self) -> bool:
        """Stop keeping the lease and revoke it on etcd (its keys go at once); whether etcd
        confirmed. Never raises: an unreachable etcd expires the lease by itself."""
        self._halt("revoked")
        lease = self.lease
        if lease is None:
            return False
        try:
            return self._coord.revoke(lease.id, timeout=self.config.timeout)
        except CoordinatorError as exc:
            log.info("lease %s (%d): revoke failed: %s", self.name, lease.id, exc.message)
            return False

    def close(self) -> None:
        """Stop keeping the lease without revoking it (it expires on etcd). Idempotent."""
        self._halt("closed")
