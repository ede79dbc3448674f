"""Batch puts cut their objects from one region per batch: ranges never overlap, the unused
rest goes back, and freeing the objects one by one gives the segments back whole."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

MiB = 1 << 20
W = m.ClientId("w")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _service(segments: int, size: int, clock: Clock | None = None) -> MasterService:
    svc = MasterService(MasterConfig(seed=3), clock=clock or Clock())
    for i in range(segments):
        info = m.SegmentInfo(m.SegmentName(f"s{i}"), size, m.HostId("h"), "e", "")
        svc.handle(m.MountSegment(m.ClientId(f"n{i}"), m.HostId("h"), info))
    return svc


def _check_no_overlap(svc: MasterService) -> None:
    spans: dict[str, list[tuple[int, int]]] = {}
    for obj in svc.index.snapshot():
        for r in obj.replicas:
            spans.setdefault(r.segment.name, []).append((r.offset, obj.size))
    for r, size in svc.parked():  # preempted / force-removed writes keep their ranges
        spans.setdefault(r.segment.name, []).append((r.offset, size))
    for seg_name, ranges in spans.items():
        ranges.sort()
        for (o1, s1), (o2, _) in itertools.pairwise(ranges):
            assert o1 + s1 <= o2, f"overlap in {seg_name}: {o1}+{s1} > {o2}"
        seg = svc.segments.get(m.SegmentName(seg_name))
        assert seg is not None and seg.objects == len(ranges)
        used = sum((s + 63) // 64 * 64 for _, s in ranges)
        assert seg.allocator.allocated == used  # no region leftovers stay allocated
    for seg in svc.segments.live:
        if seg.name not in spans:
            assert seg.objects == 0 and seg.allocator.allocated == 0


batches = st.lists(
    st.tuples(
        st.sampled_from(["put", "end", "revoke", "remove"]),
        st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=20),
        st.lists(st.integers(min_value=-1, max_value=300_000), min_size=20, max_size=20),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(seq=batches, segments=st.integers(min_value=1, max_value=3))
def test_random_batches_never_overlap_and_give_everything_back(
    seq: list[tuple[str, list[int], list[int]]], segments: int
) -> None:
    clock = Clock()
    svc = _service(segments, 2 * MiB, clock)
    for op, ids, sizes in seq:
        keys = [f"k{i}" for i in ids]
        if op == "put":
            reply = svc.handle(m.BatchPutStart(W, keys, sizes[: len(keys)]))
            assert isinstance(reply, m.BatchPutStartReply) and len(reply.results) == len(keys)
        elif op == "end":
            svc.handle(m.BatchPutEnd(W, keys))
        elif op == "revoke":
            svc.handle(m.BatchPutRevoke(W, keys))
        else:
            svc.handle(m.BatchRemove(keys, True))
        _check_no_overlap(svc)
    svc.handle(m.RemoveAll(force=True))  # in-flight puts are parked until their release time
    clock.t += svc.config.put_start_release_timeout
    svc.release_stale()
    for seg in svc.segments.live:
        assert seg.objects == 0 and seg.allocator.allocated == 0
        assert seg.allocator.free_blocks() == [(0, seg.allocator.capacity)]


def test_a_batch_lands_in_one_region_and_returns_its_unused_rest() -> None:
    svc = _service(2, 16 * MiB)
    keys = [f"k{i}" for i in range(64)]
    reply = svc.handle(m.BatchPutStart(W, keys, [4096] * 64))
    assert isinstance(reply, m.BatchPutStartReply)
    segs = {r.replicas[0].segment for r in reply.results}
    offsets = sorted(r.replicas[0].offset for r in reply.results)
    assert len(segs) == 1 and offsets == [offsets[0] + 4096 * i for i in range(64)]
    # Keys that take no room (already there) leave the rest of the region unused: given back.
    again = svc.handle(m.BatchPutStart(W, [*keys[:32], "new"], [4096] * 33))
    assert isinstance(again, m.BatchPutStartReply)
    assert svc.memory_usage()[1] == 65 * 4096


def test_a_batch_that_no_segment_can_hold_whole_falls_back_to_one_range_per_key() -> None:
    svc = _service(3, MiB)
    keys = [f"k{i}" for i in range(3)]
    reply = svc.handle(m.BatchPutStart(W, keys, [MiB] * 3))
    assert isinstance(reply, m.BatchPutStartReply)
    assert [r.code for r in reply.results] == [0, 0, 0]
    assert len({r.replicas[0].segment for r in reply.results}) == 3
