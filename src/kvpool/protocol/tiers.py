"""Messages of the tiers below memory: a node names what its disk tier holds (docs/parts/tiers.md).

messages.py re-exports them and lists them in `Request`.
"""

from __future__ import annotations

from kvpool.protocol.values import ClientId, Message, SegmentName, TenantId

__all__ = [
    "DFS_DIR",
    "DFS_ROOT_FILE",
    "DFS_SEGMENT",
    "DiskEntry",
    "RegisterDiskReplicas",
    "dfs_file",
]

DFS_SEGMENT = SegmentName("kvpool-dfs")
"""The segment name a DFS replica carries (`ReplicaDesc.segment`); its `offset` is the file's
id and its `endpoint` the master's `--dfs-root` (docs/parts/tiers.md, "The DFS tier")."""
DFS_DIR = "kvpool-dfs"
"""The directory under the DFS root that holds the objects' files."""
DFS_ROOT_FILE = "kvpool-dfs-root"
"""A file beside `DFS_DIR` (in the root) naming the roots its masters call it, one a line (each
master adds its `--dfs-root` at its start): a client that mounts the directory elsewhere knows
by it which masters' replicas it serves (`kvpool.client.dfs`)."""


def dfs_file(root: str, file_id: int) -> str:
    """The path of DFS file `file_id` under `root` (the temporary one adds `.tmp`)."""
    return f"{root}/{DFS_DIR}/{file_id:016x}"


class DiskEntry(Message):
    """One object a node's disk tier holds: `size` bytes at `offset` of its disk segment,
    written whole and verified against `checksum` (xxh3_64) by the node."""

    tenant: TenantId
    key: str
    offset: int
    size: int
    checksum: int


class RegisterDiskReplicas(Message):
    """A node names the objects its disk segment `segment` holds (after a restart, or after the
    master forgot it): each becomes a COMPLETE LOCAL_DISK replica (the object is created when
    absent; an existing one of another size or checksum is left alone). Answered by
    `CountReply` (replicas registered)."""

    client_id: ClientId
    segment: SegmentName
    entries: list[DiskEntry]
