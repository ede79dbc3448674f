"""Client liveness: who is registered, when each client was last heard of, and what it holds.

A client registers by ReMountSegment (or MountSegment) and then pings every second; each Ping
pushes its deadline to now + `client_ttl`. The master's monitor calls `due(now)` every
`monitor_interval`: a client past its deadline turns *silent* (its segments stop serving, its
in-flight PutStarts are preempted, its arenas parked), and one silent for `client_dead_ttl`
since its last ping is *dead*: the service expires it (unmounts its segments, forgets it).
After a stall of the master's loop longer than half of `client_ttl` every deadline is first
`postpone`d by the stall. A Ping from a client not in the table, or from a silent one, answers
NEED_REMOUNT; its ReMountSegment brings it back (docs/parts/reliability.md).

In-flight PutStarts are tracked per client id even for clients that never registered (a pure
reader-writer without segments), so `expire` and the stale-PutStart release both find them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpool.protocol.messages import ClientId, ClientStats, HostId, SegmentName

if TYPE_CHECKING:
    from kvpool.master.metadata import ObjectMeta

__all__ = ["ClientRecord", "ClientTable"]


class ClientRecord:
    """A registered client: its host, its liveness deadline and its mounted segment names."""

    __slots__ = ("client_id", "deadline", "host_id", "segments", "silent")

    def __init__(self, client_id: ClientId, host_id: HostId, deadline: float) -> None:
        self.client_id = client_id
        self.host_id = host_id
        #: Silent from then on (the last ping + `client_ttl`).
        self.deadline = deadline
        self.segments: dict[SegmentName, None] = {}
        #: Past its deadline: kept, but neither read from nor written to until it remounts.
        self.silent = False


class ClientTable:
    """Registered clients, plus in-flight PutStarts by client (registered or not)."""

    __slots__ = ("_clients", "_grace", "_ttl", "in_flight")

    def __init__(self, client_ttl: float, client_dead_ttl: float | None = None) -> None:
        self._ttl = client_ttl
        # A silent client is dead this long after its deadline.
        self._grace = max(0.0, (client_dead_ttl or client_ttl) - client_ttl)
        self._clients: dict[ClientId, ClientRecord] = {}
        # client id -> objects it has PutStart-ed and not yet ended or revoked (insertion order).
        self.in_flight: dict[ClientId, dict[ObjectMeta, None]] = {}

    def __len__(self) -> int:
        return len(self._clients)

    def get(self, client_id: ClientId) -> ClientRecord | None:
        return self._clients.get(client_id)

    def register(self, client_id: ClientId, host_id: HostId, now: float) -> ClientRecord:
        """Add the client (or refresh it): registration counts as a ping. A silent client
        stays silent until the caller revives it (`MetadataCore.register_client`)."""
        rec = self._clients.get(client_id)
        if rec is None:
            rec = self._clients[client_id] = ClientRecord(client_id, host_id, now + self._ttl)
        else:
            rec.deadline = now + self._ttl
            if host_id:
                rec.host_id = host_id
        return rec

    def ping(self, client_id: ClientId, now: float) -> bool:
        """Refresh a known, not silent client's deadline; False when the client is unknown
        or silent (it must remount to come back)."""
        rec = self._clients.get(client_id)
        if rec is None or rec.silent:
            return False
        rec.deadline = now + self._ttl
        return True

    def due(self, now: float) -> tuple[list[ClientRecord], list[ClientRecord]]:
        """(clients that turn silent now, clients dead now): past their deadline and not yet
        silent; past it by `client_dead_ttl - client_ttl` (still in the table)."""
        silent: list[ClientRecord] = []
        dead: list[ClientRecord] = []
        grace = self._grace
        for c in self._clients.values():
            if c.deadline <= now:
                if not c.silent:
                    silent.append(c)
                if c.deadline + grace <= now:
                    dead.append(c)
        return silent, dead

    def postpone(self, seconds: float) -> None:
        """Push every client's deadline `seconds` later (the master itself was not listening)."""
        for c in self._clients.values():
            c.deadline += seconds

    def forget(self, client_id: ClientId) -> None:
        self._clients.pop(client_id, None)

    def in_flight_bucket(self, client_id: ClientId) -> dict[ObjectMeta, None]:
        """The client's in-flight set, created if needed. It stays valid while a request holds
        it: buckets are only dropped (when empty) by `prune`, between requests."""
        bucket = self.in_flight.get(client_id)
        if bucket is None:
            bucket = self.in_flight[client_id] = {}
        return bucket

    def add_in_flight(self, obj: ObjectMeta) -> None:
        self.in_flight_bucket(obj.client_id)[obj] = None

    def drop_in_flight(self, obj: ObjectMeta) -> None:
        bucket = self.in_flight.get(obj.client_id)
        if bucket is not None:
            bucket.pop(obj, None)

    def prune(self) -> None:
        """Forget the empty in-flight sets (of clients that come and go)."""
        for client_id in [c for c, bucket in self.in_flight.items() if not bucket]:
            del self.in_flight[client_id]

    def in_flight_of(self, client_id: ClientId) -> list[ObjectMeta]:
        return list(self.in_flight.get(client_id, ()))

    def stats(self, now: float, *, silent: bool = False) -> list[ClientStats]:
        """The clients that answer (or, with `silent`, the silent ones)."""
        return [
            ClientStats(
                c.client_id,
                c.host_id,
                len(c.segments),
                max(0.0, c.deadline + (self._grace if c.silent else 0.0) - now),
                len(self.in_flight.get(c.client_id, ())),
                c.silent,
            )
            for c in self._clients.values()
            if c.silent is silent
        ]
