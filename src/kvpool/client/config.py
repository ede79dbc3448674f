"""`StoreConfig`: every setting of a `Store`, one frozen, validated dataclass.

`Store(master, segment_size=..., ...)` builds one from its keyword arguments (the Mooncake-like
form); `Store.from_config(config)` takes one made elsewhere (a config file, a test's fixture).
Sizes are bytes (an int, or a string such as "4GiB", converted when the config is made),
durations seconds. Validation raises `InvalidParams` naming the field and the offending value:
sizes within `kvpool.config.MAX_SIZE` (a segment at least a page and at most this machine's
memory), durations positive and finite (at most a year; the heartbeat and task poll at most an
hour), names non-empty strs, `master` "host:port" or `etcd://HOST:PORT[,...]/CLUSTER_ID` (the
cluster id then comes from the URL; a different explicit `cluster_id` is refused).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from kvpool.client.dfs import check_root
from kvpool.client.leader import DEFAULT_FAILOVER_TIMEOUT_S, check_master
from kvpool.client.locations import (
    DEFAULT_LOCATION_CAPACITY,
    DEFAULT_LOCATION_TTL_S,
    READ_MODES,
    ReadMode,
)
from kvpool.client.node import DEFAULT_RPC_TIMEOUT_S, MIN_SEGMENT_SIZE, check_port_range
from kvpool.client.tasks import DEFAULT_POLL_INTERVAL_S
from kvpool.client.validation import check_segment_size
from kvpool.config import MAX_DURATION_S, parse_size
from kvpool.errors import InvalidParams
from kvpool.rpc.spin import DEFAULT_REPLY_POLL_S

__all__ = ["DEFAULT_TRANSFER_TIMEOUT_S", "PROTOCOLS", "WRITE_MODES", "Protocol", "StoreConfig"]

DEFAULT_TRANSFER_TIMEOUT_S: Final = 60.0
"""Seconds before one transfer (a batch's copies, a TCP read or write) gives up."""
Protocol = Literal["auto", "shm", "tcp"]
WriteMode = Literal["wait", "nowait"]
WRITE_MODES: Final = ("wait", "nowait")
PROTOCOLS: Final = ("auto", "shm", "tcp")
MAX_NAME_CHARS: Final = 255
"""Longest tenant, cluster id or host a Store takes."""
_DURATIONS: Final = {
    "rpc_timeout": MAX_DURATION_S,
    "transfer_timeout": MAX_DURATION_S,
    "heartbeat_interval": 3600.0,
    "task_poll_interval": 3600.0,
    "failover_timeout": MAX_DURATION_S,
    "location_ttl": 3600.0,
}
"""The duration fields and their maxima (seconds; a heartbeat slower than an hour would let
every master expire the Store)."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """The settings of one `Store` (Mooncake's `setup`, in Python form)."""

    master: str = "127.0.0.1:50051"
    """"host:port" of the master, or `etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID` to find and
    follow the leader of a highly available cluster (`kvpool.client.leader`)."""
    segment_size: int = 0
    """Bytes of this process's memory to contribute to the pool at start; 0 for a pure client
    (`Store.mount_segment` adds segments later)."""
    local_buffer_size: int = 0
    """Bytes; accepted for Mooncake compatibility. kvpool needs no staging buffer (values move
    straight between the caller's memory and the segment), so it only has to be a valid size."""
    host: str = "127.0.0.1"
    """The address this process's transfer server binds (only with a segment)."""
    transfer_port_range: tuple[int, int] | None = None
    """(low, high): the transfer server listens on a free port of this range, tried in a random
    order (`kvpool.client.node.bind_transfer_server`; the Mooncake layer asks for 12300-14300);
    None: a port the OS picks."""
    tenant: str = "default"
    """The namespace of every key of the Store."""
    protocol: Protocol = "auto"
    """ "auto" (memcpy / shared memory on this host, TCP otherwise), "shm", or "tcp" (force TCP,
    for benchmarks and tests)."""
    verify_checksum: bool = True
    """Check every read against the xxh3_64 recorded when the value was written."""
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S
    """Seconds before a control call to the master gives up."""
    transfer_timeout: float = DEFAULT_TRANSFER_TIMEOUT_S
    """Seconds before a transfer gives up."""
    heartbeat_interval: float = 1.0
    """Seconds between Pings to the master (tests shorten it)."""
    cluster_id: str = "kvpool"
    """Must match the master's (checked in the RPC handshake). With an `etcd://` master, left
    at "kvpool" it takes the URL's cluster id; another value must equal it."""
    task_poll_interval: float = DEFAULT_POLL_INTERVAL_S
    """With a segment, seconds between polls for the replica copy/move tasks the master assigns
    to this process (`kvpool.client.tasks`)."""
    arena_size: int = 64 << 20
    """Bytes of each arena the master lends the Store for puts in one round trip (values up to a
    quarter of it take that path); 0 turns arenas off."""
    failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT_S
    """With an `etcd://` master: seconds a call whose leader failed waits for a (new) leader
    before it fails (NotLeader / RpcError); also how long the Store waits for a leader at
    start."""
    offload_dir: str | None = None
    """A directory for this process's disk tier (`kvpool.client.disk`: a preallocated file
    of `offload_size` bytes and its journal); None for none."""
    offload_size: int = 0
    """Bytes of the disk tier (with `offload_dir`; at least 1 MiB)."""
    disk_check_interval: float | None = None
    """Seconds between two rounds of the disk tier's background check (0-3600; 0: none;
    None: `kvpool.client.disk.CHECK_INTERVAL_S`); with `offload_dir` only."""
    disk_check_per_round: int | None = None
    """Objects the check re-reads per round at most (>= 1; None: the tier's default)."""
    disk_check_bytes_per_round: int | None = None
    """Bytes the check re-reads per round at most (>= 1; None: the tier's default)."""
    dfs_root: str | None = None
    """Where the master's DFS directory (`kvpool master --dfs-root`) is mounted in this
    process, when not at the master's path (`kvpool.client.dfs`); an existing directory."""
    dfs_fsync: bool = False
    """`fdatasync` each DFS file this process writes before its rename (durable against a
    crash of this host; off: the file system's own flush, as NFS does at close)."""
    token: str = field(default="", repr=False)
    """The credential this Store proves to a master that has an auth file (docs/security.md);
    "" reads `token_file`, then $KVPOOL_AUTH_TOKEN. Never printed."""
    token_file: str = ""
    """A file whose first line is the token (used when `token` is "")."""
    read_mode: ReadMode = "strict"
    """ "strict" (every get asks the master for a leased replica) or "cached" (for keys whose
    bytes never change, such as content hashes: a get reads a place remembered less than
    `location_ttl` ago straight away, checked by its checksum; `kvpool.client.locations`)."""
    location_ttl: float = DEFAULT_LOCATION_TTL_S
    """Cached mode: seconds a remembered place may be used (the staleness bound)."""
    location_capacity: int = DEFAULT_LOCATION_CAPACITY
    """Cached mode: most places remembered (LRU)."""
    hot_cache_size: int = 0
    """Bytes of values of remote replicas kept in this process (Mooncake's
    `MC_STORE_LOCAL_HOT_CACHE_SIZE`; `kvpool.client.hotcache`); needs `read_mode="cached"`,
    whose promise it keeps. 0: none."""
    write_mode: WriteMode = "wait"
    """ "wait" (a put returns once the master committed it) or "nowait" (an arena put returns
    once its bytes are written and its commit is sent; the answer is checked at the next call,
    `flush()` or `close()`: `kvpool.client.pending`)."""
    metrics: bool = False
    """Count hits, misses, bytes and latency by path (`kvpool.client.metrics`; off: no cost)."""
    busy_poll: float = DEFAULT_REPLY_POLL_S
    """Seconds a lock-step call to a master on this host waits for its reply by polling the
    socket before it sleeps (`kvpool.rpc.spin`; 0 to 0.01; 0: it sleeps at once)."""
    tls_ca: str = ""
    """PEM CA bundle: TLS on every TCP connection of this Store, servers verified with it
    (`kvpool.rpc.tls`); "" reads $KVPOOL_TLS_CA; none: plain TCP."""
    tls_cert: str = ""
    """PEM certificate this Store presents (mutual TLS, and its segment's transfer server);
    "" reads $KVPOOL_TLS_CERT."""
    tls_key: str = ""
    """The private key of `tls_cert`; "" reads $KVPOOL_TLS_KEY."""

    def _check_disk_check(self) -> None:
        """The disk check's settings (tiers): valid, and only with a disk tier."""
        interval = self.disk_check_interval
        if interval is not None and (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not 0 <= interval <= 3600
        ):
            raise InvalidParams(f"disk_check_interval: expected 0-3600 s, got {interval!r:.80}")
        if self.disk_check_bytes_per_round is not None:
            nbytes = parse_size(self.disk_check_bytes_per_round, name="disk_check_bytes_per_round")
            object.__setattr__(self, "disk_check_bytes_per_round", nbytes)
        for name in ("disk_check_per_round", "disk_check_bytes_per_round"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidParams(f"{name}: expected an int >= 1, got {v!r:.80}")
        if self.offload_dir is None:
            for name in (
                "disk_check_interval",
                "disk_check_per_round",
                "disk_check_bytes_per_round",
            ):
                if getattr(self, name) is not None:
                    raise InvalidParams(f"{name} needs offload_dir (a disk tier to check)")

    def disk_check(self) -> dict[str, Any]:
        """The `DiskTier(...)` keyword arguments of the check settings given."""
        given = {
            "check_interval": self.disk_check_interval,
            "check_per_round": self.disk_check_per_round,
            "check_bytes_per_round": self.disk_check_bytes_per_round,
        }
        return {k: v for k, v in given.items() if v is not None}

    def __post_init__(self) -> None:
        # Sizes are normalised to ints here, so that a config read from a file may say "4GiB".
        for name in (
            "segment_size",
            "arena_size",
            "local_buffer_size",
            "offload_size",
            "hot_cache_size",
        ):
            object.__setattr__(self, name, parse_size(getattr(self, name), name=name))
        if self.transfer_port_range is not None:
            ports = check_port_range(self.transfer_port_range, "transfer_port_range")
            object.__setattr__(self, "transfer_port_range", ports)
        if self.segment_size:
            parse_size(self.segment_size, name="segment_size", minimum=MIN_SEGMENT_SIZE)
            check_segment_size(self.segment_size)
        if self.offload_dir is not None and (
            not isinstance(self.offload_dir, str) or self.offload_size < (1 << 20)
        ):
            raise InvalidParams(
                f"offload_dir {self.offload_dir!r} needs an offload_size of at least 1 MiB, "
                f"got {self.offload_size}"
            )
        self._check_disk_check()
        if self.dfs_root is not None:  # tiers: an existing directory, made absolute
            object.__setattr__(self, "dfs_root", check_root(self.dfs_root))
        if not isinstance(self.dfs_fsync, bool):
            raise InvalidParams(f"dfs_fsync: expected a bool, got {self.dfs_fsync!r:.80}")
        if not isinstance(self.protocol, str) or self.protocol not in PROTOCOLS:
            raise InvalidParams(f"protocol: {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        for name in ("tenant", "cluster_id", "host"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
                raise InvalidParams(
                    f"{name}: expected a non-empty str of at most {MAX_NAME_CHARS} characters, "
                    f"got {value!r:.80}"
                )
        object.__setattr__(self, "cluster_id", check_master(self.master, self.cluster_id))
        for name in ("token", "token_file", "tls_ca", "tls_cert", "tls_key"):
            if not isinstance(getattr(self, name), str):
                raise InvalidParams(f"{name}: expected a str")
        if not isinstance(self.verify_checksum, bool):
            raise InvalidParams(f"verify_checksum: expected a bool, got {self.verify_checksum!r}")
        if self.hot_cache_size and self.read_mode != "cached":
            raise InvalidParams(
                f"hot_cache_size: {self.hot_cache_size} needs read_mode='cached', "
                f"not {self.read_mode!r}"
            )
        if not isinstance(self.write_mode, str) or self.write_mode not in WRITE_MODES:
            raise InvalidParams(
                f"write_mode: {self.write_mode!r} is not one of {', '.join(WRITE_MODES)}"
            )
        if not isinstance(self.read_mode, str) or self.read_mode not in READ_MODES:
            raise InvalidParams(
                f"read_mode: {self.read_mode!r} is not one of {', '.join(READ_MODES)}"
            )
        if (
            isinstance(self.location_capacity, bool)
            or not isinstance(self.location_capacity, int)
            or not 1 <= self.location_capacity <= 1 << 30
        ):
            raise InvalidParams(
                f"location_capacity: {self.location_capacity!r} must be an int in [1, 2**30]"
            )
        if not isinstance(self.metrics, bool):
            raise InvalidParams(f"metrics: expected a bool, got {self.metrics!r}")
        for name, most in _DURATIONS.items():
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value <= most  # False for nan
            ):
                raise InvalidParams(
                    f"{name}: {value!r} must be a number of seconds in (0, {most:.0f}]"
                )
            object.__setattr__(self, name, float(value))
        poll = self.busy_poll
        if isinstance(poll, bool) or not isinstance(poll, int | float) or not 0 <= poll <= 0.01:
            raise InvalidParams(f"busy_poll: {poll!r} must be a number of seconds in [0, 0.01]")
        object.__setattr__(self, "busy_poll", float(poll))
