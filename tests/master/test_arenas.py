"""Arenas (one-round-trip puts): ReserveArena, PutCommit, BatchPutCommit, ReleaseArenas.

The rules checked here: a commit creates a readable object at exactly the committed range;
ranges outside the client's arena, overlapping an earlier commit, misaligned, or of another
client's arena are refused and create nothing (nor let go of a stale or dead holder of the
key); an existing key answers OBJECT_ALREADY_EXISTS;
releasing an arena frees exactly what was never committed, and removing the objects then
gives the segment back whole; an expired client's arena stays parked until the release
timeout; an arena on an unmounted segment is forgotten.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

from .conftest import NODE, OTHER, WRITER, Clock, MakeService, MiB, mount

OK = 0


def _reserve(svc: MasterService, size: int = MiB, client: m.ClientId = WRITER) -> m.ArenaReply:
    rep = svc.handle(m.ReserveArena(client, size))
    assert isinstance(rep, m.ArenaReply)
    return rep


def _commit(
    svc: MasterService, arena: m.ArenaReply, key: str, size: int, offset: int, **kw: object
) -> int:
    rep = svc.handle(
        m.PutCommit(kw.pop("client", WRITER), key, size, arena.arena_id, offset, 42, **kw)  # type: ignore[arg-type]
    )
    assert isinstance(rep, m.Reply)
    return rep.code


def _allocated(svc: MasterService) -> int:
    return sum(s.allocator.allocated for s in svc.segments.live)


def test_commit_makes_a_readable_object_at_the_committed_range(svc: MasterService) -> None:
    a = _reserve(svc)
    assert a.code == OK and a.size == MiB and a.alignment == 64 and a.segment
    assert _commit(svc, a, "k", 1000, a.offset + 128) == OK
    rl = svc.handle(m.GetReplicaList("k"))
    assert isinstance(rl, m.ReplicaListReply) and rl.code == OK
    assert rl.size == 1000 and rl.checksum == 42
    (r,) = rl.replicas
    assert (r.segment, r.offset, r.status) == (a.segment, a.offset + 128, m.ReplicaStatus.COMPLETE)


def test_existing_key_answers_exists_and_keeps_the_old_object(svc: MasterService) -> None:
    a = _reserve(svc)
    assert _commit(svc, a, "k", 100, a.offset) == OK
    assert _commit(svc, a, "k", 100, a.offset + 1024) == ErrorCode.OBJECT_ALREADY_EXISTS
    rl = svc.handle(m.GetReplicaList("k"))
    assert isinstance(rl, m.ReplicaListReply) and rl.replicas[0].offset == a.offset
    # A PutStart of the same key also sees it.
    ps = svc.handle(m.PutStart(WRITER, "k", 100))
    assert isinstance(ps, m.PutStartReply) and ps.code == ErrorCode.OBJECT_ALREADY_EXISTS


def test_bad_ranges_are_refused_and_create_nothing(svc: MasterService) -> None:
    a = _reserve(svc)
    end = a.offset + a.size
    assert _commit(svc, a, "inside", 4096, a.offset + 4096) == OK
    cases = [
        ("overlap-left", 4096, a.offset + 2048),  # ends inside the committed range
        ("overlap-right", 100, a.offset + 8192 - 64),  # starts inside it
        ("covering", 3 * 4096, a.offset),
        ("before", 64, a.offset - 64),
        ("past-end", 128, end - 64),
        ("misaligned", 64, a.offset + 32),
        ("zero", 0, a.offset + 65536),
    ]
    for key, size, off in cases:
        assert _commit(svc, a, key, size, off) == ErrorCode.INVALID_PARAMS, key
        assert svc.index.get(m.DEFAULT_TENANT, key) is None, key
    assert _commit(svc, a, "", 64, a.offset + 65536) == ErrorCode.INVALID_PARAMS


def test_unknown_or_foreign_arena_is_an_invalid_write(svc: MasterService) -> None:
    a = _reserve(svc)
    assert _commit(svc, a, "k", 64, a.offset, client=OTHER) == ErrorCode.INVALID_WRITE
    bogus = m.ArenaReply(OK, a.arena_id + 1, a.segment, a.offset, a.size)
    assert _commit(svc, bogus, "k", 64, a.offset) == ErrorCode.INVALID_WRITE
    assert svc.index.get(m.DEFAULT_TENANT, "k") is None


def test_configs_an_arena_cannot_hold_are_refused(svc: MasterService) -> None:
    a = _reserve(svc)
    two = m.ReplicateConfigMsg(replica_num=2)
    assert _commit(svc, a, "k", 64, a.offset, config=two) == ErrorCode.INVALID_PARAMS
    pref = m.ReplicateConfigMsg(preferred_segments=[m.SegmentName("seg-0")])
    assert _commit(svc, a, "k", 64, a.offset, config=pref) == ErrorCode.INVALID_PARAMS


def test_pins_of_the_config_apply(svc: MasterService, clock: Clock) -> None:
    a = _reserve(svc)
    cfg = m.ReplicateConfigMsg(
        soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=5000, with_hard_pin=True
    )
    assert _commit(svc, a, "k", 64, a.offset, config=cfg) == OK
    obj = svc.index.get(m.DEFAULT_TENANT, "k")
    assert obj is not None and obj.hard_pin and obj.complete
    assert obj.soft_pin_deadline == clock() + 5.0


def test_release_frees_exactly_the_gaps_then_removes_free_the_rest(svc: MasterService) -> None:
    before = _allocated(svc)
    a = _reserve(svc, 2 * MiB)
    assert _allocated(svc) == before + 2 * MiB
    offs = [a.offset, a.offset + 4096, a.offset + 3 * 4096]  # a gap at 2*4096
    for i, off in enumerate(offs):
        assert _commit(svc, a, f"k{i}", 4000, off) == OK
    assert svc.handle(m.ReleaseArenas(WRITER, [a.arena_id])) == m.Reply(OK)
    assert _allocated(svc) == before + 3 * 4032  # 4000 rounded up to 64
    assert _commit(svc, a, "late", 64, a.offset + 8 * 4096) == ErrorCode.INVALID_WRITE
    svc.handle(m.RemoveAll(force=True))
    assert _allocated(svc) == before
    for seg in svc.segments.live:
        assert seg.objects == 0
        assert seg.allocator.free_blocks() == [(0, seg.allocator.capacity)]


def test_retire_in_reserve_releases_the_old_arena(svc: MasterService) -> None:
    a = _reserve(svc)
    b = svc.handle(m.ReserveArena(WRITER, MiB, 0, [a.arena_id]))
    assert isinstance(b, m.ArenaReply) and b.code == OK
    assert [x.arena_id for x in svc.arenas_of(WRITER)] == [b.arena_id]
    assert _allocated(svc) == MiB


def test_arena_size_is_capped_and_min_size_honoured(make_service: MakeService) -> None:
    svc = make_service(segments=1, size=16 * MiB)
    a = _reserve(svc, 64 * MiB)
    assert a.code == OK and a.size == 2 * MiB  # an eighth of the segment
    rep = svc.handle(m.ReserveArena(WRITER, 64 * MiB, 3 * MiB))
    assert isinstance(rep, m.ArenaReply) and rep.code == ErrorCode.NO_AVAILABLE_HANDLE
    bad = svc.handle(m.ReserveArena(WRITER, MiB, 2 * MiB))
    assert isinstance(bad, m.ArenaReply) and bad.code == ErrorCode.INVALID_PARAMS
    off = make_service(segments=1, max_arena_size=0)
    rep = off.handle(m.ReserveArena(WRITER, MiB))
    assert isinstance(rep, m.ArenaReply) and rep.code == ErrorCode.NOT_SUPPORTED


def test_expired_client_arena_is_parked_until_release_timeout(
    make_service: MakeService, clock: Clock
) -> None:
    svc = make_service(client_ttl=5.0)
    svc.handle(m.ReMountSegment(WRITER, m.HostId("h")))  # registered, no segments
    a = _reserve(svc, MiB)
    assert _commit(svc, a, "k", 64, a.offset) == OK
    clock.advance(6.0)
    svc.handle(m.Ping(NODE))  # the segments' owner stays alive
    assert svc.expire_clients() == [WRITER]
    assert svc.arenas_of(WRITER) == []
    assert _allocated(svc) == MiB  # the object (64) + the parked gap (MiB - 64)
    clock.advance(svc.config.put_start_release_timeout)
    svc.handle(m.Ping(NODE))
    svc.release_stale()
    assert _allocated(svc) == 64  # only the committed object is left
    assert svc.handle(m.GetReplicaList("k")).code == OK  # type: ignore[attr-defined]


def test_arena_on_an_unmounted_segment_is_forgotten(make_service: MakeService) -> None:
    svc = make_service(segments=1)
    a = _reserve(svc)
    seg = svc.segments.get(m.SegmentName(a.segment))
    assert seg is not None
    svc.handle(m.UnmountSegment(seg.client_id, seg.name))
    assert svc.arenas_of(WRITER) == []
    assert _commit(svc, a, "k", 64, a.offset) == ErrorCode.INVALID_WRITE
    mount(svc, "seg-new")
    b = _reserve(svc)
    assert b.code == OK and b.segment == "seg-new"


def test_batch_commit_is_per_key(svc: MasterService) -> None:
    a = _reserve(svc)
    svc.handle(m.PutCommit(WRITER, "dup", 64, a.arena_id, a.offset, 1))
    keys = ["x", "dup", "y", "bad"]
    offs = [a.offset + 64, a.offset + 128, a.offset + 192, a.offset + 64]  # bad overlaps x
    rep = svc.handle(m.BatchPutCommit(WRITER, a.arena_id, keys, [64] * 4, offs, [1, 2, 3, 4]))
    assert isinstance(rep, m.BatchReply)
    assert rep.codes == [
        OK,
        ErrorCode.OBJECT_ALREADY_EXISTS,
        OK,
        ErrorCode.INVALID_PARAMS,
    ]
    short = svc.handle(m.BatchPutCommit(WRITER, a.arena_id, ["z"], [64, 64], [a.offset + 256]))
    assert isinstance(short, m.BatchReply) and short.codes == [ErrorCode.INVALID_PARAMS]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["commit", "remove", "release", "put"]),
            st.integers(min_value=0, max_value=15),  # key
            st.integers(min_value=0, max_value=40),  # slot in the arena (x 4 KiB)
            st.integers(min_value=1, max_value=9000),  # size
        ),
        max_size=60,
    )
)
def test_model_no_overlap_and_everything_comes_back(ops: list[tuple[str, int, int, int]]) -> None:
    """Any mix of commits (valid or not), PutStart/PutEnd puts, removes and releases: no two
    live objects share a byte, and after releasing and removing everything each segment is
    one free block again."""
    svc = MasterService(MasterConfig(seed=5), clock=Clock())
    for i in range(2):
        mount(svc, f"s{i}", 16 * MiB)
    arena = _reserve(svc, MiB)
    for op, k, slot, size in ops:
        key = f"k{k}"
        if op == "commit":
            _commit(svc, arena, key, size, arena.offset + slot * 4096)
        elif op == "put":
            ps = svc.handle(m.PutStart(WRITER, key, size))
            if isinstance(ps, m.PutStartReply) and ps.code == OK:
                svc.handle(m.PutEnd(WRITER, key, 0))
        elif op == "remove":
            svc.handle(m.Remove(key, force=True))
        else:
            svc.handle(m.ReleaseArenas(WRITER, [arena.arena_id]))
            arena = _reserve(svc, MiB)
        spans: dict[str, list[tuple[int, int]]] = {}
        for obj in svc.index.snapshot():
            for r in obj.replicas:
                spans.setdefault(r.segment.name, []).append((r.offset, obj.size))
        for ranges in spans.values():
            ranges.sort()
            for (o1, s1), (o2, _) in itertools.pairwise(ranges):
                assert o1 + s1 <= o2
    svc.handle(m.ReleaseArenas(WRITER, [arena.arena_id]))
    svc.handle(m.RemoveAll(force=True))
    for seg in svc.segments.live:
        assert seg.objects == 0
        assert seg.allocator.free_blocks() == [(0, seg.allocator.capacity)]


# ---------------------------------------------------------------- leases and limits


def test_a_commit_renews_the_lease_and_an_idle_arena_is_released_after_it(
    make_service: MakeService, clock: Clock
) -> None:
    svc = make_service(put_start_release_timeout=60.0, put_start_discard_timeout=30.0)
    svc.handle(m.Ping(NODE))
    a = _reserve(svc)
    assert a.lease_ms == 2000
    clock.advance(1.5)
    assert _commit(svc, a, "k", 64, a.offset) == OK  # renews: deadline = now + 2 s
    clock.advance(60.0 + 1.0)  # 61 s after the commit: deadline + release timeout not reached
    svc.handle(m.Ping(NODE))
    svc.release_stale()
    assert svc.arenas_of(WRITER) != []
    clock.advance(1.5)
    svc.handle(m.Ping(NODE))
    svc.release_stale()
    assert svc.arenas_of(WRITER) == []
    assert _allocated(svc) == 64  # the object; the gap is back


def test_an_unregistered_client_cannot_hold_an_arena_forever(
    make_service: MakeService, clock: Clock
) -> None:
    svc = make_service(put_start_release_timeout=60.0, put_start_discard_timeout=30.0)
    ghost = m.ClientId("never-registered")
    assert _reserve(svc, client=ghost).code == OK
    clock.advance(63.0)
    svc.handle(m.Ping(NODE))
    svc.release_stale()
    assert svc.arenas_of(ghost) == [] and _allocated(svc) == 0


def test_a_client_holds_at_most_four_arenas(svc: MasterService) -> None:
    got = [_reserve(svc, 256 << 10) for _ in range(4)]
    assert all(g.code == OK for g in got)
    assert _reserve(svc, 256 << 10).code == ErrorCode.NO_AVAILABLE_HANDLE
    retired = svc.handle(m.ReserveArena(WRITER, 256 << 10, 0, [got[0].arena_id]))
    assert isinstance(retired, m.ArenaReply) and retired.code == OK


def test_arenas_take_at_most_a_quarter_of_a_segment(make_service: MakeService) -> None:
    svc = make_service(segments=1, size=16 * MiB)
    clients = [m.ClientId(f"c{i}") for i in range(4)]
    granted = [_reserve(svc, 2 * MiB, client=c) for c in clients]
    assert [g.code for g in granted] == [OK, OK, ErrorCode.NO_AVAILABLE_HANDLE] * 1 + [
        ErrorCode.NO_AVAILABLE_HANDLE
    ]
    assert svc.stats(m.Stats()).arenas == 2
    assert svc.stats(m.Stats()).arena_bytes == 4 * MiB


def test_reserve_never_evicts_and_grants_the_largest_free_block(clock: Clock) -> None:
    from kvpool.master.reclaim.adapter import MasterReclaimHooks

    svc = MasterService(MasterConfig(seed=1), clock=clock, hooks=MasterReclaimHooks())
    mount(svc, "s", 16 * MiB)
    for n in range(256):  # fill the segment with 64 KiB objects, exactly
        ps = svc.handle(m.PutStart(WRITER, f"o{n}", 64 << 10))
        assert isinstance(ps, m.PutStartReply) and ps.code == OK
        svc.handle(m.PutEnd(WRITER, f"o{n}", 1))
    svc.handle(m.Remove("o3", force=True))  # one 64 KiB hole
    objects = len(svc.index)
    rep = svc.handle(m.ReserveArena(WRITER, 2 * MiB, 4096))
    assert isinstance(rep, m.ArenaReply) and rep.code == OK and rep.size == 64 << 10
    assert len(svc.index) == objects  # nothing was evicted for it
    rep = svc.handle(m.ReserveArena(WRITER, 2 * MiB, 4096))
    assert isinstance(rep, m.ArenaReply) and rep.code == ErrorCode.NO_AVAILABLE_HANDLE
    assert len(svc.index) == objects


def test_a_segment_mounted_again_keeps_old_arena_ranges_reserved(
    make_service: MakeService, clock: Clock
) -> None:
    svc = make_service(segments=1, put_start_release_timeout=60.0, put_start_discard_timeout=30.0)
    a = _reserve(svc, MiB)
    assert _commit(svc, a, "k", 4096, a.offset) == OK
    seg = svc.segments.get(m.SegmentName(a.segment))
    assert seg is not None
    owner, info = seg.client_id, seg.info()
    svc.handle(m.UnmountSegment(owner, seg.name))  # e.g. its owner expired ...
    assert svc.handle(m.MountSegment(owner, seg.host_id, info)) == m.Reply(OK)  # ... and is back
    new = svc.segments.get(m.SegmentName(a.segment))
    assert new is not None and new is not seg
    # The writer may still be writing anywhere in its arena past the committed 4 KiB.
    lo, hi = a.offset + 4096, a.offset + a.size
    placed = []
    for i in range(40):
        ps = svc.handle(m.PutStart(OTHER, f"x{i}", 64 << 10))
        assert isinstance(ps, m.PutStartReply) and ps.code == OK
        placed.append(ps.replicas[0].offset)
    assert all(off + (64 << 10) <= lo or off >= hi for off in placed)
    # Until the old lease plus the release timeout: then the range is free again.
    clock.advance(2.0 + 60.0 + 0.1)
    svc.handle(m.Ping(owner))
    svc.release_stale()
    assert new.allocator.alloc_at(lo, hi - lo)


def test_an_expired_client_arena_stays_parked_past_its_lease(
    make_service: MakeService, clock: Clock
) -> None:
    svc = make_service(client_ttl=1.0, put_start_release_timeout=5.0, put_start_discard_timeout=1.0)
    svc.handle(m.ReMountSegment(WRITER, m.HostId("h")))
    a = _reserve(svc, MiB)  # lease: min(2 s, client_ttl) = 1 s
    assert a.lease_ms == 1000
    clock.advance(1.5)
    svc.handle(m.Ping(NODE))
    assert svc.expire_clients() == [WRITER]
    clock.advance(4.0)  # 5.5 s after the grant: deadline (1 s) + 5 s not reached
    svc.handle(m.Ping(NODE))
    svc.release_stale()
    assert _allocated(svc) == MiB
    clock.advance(1.1)
    svc.handle(m.Ping(NODE))
    svc.release_stale()
    assert _allocated(svc) == 0


def test_a_commit_refused_for_its_config_still_renews_the_arena_lease(
    make_service: MakeService, clock: Clock
) -> None:
    """The client wrote into its arena before the master saw the request: whatever the answer
    (but INVALID_WRITE), the arena must stay the client's for a new lease, or the master could
    hand out a range the client still believes is its own."""
    svc = make_service()
    a = _reserve(svc)
    (arena,) = svc.arenas_of(WRITER)
    clock.advance(1.5)
    too_long = m.ReplicateConfigMsg(
        soft_pin_action=m.SoftPinAction.ENABLE,
        soft_pin_ttl_ms=int(svc.config.max_kv_soft_pin_ttl * 1000) + 1000,
    )
    assert _commit(svc, a, "k", 64, a.offset, config=too_long) == ErrorCode.INVALID_PARAMS
    assert arena.deadline == clock() + svc.arena_lease
    bad_group = m.ReplicateConfigMsg(group_ids=["a", "b"])
    clock.advance(1.0)
    assert _commit(svc, a, "k", 64, a.offset, config=bad_group) == ErrorCode.INVALID_PARAMS
    assert arena.deadline == clock() + svc.arena_lease


def test_parked_ranges_stay_reserved_across_an_unmount_and_a_mount_of_the_same_name(
    make_service: MakeService, clock: Clock
) -> None:
    """A writer expired (its arena parked on segment S), then S's owner is unmounted and mounts
    S again before the park ends: the parked ranges must be reserved in the new allocator too."""
    svc = make_service(
        segments=1, client_ttl=1.0, put_start_release_timeout=30.0, put_start_discard_timeout=1.0
    )
    svc.handle(m.ReMountSegment(WRITER, m.HostId("h")))
    a = _reserve(svc, MiB)
    clock.advance(1.5)
    svc.handle(m.Ping(NODE))
    assert svc.expire_clients() == [WRITER]  # arena parked for 30 s past its lease
    seg = svc.segments.get(m.SegmentName(a.segment))
    assert seg is not None
    info = seg.info()
    svc.handle(m.UnmountSegment(NODE, seg.name))
    assert svc.handle(m.MountSegment(NODE, seg.host_id, info)) == m.Reply(OK)
    new = svc.segments.get(m.SegmentName(a.segment))
    assert new is not None and new.allocator.allocated == MiB
    assert not new.allocator.alloc_at(a.offset, a.size)
    clock.advance(31.0 + 2.0)
    svc.handle(m.Ping(NODE))
    svc.release_stale()
    assert new.allocator.allocated == 0


def _held(svc: MasterService) -> tuple[object, ...]:
    """Everything a refused commit must leave as it was: objects, in-flight writes, parked
    ranges, allocated bytes, arena ranges."""
    objs = [(o.key, id(o), o.replicas, o.complete) for o in svc.index.snapshot()]
    in_flight = {c: list(b) for c, b in svc.clients.in_flight.items() if b}
    parked = [(r.segment.name, r.offset, size) for r, size in svc.parked()]
    arenas = [(x.arena_id, list(x.starts), list(x.ends)) for x in svc.arenas_of(WRITER)]
    return objs, in_flight, parked, _allocated(svc), arenas


def test_a_commit_refused_for_its_range_leaves_a_stale_write_of_the_key_alone(
    svc: MasterService, clock: Clock
) -> None:
    start = svc.handle(m.PutStart(OTHER, "k", 4096))
    assert isinstance(start, m.PutStartReply) and start.code == OK
    clock.advance(svc.config.put_start_discard_timeout + 1)  # stale: a put may preempt it
    a = _reserve(svc)
    before = _held(svc)
    assert _commit(svc, a, "k", 4096, a.offset - 64) == ErrorCode.INVALID_PARAMS  # outside
    rep = svc.handle(
        m.BatchPutCommit(WRITER, a.arena_id, ["k"], [4096], [a.offset + a.size - 64], [1])
    )
    assert isinstance(rep, m.BatchReply) and rep.codes == [ErrorCode.INVALID_PARAMS]
    assert _held(svc) == before
    # The stale writer still owns its write and may finish it.
    end = svc.handle(m.PutEnd(OTHER, "k"))
    assert isinstance(end, m.Reply) and end.code == OK


def test_a_commit_refused_for_its_range_leaves_a_dead_object_of_the_key_alone(
    svc: MasterService,
) -> None:
    cfg = m.ReplicateConfigMsg(preferred_segments=[m.SegmentName("seg-1")])
    start = svc.handle(m.PutStart(OTHER, "k", 4096, cfg))
    assert isinstance(start, m.PutStartReply) and start.replicas[0].segment == "seg-1"
    svc.handle(m.UnmountSegment(NODE, m.SegmentName("seg-1")))
    a = _reserve(svc)
    assert a.segment == "seg-0"
    before = _held(svc)
    assert _commit(svc, a, "k", 4096, a.offset - 4096) == ErrorCode.INVALID_PARAMS  # outside
    assert _held(svc) == before
    # A commit that is accepted takes the key from the dead object.
    assert _commit(svc, a, "k", 4096, a.offset) == OK
    (obj,) = svc.index.snapshot()
    assert obj.replicas[0].segment.name == "seg-0"
