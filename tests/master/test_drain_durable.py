"""A graceful drain is durable metadata (`oplog.DrainRec`): a master restarted on the data
directory resumes it, to the same end of its grace, with the segment out of placement; a drain
that ended with its unmount is not resumed; a snapshot carries the drains under way."""

from __future__ import annotations

from pathlib import Path

from tests.master.conftest import WRITER, Clock
from tests.master.test_durable import SA, SB, close, first_master, flush, master, remount

from kvpool.master.oplog import DrainRec
from kvpool.protocol import messages as m
from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus

PINNED = m.ReplicateConfigMsg(with_hard_pin=True, preferred_segments=[SA])


def test_a_restarted_master_resumes_a_drain_to_the_same_end(tmp_path: Path, clock: Clock) -> None:
    svc = first_master(clock, tmp_path)
    for i in range(3):
        assert svc.handle(m.PutStart(WRITER, f"pinned-{i}", 4096, PINNED)).code == 0
        assert svc.handle(m.PutEnd(WRITER, f"pinned-{i}", i)) == m.Reply(0)
        flush(svc)
    started = svc.handle(DrainSegment(SA, grace_ms=60_000))
    assert isinstance(started, DrainReply) and started.code == 0
    flush(svc)
    close(svc)  # (a kill -9 leaves the same files)

    again = master(clock, tmp_path)
    st = again.handle(DrainStatus(SA))
    assert isinstance(st, DrainReply) and st.code == 0, st
    # The end is kept in wall-clock time (the hand clock does not move it; the HA test in
    # tests/ops/test_drain_failover.py checks the elapsed time across a real failover).
    assert st.grace_s == 60.0 and 0.0 <= st.elapsed_s < 30.0, st
    assert st.state not in ("done", "aborted")
    remount(again)
    # Out of placement: a put the master places goes to seg-b.
    reply = again.handle(m.PutStart(WRITER, "after", 4096))
    assert reply.code == 0 and [d.segment for d in reply.replicas] == [SB], reply
    segs = {s.name: s for s in again.segments.mounted()}
    assert segs[SA].draining and not segs[SB].draining
    close(again)


def test_a_drain_that_unmounted_its_segment_is_not_resumed(tmp_path: Path, clock: Clock) -> None:
    svc = first_master(clock, tmp_path)
    assert svc.handle(DrainSegment(SB, grace_ms=0)).code == 0  # nothing on it: ends at once
    for _ in range(5):
        svc.drains.tick()
    assert svc.handle(DrainStatus(SB)).state == "done"  # type: ignore[attr-defined]
    flush(svc)
    close(svc)
    again = master(clock, tmp_path)
    assert again.handle(DrainStatus(SB)).code != 0  # type: ignore[attr-defined]
    assert SB not in {s.name for s in again.segments.mounted()}
    assert not again.drains.active
    close(again)


def test_a_snapshot_carries_the_drains_under_way(tmp_path: Path, clock: Clock) -> None:
    svc = first_master(clock, tmp_path)
    assert svc.handle(DrainSegment(SA, grace_ms=30_000)).code == 0
    flush(svc)
    drains = [r for r in svc.state_records() if isinstance(r, DrainRec)]
    assert [(r.name, r.grace) for r in drains] == [(SA, 30.0)]
    close(svc)
