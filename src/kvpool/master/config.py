"""Settings of the master: one frozen, validated dataclass, named like Mooncake's master flags.

Durations are seconds (floats), sizes bytes. `kvpool master` maps each flag onto one field
(flag > environment > default); tests build `MasterConfig(...)` directly. Validation raises
`InvalidParams` naming the field and the offending value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from kvpool.errors import InvalidParams
from kvpool.master.tier_config import TierConfig

__all__ = ["AllocationStrategy", "EvictionMode", "MasterConfig"]

DEAD_TTL_FACTOR = 3.0
"""`client_dead_ttl` by default, in units of `client_ttl`: a pause of up to this many TTLs keeps
a node's objects; a death is repaired from other replicas once it has lasted that long."""


class AllocationStrategy(StrEnum):
    """How PutStart picks segments for an object's replicas (after `preferred_segments`)."""

    RANDOM = "random"
    """A uniformly random segment with room (Mooncake's default)."""
    FREE_RATIO_FIRST = "free_ratio_first"
    """The segments with the largest free fraction first (evens out fill levels)."""
    LOCAL_FIRST = "local_first"
    """Segments on the writing client's host first (same-host shm copies), then random."""


class EvictionMode(StrEnum):
    """What reclaim may do to an object that has to leave memory (used by the reclaim hooks)."""

    CACHE = "cache"
    """Objects are a cache: an evicted object is dropped (recomputed on miss)."""
    POOL = "pool"
    """Objects must not be lost: eviction moves them (to another node or to disk)."""


@dataclass(frozen=True, slots=True)
class MasterConfig:
    """Every setting of the master, with Mooncake's defaults."""

    host: str = "127.0.0.1"
    """Address the RPC server binds (loopback unless told otherwise)."""
    port: int = 50051
    """RPC port; 0 picks a free one (tests)."""
    unix_socket: bool = True
    """Also listen on an abstract Unix socket (named in the handshake), which clients on this
    host then use instead of TCP for a cheaper round trip; TCP stays for everyone else."""
    cluster_id: str = "kvpool"
    """Checked in the RPC handshake, so clients of another pool are refused."""
    default_kv_lease_ttl: float = 10.0
    """Seconds of read lease granted by GetReplicaList / ExistKey / GetSize."""
    default_kv_soft_pin_ttl: float = 30 * 60.0
    """Seconds of soft pin when a put asks for ENABLE without a TTL."""
    max_kv_soft_pin_ttl: float = 24 * 3600.0
    """Largest soft-pin TTL a put may ask for (more is INVALID_PARAMS)."""
    allow_evict_soft_pinned_objects: bool = True
    """Whether reclaim may evict soft-pinned objects as a last resort."""
    eviction_high_watermark_ratio: float = 0.9
    """Used fraction of memory above which background reclaim starts."""
    eviction_ratio: float = 0.05
    """Fraction of objects one reclaim round aims to free."""
    eviction_mode: EvictionMode = EvictionMode.CACHE
    """Drop evicted objects (cache) or keep them elsewhere (pool)."""
    client_ttl: float = 10.0
    """Seconds without a Ping after which a client is *silent*: its segments take no new
    replicas and serve no reads, but their metadata is kept (docs/parts/reliability.md)."""
    client_dead_ttl: float | None = None
    """Seconds without a Ping after which a silent client is dropped: its segments unmounted,
    their objects repaired from other replicas. None: `DEAD_TTL_FACTOR` (3) * `client_ttl`; at least
    `client_ttl` (equal: dropped as soon as silent)."""
    put_start_discard_timeout: float = 30.0
    """Age after which an unfinished PutStart may be preempted by a new PutStart of its key."""
    put_start_release_timeout: float = 600.0
    """Age after which the space of an unfinished (or preempted) PutStart is released."""
    allocation_strategy: AllocationStrategy = AllocationStrategy.RANDOM
    """How segments are chosen for new replicas."""
    num_shards: int = 64
    """Metadata shards (by xxh3 of (tenant, key)); reclaim keeps its lists per shard."""
    alignment: int = 64
    """Byte alignment of every replica's offset and size inside a segment."""
    max_replicas: int = 16
    """Largest replica_num a put may ask for."""
    max_arena_size: int = 64 << 20
    """Largest arena (a range lent to one client for its one-round-trip puts) granted; an
    arena is also never more than an eighth of the largest segment. 0 turns arenas off."""
    monitor_interval: float = 1.0
    """Seconds between runs of the liveness monitor and the stale-PutStart release."""
    reclaim_interval: float = 0.05
    """Seconds between reclaim ticks (`ReclaimHooks.tick`, kswapd's chance to act)."""
    batch_chunk_keys: int = 4096
    """Keys of a batch request served per event-loop turn (larger batches are split)."""
    sweep_batch: int = 20_000
    """Objects examined per event-loop turn when sweeping replicas of dead segments."""
    seed: int | None = None
    """Seed of the placement RNG (None: from the OS), for reproducible tests."""
    replica_task_timeout: float = 300.0
    """Seconds after which a replica copy/move task that has not ended fails (its
    destination is freed)."""
    task_retention: float = 600.0
    """Seconds an ended replica task stays answerable by QueryTask."""
    repair_interval: float = 0.05
    """Seconds between two rounds of replica repair (copies of objects that lost replicas)."""
    repair_per_tick: int = 64
    """Repair copies started per round at most (repair never starves foreground work)."""
    repair_max_in_flight: int = 256
    """Repair copies running at once at most (0 turns repair off)."""
    repair_max_attempts: int = 8
    """Failed copies of one object before its repair is given up (until its next loss)."""
    repair_backoff: float = 1.0
    """Seconds before a failed repair is tried again, doubled per failure (at most 60 s)."""
    regex_match_budget: float = 0.1
    """Seconds of RemoveByRegex pattern matching allowed per chunk of 5,000 keys (one
    event-loop turn); a request that overruns it stops with INVALID_PARAMS (the pattern is the
    client's: a catastrophic one must not stall the master)."""
    rpc_handshake_timeout: float = 5.0
    """Seconds a new connection has to complete its handshake before it is closed."""
    rpc_idle_timeout: float = 300.0
    """Seconds without a byte received after which a connection is closed (a Store pings
    every `heartbeat_interval`, 1 s, so a live one is never idle that long)."""
    rpc_max_connections: int = 16384
    """Connections served at once; lowered at start to fit the file-descriptor limit (raised
    to its hard limit first). More are refused with UNAVAILABLE_IN_CURRENT_STATUS."""
    rpc_max_connections_per_peer: int = 1024
    """Connections served at once from one remote IP (Unix-socket clients count as one)."""
    rpc_busy_poll: float = 200e-6
    """Seconds the master's loop keeps polling, not sleeping, after a request while requests
    come that close together (`kvpool.rpc.spin`); 0: it sleeps until each next one."""
    data_dir: str | None = None
    """Directory of the operation log and snapshots (durable metadata, docs/parts/ha.md);
    None: the metadata lives in memory only and a restart empties the pool."""
    fsync_interval: float = 0.01
    """Seconds between two fdatasync of the operation log (0: after every record)."""
    snapshot_interval: float = 60.0
    """Seconds between two snapshots of the metadata (each starts a new log segment)."""
    # -- high availability (docs/parts/ha.md, "The master's HA")
    ha_url: str | None = None
    """`etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID`: run as one master of an HA group (elect a
    leader through etcd, standbys follow its log). None: a single master."""
    advertise: str | None = None
    """HOST:PORT the other masters, nodes and clients reach this master at (published in
    etcd); None: the bound host and port."""
    member_id: str | None = None
    """This master's name in its HA group (None: derived from the advertised address)."""
    ha_lease_ttl: int = 3
    """Seconds of the leader's etcd lease (whole seconds; a dead leader is replaced this long
    after its last keepalive; it stops serving writes a fifth of it earlier)."""
    ha_ack: str = "standby"
    """When an HA leader answers a write: "standby" (default) once every standby in sync has
    its records, so a failover never loses an acknowledged write; "leader" at once, the
    standbys following a moment later (a failover may lose the writes of that moment, the
    replication lag; a lower latency with a standby on the same host)."""
    ha_standby_timeout: float = 2.0
    """A standby that asked nothing for this long is no longer waited for: the leader
    acknowledges writes without it (and says so in its log) until it is in sync again."""
    ha_buffer_bytes: int = 256 << 20
    """Bytes of operation log the leader keeps for standbys; one further behind is dropped
    and bootstraps again from a snapshot."""
    ha_chunk_bytes: int = 1 << 20
    """Largest piece of log or snapshot sent in one reply to a standby."""
    # -- security (docs/security.md)
    auth_file: str = ""
    """YAML file of the tokens connections must prove (`kvpool.master.auth`; reloaded on
    SIGHUP); "": no credentials, every connection is served as before."""
    tenant_quota_file: str = ""
    """Mooncake-format tenant quota policy (`kvpool.master.quota`; reloaded on SIGHUP); "":
    no quotas."""
    tls_cert: str = ""
    """PEM certificate of the TCP listener (`kvpool.rpc.tls`); "": plain TCP."""
    tls_key: str = ""
    """The private key of `tls_cert`."""
    tls_ca: str = ""
    """PEM CA bundle: clients must present a certificate it signed (mutual TLS); an HA
    standby verifies its leader with it."""

    tiers: TierConfig = field(default_factory=TierConfig)
    """Offload to node disk tiers and promotion on hit (`tier_config.py`)."""

    def __post_init__(self) -> None:
        if self.ha_lease_ttl < 2 or isinstance(self.ha_lease_ttl, bool):
            raise InvalidParams(
                f"ha_lease_ttl must be whole seconds >= 2, got {self.ha_lease_ttl!r}"
            )
        _positive("ha_standby_timeout", self.ha_standby_timeout)
        if self.ha_ack not in ("standby", "leader"):
            raise InvalidParams(f"ha_ack must be 'standby' or 'leader', got {self.ha_ack!r}")
        for name in ("ha_buffer_bytes", "ha_chunk_bytes"):
            if getattr(self, name) < 4096:
                raise InvalidParams(f"{name} must be >= 4096, got {getattr(self, name)}")
        _positive("fsync_interval", self.fsync_interval, allow_zero=True)
        _positive("snapshot_interval", self.snapshot_interval)
        _positive("default_kv_lease_ttl", self.default_kv_lease_ttl, allow_zero=True)
        _positive("default_kv_soft_pin_ttl", self.default_kv_soft_pin_ttl, allow_zero=True)
        _positive("max_kv_soft_pin_ttl", self.max_kv_soft_pin_ttl, allow_zero=True)
        if self.default_kv_soft_pin_ttl > self.max_kv_soft_pin_ttl:
            raise InvalidParams(
                f"default_kv_soft_pin_ttl ({self.default_kv_soft_pin_ttl} s) exceeds "
                f"max_kv_soft_pin_ttl ({self.max_kv_soft_pin_ttl} s)"
            )
        for name in ("eviction_high_watermark_ratio", "eviction_ratio"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0 or math.isnan(v):
                raise InvalidParams(f"{name} must be within [0, 1], got {v!r}")
        _positive("client_ttl", self.client_ttl)
        if self.client_dead_ttl is None:
            object.__setattr__(self, "client_dead_ttl", DEAD_TTL_FACTOR * self.client_ttl)
        else:
            _positive("client_dead_ttl", self.client_dead_ttl)
            if self.client_dead_ttl < self.client_ttl:
                raise InvalidParams(
                    f"client_dead_ttl ({self.client_dead_ttl} s) must be at least client_ttl "
                    f"({self.client_ttl} s)"
                )
        _positive("repair_interval", self.repair_interval)
        _positive("repair_backoff", self.repair_backoff)
        for name in ("repair_per_tick", "repair_max_in_flight", "repair_max_attempts"):
            if getattr(self, name) < 0:
                raise InvalidParams(f"{name} must be >= 0, got {getattr(self, name)}")
        _positive("put_start_discard_timeout", self.put_start_discard_timeout, allow_zero=True)
        _positive("put_start_release_timeout", self.put_start_release_timeout, allow_zero=True)
        if self.put_start_release_timeout < self.put_start_discard_timeout:
            raise InvalidParams(
                f"put_start_release_timeout ({self.put_start_release_timeout} s) must be at "
                f"least put_start_discard_timeout ({self.put_start_discard_timeout} s)"
            )
        _positive("replica_task_timeout", self.replica_task_timeout)
        _positive("task_retention", self.task_retention, allow_zero=True)
        _positive("monitor_interval", self.monitor_interval)
        _positive("reclaim_interval", self.reclaim_interval)
        _positive("regex_match_budget", self.regex_match_budget)
        if not 0 <= self.port <= 65535:
            raise InvalidParams(f"port must be within [0, 65535], got {self.port}")
        if self.num_shards < 1:
            raise InvalidParams(f"num_shards must be >= 1, got {self.num_shards}")
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise InvalidParams(f"alignment must be a power of two, got {self.alignment}")
        if self.max_replicas < 1:
            raise InvalidParams(f"max_replicas must be >= 1, got {self.max_replicas}")
        if self.max_arena_size < 0:
            raise InvalidParams(f"max_arena_size must be >= 0, got {self.max_arena_size}")
        if self.batch_chunk_keys < 1:
            raise InvalidParams(f"batch_chunk_keys must be >= 1, got {self.batch_chunk_keys}")
        if self.sweep_batch < 1:
            raise InvalidParams(f"sweep_batch must be >= 1, got {self.sweep_batch}")
        # Strings are accepted for the enums (flags, tests) and stored as the enum member.
        try:
            object.__setattr__(
                self, "allocation_strategy", AllocationStrategy(self.allocation_strategy)
            )
        except ValueError:
            choices = ", ".join(s.value for s in AllocationStrategy)
            raise InvalidParams(
                f"unknown allocation_strategy {self.allocation_strategy!r} (one of {choices})"
            ) from None
        try:
            object.__setattr__(self, "eviction_mode", EvictionMode(self.eviction_mode))
        except ValueError:
            raise InvalidParams(
                f"unknown eviction_mode {self.eviction_mode!r} (cache or pool)"
            ) from None
        _positive("rpc_handshake_timeout", self.rpc_handshake_timeout)
        _positive("rpc_idle_timeout", self.rpc_idle_timeout)
        if not 0 <= self.rpc_busy_poll <= 0.01:
            raise InvalidParams(f"rpc_busy_poll must be 0 to 0.01 s, got {self.rpc_busy_poll}")
        for name in ("rpc_max_connections", "rpc_max_connections_per_peer"):
            if getattr(self, name) < 1:
                raise InvalidParams(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def dead_ttl(self) -> float:
        """`client_dead_ttl` resolved (seconds)."""
        ttl = self.client_dead_ttl
        return ttl if ttl is not None else DEAD_TTL_FACTOR * self.client_ttl


def _positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidParams(f"{name} must be {bound} seconds, got {value!r}")
