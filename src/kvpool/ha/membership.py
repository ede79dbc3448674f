"""`Membership`: each running master registers itself under its cluster's members prefix.

`/kvpool/<cluster_id>/members/<member_id>` holds a `MemberRecord` (JSON) on a lease of the
member's own (not the leader lease: a standby is a member too), so the key disappears within a
TTL of the master's death and at once on `close()`. The registration thread
(`membership-<member id>`) grants the lease, writes the key and, when the lease is lost (etcd
unreachable past the local deadline, or restarted and the lease gone), registers again with a new
lease as soon as etcd answers. `members()` lists who is registered now.
"""

from __future__ import annotations

import logging
import threading

import msgspec

from kvpool.errors import InvalidParams
from kvpool.ha.coordinator import Coordinator, CoordinatorError
from kvpool.ha.keys import ClusterKeys, validate_name
from kvpool.ha.lease import LeaseConfig, LeaseKeeper

__all__ = ["MemberRecord", "Membership"]

log = logging.getLogger(__name__)


class MemberRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One registered master: its id and the address it serves clients on ("HOST:PORT")."""

    member_id: str
    address: str


class Membership:
    """Keep `member_id` registered in `keys`' cluster until `close()`."""

    def __init__(
        self,
        coordinator: Coordinator,
        keys: ClusterKeys,
        member_id: str,
        address: str,
        *,
        lease: LeaseConfig | None = None,
        retry_interval: float = 0.5,
    ) -> None:
        self._coord = coordinator
        self.keys = keys
        self.record = MemberRecord(validate_name("member id", member_id), address)
        self.lease_config = lease or LeaseConfig()
        self.retry_interval = retry_interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._keeper: LeaseKeeper | None = None
        self._registered = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise InvalidParams(f"membership of {self.record.member_id}: start() called twice")
        self._thread = threading.Thread(
            target=self._run, name=f"membership-{self.record.member_id}", daemon=True
        )
        self._thread.start()

    def registered(self) -> bool:
        """Whether the member key is surely present now (its lease is valid)."""
        keeper = self._keeper
        return keeper is not None and keeper.valid()

    def wait_registered(self, timeout: float) -> bool:
        return self._registered.wait(timeout)

    def _run(self) -> None:
        key = self.keys.member(self.record.member_id)
        value = msgspec.json.encode(self.record)
        while not self._stop.is_set():
            keeper = LeaseKeeper(
                self._coord,
                self.lease_config,
                name=f"member-{self.record.member_id}",
                on_lost=lambda _reason: self._wake.set(),
            )
            try:
                lease = keeper.grant()
                self._keeper = keeper
                self._coord.put(key, value, lease=lease.id, timeout=self.lease_config.timeout)
            except CoordinatorError as exc:
                log.info("membership %s: %s", self.record.member_id, exc.message)
                keeper.close()
                self._stop.wait(self.retry_interval)
                continue
            self._registered.set()
            while not self._stop.is_set() and not keeper.lost.is_set():
                self._wake.wait(1.0)
                self._wake.clear()
            if not self._stop.is_set():
                self._registered.clear()
                keeper.revoke()  # best effort: the old lease must not keep an old record
        last = self._keeper
        if last is not None:
            last.revoke()

    def members(self, timeout: float | None = None) -> dict[str, MemberRecord]:
        """Every registered member of the cluster by id (`CoordinatorError` if etcd fails)."""
        kvs, _ = self._coord.get_prefix(self.keys.members, timeout=timeout)
        out: dict[str, MemberRecord] = {}
        for kv in kvs:
            try:
                record = msgspec.json.decode(kv.value, type=MemberRecord)
            except msgspec.DecodeError:
                log.warning("membership: ignoring malformed record at %r", kv.key)
                continue
            out[record.member_id] = record
        return out

    def close(self) -> None:
        """Deregister (revoke the lease, so the key goes at once) and stop. Idempotent."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self.lease_config.timeout * 4 + 10)
