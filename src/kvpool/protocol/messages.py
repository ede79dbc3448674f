"""Every message between a client (or node) and the master: msgspec Structs, one per message.

Each Struct is tagged with its class name and encoded as a msgpack array (`array_like=True`:
about a third of the bytes of the map form and faster to encode), so decoding a frame against
the `Request` or `Response` union is also its validation. Service outcomes travel as `code`
fields (an `ErrorCode` value, 0 for success) inside these replies; `ErrorReply` of the RPC layer
is only for protocol faults. Compatibility rule: a message only ever grows by new fields *with
defaults* at its end, so an older peer still decodes it.

Lifecycles (the master is the only writer of metadata; bytes never pass through it):

* **Registration and liveness.** A client makes its own `client_id` (uuid4 hex) and registers
  with `ReMountSegment(client_id, host_id, segments)` (the list may be empty for a pure client);
  a node mounts memory with `MountSegment` or `ReMountSegment` (both idempotent). Every client
  sends `Ping(client_id)` every second. A client silent for `client_ttl` (10 s) is *silent*:
  its segments are kept but serve no reads and take no new replicas, its in-flight PutStarts
  are preempted; silent for `client_dead_ttl` it is dropped: its segments are unmounted,
  replicas on them dropped (and repaired from other replicas). A `Ping` from a client the
  master does not know (it restarted, or dropped the client) or holds as silent answers
  `ClientStatus.NEED_REMOUNT`; the client then sends `ReMountSegment` with all its segments,
  each with the `generation` drawn when its memory was made: a silent segment named with the
  same generation is restored with its objects (`RemountReply.restored`), any other is mounted
  fresh (docs/parts/reliability.md).
  `UnmountSegment` is allowed only to the owner (ILLEGAL_CLIENT otherwise).

* **Put.** `PutStart(client_id, key, size, config)` validates, allocates `replica_num` memory
  replicas on distinct segments (best effort: fewer segments give fewer replicas) and answers
  their `ReplicaDesc`s in status PROCESSING. The client writes `size` bytes at `offset` of each
  replica's segment through the transfer engine, then sends `PutEnd(client_id, key, checksum)`
  (xxh3_64 of the value), which marks the replicas COMPLETE and makes the object readable. On a
  failed write it sends `PutRevoke`, which frees everything the PutStart took. A key that is
  complete, or whose PutStart is younger than `put_start_discard_timeout` (30 s), answers
  OBJECT_ALREADY_EXISTS (the Store maps that to success: put is insert-if-absent); an older
  PutStart is preempted and its space is released `put_start_release_timeout` (600 s) after it
  started, so a slow writer can never scribble over a new object. `UpsertStart` overwrites: an
  absent key is put, the same size reuses the replicas in place, another size reallocates; it
  is finished with the same `PutEnd` / `PutRevoke`.

* **Put in one round trip (arenas).** A client may hold *arenas*: ranges of one segment that
  `ReserveArena(client_id, size, min_size)` allocates to it (`ArenaReply`: id, segment, offset,
  size, alignment). It cuts each value's range from an arena itself (bump allocation, aligned),
  writes the value there, then sends `PutCommit(client_id, key, size, arena_id, offset,
  checksum)`, which creates the object COMPLETE in one step (OBJECT_ALREADY_EXISTS as PutStart;
  the range then stays part of the arena). The master checks that the range lies in one of the
  client's arenas and overlaps no range committed from it before (INVALID_PARAMS otherwise);
  an arena it does not know (released, on an unmounted segment, the client expired, or the
  master restarted) answers INVALID_WRITE, and the client falls back to PutStart/PutEnd.
  `ReleaseArenas(client_id, ids)` (also the `retire` list of a ReserveArena) gives the parts
  never committed back; a committed range belongs to its object from then on and is freed with
  it. An arena is a lease (`lease_ms`): the client writes into it only for half of it after
  the last request naming it; ranges the master lets go of without being asked (client
  expired, arena idle, segment unmounted and mounted again) stay reserved until a write that
  started in time must have ended (`kvpool.master.arenas`). Only one-replica puts without
  preferred segments take this path.

* **Get.** `GetReplicaList(key)` answers the readable replicas (COMPLETE, on a live segment),
  the size, the checksum and `lease_ttl_ms`: the object holds a read lease until
  max(old lease, now + `default_kv_lease_ttl`), during which Remove refuses it
  (OBJECT_HAS_LEASE) and eviction skips it. REPLICA_IS_NOT_READY while only PROCESSING replicas
  exist, OBJECT_NOT_FOUND otherwise. `ExistKey` and `GetSize` grant the same lease.
  `BatchGetLocations(keys)` is the batch form a Store uses: the same answers and lease in the
  compact `LocationsReply` (parallel lists; segments named once per reply), which costs the
  master and the client a fraction of a Struct per key and replica.

* **Remove.** `Remove(key, force)` refuses a leased object (OBJECT_HAS_LEASE) or one still being
  written (REPLICA_IS_NOT_READY) unless `force`; `RemoveAll` and `RemoveByRegex` answer how many
  objects they removed and skip leased objects unless `force`.

* **Replica tasks** (Mooncake's create_copy_task / create_move_task / query_task):
  `CreateCopyTask` / `CreateMoveTask` answer `TaskReply(code, task_id)`; the master allocates
  the destinations (PROCESSING) and assigns the task to one executor, which learns of it from
  `PingReply.pending_tasks`, takes it with `FetchTasks`, copies through its transfer engine and
  reports `MarkTaskComplete` (with `bad_source` for a replica that failed its checksum, as
  `ReportBadReplica` does for readers). `QueryTask` answers the status; `BatchReplicaClear`
  drops a client's own expired replicas. Step by step: `kvpool.master.tasks`.

Every per-key request has a batch form whose reply carries one result per key, in order. Keys
live in a tenant (default "default"); shards are chosen by a stable hash of (tenant, key).
"""

from __future__ import annotations

from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus
from kvpool.protocol.replication import (
    Barrier,
    FetchSnapshot,
    FollowLog,
    HaRequest,
    HaResponse,
    HaStatus,
    HaStatusReply,
    LogReply,
    SnapshotReply,
)
from kvpool.protocol.tiers import DiskEntry, RegisterDiskReplicas
from kvpool.protocol.values import (
    DEFAULT_REPLICATE_CONFIG,
    DEFAULT_TENANT,
    ClientId,
    ClientStatus,
    HostId,
    Message,
    ReplicaDesc,
    ReplicaKind,
    ReplicaStatus,
    ReplicateConfigMsg,
    SegmentInfo,
    SegmentName,
    SoftPinAction,
    TaskStatus,
    TaskType,
    TenantId,
    TenantUsage,
)

__all__ = [
    "DEFAULT_TENANT",
    "ArenaReply",
    "Barrier",
    "BatchExistKey",
    "BatchExistReply",
    "BatchGetLocations",
    "BatchGetReplicaList",
    "BatchPutCommit",
    "BatchPutEnd",
    "BatchPutRevoke",
    "BatchPutStart",
    "BatchPutStartReply",
    "BatchRemove",
    "BatchReplicaClear",
    "BatchReplicaClearReply",
    "BatchReplicaListReply",
    "BatchReply",
    "BatchUpsertStart",
    "ClientId",
    "ClientStats",
    "ClientStatus",
    "CountReply",
    "CreateCopyTask",
    "CreateMoveTask",
    "DiskEntry",
    "Echo",
    "EchoReply",
    "ExistKey",
    "ExistReply",
    "FetchSnapshot",
    "FetchTasks",
    "FetchTasksReply",
    "FollowLog",
    "GetReplicaList",
    "GetSegment",
    "GetSize",
    "HaStatus",
    "HaStatusReply",
    "HostId",
    "LocationsReply",
    "LogReply",
    "MarkTaskComplete",
    "Message",
    "MountSegment",
    "Ping",
    "PingReply",
    "PutCommit",
    "PutEnd",
    "PutRevoke",
    "PutStart",
    "PutStartReply",
    "QueryTask",
    "QueryTaskReply",
    "ReMountSegment",
    "RegisterDiskReplicas",
    "ReleaseArenas",
    "RemountReply",
    "Remove",
    "RemoveAll",
    "RemoveByRegex",
    "ReplicaDesc",
    "ReplicaKind",
    "ReplicaListReply",
    "ReplicaStatus",
    "ReplicaTask",
    "ReplicateConfigMsg",
    "Reply",
    "ReportBadReplica",
    "Request",
    "ReserveArena",
    "Response",
    "SegmentInfo",
    "SegmentName",
    "SegmentReply",
    "SegmentStats",
    "SizeReply",
    "SnapshotReply",
    "SoftPinAction",
    "Stats",
    "StatsReply",
    "TaskReply",
    "TaskStatus",
    "TaskType",
    "TenantId",
    "TenantUsage",
    "UnmountSegment",
    "UpsertStart",
]

# ---------------------------------------------------------------- requests


class Echo(Message):
    """Answered with its payload and nothing else: the RPC-layer baseline of the benchmarks."""

    payload: bytes = b""


class Ping(Message):
    client_id: ClientId


class MountSegment(Message):
    client_id: ClientId
    host_id: HostId
    segment: SegmentInfo


class ReMountSegment(Message):
    """Register the client and (re)mount all of its segments; idempotent."""

    client_id: ClientId
    host_id: HostId
    segments: list[SegmentInfo] = []


class UnmountSegment(Message):
    client_id: ClientId
    name: SegmentName


class GetSegment(Message):
    name: SegmentName


class PutStart(Message):
    client_id: ClientId
    key: str
    size: int
    config: ReplicateConfigMsg = DEFAULT_REPLICATE_CONFIG
    tenant: TenantId = DEFAULT_TENANT


class UpsertStart(Message):
    client_id: ClientId
    key: str
    size: int
    config: ReplicateConfigMsg = DEFAULT_REPLICATE_CONFIG
    tenant: TenantId = DEFAULT_TENANT


class BatchPutStart(Message):
    client_id: ClientId
    keys: list[str]
    sizes: list[int]
    config: ReplicateConfigMsg = DEFAULT_REPLICATE_CONFIG
    tenant: TenantId = DEFAULT_TENANT


class BatchUpsertStart(Message):
    client_id: ClientId
    keys: list[str]
    sizes: list[int]
    config: ReplicateConfigMsg = DEFAULT_REPLICATE_CONFIG
    tenant: TenantId = DEFAULT_TENANT


class PutEnd(Message):
    """Finish a PutStart or UpsertStart; `checksum` is xxh3_64 of the whole value.

    `replica_id` names the put being finished: the id of the first replica its PutStart
    answered. A PutEnd whose put was taken over meanwhile (a stale write preempted by a later
    put of the key from the same client) then answers ILLEGAL_CLIENT instead of finishing the
    later put with its own checksum. None: not checked (older clients)."""

    client_id: ClientId
    key: str
    checksum: int | None = None
    tenant: TenantId = DEFAULT_TENANT
    replica_id: int | None = None


class BatchPutEnd(Message):
    """`checksums` is empty (none recorded) or one per key; `replica_ids` is empty (not
    checked) or one per key, as `PutEnd.replica_id`."""

    client_id: ClientId
    keys: list[str]
    checksums: list[int] = []
    tenant: TenantId = DEFAULT_TENANT
    replica_ids: list[int] = []


class PutRevoke(Message):
    """Undo an unfinished PutStart. `replica_id` as in `PutEnd`. `park`: a write into its
    ranges failed part-way (a node may be frozen, not dead, and still write them when it
    wakes), so the ranges stay allocated until `put_start_release_timeout` instead of being
    freed at once."""

    client_id: ClientId
    key: str
    tenant: TenantId = DEFAULT_TENANT
    replica_id: int | None = None
    park: bool = False


class BatchPutRevoke(Message):
    """`PutRevoke` of several keys; `replica_ids` empty (not checked) or one per key."""

    client_id: ClientId
    keys: list[str]
    tenant: TenantId = DEFAULT_TENANT
    replica_ids: list[int] = []
    park: bool = False


class ReserveArena(Message):
    """Allocate an arena of `size` bytes (the master may grant less, never below `min_size`)
    for this client's one-round-trip puts; `retire` releases the client's arenas first."""

    client_id: ClientId
    size: int
    min_size: int = 0
    retire: list[int] = []


class ReleaseArenas(Message):
    """Give back what was never committed from these arenas (unknown ids are ignored)."""

    client_id: ClientId
    arena_ids: list[int]


class PutCommit(Message):
    """Create `key` COMPLETE from `size` bytes the client already wrote at `offset` of its arena
    `arena_id`; `checksum` is xxh3_64 of the value. `config` must ask for one replica and no
    preferred segments (its pins apply)."""

    client_id: ClientId
    key: str
    size: int
    arena_id: int
    offset: int
    checksum: int | None = None
    config: ReplicateConfigMsg = DEFAULT_REPLICATE_CONFIG
    tenant: TenantId = DEFAULT_TENANT


class BatchPutCommit(Message):
    """`PutCommit` of many keys from one arena; `checksums` is empty or one per key."""

    client_id: ClientId
    arena_id: int
    keys: list[str]
    sizes: list[int]
    offsets: list[int]
    checksums: list[int] = []
    config: ReplicateConfigMsg = DEFAULT_REPLICATE_CONFIG
    tenant: TenantId = DEFAULT_TENANT


class GetReplicaList(Message):
    key: str
    tenant: TenantId = DEFAULT_TENANT


class BatchGetReplicaList(Message):
    keys: list[str]
    tenant: TenantId = DEFAULT_TENANT


class BatchGetLocations(Message):
    """`BatchGetReplicaList` answered in the compact `LocationsReply` (same rules, same lease):
    what a batch read needs, without a Struct per key and replica."""

    keys: list[str]
    tenant: TenantId = DEFAULT_TENANT


class ExistKey(Message):
    key: str
    tenant: TenantId = DEFAULT_TENANT


class BatchExistKey(Message):
    keys: list[str]
    tenant: TenantId = DEFAULT_TENANT


class GetSize(Message):
    key: str
    tenant: TenantId = DEFAULT_TENANT


class Remove(Message):
    key: str
    force: bool = False
    tenant: TenantId = DEFAULT_TENANT


class BatchRemove(Message):
    keys: list[str]
    force: bool = False
    tenant: TenantId = DEFAULT_TENANT


class RemoveAll(Message):
    force: bool = False
    tenant: TenantId = DEFAULT_TENANT


class RemoveByRegex(Message):
    """Remove the keys in which `pattern` (Python `re` syntax) is found (`re.search`)."""

    pattern: str
    force: bool = False
    tenant: TenantId = DEFAULT_TENANT


class Stats(Message):
    """Ask for the pool's segments, clients and object count (what `kvpool status` prints)."""


# ---------------------------------------------------------------- replies


class EchoReply(Message):
    payload: bytes = b""


class Reply(Message):
    """The outcome of a request that answers nothing else."""

    code: int = 0


class BatchReply(Message):
    codes: list[int]


class RemountReply(Reply):
    """The answer to a `ReMountSegment` that restored segments: `code` as a `Reply`, and the
    segments the master had kept while the client was silent and now serves again with their
    objects (name and generation matched); every other segment of the request was mounted
    fresh (empty). A remount that restored nothing answers a plain `Reply`."""

    restored: list[SegmentName] = []


class PingReply(Message):
    code: int
    client_status: ClientStatus
    view_version: int = 0
    pending_tasks: int = 0
    """Replica tasks waiting for this client to `FetchTasks` them."""


class SegmentReply(Message):
    code: int
    segment: SegmentInfo | None = None


class PutStartReply(Message):
    """`retry_after_ms` > 0 with NO_AVAILABLE_HANDLE: the master is making room for the put
    (pool mode: moving neighbours out of a fragmented range); asking again after that many
    milliseconds may succeed. 0: nothing is under way."""

    code: int
    replicas: list[ReplicaDesc] = []
    retry_after_ms: int = 0


class BatchPutStartReply(Message):
    results: list[PutStartReply]


class ArenaReply(Message):
    """A granted arena: `size` bytes at `offset` of `segment` (owned by `endpoint`'s node);
    ranges cut from it must start on multiples of `alignment`. The client writes into it only
    for `lease_ms / 2` after sending the last request the master answered for it (this one,
    or a commit naming it)."""

    code: int
    arena_id: int = 0
    segment: SegmentName = SegmentName("")
    offset: int = 0
    size: int = 0
    alignment: int = 64
    endpoint: str = ""
    lease_ms: int = 0


class ReplicaListReply(Message):
    """Readable replicas of one object; `lease_ttl_ms` is how long the read lease runs."""

    code: int
    replicas: list[ReplicaDesc] = []
    size: int = 0
    checksum: int | None = None
    lease_ttl_ms: int = 0


class BatchReplicaListReply(Message):
    results: list[ReplicaListReply]


class LocationsReply(Message):
    """The answer to `BatchGetLocations`: parallel lists with one entry per key, in order.

    `codes[i]` is what GetReplicaList would answer; for an OK key `sizes[i]`, `checksums[i]`
    and `places[i]`, its readable memory replicas in the master's order, flattened as
    `[segment index, offset, segment index, offset, ...]`; the indexes point into `segments`
    and `endpoints` (each segment named once per reply). One `lease_ttl_ms` for all keys.
    Disk-tier replicas follow the memory ones; `disk_segments` says which segments they are on.
    """

    codes: list[int]
    sizes: list[int]
    checksums: list[int | None]
    places: list[list[int]]
    segments: list[SegmentName] = []
    endpoints: list[str] = []
    lease_ttl_ms: int = 0
    disk_segments: list[int] = []


class ExistReply(Message):
    code: int
    exists: bool = False


class BatchExistReply(Message):
    results: list[ExistReply]


class SizeReply(Message):
    code: int
    size: int = 0


class CountReply(Message):
    code: int
    count: int = 0


class SegmentStats(Message):
    """One mounted segment in a `StatsReply`."""

    name: SegmentName
    client_id: ClientId
    host_id: HostId
    endpoint: str
    capacity: int
    used: int
    objects: int


class ClientStats(Message):
    """One registered client in a `StatsReply`; `ttl_left_s` is time until it would expire."""

    client_id: ClientId
    host_id: HostId
    segments: int
    ttl_left_s: float
    in_flight_puts: int = 0
    silent: bool = False
    """Silent past `client_ttl`: its segments take no new replicas and serve no reads until it
    comes back; `ttl_left_s` is then the time left before it is dropped (`client_dead_ttl`)."""


class StatsReply(Message):
    code: int
    segments: list[SegmentStats] = []
    clients: list[ClientStats] = []
    objects: int = 0
    processing: int = 0
    capacity: int = 0
    used: int = 0
    uptime_s: float = 0.0
    tasks_active: int = 0
    """Replica tasks PENDING or PROCESSING."""
    arenas: int = 0
    """Arenas lent to clients for one-round-trip puts, and the bytes they hold (in `used`)."""
    arena_bytes: int = 0
    silent_segments: list[SegmentStats] = []
    """Segments of silent clients, kept (not in `segments`, `capacity`, `used`) until their
    owner comes back or is dropped."""
    silent_clients: list[ClientStats] = []
    """Clients silent past `client_ttl` (not in `clients`), kept until `client_dead_ttl`."""
    under_replicated: int = 0
    """Objects known to have fewer replicas than they asked for (lost to a dropped segment),
    being repaired or waiting for a source or a target."""
    repair_queued: int = 0
    repair_in_flight: int = 0
    repair_done: int = 0
    """Repair copies that succeeded since the master started."""
    repair_failed: int = 0
    """Repair copies that failed (each is retried with backoff, up to a limit)."""
    standbys: int = 0
    """HA leader: standbys in sync (each write waits for all of them); 0 otherwise."""
    tenants: list[TenantUsage] = []
    """Bytes of indexed objects per tenant, with its quota (`kvpool.master.quota`); a
    non-admin of a master with credentials sees its own tenant only."""


# ---------------------------------------------------------------- replica tasks


class CreateCopyTask(Message):
    """Copy an object's bytes to one new memory replica on each of `targets` (segment names)."""

    key: str
    targets: list[SegmentName]
    tenant: TenantId = DEFAULT_TENANT


class CreateMoveTask(Message):
    """Move the object's replica on segment `source` to segment `target`."""

    key: str
    source: SegmentName
    target: SegmentName
    tenant: TenantId = DEFAULT_TENANT


class TaskReply(Message):
    code: int
    task_id: str = ""


class QueryTask(Message):
    task_id: str


class QueryTaskReply(Message):
    """`created_s` / `updated_s` are on the master's clock (compare them with each other);
    `age_s` is how long ago the task was created."""

    code: int
    task_id: str = ""
    task_type: TaskType = TaskType.COPY
    status: TaskStatus = TaskStatus.PENDING
    message: str = ""
    created_s: float = 0.0
    updated_s: float = 0.0
    key: str = ""
    tenant: TenantId = DEFAULT_TENANT
    executor: ClientId = ClientId("")
    age_s: float = 0.0


class ReplicaTask(Message):
    """One task as its executor gets it: copy `size` bytes from `source` to every replica of
    `targets` (already allocated, PROCESSING). `segments` describes every segment named in
    `source` and `targets` (endpoint, shm path, host), so no `GetSegment` is needed.
    `checksum` is the object's xxh3_64 (None when the writer sent none)."""

    task_id: str
    task_type: TaskType
    key: str
    tenant: TenantId
    size: int
    checksum: int | None
    source: ReplicaDesc
    targets: list[ReplicaDesc]
    segments: list[SegmentInfo] = []


class FetchTasks(Message):
    """The executor takes up to `max_tasks` of its PENDING tasks (they become PROCESSING)."""

    client_id: ClientId
    max_tasks: int = 16
    dfs: bool = False  # the executor sees the DFS directory: it may promote from DFS files


class FetchTasksReply(Message):
    code: int
    tasks: list[ReplicaTask] = []
    disk_freed: list[tuple[SegmentName, int]] = []  # ranges of the executor's disk tiers freed


class MarkTaskComplete(Message):
    """The executor's report: `ok` when every target holds the bytes. Answered by `Reply`.
    `bad_source`: the task failed because the source's bytes do not match the object's
    checksum (the master then treats the source as a `ReportBadReplica` would)."""

    client_id: ClientId
    task_id: str
    ok: bool
    message: str = ""
    bad_source: bool = False


class ReportBadReplica(Message):
    """A reader (or executor) found the replica of `key` at `offset` of `segment` not matching
    the object's checksum. Answered by `Reply`: OK (the replica is dropped and the object
    repaired from another one; kept when it is the last readable replica: nothing better
    exists), OBJECT_NOT_FOUND, REPLICA_NOT_FOUND (no such replica: already dropped)."""

    key: str
    segment: SegmentName
    offset: int
    tenant: TenantId = DEFAULT_TENANT


class BatchReplicaClear(Message):
    """Drop the replicas of `client_id`'s own objects among `keys` whose lease has expired:
    all of them (the object goes) or, with `segment_name`, only those on that segment."""

    keys: list[str]
    client_id: ClientId
    segment_name: SegmentName = SegmentName("")
    tenant: TenantId = DEFAULT_TENANT


class BatchReplicaClearReply(Message):
    code: int
    cleared: list[str] = []


Request = (
    Echo
    | Ping
    | MountSegment
    | ReMountSegment
    | UnmountSegment
    | GetSegment
    | PutStart
    | UpsertStart
    | BatchPutStart
    | BatchUpsertStart
    | PutEnd
    | BatchPutEnd
    | PutRevoke
    | BatchPutRevoke
    | GetReplicaList
    | BatchGetReplicaList
    | BatchGetLocations
    | ExistKey
    | BatchExistKey
    | GetSize
    | Remove
    | BatchRemove
    | RemoveAll
    | RemoveByRegex
    | Stats
    | CreateCopyTask
    | CreateMoveTask
    | QueryTask
    | FetchTasks
    | MarkTaskComplete
    | BatchReplicaClear
    | ReportBadReplica
    | ReserveArena
    | ReleaseArenas
    | PutCommit
    | BatchPutCommit
    | HaRequest
    | DrainSegment
    | DrainStatus
    | RegisterDiskReplicas
)
"""Every request the master serves (the `request_type` of its RpcServer)."""

Response = (
    EchoReply
    | Reply
    | BatchReply
    | RemountReply
    | PingReply
    | SegmentReply
    | PutStartReply
    | BatchPutStartReply
    | ReplicaListReply
    | BatchReplicaListReply
    | LocationsReply
    | ExistReply
    | BatchExistReply
    | SizeReply
    | CountReply
    | StatsReply
    | TaskReply
    | QueryTaskReply
    | FetchTasksReply
    | BatchReplicaClearReply
    | ArenaReply
    | HaResponse
    | DrainReply
)
"""Every reply of the master (the `response_type` of an RpcClient talking to it). Named
`Response` because `Reply` is the plain `Reply(code)` message of the contract."""
