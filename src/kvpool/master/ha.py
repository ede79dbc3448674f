"""`HaMasterServer`: a master that is one member of an HA group (`kvpool master --ha ...`).

Every member runs an `Election` and a `Membership` (`kvpool.ha`, through etcd) and the same
RPC server; its role decides what it answers (docs/parts/ha.md, "The master's HA"):

* **standby** (another member leads, or none yet): every request but `Echo`, `HaStatus`
  answers NOT_LEADER, its message naming the leader it knows (`leader=HOST:PORT term=N`).
  A `Follower` keeps a hot copy (`StandbyCopy`) of the leader's metadata.
* **leader** (won term T): builds its metadata from its copy (or keeps its own when it led
  the term before and nobody else did), logs every change into an `OpLog` (a file with
  `--data-dir`, memory only without) whose flushes feed a `ReplicationSource`. A write is
  served only while `Election.leading()` is true (checked per request: a clock compare), and
  its reply waits until every standby in sync acknowledged its records (LEADER_CHANGED when
  the lead is lost meanwhile). Reads answer at once. `Welcome.term` is T.
* **lost the lead** (its lease's local deadline passed, etcd unreachable): writes answer
  NOT_LEADER; reads are still answered from its metadata until it learns of another leader
  (then it is *deposed*: NOT_LEADER for everything, and it follows the new leader; its stale
  metadata is replaced by the copy when it leads again).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, NotLeader
from kvpool.ha import (
    ClusterKeys,
    Election,
    ElectionConfig,
    EtcdGateway,
    EtcdUrl,
    LeaseConfig,
    Membership,
    Role,
)
from kvpool.master.config import MasterConfig
from kvpool.master.hooks import ReclaimHooks
from kvpool.master.oplog import OpLog
from kvpool.master.replication import ReplicationSource
from kvpool.master.server import MasterServer
from kvpool.master.service import MasterService
from kvpool.master.standby import Follower, StandbyCopy, write_dir_term
from kvpool.protocol.messages import (
    BatchExistKey,
    BatchGetLocations,
    BatchGetReplicaList,
    BatchPutStart,
    BatchUpsertStart,
    Echo,
    ExistKey,
    FetchSnapshot,
    FollowLog,
    GetReplicaList,
    GetSegment,
    GetSize,
    HaStatus,
    HaStatusReply,
    MountSegment,
    Ping,
    PutStart,
    QueryTask,
    ReMountSegment,
    ReserveArena,
    Stats,
    StatsReply,
    UpsertStart,
)
from kvpool.rpc.server import Connection

__all__ = ["HaMasterServer", "member_id_for"]

log = logging.getLogger(__name__)

#: Answered from the metadata without the lead for writes (see the module docstring).
READS: frozenset[type[Any]] = frozenset(
    {
        GetReplicaList,
        BatchGetReplicaList,
        BatchGetLocations,
        ExistKey,
        BatchExistKey,
        GetSize,
        Stats,
        GetSegment,
        QueryTask,
    }
)
#: Writes answered without waiting for the standbys: each hands out something the client
#: only acts on through a later request that does wait (PutEnd, PutCommit), and the stream is
#: a prefix, so that later ack covers these records too. Lost in a failover before any ack,
#: they cost a retry (NEED_REMOUNT, an unknown arena, a PutEnd answered OBJECT_NOT_FOUND) or,
#: for a writer frozen across the whole failover, a detected CHECKSUM_MISMATCH; never an
#: acknowledged object. Measured: waiting on PutStart too doubled a single put's p50.
NO_WAIT: frozenset[type[Any]] = frozenset(
    {
        PutStart,
        BatchPutStart,
        UpsertStart,
        BatchUpsertStart,
        ReserveArena,
        Ping,
        MountSegment,
        ReMountSegment,
    }
)
_TICK_S = 0.01
#: How often a master with `--tenant-quota-file etcd` reads the policy (`_poll_quotas`).
_QUOTA_POLL_S = 1.0


class InSyncRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """`/kvpool/<cluster>/insync`: the standbys in sync with the leader of `term`. Written by
    that leader (fenced by its leader key) when it starts (none yet) and whenever the set
    changes; a standby leaves it only once etcd says so, before any write is acknowledged
    without it. Who may campaign next: any member of `members` whose copy follows `term`, or
    the `leader` itself if it still holds that term's metadata; anyone when `members` is
    empty (the leader acknowledged alone: what only it had is lost with it, as documented)."""

    term: int
    leader: str
    members: list[str] = []


_RECORD_ENCODER = msgspec.json.Encoder()
_RECORD_DECODER = msgspec.json.Decoder(InSyncRecord)


def member_id_for(advertise: str) -> str:
    """A member id from an advertised HOST:PORT (etcd key-safe)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", advertise)[:128]


class HaMasterServer(MasterServer):
    """A `MasterServer` that leads or stands by in the HA group of `config.ha_url`."""

    def __init__(
        self,
        config: MasterConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        hooks_factory: Callable[[], ReclaimHooks | None] = lambda: None,
        server_name: str = "kvpool-master",
    ) -> None:
        if config.ha_url is None:
            raise InvalidParams("ha_url: an HA master needs etcd://HOST:PORT/CLUSTER_ID")
        self.url = EtcdUrl.parse(config.ha_url)
        if config.cluster_id != self.url.cluster_id:
            raise InvalidParams(
                f"cluster_id {config.cluster_id!r} differs from the cluster id of ha_url "
                f"({self.url.cluster_id!r})"
            )
        self._hooks_factory = hooks_factory
        #: Whether a write's reply waits for the standbys in sync (`ha_ack` "standby").
        self._ack_by_standby = config.ha_ack == "standby"
        super().__init__(
            config,
            clock=clock,
            hooks=hooks_factory(),
            server_name=server_name,
            open_data_dir=False,
            term=self.serving_term,
        )
        self.member_id = config.member_id or ""
        self.advertise = config.advertise or ""
        self.copy = StandbyCopy(config.data_dir, config.fsync_interval)
        self.election: Election | None = None
        self.membership: Membership | None = None
        self._gateway: EtcdGateway | None = None
        self._source: ReplicationSource | None = None
        self._oplog: OpLog | None = None
        self._term = 0  # the term served now (0: none)
        self._core_term = 0  # the term whose metadata the service holds (0: none, fresh)
        self._lost = False  # the lead of `_core_term` was lost (reads only)
        self._deposed = False  # another member leads a newer term than `_core_term`
        self._follower: Follower | None = None
        #: When the last promotion finished, and how long it took (s), for tests and benches.
        self.promoted_at = 0.0
        self.promotion_s = 0.0
        self._keys: ClusterKeys | None = None
        self._published: frozenset[str] | None = None
        self._publishing = False
        self._ineligible_logged = float("-inf")
        self._quota_due = 0.0  # when `_poll_quotas` reads etcd next

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await super().start()
        host, port = self.address
        if not self.advertise:
            self.advertise = f"{host}:{port}"
        if not self.member_id:
            self.member_id = member_id_for(self.advertise)
        cfg = self.config
        self._gateway = EtcdGateway(list(self.url.endpoints), timeout=2.0)
        keys = ClusterKeys(self.url.cluster_id)
        lease = LeaseConfig(ttl=cfg.ha_lease_ttl)
        self._keys = keys
        self.election = Election(
            self._gateway,
            keys,
            self.member_id,
            self.advertise,
            config=ElectionConfig(lease=lease),
            may_campaign=self._may_campaign,
        )
        self.membership = Membership(
            self._gateway, keys, self.member_id, self.advertise, lease=lease
        )
        self._follower = Follower(
            self.member_id,
            self.url.cluster_id,
            self.copy,
            self._leader_to_follow,
            token=None if self.credentials is None else self.credentials.first_admin_token(),
            tls=self.tls.client_context() if self.tls is not None and self.tls.ca else None,
        )
        self.election.start()
        self.membership.start()
        self._tasks.append(asyncio.create_task(self._ha_ticks(), name="master-ha"))
        self._tasks.append(asyncio.create_task(self._follower.run(), name="master-standby"))
        log.info(
            "HA master %s at %s in cluster %s (etcd %s)",
            self.member_id,
            self.advertise,
            self.url.cluster_id,
            ",".join(self.url.endpoints),
        )

    async def close(self) -> None:
        if self._closed:
            return
        # Resign first: a standby takes over within a round trip instead of a lease TTL.
        if self.election is not None:
            await asyncio.to_thread(self.election.close)
        if self._source is not None:
            self._source.close("this master is shutting down")
        await super().close()
        if self.membership is not None:
            await asyncio.to_thread(self.membership.close)
        if self._oplog is not None and self.service.durable is None:
            self._oplog.close()
        self.copy.close()
        if self._gateway is not None:
            self._gateway.close()

    # ------------------------------------------------------------------ role

    def serving_term(self) -> int:
        """The term whose writes this master serves now (0: none): the `Welcome` term."""
        e = self.election
        return self._term if self._term and e is not None and e.leading() else 0

    def _leader_to_follow(self) -> tuple[str, int] | None:
        e = self.election
        if e is None or (self._core_term and not self._deposed):
            return None  # its own metadata is the newest it knows of
        view = e.state.leader
        if view is None or view.member_id == self.member_id or e.state.role is not Role.FOLLOWER:
            return None
        return view.address, view.term

    def _refusal(self, code: ErrorCode = ErrorCode.NOT_LEADER) -> NotLeader:
        e = self.election
        view = e.state.leader if e is not None else None
        if view is not None and view.member_id != self.member_id:
            where = f"leader={view.address} term={view.term}"
        else:
            where = "leader unknown"
        return NotLeader(f"this master does not lead ({where})", code)

    async def _ha_ticks(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            try:
                await self._tick()
            except Exception:
                log.exception("HA tick failed")

    async def _tick(self) -> None:
        e = self.election
        assert e is not None
        if self._oplog is not None and self.service.durable is None:
            self._oplog.flush()  # background work's records (sweep, repair, expiry)
        fd = self.copy.sync_due()
        if fd is not None:
            await asyncio.to_thread(OpLog.fdatasync_fd, fd)
        state = e.state
        leading = e.leading()
        if self._term and not leading:
            self._step_down(state.reason or "lease lost")
        view = state.leader
        if (
            self._core_term
            and not self._deposed
            and view is not None
            and view.member_id != self.member_id
            and view.term > self._core_term
        ):
            self._deposed = True
            log.warning(
                "deposed: %s leads term %d (this master led term %d); following it",
                view.member_id,
                view.term,
                self._core_term,
            )
            durable = self.service.durable
            if durable is not None:
                # The data directory is the copy's from now on (`StandbyCopy` writes there).
                durable.close()
                self.service.durable = None
        if leading and state.role is Role.LEADER and state.term != self._term:
            try:
                await self._promote(state.term)
            except Exception:
                # Holding the lease without serving would stall the cluster: give it up, and
                # let another member (or this one, after a pause) try.
                log.exception("promotion to term %d failed; resigning", state.term)
                e.resign(cooldown=2.0 * self.config.ha_lease_ttl)
                return
        if self._source is not None:
            self._source.tick()
            await self._publish_in_sync()
        await self._poll_quotas()

    async def _poll_quotas(self) -> None:
        """`--tenant-quota-file etcd`: read `/kvpool/<cluster>/quota` at most once a second
        and apply a new revision (`kvpool.master.quota.TenantQuotas.apply`)."""
        quotas, gateway, keys = self.quotas, self._gateway, self._keys
        now = time.monotonic()
        if quotas is None or not quotas.etcd or gateway is None or keys is None:
            return
        if now < self._quota_due:
            return
        self._quota_due = now + _QUOTA_POLL_S
        key = keys.prefix + b"quota"
        try:
            kv, _ = await asyncio.to_thread(gateway.get, key)
        except (KVPoolError, OSError) as exc:
            log.debug("tenant quotas: etcd read failed: %s", exc)
            return
        quotas.apply(
            None if kv is None else kv.value, 0 if kv is None else kv.mod_revision, key.decode()
        )

    # ------------------------------------------------------------------ the in-sync record

    def _may_campaign(self) -> bool:
        """(Election thread.) Whether this member may lead next without losing a write the last
        leader acknowledged (`InSyncRecord`); logged when it may not."""
        assert self._gateway is not None and self._keys is not None
        key = self._keys.in_sync
        kv, _ = self._gateway.get(key, timeout=2.0)
        if kv is None:
            return True
        try:
            rec = _RECORD_DECODER.decode(kv.value)
        except msgspec.DecodeError:
            log.error("unreadable %s: %r; campaigning", key.decode(), kv.value)
            return True
        if not rec.members:
            return True
        copy = self.copy
        if self.member_id in rec.members and rec.term in (copy.term, copy.disk_term):
            return True
        if rec.leader == self.member_id and rec.term in (self._core_term, copy.disk_term):
            return True
        now = time.monotonic()
        if now - self._ineligible_logged > 10.0:
            self._ineligible_logged = now
            log.warning(
                "not campaigning: the standbys in sync with term %d were %s (this member's copy "
                "follows term %d); only they hold every acknowledged write",
                rec.term,
                ", ".join(rec.members),
                self.copy.term,
            )
        return False

    async def _publish_in_sync(self, force: bool = False) -> None:
        """Record this term's standbys in sync in etcd when the set changed (at once for a
        drop: writes wait until it is recorded)."""
        source = self._source
        e = self.election
        keys = self._keys
        if source is None or e is None or keys is None or self._publishing:
            return
        members = frozenset(source.in_sync())
        if members == self._published and not force:
            return
        rec = InSyncRecord(source.term, self.member_id, sorted(members))
        self._publishing = True
        try:
            ok = await asyncio.to_thread(e.publish, keys.in_sync, _RECORD_ENCODER.encode(rec))
        except KVPoolError as exc:
            log.warning("recording the standbys in sync failed: %s", exc.message)
            ok = False
        finally:
            self._publishing = False
        if not ok:
            if force:
                raise NotLeader("could not record this term's standbys in etcd")
            return
        if self._source is source:
            self._published = members
            source.published(members)

    def _step_down(self, reason: str) -> None:
        log.warning("lost the lead of term %d: %s; writes refused", self._term, reason)
        if self._source is not None:
            self._source.close(f"lost the lead of term {self._term}")
            self._source = None
        if self._oplog is not None:
            self._oplog.tap = None
        self._term = 0
        self._lost = True

    async def _promote(self, term: int) -> None:
        started = time.monotonic()
        cfg = self.config
        copy = self.copy
        if self._core_term and not self._deposed:
            # We led the last term we know of and nobody newer was seen: our own metadata is
            # the newest there is (etcd was away, or our lease lapsed and came back).
            if term != self._core_term + 1:
                log.warning(
                    "leading term %d after term %d without having seen the terms between; "
                    "keeping this master's metadata",
                    term,
                    self._core_term,
                )
            how = f"kept the metadata of term {self._core_term}"
        else:
            if self._core_term:
                self._fresh_service()
            if copy.term and copy.term != term - 1:
                log.warning(
                    "leading term %d with a copy of term %d: changes of the terms between "
                    "are missing",
                    term,
                    copy.term,
                )
            elif not copy.term:
                log.warning(
                    "leading term %d WITHOUT a copy of any leader's metadata (no bootstrap "
                    "completed)%s",
                    term,
                    "; loading the data directory" if cfg.data_dir else ": starting empty",
                )
            if cfg.data_dir is not None:
                copy.close()  # the copy's files are what Durability loads
                self.service.open_data_dir()
            else:
                self.service.load(copy.state)
            how = f"built from the copy of term {copy.term} at position {copy.position}"
            copy.reset()
        svc = self.service
        if svc.durable is not None:
            oplog = svc.durable.log
        else:
            oplog = self._oplog if self._oplog is not None else OpLog(None, 0, cfg.fsync_interval)
            svc.journal_to(oplog)
        self._oplog = oplog
        oplog.flush()
        source = ReplicationSource(term, cfg, records=svc.state_records, flush=oplog.flush)
        oplog.tap = source.append
        self._source = source
        if cfg.data_dir is not None:  # this directory now holds the metadata of `term`
            await asyncio.to_thread(write_dir_term, cfg.data_dir, term)
            copy.disk_term = term
        # Recorded before any write is served: a standby of the last term that is not in sync
        # with this one must not lead next with a copy that lacks this term's writes.
        self._published = None
        try:
            await self._publish_in_sync(force=True)
        except BaseException:
            source.close("the promotion failed")
            oplog.tap = None
            self._source = None
            raise
        self._core_term = term
        self._term = term
        self._lost = False
        self._deposed = False
        self.promotion_s = time.monotonic() - started
        self.promoted_at = time.monotonic()
        log.warning(
            "leading term %d: %s; %d objects, %d segment(s) (silent until their nodes "
            "remount); promotion took %.3f s",
            term,
            how,
            len(svc.index),
            len(svc.segments.mounted()),
            self.promotion_s,
        )

    def _fresh_service(self) -> None:
        """Drop the stale metadata of a term we lost (replaced by the copy)."""
        old = self.service
        if old.durable is not None:
            old.durable.close()
        if self._oplog is not None and old.durable is None:
            self._oplog.close()
        self._oplog = None
        self._install(
            MasterService(
                self.config, clock=self._clock, hooks=self._hooks_factory(), open_data_dir=False
            )
        )

    # ------------------------------------------------------------------ requests

    def _rpc_handler(self) -> Callable[[Any, Connection], Any]:
        return self._handle_ha

    def _handle_ha(self, request: Any, conn: Connection) -> Any:
        kind = type(request)
        if kind in READS:
            if kind is Stats:
                return self._stats(request)
            if self._term:
                return self._handlers[kind](request)
            if self._lost and not self._deposed:
                return self._handlers[kind](request)  # etcd away: reads of our metadata
            raise self._refusal()
        if kind is FollowLog or kind is FetchSnapshot:
            source = self._source
            if source is None or not self._leading():
                raise self._refusal()
            if kind is FollowLog:
                return source.follow(request)
            return source.fetch_snapshot(request)
        if kind is HaStatus:
            return self._status()
        if kind is Echo:
            return self._handlers[kind](request)
        # Everything else changes metadata (or tells liveness): the leader's alone.
        if not self._leading():
            if kind is Ping and self._lost and not self._deposed:
                # etcd away: nodes that keep pinging stay live, so reads keep finding them.
                return self._handlers[kind](request)
            raise self._refusal()
        reply = self._handlers[kind](request)
        oplog = self._oplog
        assert oplog is not None
        oplog.flush()
        if inspect.isawaitable(reply):
            return self._chunked(reply)
        if kind in NO_WAIT or not self._ack_by_standby:
            return reply
        source = self._source
        assert source is not None
        pending = source.wait(source.end)
        if pending is None:
            return reply
        return self._acked(pending, reply)

    def _stats(self, request: Stats) -> Any:
        if not self._term and not (self._lost and not self._deposed):
            raise self._refusal()
        reply = self._handlers[Stats](request)
        source = self._source
        if source is not None and isinstance(reply, StatsReply):
            reply.standbys = len(source.in_sync())
        return reply

    def _leading(self) -> bool:
        e = self.election
        return bool(self._term) and e is not None and e.leading()

    async def _acked(self, pending: asyncio.Future[None], reply: Any) -> Any:
        await pending
        if not self._leading():
            raise self._refusal(ErrorCode.LEADER_CHANGED)
        return reply

    async def _chunked(self, reply: Awaitable[Any]) -> Any:
        try:
            result = await reply
        finally:
            if self._oplog is not None:
                self._oplog.flush()
        source = self._source
        if source is None:
            raise self._refusal(ErrorCode.LEADER_CHANGED)
        pending = source.wait(source.end) if self._ack_by_standby else None
        if pending is not None:
            await pending
        if not self._leading():
            raise self._refusal(ErrorCode.LEADER_CHANGED)
        return result

    def ha_status(self) -> HaStatusReply:
        return self._status()

    def _status(self) -> HaStatusReply:
        e = self.election
        view = e.state.leader if e is not None else None
        source = self._source
        if self._term and self._leading():
            role = "leader"
        elif self._deposed or not self._core_term:
            role = "standby"
        else:
            role = "lost-lead"
        standby = role == "standby"
        return HaStatusReply(
            0,
            role,
            self.member_id,
            self.serving_term(),
            view.address if view is not None else "",
            view.term if view is not None else 0,
            source.end if source is not None and not standby else self.copy.position,
            source.in_sync() if source is not None else [],
            self.copy.term,
            self.copy.objects() if standby else len(self.service.index),
        )
