"""kvpool.client: the `Store` API, the node runtime, and the embedded pool.

Layers inside the package (each module imports only those above it)::

    replicate.py   ReplicateConfig: validated placement/pin settings → ReplicateConfigMsg
    replica.py     replica choice (local memory first), checksum and lease checks
    node.py        NodeRuntime: client id, master connection, segments + TransferServer,
                   heartbeat (Ping, remount on NEED_REMOUNT, reconnect with backoff)
    datapath.py    DataPath: TransferEngine, segment locations, same-host copy+hash fast paths
    arena.py       Arenas: ranges the master lends for puts in one round trip
    tasks.py       TaskExecutor: runs the replica copy/move tasks the master assigns to a node
    config.py      StoreConfig: the Store's settings, frozen and validated
    validation.py  what the Store checks of its input (and of batch answers' lengths)
    result.py      PutResult, PutStats: what a put achieved (replicas), a Store's put counters
    writer.py      Writer: the put paths (PutStart/PutEnd/PutRevoke, arenas, batches, retries)
    reader.py      Reader: the get paths (replica choice, batches, the mapped fast path)
    control.py     Control: queries, removal, replica tasks and descriptors (no bytes move)
    store.py       Store: the public API, a façade over the parts above
    aio.py         AsyncStore: the Store's methods as coroutines (a private thread pool)
    embedded.py    EmbeddedPool: `kvpool master` + `kvpool node` as owned child processes

May import: kvpool.errors, kvpool.config, kvpool.protocol, kvpool.rpc, kvpool.transfer. Never the
master, the engine-side cache, the compat layer or the CLI (import-linter checks it). The
lifecycles are described in docs/parts/client.md.
"""

from __future__ import annotations

from kvpool.client.aio import AsyncStore
from kvpool.client.config import StoreConfig
from kvpool.client.replicate import ReplicateConfig, SoftPinAction
from kvpool.client.result import PutResult, PutStats
from kvpool.client.store import HealthStatus, Store

__all__ = [
    "AsyncStore",
    "HealthStatus",
    "PutResult",
    "PutStats",
    "ReplicateConfig",
    "SoftPinAction",
    "Store",
    "StoreConfig",
]
