"""kvpool.master: the metadata master of a pool (`kvpool master`).

It owns every piece of metadata (objects, replicas, segments, clients, leases) on one asyncio
event loop, so nothing locks; it never touches object bytes. Layers, lowest first (a module
imports only those above it in this list):

    config.py      MasterConfig: every setting, Mooncake's flag names and defaults
    allocator.py   OffsetAllocator: aligned ranges of one segment (TLSF-like, O(1) coalescing)
    segments.py    Segment / SegmentTable: mounted segments, owner, endpoint, allocator
    metadata.py    ObjectMeta / Replica (slotted records) and ObjectIndex (xxh3 shards)
    lease.py       read leases and soft-pin resolution
    liveness.py    ClientTable: registered clients, ping deadlines, in-flight PutStarts
    placement.py   Placement: which segments get an object's replicas
    hooks.py       ReclaimHooks / ReclaimTarget: the seam to reclaim/ (eviction)
    state.py       ServiceState: the state the service's parts share, and their helpers
    writes.py      WritePath: PutStart / UpsertStart / PutEnd / PutRevoke (+ batch forms)
    reads.py       ReadPath: GetReplicaList / ExistKey / GetSize, read leases
    admin.py       AdminPath: segments, liveness, removal, stats
    service.py     MasterService = WritePath + ReadPath + AdminPath: request in, reply out
    server.py      MasterServer: RpcServer + service + background tasks on one loop
    reclaim/       seed 001's active/inactive lists (plugs in through hooks.py)

May import `kvpool.protocol`, `kvpool.rpc`, `kvpool.errors`, `kvpool.config`; never the data
plane or the client (an import-linter contract holds that).
"""
