"""Which DFS replicas a process's `dfs_root` translates (`kvpool.client.dfs._root`): those of
the masters that named themselves in the directory's `kvpool-dfs-root` (`kvpool.master.dfs`),
even when their root does not exist on this host; any other master's replicas keep their own
`endpoint` (tests/review/test_r3_dfs_root_two_pools.py is the two-pool case end to end)."""

from __future__ import annotations

from pathlib import Path

from kvpool.client import dfs
from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.master.tier_config import TierConfig
from kvpool.protocol.messages import ReplicaDesc, ReplicaKind, ReplicaStatus
from kvpool.protocol.tiers import DFS_ROOT_FILE, DFS_SEGMENT, dfs_file


def _replica(endpoint: str, file_id: int) -> ReplicaDesc:
    return ReplicaDesc(
        1, ReplicaKind.DFS, ReplicaStatus.COMPLETE, DFS_SEGMENT, file_id, 1, endpoint
    )


def test_masters_name_their_roots_in_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "dfs"
    for _ in range(2):  # a restart adds nothing
        MasterService(MasterConfig(tiers=TierConfig(dfs_root=str(root))))
    assert (root / DFS_ROOT_FILE).read_text().splitlines() == [str(root)]


def test_only_the_replicas_of_the_directorys_masters_are_translated(tmp_path: Path) -> None:
    local = tmp_path / "here"
    local.mkdir()
    away = str(tmp_path / "on-the-master")  # this directory's root there: absent here
    other = str(tmp_path / "another-pool")  # another pool's root: absent here too
    (local / DFS_ROOT_FILE).write_text(f"/elsewhere\n{away}\n")
    attached = dfs.attach(str(local))
    try:
        assert dfs._path(_replica(away, 7)) == dfs_file(str(local), 7)
        assert dfs._path(_replica(other, 7)) == dfs_file(other, 7)
    finally:
        dfs.detach(attached)
    assert dfs._path(_replica(away, 7)) == dfs_file(away, 7)  # detached: the master's path
