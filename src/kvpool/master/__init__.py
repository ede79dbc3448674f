"""kvpool.master: the metadata master of a pool (`kvpool master`).

It owns every piece of metadata (objects, replicas, segments, clients, leases) on one asyncio
event loop, so nothing locks; it never touches object bytes. Layers, highest first: a module
imports only modules of the layers below its own (an import-linter `layers` contract in
pyproject.toml holds that; modules on one line do not import each other):

    ha.py            HaMasterServer: a MasterServer that leads or stands by in an etcd-elected
                     group (`--ha`): the request gate (NOT_LEADER), promotion, acks
    server.py        MasterServer: RpcServer + service + background tasks on one loop
    replication.py  standby.py
                     the leader's stream for standbys (ReplicationSource: acks, snapshots);
                     the standby's hot copy (StandbyCopy) and its puller (Follower)
    service.py       MasterService: builds the parts below, dispatches requests, ReclaimTarget
    reclaim/         seed 001's active/inactive lists (plugs in through hooks.py)
    writes.py  reads.py  admin.py  tasks.py  arenas.py
                     the request handlers: WritePath, ReadPath, AdminPath, TaskPath, ArenaPath
    task_table.py    TaskTable: replica tasks by id, object and executor, and their lifecycle
    arena_table.py   ArenaTable: live arenas by id and client, ghosts of unmounted ones
    durable.py       Durability: --data-dir's log, forked snapshots and the restart (replay,
                     every segment silent until its node remounts it)
    core.py          MetadataCore: the metadata and the only code that changes it (named
                     operations)
    observer.py      MetadataObserver: how the tables hear of removals, mounts and expiries
    planner.py       PutPlanner / PutPlan: put validation, and the one rule for claiming a key
    parking.py       ParkedRanges: ranges kept allocated until a late writer is surely done
    oplog.py         the operation log's records and files; Journal: how the core logs a change
    placement.py     Placement: which segments get an object's replicas
    liveness.py      ClientTable: registered clients, ping deadlines, in-flight PutStarts
    lease.py         read leases and soft-pin resolution
    hooks.py         ReclaimHooks / ReclaimTarget: the seam to reclaim/ (eviction)
    metadata.py      ObjectMeta / Replica (slotted records) and ObjectIndex (xxh3 shards)
    segments.py      Segment / SegmentTable: mounted segments, owner, endpoint, allocator
    allocator.py     OffsetAllocator: aligned ranges of one segment (TLSF-like, O(1) coalescing)
    config.py        MasterConfig: every setting, Mooncake's flag names and defaults

May import `kvpool.protocol`, `kvpool.rpc`, `kvpool.errors`, `kvpool.codes`, `kvpool.override`,
`kvpool.config`, `kvpool.ha` (election, membership: ha.py only); never the data plane or the client (an import-linter contract holds that).
"""
