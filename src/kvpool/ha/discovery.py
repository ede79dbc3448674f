"""`LeaderDiscovery`: how clients and nodes find the leader of an HA cluster, and follow it.

Given `etcd://HOST:PORT[,...]/CLUSTER_ID` (`kvpool.ha.url.EtcdUrl`), a Store or node:

1. `resolve()` reads the leader key once and answers the `LeaderView` (address and term), or
   None while no master leads;
2. `start()` follows changes on a thread (`leader-discovery-<cluster>`): a watch on the leader
   key, a re-read every `resync_interval` even when the watch is quiet, and a new watch after any
   break; `on_change(view)` runs on that thread for each newer leader;
3. calls `refresh()` after N failed pings of the master it has (the caller's rule, as in
   Mooncake's client: 3 failures a second apart), which reads again at once.

Terms only grow (`kvpool.ha.election`), so discovery keeps the highest term it has seen and
**refuses older answers**: a view from a lower term (a slow read, a stale etcd member) never
replaces a newer one, and `current()` never goes back in time. A vanished leader key leaves
`current()` as it was (the caller keeps trying that address until a newer leader appears);
`leaderless()` says whether the key is absent at the last look.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvpool.errors import InvalidParams
from kvpool.ha.coordinator import Coordinator, CoordinatorError, EventType, WatchLost
from kvpool.ha.keys import ClusterKeys
from kvpool.ha.leader import LeaderView

__all__ = ["LeaderDiscovery"]

log = logging.getLogger(__name__)

_POLL = 0.1  # how often the follow thread looks up from its watch to check for close()


class LeaderDiscovery:
    """Find and follow the leader of `keys`' cluster through `coordinator`."""

    def __init__(
        self,
        coordinator: Coordinator,
        keys: ClusterKeys,
        *,
        resync_interval: float = 10.0,
        retry_interval: float = 0.5,
        timeout: float | None = None,
        on_change: Callable[[LeaderView], None] | None = None,
    ) -> None:
        if not resync_interval > 0 or not retry_interval > 0:
            raise InvalidParams(
                f"discovery: intervals must be > 0 s (resync {resync_interval!r}, "
                f"retry {retry_interval!r})"
            )
        self._coord = coordinator
        self.keys = keys
        self.resync_interval = resync_interval
        self.retry_interval = retry_interval
        self.timeout = timeout
        self._on_change = on_change
        self._cond = threading.Condition()
        self._view: LeaderView | None = None
        self._leaderless = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> LeaderView | None:
        """The newest leader seen so far (None: none yet)."""
        with self._cond:
            return self._view

    def leaderless(self) -> bool:
        """Whether the leader key was absent at the last look."""
        with self._cond:
            return self._leaderless

    def offer(self, view: LeaderView | None) -> bool:
        """Take `view` if it is newer than the current one; whether it was taken.

        None records that no leader holds the key now. Callers may offer views learned
        elsewhere (a master's own reply naming its term); the same term rule applies.
        """
        with self._cond:
            if view is None:
                self._leaderless = True
                return False
            if not view.newer_than(self._view):
                if view == self._view:
                    self._leaderless = False
                return False
            self._view = view
            self._leaderless = False
            self._cond.notify_all()
        log.info(
            "discovery %s: leader %s at %s, term %d",
            self.keys.cluster_id,
            view.member_id,
            view.address,
            view.term,
        )
        if self._on_change is not None:
            self._on_change(view)
        return True

    def resolve(self) -> LeaderView | None:
        """Read the leader key now; the current leader (never older than one seen before), or
        None while no leader holds the key. `CoordinatorError` if etcd fails."""
        kv, _ = self._coord.get(self.keys.leader, timeout=self.timeout)
        self.offer(None if kv is None else self._decode(kv.value))
        return self.current() if kv is not None else None

    refresh = resolve
    """What a client calls after repeated failed pings: ask etcd again, now."""

    def wait_for(self, min_term: int, timeout: float) -> LeaderView | None:
        """The first leader of term >= `min_term`; None after `timeout` s (needs `start()` or
        other callers of `resolve` to learn of it)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._view is None or self._view.term < min_term:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._view

    def _decode(self, data: bytes) -> LeaderView | None:
        try:
            return LeaderView.decode(data)
        except CoordinatorError as exc:
            log.warning("discovery %s: %s", self.keys.cluster_id, exc.message)
            return None

    def start(self) -> None:
        if self._thread is not None:
            raise InvalidParams("discovery: start() called twice")
        self._thread = threading.Thread(
            target=self._run, name=f"leader-discovery-{self.keys.cluster_id}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow_once()
            except CoordinatorError as exc:
                log.info("discovery %s: etcd: %s", self.keys.cluster_id, exc.message)
                self._stop.wait(self.retry_interval)

    def _follow_once(self) -> None:
        kv, revision = self._coord.get(self.keys.leader, timeout=self.timeout)
        self.offer(None if kv is None else self._decode(kv.value))
        watch = self._coord.watch(
            self.keys.leader, start_revision=revision + 1, timeout=self.timeout
        )
        try:
            resync_at = time.monotonic() + self.resync_interval
            while not self._stop.is_set() and time.monotonic() < resync_at:
                for event in watch.get(_POLL) or ():
                    if event.type is EventType.DELETE:
                        self.offer(None)
                    else:
                        self.offer(self._decode(event.kv.value))
        except WatchLost:
            return
        finally:
            watch.close()

    def close(self) -> None:
        """Stop following (idempotent); the coordinator stays the caller's."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=10)
