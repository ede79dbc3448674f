"""Durable metadata on one machine (`--data-dir`), on the service with a hand clock: a master
built on the directory another one wrote gets the objects back, silent until their nodes
remount the same memory; a torn last record is cut off, a corrupt middle refused; a snapshot
plus the log after it gives the state the log alone gives; ranges a writer may still be
writing are never handed out by the restarted master."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from tests.master.conftest import HOST, WRITER, Clock, MiB

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.oplog import OpLogCorrupt, list_files
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

E = ErrorCode
A = m.ClientId("node-a")
B = m.ClientId("node-b")
SA, SB = m.SegmentName("seg-a"), m.SegmentName("seg-b")
GEN = 0x5EED_0000_0000_0001


def info(name: str, gen: int) -> m.SegmentInfo:
    return m.SegmentInfo(m.SegmentName(name), 16 * MiB, HOST, f"127.0.0.1:{len(name)}", "", "", gen)


def master(clock: Clock, data_dir: Path, **cfg: Any) -> MasterService:
    cfg.setdefault("seed", 7)
    cfg.setdefault("client_ttl", 2.0)
    cfg.setdefault("client_dead_ttl", 10.0)
    return MasterService(MasterConfig(data_dir=str(data_dir), **cfg), clock=clock)


def first_master(clock: Clock, data_dir: Path) -> MasterService:
    svc = master(clock, data_dir)
    assert svc.handle(m.MountSegment(A, HOST, info("seg-a", GEN))) == m.Reply(0)
    assert svc.handle(m.MountSegment(B, HOST, info("seg-b", GEN + 1))) == m.Reply(0)
    assert svc.handle(m.ReMountSegment(WRITER, HOST, [])) == m.Reply(0)
    return svc


def put(svc: MasterService, key: str, *segments: m.SegmentName, size: int = 4096) -> None:
    """PutStart + PutEnd, each request's records written before its reply, as the server
    does (one log frame per request)."""
    cfg = m.ReplicateConfigMsg(replica_num=len(segments), preferred_segments=list(segments))
    reply = svc.handle(m.PutStart(WRITER, key, size, cfg))
    flush(svc)
    assert reply.code == 0 and [d.segment for d in reply.replicas] == list(segments), reply
    assert svc.handle(m.PutEnd(WRITER, key, hash(key) & 0xFFFF)) == m.Reply(0)
    flush(svc)


def flush(svc: MasterService) -> None:
    if svc.durable is not None:
        svc.durable.log.flush()


def remount(svc: MasterService) -> None:
    for client, name, gen in ((A, "seg-a", GEN), (B, "seg-b", GEN + 1)):
        assert svc.handle(m.Ping(client)).client_status is m.ClientStatus.NEED_REMOUNT
        reply = svc.handle(m.ReMountSegment(client, HOST, [info(name, gen)]))
        assert reply.code == 0, reply
    svc.handle(m.ReMountSegment(WRITER, HOST, []))


def state(svc: MasterService) -> Any:
    """What must survive: objects (size, checksum, replicas), segments, allocations, parks."""
    objs = sorted(
        (o.tenant, o.key, o.size, o.checksum, o.replica_num, o.group_id, o.hard_pin, _where(o))
        for o in svc.index.snapshot()
        if o.complete
    )
    segs = sorted(
        (s.name, s.generation, s.client_id, s.allocator.allocated, s.objects)
        for s in svc.segments.mounted()
    )
    parked = sorted((r.segment.name, r.offset, size) for r, size in svc.parked())
    return objs, segs, parked


def _where(o: Any) -> list[tuple[str, int]]:
    return sorted((r.segment.name, r.offset) for r in o.replicas)


def close(svc: MasterService) -> None:
    assert svc.durable is not None
    svc.durable.close()


def test_a_restarted_master_knows_every_object_once_its_nodes_remount(
    tmp_path: Path, clock: Clock
) -> None:
    svc = first_master(clock, tmp_path)
    put(svc, "one", SA)
    put(svc, "two", SA, SB)
    put(svc, "gone", SB)
    assert svc.handle(m.Remove("gone")) == m.Reply(0)
    before = state(svc)
    close(svc)  # (a kill -9 leaves the same files: every record was written before replying)

    again = master(clock, tmp_path)
    # Known, but silent: not offered to readers, no new replicas there.
    assert again.handle(m.GetReplicaList("one")).code == E.REPLICA_IS_NOT_READY
    stats = again.handle(m.Stats())
    assert stats.segments == [] and {s.name for s in stats.silent_segments} == {SA, SB}
    remount(again)
    assert state(again) == before
    reply = again.handle(m.GetReplicaList("two"))
    assert reply.code == 0 and {d.segment for d in reply.replicas} == {SA, SB}
    assert again.handle(m.GetReplicaList("gone")).code == E.OBJECT_NOT_FOUND
    put(again, "new", SA)  # placement works around the restored ranges
    assert again.handle(m.GetReplicaList("new")).code == 0
    close(again)


def test_a_segment_remounted_with_new_memory_loses_its_objects(
    tmp_path: Path, clock: Clock
) -> None:
    svc = first_master(clock, tmp_path)
    put(svc, "k", SA)
    close(svc)
    again = master(clock, tmp_path)
    assert again.handle(m.ReMountSegment(A, HOST, [info("seg-a", GEN + 99)])).code == 0
    assert again.handle(m.GetReplicaList("k")).code == E.OBJECT_NOT_FOUND
    close(again)


def test_segments_that_never_come_back_are_dropped_after_client_dead_ttl(
    tmp_path: Path, clock: Clock
) -> None:
    svc = first_master(clock, tmp_path)
    put(svc, "k", SA)
    close(svc)
    again = master(clock, tmp_path)
    clock.advance(11.0)
    again.expire_clients()
    assert again.segments.get(SA) is None
    assert again.handle(m.GetReplicaList("k")).code == E.OBJECT_NOT_FOUND
    close(again)


def _log(data_dir: Path) -> Path:
    return list_files(data_dir, "log")[-1][1]


def test_a_torn_last_record_is_cut_off(tmp_path: Path, clock: Clock) -> None:
    svc = first_master(clock, tmp_path)
    put(svc, "a", SA)
    put(svc, "b", SB)
    close(svc)
    path = _log(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # killed in the middle of b's PutEnd record
    again = master(clock, tmp_path)
    remount(again)
    assert again.handle(m.GetReplicaList("a")).code == 0
    assert again.handle(m.GetReplicaList("b")).code == E.OBJECT_NOT_FOUND
    close(again)


def test_a_corrupt_record_in_the_middle_is_refused(tmp_path: Path, clock: Clock) -> None:
    svc = first_master(clock, tmp_path)
    for i in range(5):
        put(svc, f"k{i}", SA)
    close(svc)
    path = _log(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(OpLogCorrupt, match="corrupt record"):
        master(clock, tmp_path)


def test_a_snapshot_plus_the_log_after_it_gives_what_the_log_alone_gives(
    tmp_path: Path, clock: Clock
) -> None:
    d = tmp_path / "d"
    svc = first_master(clock, d)
    for i in range(20):
        put(svc, f"k{i}", SA if i % 2 else SB)
    put(svc, "both", SA, SB)
    assert svc.handle(m.PutStart(WRITER, "open", 4096)).code == 0  # in flight at the snapshot
    assert svc.durable is not None
    svc.durable.log.flush()  # what the server does before each reply
    alone = tmp_path / "alone"
    shutil.copytree(d, alone)  # the empty startup snapshot and every record so far
    assert svc.durable.snapshot()
    deadline = time.monotonic() + 10
    while not svc.durable.poll():
        assert time.monotonic() < deadline, "the snapshot child did not finish"
        time.sleep(0.01)
    for i in range(0, 20, 3):
        assert svc.handle(m.Remove(f"k{i}")) == m.Reply(0)
    put(svc, "late", SB)
    close(svc)
    assert [s for s, _ in list_files(d, "snapshot")] == [2]  # the older one is gone
    for seq, path in list_files(d, "log"):
        if seq >= 2:
            shutil.copy(path, alone / path.name)
    from_snapshot = master(clock, d)
    from_log = master(clock, alone)
    assert state(from_snapshot) == state(from_log)
    assert len(from_log.index) == 21 - 7 + 1
    close(from_snapshot)
    close(from_log)


def _ranges(svc: MasterService, key: str) -> list[tuple[str, int]]:
    return [(r.segment.name, r.offset) for r in svc.index.get("default", key).replicas]  # type: ignore[union-attr]


def test_ranges_a_writer_may_still_write_are_not_handed_out_after_a_restart(
    tmp_path: Path, clock: Clock
) -> None:
    svc = first_master(
        clock,
        tmp_path,
    )
    cfg = m.ReplicateConfigMsg(replica_num=1, preferred_segments=[SA])
    reply = svc.handle(m.PutStart(WRITER, "open", 1 * MiB, cfg))
    assert reply.code == 0
    writing = (reply.replicas[0].segment, reply.replicas[0].offset, 1 * MiB)
    arena = svc.handle(m.ReserveArena(WRITER, 2 * MiB, 2 * MiB))
    assert arena.code == 0
    lent = (arena.segment, arena.offset, arena.size)
    close(svc)

    again = master(clock, tmp_path)
    remount(again)
    # The pool fills up: no new object may overlap the range being written or the arena.
    placed: list[tuple[str, int, int]] = []
    for i in range(64):
        r = again.handle(m.PutStart(WRITER, f"fill{i}", 1 * MiB, cfg))
        if r.code != 0:
            break
        placed.append((r.replicas[0].segment, r.replicas[0].offset, 1 * MiB))
    assert placed, "nothing could be placed at all"
    for seg, off, size in placed:
        for busy_seg, busy_off, busy_size in (writing, lent):
            assert seg != busy_seg or off + size <= busy_off or busy_off + busy_size <= off
    # After put_start_release_timeout the parked ranges are free again.
    clock.advance(MasterConfig().put_start_release_timeout + 1)
    assert again.release_stale() >= 1
    close(again)
