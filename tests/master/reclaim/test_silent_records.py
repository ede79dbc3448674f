"""A silent node's objects keep their reclaim records: while its owner is silent they are neither
evicted nor moved, and once it comes back with its objects they are reclaimable as before (a
pass that met them while silent must not forget them, or every pause would leave objects no
eviction can ever reach)."""

from __future__ import annotations

from tests.master.conftest import HOST, Clock, MiB

from kvpool.master.config import MasterConfig
from kvpool.master.reclaim.adapter import MasterReclaimHooks
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

A, B, W = m.ClientId("node-a"), m.ClientId("node-b"), m.ClientId("writer")


def info(name: str, generation: int) -> m.SegmentInfo:
    return m.SegmentInfo(
        m.SegmentName(name), 16 * MiB, HOST, f"127.0.0.1:{len(name)}", "", "", generation
    )


def put(svc: MasterService, key: str, seg: str, size: int = 3 * MiB) -> int:
    cfg = m.ReplicateConfigMsg(preferred_segments=[m.SegmentName(seg)])
    rep = svc.handle(m.PutStart(W, key, size, cfg))
    assert isinstance(rep, m.PutStartReply)
    if rep.code:
        return rep.code
    end = svc.handle(m.PutEnd(W, key, 7))
    assert isinstance(end, m.Reply)
    return end.code


def test_a_silent_nodes_objects_keep_their_records_and_are_evictable_after_it_returns() -> None:
    clock = Clock()
    hooks = MasterReclaimHooks()
    svc = MasterService(
        MasterConfig(seed=7, client_ttl=2.0, client_dead_ttl=10.0), clock=clock, hooks=hooks
    )
    assert svc.handle(m.MountSegment(A, HOST, info("seg-a", 11))) == m.Reply(0)
    assert svc.handle(m.MountSegment(B, HOST, info("seg-b", 22))) == m.Reply(0)
    svc.handle(m.ReMountSegment(W, HOST, []))
    for i in range(5):
        assert put(svc, f"a{i}", "seg-a") == 0
    clock.advance(3)  # node-a falls silent; node-b and the writer ping
    svc.handle(m.Ping(B))
    svc.handle(m.Ping(W))
    svc.expire_clients()
    # Filling seg-b runs direct reclaim over the lists, which hold seg-a's records too.
    for i in range(8):
        put(svc, f"b{i}", "seg-b")
        clock.advance(0.1)
        svc.handle(m.Ping(B))
        svc.handle(m.Ping(W))
    for i in range(5):
        obj = svc.index.get(m.DEFAULT_TENANT, f"a{i}")
        assert obj is not None, f"a{i} was evicted while its node was silent"
    rep = svc.handle(m.ReMountSegment(A, HOST, [info("seg-a", 11)]))
    assert isinstance(rep, m.RemountReply) and rep.restored == ["seg-a"]
    for i in range(5):
        obj = svc.index.get(m.DEFAULT_TENANT, f"a{i}")
        assert obj is not None and obj.reclaim is not None, f"a{i} lost its reclaim record"
    # Back and idle: a put that needs room on seg-a evicts them as it would any object.
    clock.advance(20)
    for c in (A, B, W):
        svc.handle(m.Ping(c))
    assert put(svc, "new-a", "seg-a", 9 * MiB) == 0
