"""Review finding on the DFS tier's background check (src/kvpool/master/dfs.py `check`).

`check` decides that a DFS file "vanished" with `os.path.exists`, which answers False for any
error of `stat`, not only ENOENT: a DFS that fails a stat for a moment (EIO/ESTALE of an NFS
server, a symlink loop, a mount point briefly gone) makes the master drop every DFS replica it
checks in that moment. An object whose only copy is its DFS file (its node gone: "the copy
outlives every node") is then deleted although its file is intact, and the file is left
behind (the master's unlink fails the same way). The client's reader tells the two apart
(`kvpool.client.dfs.read`: FileNotFoundError is OBJECT_NOT_FOUND, any other error
TRANSFER_FAIL); the master's check does not.

The transient failure here: the DFS directory is replaced by a symlink to itself (stat fails
with ELOOP) for a little longer than one round of the check, then put back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import DFS_DIR, dfs_file
from kvtest.dfs import DFS, dfs_pool, wait_dfs_only
from kvtest.pool import PoolFactory, pool  # noqa: F401

VALUE = b"dfs-only" * 8192


@pytest.fixture
def broken_for_a_moment(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "dfs"
    yield root
    away = root / (DFS_DIR + ".away")
    if away.exists():  # put the directory back, whatever happened
        link = root / DFS_DIR
        if link.is_symlink():
            link.unlink()
        away.rename(link)


def test_a_transient_dfs_error_loses_no_object(
    pool: PoolFactory,  # noqa: F811
    broken_for_a_moment: Path,
) -> None:
    root = broken_for_a_moment
    p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s")
    with Store(p.address, rpc_timeout=20.0) as s:
        assert s.put("only-in-dfs", VALUE, DFS)
        assert s.put("probe", VALUE, DFS)
        p.kill_node(0)
        wait_dfs_only(s, ["only-in-dfs"], what="the memory replica gone with its node")
        # Does this build's background check look at completed objects at all (main since
        # d411593)? A file really deleted (ENOENT) must be found: else there is nothing to test.
        (probe,) = [r for r in s.get_replica_desc("probe") if r.kind == ReplicaKind.DFS]
        os.unlink(dfs_file(str(root), probe.offset))
        try:
            p.master.wait_for_line(r"DFS: the file of 'probe' .* vanished", timeout=10.0)
        except AssertionError:
            pytest.skip("this master's DFS check does not look at completed objects")
        d = root / DFS_DIR
        away = root / (DFS_DIR + ".away")
        d.rename(away)
        os.symlink(DFS_DIR, d)  # stat of anything under it: ELOOP
        # The failure lasts until the master's check has looked (it logs a drop), or a few
        # of its rounds (a master that tells ENOENT from other errors logs nothing).
        with contextlib.suppress(AssertionError):
            p.master.wait_for_line(r"DFS: the file of 'only-in-dfs' .* vanished", timeout=3.0)
        d.unlink()
        away.rename(d)
        assert os.listdir(d), "the file is still there"
        assert s.get("only-in-dfs") == VALUE
