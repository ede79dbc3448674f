"""DFS file ids after a restart (`kvpool.master.dfs.DfsTier.allocate`): a put that was in flight
when the master died leaves its id parked in the restarted master; the next DFS puts take ids
around it (never none: a put asking for a DFS copy must get one while the space has room)."""

from __future__ import annotations

from pathlib import Path

from tests.master.conftest import HOST, WRITER, Clock, MiB

from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.master.tier_config import TierConfig
from kvpool.protocol import messages as m
from kvpool.protocol.messages import ReplicaKind

MEM, DFS = ReplicaKind.MEMORY, ReplicaKind.DFS
OFFSET = (1 << 44) - 1


def test_dfs_puts_after_a_restart_take_ids_around_a_parked_in_flight_put(tmp_path: Path) -> None:
    data, root = tmp_path / "data", str(tmp_path / "dfs")
    clock = Clock()

    def master() -> MasterService:
        return MasterService(
            MasterConfig(
                data_dir=str(data),
                seed=7,
                client_ttl=2.0,
                client_dead_ttl=10.0,
                tiers=TierConfig(dfs_root=root),
            ),
            clock=clock,
        )

    node = m.ClientId("node-a")
    mem = m.SegmentInfo(m.SegmentName("mem"), 16 * MiB, HOST, "127.0.0.1:1", "", "", 11)
    cfg = m.ReplicateConfigMsg(dfs_replica_num=1)
    svc = master()
    try:
        assert svc.handle(m.MountSegment(node, HOST, mem)) == m.Reply(0)
        assert svc.handle(m.ReMountSegment(WRITER, HOST, [])) == m.Reply(0)
        done = svc.handle(m.PutStart(WRITER, "done", 5000, cfg))
        assert [ReplicaKind(r.kind) for r in done.replicas] == [MEM, DFS]
        assert svc.handle(m.PutEnd(WRITER, "done", 7)) == m.Reply(0)
        flying = svc.handle(m.PutStart(WRITER, "flying", 5000, cfg))  # never ended
        assert [ReplicaKind(r.kind) for r in flying.replicas] == [MEM, DFS]
    finally:
        assert svc.durable is not None
        svc.durable.log.flush()
        svc.durable.close()

    svc = master()
    try:
        assert svc.handle(m.ReMountSegment(WRITER, HOST, [])).code == 0
        assert svc.handle(m.ReMountSegment(node, HOST, [mem])).code == 0
        ids = set()
        for i in range(4):
            reply = svc.handle(m.PutStart(WRITER, f"new{i}", 5000, cfg))
            assert reply.code == 0, reply
            assert [ReplicaKind(r.kind) for r in reply.replicas] == [MEM, DFS], i
            ids.add(reply.replicas[-1].replica_id & OFFSET)
            assert svc.handle(m.PutEnd(WRITER, f"new{i}", 7)) == m.Reply(0)
        taken = {r.replica_id & OFFSET for r in (done.replicas[-1], flying.replicas[-1])}
        assert len(ids) == 4 and not ids & taken
    finally:
        if svc.durable is not None:
            svc.durable.close()
