"""Orphan files in the DFS directory (docs/parts/tiers.md, "The DFS tier"): files that no
object names (a master run without `--data-dir`, a writer that died between its write and its
commit, `.tmp` files of abandoned writes) are removed by the master's check once older than
`--dfs-orphan-grace`; a live object's file, a young file and names that are no file id stay.
Also the master's DFS check options, through the real command."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.protocol.tiers import DFS_DIR, dfs_file
from kvtest.dfs import DFS, dfs_pool
from kvtest.etcd import EtcdServer
from kvtest.ha import HaMaster, wait_leader
from kvtest.ops_http import http_base, metrics_text
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import kvpool_proc, run_kvpool, wait_until
from kvtest.replicas import dfs_file_id
from kvtest.stores import open_store

OLD = 3600.0


def scrape(base: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", metrics_text(base), re.M)
    assert m is not None, name
    return float(m.group(1))


def plant(path: str, age: float) -> None:
    with open(path, "wb") as f:
        f.write(b"orphan" * 100)
    t = time.time() - age
    os.utime(path, (t, t))


def test_old_orphan_and_tmp_files_go_while_live_and_young_files_stay(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    root.mkdir()
    d = root / DFS_DIR
    d.mkdir()
    # Left by an earlier master run (no --data-dir) and by a writer that died.
    orphan = dfs_file(str(root), 1 << 40)
    stale_tmp = dfs_file(str(root), (1 << 40) + (1 << 20)) + ".tmp"
    plant(orphan, OLD)
    plant(stale_tmp, OLD)
    young = dfs_file(str(root), (1 << 40) + (2 << 20))
    plant(young, 0)
    foreign = str(d / "README")  # not a file id: never touched
    plant(foreign, OLD)
    odd = str(d / "00000000000000AB")  # capitals: not a name the tier makes
    plant(odd, OLD)
    p = dfs_pool(
        pool,
        root,
        "--dfs-orphan-grace",
        "20s",
        "--dfs-check-interval",
        "20ms",
        "--dfs-check-per-round",
        "2",  # several rounds per pass over the directory
        "--http-port",
        "0",
    )
    base = http_base(p.master)
    s = open_store(stores, p.address)
    assert s.put("live", b"v" * 4096, DFS)
    live_id = dfs_file_id(s, "live")
    live = dfs_file(str(root), live_id)
    t = time.time() - OLD
    os.utime(live, (t, t))  # old, but named by an object
    wait_until(
        lambda: not os.path.exists(orphan) and not os.path.exists(stale_tmp),
        timeout=20,
        what="the old orphan files removed",
    )
    passes = scrape(base, "kvpool_dfs_orphans_total")
    assert passes == 2
    # A few more passes over the directory: nothing else goes.
    deadline = time.monotonic() + 0.5
    wait_until(lambda: time.monotonic() >= deadline, timeout=5, what="more rounds")
    for kept in (young, foreign, odd, live):
        assert os.path.exists(kept), kept
    assert s.get("live") == b"v" * 4096
    assert scrape(base, "kvpool_dfs_orphans_total") == 2


def test_the_grace_is_an_age(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    root = tmp_path / "dfs"
    (root / DFS_DIR).mkdir(parents=True)
    young = dfs_file(str(root), 5 << 20)
    plant(young, 0)
    dfs_pool(pool, root, "--dfs-orphan-grace", "1s", "--dfs-check-interval", "50ms", nodes=0)
    assert os.path.exists(young)  # younger than a second when the master came up
    wait_until(lambda: not os.path.exists(young), timeout=20, what="the file aged past grace")


@pytest.mark.parametrize(
    ("option", "bad"),
    [
        ("--dfs-check-interval", "0"),
        ("--dfs-check-interval", "2h"),
        ("--dfs-check-interval", "soon"),
        ("--dfs-check-per-round", "0"),
        ("--dfs-orphan-grace", "-1s"),
        ("--dfs-orphan-grace", "40d"),
    ],
)
def test_bad_dfs_check_options_are_refused_naming_the_option(
    tmp_path: Path, option: str, bad: str
) -> None:
    out = run_kvpool("master", "--port", "0", "--dfs-root", str(tmp_path), option, bad)
    assert out.returncode == 2, out.stderr
    assert option in out.stderr, out.stderr


def test_only_the_leader_removes_orphans(
    etcd_shared: EtcdServer,
    cluster: str,
    tmp_path: Path,
) -> None:
    # A standby's metadata names no file: were it to sweep, it would take every live one
    # (the grace is 0 here).
    root = tmp_path / "dfs"
    flags = ("--dfs-root", str(root), "--dfs-orphan-grace", "0s", "--dfs-check-interval", "20ms")
    with contextlib.ExitStack() as stack:
        masters = [HaMaster(etcd_shared.endpoint, cluster, n, *flags) for n in "ab"]
        for m in masters:
            stack.callback(m.stop)
        leader = wait_leader(masters)
        standby = next(m for m in masters if m is not leader)
        url = f"etcd://{etcd_shared.endpoint}/{cluster}"
        node = kvpool_proc("node", "--master", url, "--segment-size", "16MiB", "--no-progress")
        stack.callback(node.stop)
        node.wait_ready(timeout=60)
        s = stack.enter_context(Store(url, rpc_timeout=20.0))
        for i in range(3):
            assert s.put(f"h{i}", bytes([i]) * 8192, DFS)
        wait_until(
            lambda: (st := standby.status()) is not None and st.objects == 3,
            timeout=10,
            what="the standby's copy to hold every object",
        )
        orphan = dfs_file(str(root), 1 << 40)
        plant(orphan, OLD)
        wait_until(lambda: not os.path.exists(orphan), timeout=20, what="the leader's sweep")
        # The standby ran rounds meanwhile too (same interval); every live file is there.
        assert len(os.listdir(root / DFS_DIR)) == 3
        for i in range(3):
            assert s.get(f"h{i}") == bytes([i]) * 8192


def test_a_closed_master_releases_the_sweeps_directory_handle(tmp_path: Path) -> None:
    """The orphan sweep keeps a directory iterator open between rounds (it resumes where it
    stopped): closing the master, or an HA master replacing its service, releases it."""
    from kvpool.master.config import MasterConfig
    from kvpool.master.server import MasterServer
    from kvpool.master.service import MasterService
    from kvpool.master.tier_config import TierConfig
    from kvpool.rpc.thread import ServerThread

    os.makedirs(tmp_path / DFS_DIR)
    for i in range(8):  # more entries than one round looks at
        plant(str(tmp_path / DFS_DIR / f"junk-{i}"), OLD)
    tiers = TierConfig(dfs_root=str(tmp_path), dfs_check_per_round=2, dfs_check_interval=3600)
    config = MasterConfig(port=0, unix_socket=False, tiers=tiers)
    server = MasterServer(config)
    first = server.service.tiers.dfs
    assert first is not None
    first.sweep()
    assert first._scan is not None  # mid-directory: the iterator stays open
    server._install(MasterService(config))  # what an HA master does when it takes office
    assert first._scan is None
    second = server.service.tiers.dfs
    assert second is not None
    with ServerThread(server, name="dfs-close"):
        second.sweep()
        assert second._scan is not None
    assert second._scan is None
