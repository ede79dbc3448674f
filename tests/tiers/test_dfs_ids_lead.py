"""DFS file ids of a master that begins to lead (`kvpool.master.dfs.DfsTier._lead`): a standby's
tier was made long before its promotion, so it looks at the directory again when it first leads
and hands out no id named by a file the old leader's writers made meanwhile (a stale writer's
clean-up would remove a new object's file: tests/review/test_r3_dfs_ids_after_restart.py)."""

from __future__ import annotations

from pathlib import Path

from tests.master.conftest import HOST, WRITER, MiB

from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.master.tier_config import TierConfig
from kvpool.protocol import messages as m
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import dfs_file

OFFSET = (1 << 44) - 1


def test_a_master_that_begins_to_lead_takes_ids_past_the_files_written_meanwhile(
    tmp_path: Path,
) -> None:
    root = tmp_path / "dfs"
    svc = MasterService(MasterConfig(seed=7, tiers=TierConfig(dfs_root=str(root))))
    dfs = svc.tiers.dfs
    assert dfs is not None
    leads = [False]
    dfs.leading = lambda: leads[0]  # a standby, as `MasterServer._install` sets it
    dfs.tick(0.0)  # not leading: nothing looked at yet
    # The old leader's writers: a complete file and one being written, after this tier began.
    written, writing = 5 << 20, 9 << 20
    Path(dfs_file(str(root), written)).write_bytes(b"x")
    Path(dfs_file(str(root), writing) + ".tmp").write_bytes(b"y")
    leads[0] = True  # promoted
    node = m.ClientId("node-a")
    mem = m.SegmentInfo(m.SegmentName("mem"), 16 * MiB, HOST, "127.0.0.1:1", "", "", 11)
    assert svc.handle(m.MountSegment(node, HOST, mem)) == m.Reply(0)
    assert svc.handle(m.ReMountSegment(WRITER, HOST, [])) == m.Reply(0)
    cfg = m.ReplicateConfigMsg(dfs_replica_num=1)
    for i in range(3):
        reply = svc.handle(m.PutStart(WRITER, f"k{i}", 5000, cfg))
        assert reply.code == 0, reply
        (file,) = [r for r in reply.replicas if ReplicaKind(r.kind) is ReplicaKind.DFS]
        assert file.replica_id & OFFSET > writing, i
        assert svc.handle(m.PutEnd(WRITER, f"k{i}", 7)) == m.Reply(0)
