"""The leader's replication stream (`ReplicationSource`) and the standby's copy, in-process:
acks and group commit, a silent or lagging standby, the end of a term, and the claim the
bootstrap rests on: a fuzzy snapshot walked while the metadata changes, followed by the log
from the position it started at, gives the state the whole log gives (every record type)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from tests.master.conftest import HOST, NODE, WRITER, Clock, MiB

from kvpool.errors import ErrorCode, NotLeader
from kvpool.master.config import MasterConfig
from kvpool.master.durable import Replay
from kvpool.master.oplog import OpLog, frames
from kvpool.master.replication import ReplicationSource
from kvpool.master.service import MasterService
from kvpool.master.standby import StandbyCopy
from kvpool.protocol import messages as m

CHUNK = 4096


def journaled(clock: Clock, **cfg: Any) -> tuple[MasterService, OpLog, bytearray]:
    """A service logging into a file-less OpLog; every flush also kept in the bytearray."""
    cfg.setdefault("seed", 3)
    svc = MasterService(MasterConfig(**cfg), clock=clock)
    oplog = OpLog(None, 0, 0.01, clock)
    svc.journal_to(oplog)
    return svc, oplog, bytearray()


def tap(oplog: OpLog, whole: bytearray, source: ReplicationSource) -> None:
    def both(data: bytes) -> None:
        whole.extend(data)
        source.append(data)

    oplog.tap = both


def mount(svc: MasterService, name: str, gen: int, client: m.ClientId = NODE) -> None:
    info = m.SegmentInfo(m.SegmentName(name), 16 * MiB, HOST, "127.0.0.1:9", "", client, gen)
    assert svc.handle(m.MountSegment(client, HOST, info)).code == 0  # type: ignore[attr-defined]


def put(svc: MasterService, key: str, *, end: bool = True) -> None:
    reply = svc.handle(m.PutStart(WRITER, key, 5000))
    assert reply.code == 0, reply  # type: ignore[attr-defined]
    if end:
        assert svc.handle(m.PutEnd(WRITER, key, hash(key) & 0xFFFF)).code == 0  # type: ignore[attr-defined]


def normal(state: Replay) -> dict[str, Any]:
    """The state with mount numbers replaced by (name, generation), parks as a set."""
    by_no = {no: (rec.name, rec.generation) for no, rec in state.mounts.values()}

    def where(ranges: list[tuple[int, int]]) -> list[tuple[Any, int]]:
        return sorted((by_no.get(no, ("gone", no)), off) for no, off in ranges)

    return {
        "mounts": sorted((r.name, r.generation, r.client_id) for _, r in state.mounts.values()),
        "objects": {k: (o, where(r)) for k, (o, r) in state.objects.items()},
        "flights": {k: (f[1], where(f[2])) for k, f in state.flights.items()},
        # A park on a segment unmounted since is void (`durable.build` skips it).
        "parks": {
            (p[1], tuple(w))
            for p in state.parks
            if (w := [x for x in where(p[2]) if x[0][0] != "gone"])
        },
    }


def replay(data: bytes, state: Replay | None = None) -> Replay:
    state = state if state is not None else Replay()
    for rec in frames(data):
        state.apply(rec)
    return state


def test_a_fuzzy_snapshot_then_the_log_from_its_start_converges_for_every_record_type(
    clock: Clock,
) -> None:
    async def main() -> None:
        svc, oplog, whole = journaled(clock, ha_chunk_bytes=CHUNK)
        source = ReplicationSource(
            1, svc.config, records=svc.state_records, flush=oplog.flush, clock=clock
        )
        tap(oplog, whole, source)
        mount(svc, "a", 1)
        mount(svc, "b", 2)
        for i in range(600):
            put(svc, f"k{i}")
        put(svc, "flying", end=False)
        arena = svc.handle(m.ReserveArena(WRITER, 1 * MiB, 1 * MiB))
        assert arena.code == 0  # type: ignore[attr-defined]
        oplog.flush()
        first = source.fetch_snapshot(m.FetchSnapshot("s1", 1, 0))
        start = first.start
        snap = bytearray(first.data)
        step = 0
        reply = first
        while not reply.done:
            # Every kind of change while the walk goes on: new, overwritten, removed objects,
            # a finished and a new in-flight put, a park, an unmount and a remount.
            step += 1
            put(svc, f"new{step}")
            svc.handle(m.Remove(f"k{step * 7}", force=True))
            if step == 1:
                assert svc.handle(m.PutEnd(WRITER, "flying", 99)).code == 0  # type: ignore[attr-defined]
                put(svc, "flying2", end=False)
                svc.handle(m.UpsertStart(WRITER, "k100", 5000))
            if step == 2:
                seg = svc.segments.get(m.SegmentName("b"))
                assert seg is not None
                svc.handle(m.UnmountSegment(NODE, m.SegmentName("b")))
                for _ in svc.sweep_dead():
                    pass
                mount(svc, "b", 3)
                mount(svc, "c", 4)
            oplog.flush()
            reply = source.fetch_snapshot(m.FetchSnapshot("s1", 1, len(snap)))
            snap += reply.data
        assert step >= 3, "the snapshot should take several chunks"
        put(svc, "last")
        oplog.flush()
        tail = bytearray()
        while start + len(tail) < source.end:  # the log from the snapshot's start, in chunks
            log = source.follow(m.FollowLog("s1", 1, start + len(tail), 0))
            assert isinstance(log, m.LogReply) and not log.snapshot_needed and log.data
            tail += log.data
        assert start + len(tail) == source.end
        fuzzy = replay(bytes(tail), replay(bytes(snap)))
        exact = replay(bytes(whole))
        assert normal(fuzzy) == normal(exact)
        assert ("default", "flying") in exact.objects
        assert ("default", "flying2") in exact.flights

    asyncio.run(main())


def test_writes_wait_for_every_standby_in_sync_and_stop_waiting_for_a_silent_one(
    clock: Clock,
) -> None:
    async def main() -> None:
        svc, oplog, whole = journaled(clock, ha_standby_timeout=2.0)
        source = ReplicationSource(
            5, svc.config, records=svc.state_records, flush=oplog.flush, clock=clock
        )
        tap(oplog, whole, source)
        mount(svc, "a", 1)
        oplog.flush()
        assert source.wait(source.end) is None  # no standby: the leader acknowledges alone
        for name in ("s1", "s2"):
            source.fetch_snapshot(m.FetchSnapshot(name, 5, 0))
            assert isinstance(source.follow(m.FollowLog(name, 5, source.end, 0)), m.LogReply)
        assert source.in_sync() == ["s1", "s2"]
        put(svc, "x")
        oplog.flush()
        end = source.end
        first = source.wait(end)
        put(svc, "y")
        oplog.flush()
        second = source.wait(source.end)
        assert first is not None and second is not None
        source.follow(m.FollowLog("s1", 5, source.end, 0))
        assert not first.done()  # s2 has not acknowledged yet
        source.follow(m.FollowLog("s2", 5, end, 0))
        await asyncio.sleep(0)
        assert first.done() and not second.done()
        clock.advance(2.5)
        source.follow(m.FollowLog("s1", 5, source.end, 0))
        source.tick()  # s2 silent for 2.5 s: dropped from the set in sync...
        await asyncio.sleep(0)
        assert source.in_sync() == ["s1"] and source.held() == ["s2"]
        # ...but etcd still names it as in sync (it may lead next): writes go on waiting for
        # it until the master has recorded the set without it.
        assert not second.done()
        source.published(frozenset({"s1"}))
        await asyncio.sleep(0)
        assert second.done() and source.held() == []

    asyncio.run(main())


def test_a_standby_too_far_behind_is_dropped_and_bootstraps_again(clock: Clock) -> None:
    async def main() -> None:
        svc, oplog, whole = journaled(clock, ha_buffer_bytes=8192)
        source = ReplicationSource(
            2, svc.config, records=svc.state_records, flush=oplog.flush, clock=clock
        )
        tap(oplog, whole, source)
        mount(svc, "a", 1)
        source.fetch_snapshot(m.FetchSnapshot("slow", 2, 0))
        source.follow(m.FollowLog("slow", 2, source.end, 0))
        behind = source.end
        for i in range(200):
            put(svc, f"k{i}")
            oplog.flush()
        assert source.in_sync() == []
        reply = source.follow(m.FollowLog("slow", 2, behind, 0))
        assert isinstance(reply, m.LogReply) and reply.snapshot_needed
        other = source.follow(m.FollowLog("slow", 1, source.end, 0))  # another term
        assert isinstance(other, m.LogReply) and other.snapshot_needed

    asyncio.run(main())


def test_the_end_of_a_term_answers_waiting_writes_leader_changed(clock: Clock) -> None:
    async def main() -> None:
        svc, oplog, whole = journaled(clock)
        source = ReplicationSource(
            3, svc.config, records=svc.state_records, flush=oplog.flush, clock=clock
        )
        tap(oplog, whole, source)
        mount(svc, "a", 1)
        source.fetch_snapshot(m.FetchSnapshot("s", 3, 0))
        source.follow(m.FollowLog("s", 3, source.end, 0))
        put(svc, "x")
        oplog.flush()
        waiting = source.wait(source.end)
        assert waiting is not None
        poll = source.follow(m.FollowLog("s", 3, source.end, 500))  # acks "x"
        assert not isinstance(poll, m.LogReply)
        polling = asyncio.ensure_future(poll)
        await asyncio.sleep(0)
        assert waiting.done()
        put(svc, "y")
        oplog.flush()
        waiting = source.wait(source.end)
        assert waiting is not None
        source.close("lost the lead of term 3")
        with pytest.raises(NotLeader) as err:
            await waiting
        assert err.value.code is ErrorCode.LEADER_CHANGED
        with pytest.raises(NotLeader):  # woken by "y", but the term ended first
            await polling
        with pytest.raises(NotLeader):
            await source.follow(m.FollowLog("s", 3, source.end, 500))  # type: ignore[misc]
        with pytest.raises(NotLeader):
            source.wait(source.end)

    asyncio.run(main())


def test_a_standby_copy_with_a_data_dir_is_what_a_restart_loads(
    clock: Clock, tmp_path: Any
) -> None:
    async def main() -> None:
        svc, oplog, whole = journaled(clock, ha_chunk_bytes=CHUNK)
        source = ReplicationSource(
            1, svc.config, records=svc.state_records, flush=oplog.flush, clock=clock
        )
        tap(oplog, whole, source)
        mount(svc, "a", 1)
        for i in range(100):
            put(svc, f"k{i}")
        oplog.flush()
        copy = StandbyCopy(str(tmp_path / "standby"))
        copy.begin()
        offset = 0
        while True:
            reply = source.fetch_snapshot(m.FetchSnapshot("s", 1, offset))
            copy.add_snapshot(reply.data)
            offset += len(reply.data)
            if reply.done:
                break
        copy.end_snapshot(1, reply.start)
        for i in range(100, 150):
            put(svc, f"k{i}")
        svc.handle(m.Remove("k3", force=True))
        oplog.flush()
        log = source.follow(m.FollowLog("s", 1, copy.position, 0))
        assert isinstance(log, m.LogReply)
        copy.write_log(log.data)
        copy.add_log(log.position, log.data)
        copy.close()
        restarted = MasterService(
            MasterConfig(data_dir=str(tmp_path / "standby"), seed=3), clock=clock
        )
        keys = {o.key for o in restarted.index.snapshot()}
        assert keys == {f"k{i}" for i in range(150)} - {"k3"}
        assert keys == set(k for _, k in copy.state.objects)
        assert restarted.durable is not None
        restarted.durable.close()

    asyncio.run(main())


def test_a_standby_keeps_following_after_a_record_it_cannot_apply() -> None:
    """A record of an unknown kind (a leader one version ahead) must not end the standby's
    follower for good: it logs, drops its copy and starts over from a snapshot."""
    import struct
    import zlib

    import msgspec

    from kvpool.master.standby import Follower, StandbyCopy

    body = msgspec.msgpack.encode([[99, "a record of a later version"]])
    frame = struct.pack("<II", len(body), zlib.crc32(body)) + body
    asked: list[str] = []

    class Leader:
        async def call_as(self, req: object, typ: object, timeout: float | None = None) -> object:
            asked.append(type(req).__name__)
            if isinstance(req, m.FetchSnapshot):
                return m.SnapshotReply(0, 1, 0, 0, b"", True)
            assert isinstance(req, m.FollowLog)
            await asyncio.sleep(0.01)
            return m.LogReply(0, 1, req.position, frame if req.position == 0 else b"")

        async def close(self) -> None:
            pass

    async def main() -> None:
        copy = StandbyCopy(None)
        follower = Follower("m2", "c", copy, lambda: ("127.0.0.1:1", 1))

        async def connect(address: str) -> Leader:
            return Leader()

        follower._connect = connect  # type: ignore[method-assign,assignment]
        task = asyncio.create_task(follower.run())
        try:
            for _ in range(300):
                if asked.count("FetchSnapshot") >= 2:
                    break
                await asyncio.sleep(0.01)
            assert not task.done()
            assert asked.count("FetchSnapshot") >= 2  # bootstrapped again after the failure
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())


def test_a_standby_far_behind_catches_up_before_writes_wait_for_it(clock: Clock) -> None:
    async def main() -> None:
        svc, oplog, whole = journaled(clock, ha_chunk_bytes=CHUNK)
        source = ReplicationSource(
            3, svc.config, records=svc.state_records, flush=oplog.flush, clock=clock
        )
        tap(oplog, whole, source)
        mount(svc, "a", 1)
        oplog.flush()
        source.fetch_snapshot(m.FetchSnapshot("s1", 3, 0))
        start = source.end
        for i in range(400):  # the log grows far past one reply while s1 is away
            put(svc, f"k{i}")
        oplog.flush()
        assert source.end - start > 2 * CHUNK
        reply = source.follow(m.FollowLog("s1", 3, start, 0))
        assert isinstance(reply, m.LogReply) and reply.data
        assert source.in_sync() == []  # still catching up: writes do not wait for it
        assert source.wait(source.end) is None
        pos = start
        while pos < source.end:
            reply = source.follow(m.FollowLog("s1", 3, pos, 0))
            assert isinstance(reply, m.LogReply)
            pos += len(reply.data)
            if not reply.data:
                break
        source.follow(m.FollowLog("s1", 3, pos, 0))  # the next poll acknowledges the end
        assert source.in_sync() == ["s1"]
        put(svc, "after")
        oplog.flush()
        assert source.wait(source.end) is not None  # now every write waits for it

    asyncio.run(main())
