"""DFS replicas and disk-tier segments in the master's `--data-dir` (`kvpool.master.durable`,
`kvpool.master.oplog`): a master killed and restarted on the same data directory knows the
objects' DFS copies again (readable with every node gone, checked for vanished files, file ids
taken after them), and a disk tier's segment comes back as a disk segment."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.master.conftest import HOST, WRITER, Clock, MiB

from kvpool.client import Store
from kvpool.master.config import MasterConfig
from kvpool.master.oplog import OpLog
from kvpool.master.replication import ReplicationSource
from kvpool.master.service import MasterService
from kvpool.master.standby import StandbyCopy
from kvpool.master.tier_config import TierConfig
from kvpool.protocol import messages as m
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import DFS_DIR, DiskEntry, RegisterDiskReplicas
from kvtest.dfs import DFS, dfs_files
from kvtest.procs import Proc, kvpool_proc, wait_until
from kvtest.replicas import kinds
from kvtest.values import pattern

MEM = ReplicaKind.MEMORY


def value(i: int, size: int = MiB) -> bytes:
    return pattern(i, b"dfs-rest", size)


@pytest.fixture
def procs() -> Iterator[list[Proc | Store]]:
    made: list[Proc | Store] = []
    yield made
    for p in reversed(made):
        if isinstance(p, Store):
            p.close()
        else:
            p.stop()


def _master(made: list[Proc | Store], data: Path, root: Path) -> str:
    proc = kvpool_proc(
        "master",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--client-ttl",
        "2s",
        "--data-dir",
        str(data),
        "--dfs-root",
        str(root),
        name="kvpool master",
    )
    made.append(proc)
    return proc.wait_ready(timeout=60)


def _store(made: list[Proc | Store], address: str) -> Store:
    s = Store(address, rpc_timeout=20.0)
    made.append(s)
    return s


def test_dfs_copies_survive_a_master_restart_on_its_data_dir(
    tmp_path: Path, procs: list[Proc | Store]
) -> None:
    data, root = tmp_path / "data", tmp_path / "dfs"
    address = _master(procs, data, root)
    node = kvpool_proc(
        "node", "--master", address, "--segment-size", "16MiB", "--no-progress", name="node"
    )
    procs.append(node)
    node.wait_ready(timeout=60)
    s = _store(procs, address)
    for i in range(3):
        assert s.put(f"d{i}", value(i), DFS)
    assert len(dfs_files(root)) == 3
    s.close()
    node.kill9()
    procs[0].kill9()  # type: ignore[union-attr]

    address = _master(procs, data, root)  # same data dir, same DFS root; no node at all
    s = _store(procs, address)
    for i in range(3):  # the memory replicas' node is gone: read from the files
        assert s.get(f"d{i}") == value(i)
    assert ReplicaKind.DFS in kinds(s, "d0")
    # New puts take file ids after the restored ones: nothing of theirs is overwritten.
    node = kvpool_proc(
        "node", "--master", address, "--segment-size", "16MiB", "--no-progress", name="node"
    )
    procs.append(node)
    node.wait_ready(timeout=60)
    assert s.put("d3", value(3), DFS)
    assert len(dfs_files(root)) == 4
    for i in range(4):
        assert s.get(f"d{i}") == value(i)
    # The background check knows the restored replicas: with their files gone, the objects
    # that had no other readable replica go; d3 keeps its memory replica.
    for name in dfs_files(root):
        os.unlink(root / DFS_DIR / name)
    wait_until(
        lambda: not any(s.exists(f"d{i}") for i in range(3)) and kinds(s, "d3") == [MEM],
        timeout=20,
        what="the vanished DFS replicas dropped",
    )
    assert s.get("d3") == value(3)


def test_a_disk_segment_is_restored_as_a_disk_segment(tmp_path: Path) -> None:
    """The log records a segment's kind: after a restart the disk tier's segment is a disk
    segment again (not memory a put could be placed on), its replicas disk replicas, and its
    node's remount with the same generation restores both."""
    data = tmp_path / "data"
    clock = Clock()

    def master() -> MasterService:
        return MasterService(
            MasterConfig(data_dir=str(data), seed=7, client_ttl=2.0, client_dead_ttl=10.0),
            clock=clock,
        )

    a = m.ClientId("node-a")
    mem = m.SegmentInfo(m.SegmentName("mem"), 16 * MiB, HOST, "127.0.0.1:1", "", "", 11)
    disk = m.SegmentInfo(
        m.SegmentName("disk"), 64 * MiB, HOST, "127.0.0.1:1", "", "", 12, ReplicaKind.LOCAL_DISK
    )
    svc = master()
    try:
        assert svc.handle(m.MountSegment(a, HOST, mem)) == m.Reply(0)
        assert svc.handle(m.MountSegment(a, HOST, disk)) == m.Reply(0)
        entry = DiskEntry(m.DEFAULT_TENANT, "k", 0, 4096, 77)
        assert svc.handle(RegisterDiskReplicas(a, m.SegmentName("disk"), [entry])).code == 0
    finally:
        assert svc.durable is not None
        svc.durable.log.flush()
        svc.durable.close()

    svc = master()
    try:
        kinds = {s.name: s.kind for s in svc.segments.mounted()}  # silent until remounted
        assert kinds == {"mem": ReplicaKind.MEMORY, "disk": ReplicaKind.LOCAL_DISK}
        assert svc.handle(m.Ping(a)).client_status is m.ClientStatus.NEED_REMOUNT
        assert svc.handle(m.ReMountSegment(a, HOST, [mem, disk])).code == 0
        assert [s.name for s in svc.segments.disks] == ["disk"]
        assert [s.name for s in svc.segments.live] == ["mem"]
        assert svc.handle(m.ReMountSegment(WRITER, HOST, [])).code == 0
        reply = svc.handle(m.GetReplicaList("k"))
        assert reply.code == 0, reply
        assert [ReplicaKind(r.kind) for r in reply.replicas] == [ReplicaKind.LOCAL_DISK]
    finally:
        if svc.durable is not None:
            svc.durable.close()


def test_a_promoted_standby_knows_the_dfs_copies(tmp_path: Path) -> None:
    """HA: the standby's copy (bootstrap snapshot, then the log) carries the DFS replicas, and
    the master built from it (`MasterService.load`, as a promotion does) serves them."""
    clock = Clock()
    root = str(tmp_path / "dfs")

    def config() -> MasterConfig:
        return MasterConfig(seed=3, ha_chunk_bytes=4096, tiers=TierConfig(dfs_root=root))

    async def main() -> None:
        leader = MasterService(config(), clock=clock)
        oplog = OpLog(None, 0, 0.01, clock)
        leader.journal_to(oplog)
        source = ReplicationSource(
            1, leader.config, records=leader.state_records, flush=oplog.flush, clock=clock
        )
        oplog.tap = source.append
        node = m.ClientId("node-a")
        mem = m.SegmentInfo(m.SegmentName("mem"), 16 * MiB, HOST, "127.0.0.1:9", "", "", 5)
        assert leader.handle(m.MountSegment(node, HOST, mem)) == m.Reply(0)
        assert leader.handle(m.ReMountSegment(WRITER, HOST, [])) == m.Reply(0)
        cfg = m.ReplicateConfigMsg(dfs_replica_num=1)

        def put(key: str) -> None:
            reply = leader.handle(m.PutStart(WRITER, key, 5000, cfg))
            assert [ReplicaKind(r.kind) for r in reply.replicas] == [MEM, ReplicaKind.DFS]
            assert leader.handle(m.PutEnd(WRITER, key, 7)) == m.Reply(0)

        put("before")  # in the bootstrap snapshot
        oplog.flush()
        copy = StandbyCopy(None)
        copy.begin()
        offset = 0
        while True:
            reply = source.fetch_snapshot(m.FetchSnapshot("s", 1, offset))
            copy.add_snapshot(reply.data)
            offset += len(reply.data)
            if reply.done:
                break
        copy.end_snapshot(1, reply.start)
        put("after")  # in the log
        oplog.flush()
        log = source.follow(m.FollowLog("s", 1, copy.position, 0))
        assert isinstance(log, m.LogReply)
        copy.add_log(log.position, log.data)
        copy.close()

        promoted = MasterService(config(), clock=clock)
        promoted.load(copy.state)
        for key in ("before", "after"):  # the node is silent: the DFS copy is what is readable
            got = promoted.handle(m.GetReplicaList(key))
            assert got.code == 0, got
            assert [ReplicaKind(r.kind) for r in got.replicas] == [ReplicaKind.DFS]
        # A new DFS put takes a file id after the restored ones.
        ids = {
            r.offset
            for o in promoted.index.snapshot()
            for r in o.replicas
            if r.kind is ReplicaKind.DFS
        }
        promoted.handle(m.ReMountSegment(WRITER, HOST, []))
        assert promoted.handle(m.Ping(node)).client_status is m.ClientStatus.NEED_REMOUNT
        assert promoted.handle(m.ReMountSegment(node, HOST, [mem])).code == 0
        reply = promoted.handle(m.PutStart(WRITER, "new", 5000, cfg))
        assert reply.code == 0, reply
        assert reply.replicas[-1].replica_id & ((1 << 44) - 1) > max(ids)  # the offset: its id

    asyncio.run(main())
