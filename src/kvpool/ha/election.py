"""`Election`: masters of one cluster elect one leader through etcd, with fencing by term.

Each master runs an `Election` for its cluster (`kvpool.ha.keys.ClusterKeys`). Its thread
(`election-<member id>`) loops over rounds:

1. **Read** the leader key. Held by someone: **follow** (below). Absent: campaign.
2. **Campaign.** Read the term key (T, or 0), grant a lease (`kvpool.ha.lease.LeaseKeeper`),
   then one transaction: *if* the leader key is absent *and* the term key is unchanged, put the
   leader key = `LeaderView(member_id, address, T + 1)` on the lease *and* the term key = T + 1.
   Exactly one campaigner's transaction can succeed per term, and terms strictly increase
   across leaders (the term key never expires). A loser revokes its lease and follows.
3. **Lead** while the lease keeper is valid: the role is LEADER and `leading()` is true. The
   leader watches its own key and steps down if it is deleted or replaced.
4. **Step down** the moment the keeper's local deadline passes or etcd says the lease is gone:
   `leading()` is false from that instant on (it checks the deadline itself, see
   `kvpool.ha.lease`), the state turns FOLLOWER and `on_change` runs. The old lease is revoked
   as soon as etcd answers, so the others need not wait for it to expire; the term is never
   used again. Leading again takes a new campaign, which gives a new, higher term.
5. **Follow**: watch the leader key from the read's revision; a DELETE (the leader resigned, or
   its lease expired) starts a new round at once; the key is also re-read every
   `resync_interval` and whenever the watch breaks. A leader record left by this member's own
   previous life (same member id, another lease) is revoked, so a restarted master need not wait
   out its old lease.

**Fencing rule for the caller** (the master, later): serve a write only while `leading()` is
true, and tag what it hands out with `term`; a standby or client that has seen term T refuses
anything from a lower term. Since `leading()` turns false before etcd can expire the lease, no
two members ever both see `leading()` true at the same time (given clocks that run at nearly the
same rate; the safety margin covers the rest).

`close()` resigns: the lease is revoked, which deletes the leader key, so a standby campaigns at
once instead of after a TTL. An etcd that cannot be reached makes a round fail; the thread waits
`retry_interval` and starts over (a leader steps down by its own deadline meanwhile).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpool.errors import InvalidParams
from kvpool.ha.coordinator import (
    Coordinator,
    CoordinatorError,
    EventType,
    KeyValue,
    LeaseId,
    ModRevisionIs,
    Put,
    Watch,
    WatchLost,
)
from kvpool.ha.keys import ClusterKeys, validate_name
from kvpool.ha.leader import LeaderView
from kvpool.ha.lease import LeaseConfig, LeaseKeeper

__all__ = ["Election", "ElectionConfig", "ElectionState", "Role"]

log = logging.getLogger(__name__)

_POLL = 0.05  # how often the thread looks up from a watch to check its flags (s)


class Role(enum.Enum):
    FOLLOWER = "follower"
    LEADER = "leader"
    CLOSED = "closed"


@dataclass(frozen=True)
class ElectionState:
    """One member's view: its role, the leader it knows of (itself when leading; None when it
    knows of none) and why the state last changed."""

    role: Role
    leader: LeaderView | None
    reason: str = ""

    @property
    def term(self) -> int:
        """The term of the known leader (0: none)."""
        return self.leader.term if self.leader is not None else 0


@dataclass(frozen=True)
class ElectionConfig:
    """Timing of an election (seconds)."""

    lease: LeaseConfig = field(default_factory=LeaseConfig)
    """The leader lease: TTL, keepalive interval, safety margin (`kvpool.ha.lease`)."""
    resync_interval: float = 10.0
    """A follower re-reads the leader key this often even when its watch is quiet."""
    retry_interval: float = 0.5
    """Pause before the next round after etcd could not be reached."""

    def __post_init__(self) -> None:
        for name in ("resync_interval", "retry_interval"):
            value = getattr(self, name)
            if not value > 0:
                raise InvalidParams(f"election {name}: expected seconds > 0, got {value!r}")


class Election:
    """Campaign for the leadership of `keys`' cluster as `member_id`, serving at `address`.

    `on_change(state)` runs on the election's thread after every change of role or known
    leader (keep it short; hand work to your own loop). `start()` starts the thread; `close()`
    resigns and joins it.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        keys: ClusterKeys,
        member_id: str,
        address: str,
        *,
        config: ElectionConfig | None = None,
        on_change: Callable[[ElectionState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        may_campaign: Callable[[], bool] | None = None,
    ) -> None:
        self._coord = coordinator
        #: Asked (on the election thread) before each campaign: False waits `retry_interval`
        #: and reads again instead (a master whose copy would lose acknowledged writes).
        self.may_campaign = may_campaign
        self._resign = threading.Event()
        self._won_revision = 0
        self._cooldown_until = float("-inf")
        self.keys = keys
        self.member_id = validate_name("member id", member_id)
        self.address = address
        self.config = config or ElectionConfig()
        self._on_change = on_change
        self._clock = clock
        self._cond = threading.Condition()
        self._state = ElectionState(Role.FOLLOWER, None, "not started")
        self._keeper: LeaseKeeper | None = None
        self._last_deadline = float("-inf")
        self._stale: list[LeaseId] = []  # leases of ended leaderships, to revoke when etcd answers
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the master asks -------------------------------------------------------------

    @property
    def state(self) -> ElectionState:
        with self._cond:
            return self._state

    def leading(self) -> bool:
        """True only while this member leads and its lease is surely alive (any thread; cheap)."""
        keeper = self._keeper
        return (
            keeper is not None and keeper.valid() and self._state.role is Role.LEADER
        ) and not self._closing.is_set()

    def leader_deadline(self) -> float:
        """The clock reading until which the current leadership is surely valid (-inf: none)."""
        keeper = self._keeper
        if keeper is None or self._state.role is not Role.LEADER:
            return float("-inf")
        return keeper.deadline

    @property
    def last_deadline(self) -> float:
        """The local deadline of the most recent leadership, kept after it ended (-inf: none):
        the instant from which this member stopped believing it led."""
        keeper = self._keeper
        return keeper.deadline if keeper is not None else self._last_deadline

    def wait(
        self, predicate: Callable[[ElectionState], bool], timeout: float
    ) -> ElectionState | None:
        """The first state (current or later) that satisfies `predicate`; None after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self._state):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._state

    def start(self) -> None:
        if self._thread is not None:
            raise InvalidParams(f"election of {self.member_id}: start() called twice")
        self._thread = threading.Thread(
            target=self._run, name=f"election-{self.member_id}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Resign (revoke the leader lease, so a standby takes over at once) and stop. Idempotent."""
        self._closing.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.config.lease.timeout * 4 + 10)
        self._set(Role.CLOSED, None, "closed")

    def __enter__(self) -> Election:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the thread -----------------------------------------------------------------------

    def _set(self, role: Role, leader: LeaderView | None, reason: str) -> None:
        with self._cond:
            old = self._state
            if old.role is Role.CLOSED or (old.role is role and old.leader == leader):
                return
            self._state = state = ElectionState(role, leader, reason)
            self._cond.notify_all()
        log.info(
            "election %s/%s: %s (leader %s, term %d): %s",
            self.keys.cluster_id,
            self.member_id,
            role.value,
            leader.member_id if leader else "-",
            state.term,
            reason,
        )
        if self._on_change is not None:
            self._on_change(state)

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                try:
                    self._round()
                except CoordinatorError as exc:
                    log.info("election %s: etcd: %s", self.member_id, exc.message)
                    if self._state.role is Role.LEADER:
                        self._step_down(f"etcd failed: {exc.message}")
                    self._closing.wait(self.config.retry_interval)
                except Exception as exc:  # a bug or a foreign record: never stop campaigning
                    log.exception("election %s: round failed", self.member_id)
                    if self._state.role is Role.LEADER:
                        self._step_down(f"{type(exc).__name__}: {exc}")
                    self._closing.wait(self.config.retry_interval)
        finally:
            keeper = self._keeper
            if keeper is not None:
                self._last_deadline = min(keeper.deadline, self._clock())
                self._keeper = None
                self._set(Role.FOLLOWER, None, "resigned")
                keeper.revoke()
            self._revoke_stale(quiet=True)
            self._set(Role.CLOSED, None, "closed")

    def _revoke_stale(self, quiet: bool = False) -> None:
        while self._stale:
            lease = self._stale[0]
            try:
                self._coord.revoke(lease, timeout=self.config.lease.timeout)
            except CoordinatorError:
                if quiet:
                    return
                raise
            self._stale.pop(0)

    def _round(self) -> None:
        self._revoke_stale()
        timeout = self.config.lease.timeout
        kv, revision = self._coord.get(self.keys.leader, timeout=timeout)
        if kv is None:
            holder = self._campaign()
            if holder is None:
                return  # led and stepped down, or lost a race to nobody: read again
            kv, revision = holder
        self._follow(kv, revision)

    def resign(self, cooldown: float = 0.0) -> None:
        """Give up the lead now (the lease is revoked, so another member may win at once) and
        go on as a follower that campaigns again, not before `cooldown` seconds. Any thread;
        the cooldown applies even when not leading."""
        self._cooldown_until = self._clock() + cooldown
        self._resign.set()

    def publish(self, key: bytes, value: bytes) -> bool:
        """Put `key` = `value` only while this member's leader key is the one it won (an etcd
        transaction): False when it no longer leads. Raises `CoordinatorError` when etcd does
        not answer. Blocking: call it off the event loop."""
        revision = self._won_revision
        if not revision or not self.leading():
            return False
        result = self._coord.txn(
            [ModRevisionIs(self.keys.leader, revision)],
            [Put(key, value)],
            timeout=self.config.lease.timeout,
        )
        return result.succeeded

    def _campaign(self) -> tuple[KeyValue, int] | None:
        """One attempt; leads until the end when won (then None). Else the holder's key."""
        timeout = self.config.lease.timeout
        if self._clock() < self._cooldown_until or (
            self.may_campaign is not None and not self.may_campaign()
        ):
            self._closing.wait(self.config.retry_interval)
            return None
        term_kv, _ = self._coord.get(self.keys.term, timeout=timeout)
        try:
            term = int(term_kv.value) if term_kv is not None else 0
        except ValueError:
            raise CoordinatorError(f"term key {self.keys.term!r} holds {term_kv!r}") from None
        keeper = LeaseKeeper(self._coord, self.config.lease, name=self.member_id)
        lease = keeper.grant()
        view = LeaderView(self.member_id, self.address, term + 1)
        try:
            result = self._coord.txn(
                [
                    ModRevisionIs(self.keys.leader, 0),
                    ModRevisionIs(self.keys.term, term_kv.mod_revision if term_kv else 0),
                ],
                [
                    Put(self.keys.leader, view.encode(), lease.id),
                    Put(self.keys.term, str(term + 1).encode()),
                ],
                read_on_failure=[self.keys.leader],
                timeout=timeout,
            )
        except CoordinatorError:
            # Applied or not, we cannot know: revoking the lease undoes it if it was.
            keeper.close()
            self._stale.append(lease.id)
            raise
        holder = result.current.get(self.keys.leader)
        if not result.succeeded and holder is not None and holder.lease == lease.id:
            # A retried request whose first try had been applied: the key is ours.
            view = LeaderView.decode(holder.value)
        elif not result.succeeded:
            keeper.close()
            self._stale.append(lease.id)
            self._revoke_stale(quiet=True)
            return None if holder is None else (holder, result.revision)
        self._lead(keeper, view, result.revision)
        return None

    def _lead(self, keeper: LeaseKeeper, view: LeaderView, revision: int) -> None:
        self._keeper = keeper
        self._won_revision = revision
        self._resign.clear()
        if not keeper.valid():
            self._step_down("won too late: the lease's local deadline had passed")
            return
        self._set(Role.LEADER, view, f"won term {view.term}")
        lease = keeper.lease
        assert lease is not None
        watch: Watch | None = None
        seen = revision
        reason = ""
        try:
            while not reason:
                if self._closing.is_set():
                    return  # _run's finally resigns
                if not keeper.valid():
                    reason = keeper.lost_reason or "the lease's local deadline passed"
                    break
                if self._resign.is_set():
                    reason = "resigned"
                    break
                if watch is None:
                    left = keeper.deadline - self._clock()
                    try:
                        watch = self._coord.watch(
                            self.keys.leader,
                            start_revision=seen + 1,
                            timeout=max(0.01, min(self.config.lease.timeout, left)),
                        )
                    except CoordinatorError:
                        keeper.lost.wait(_POLL)
                        continue
                try:
                    events = watch.get(min(_POLL, max(0.0, keeper.deadline - self._clock())))
                except WatchLost:
                    watch.close()
                    watch = None
                    continue
                for event in events or ():
                    seen = event.kv.mod_revision
                    if event.type is EventType.DELETE:
                        reason = "the leader key was deleted"
                    elif event.kv.lease != lease.id:
                        reason = "the leader key was replaced"
        finally:
            if watch is not None:
                watch.close()
        self._step_down(reason)

    def _step_down(self, reason: str) -> None:
        keeper = self._keeper
        if keeper is not None:
            self._last_deadline = keeper.deadline
        self._keeper = None
        self._set(Role.FOLLOWER, None, f"lost leadership: {reason}")
        if keeper is not None:
            keeper.close()
            if keeper.lease is not None:
                self._stale.append(keeper.lease.id)

    def _follow(self, kv: KeyValue, revision: int) -> None:
        try:
            view: LeaderView | None = LeaderView.decode(kv.value)
        except CoordinatorError as exc:
            log.warning("election %s: %s", self.member_id, exc.message)
            view = None
        if view is not None and view.member_id == self.member_id and kv.lease:
            # Our own record from before a restart: its lease is no one's any more.
            self._stale.append(kv.lease)
            self._revoke_stale()
            return
        self._set(Role.FOLLOWER, view, "following")
        watch = self._coord.watch(
            self.keys.leader, start_revision=revision + 1, timeout=self.config.lease.timeout
        )
        try:
            resync_at = self._clock() + self.config.resync_interval
            while not self._closing.is_set() and self._clock() < resync_at:
                for event in watch.get(_POLL) or ():
                    if event.type is EventType.DELETE:
                        self._set(Role.FOLLOWER, None, "the leader key is gone")
                        return
                    try:
                        view = LeaderView.decode(event.kv.value)
                    except CoordinatorError:
                        continue
                    self._set(Role.FOLLOWER, view, "following")
        except WatchLost:
            return
        finally:
            watch.close()
