"""The put planner: one rule for whether a put may take a key that an object holds.

Mooncake's rule, shared by PutStart, UpsertStart and PutCommit: a complete object, or a write
younger than the discard timeout, keeps its key (EXISTS); an object with no replica on a
mounted segment is gone already (FORGET_DEAD); an older unfinished write is preempted
(PREEMPT). The planner only decides: it changes nothing, whatever it answers.
"""

from __future__ import annotations

from kvpool.master.config import MasterConfig
from kvpool.master.liveness import ClientTable
from kvpool.master.metadata import ObjectIndex, ObjectMeta, Replica
from kvpool.master.planner import Claim, PutPlanner
from kvpool.master.segments import SegmentTable
from kvpool.protocol import messages as m

from .conftest import NODE, WRITER

CONFIG = MasterConfig(put_start_discard_timeout=30.0)
T0 = 1000.0


def _planner() -> tuple[PutPlanner, SegmentTable]:
    segments = SegmentTable(CONFIG.alignment)
    host = m.HostId("h")
    segments.mount(m.SegmentInfo(m.SegmentName("s"), 1 << 20, host, "e", ""), NODE, host)
    index = ObjectIndex(CONFIG.num_shards)
    planner = PutPlanner(CONFIG, index, ClientTable(CONFIG.client_ttl), CONFIG.allocation_strategy)
    return planner, segments


def _obj(segments: SegmentTable, *, complete: bool) -> ObjectMeta:
    seg = segments.live[0]
    status = m.ReplicaStatus.COMPLETE if complete else m.ReplicaStatus.PROCESSING
    obj = ObjectMeta(
        "k", m.TenantId("default"), 0, 64, WRITER, (Replica(seg, 0, status),), T0, None, False, ""
    )
    obj.complete = complete
    return obj


def test_a_complete_object_keeps_its_key_however_old() -> None:
    planner, segments = _planner()
    obj = _obj(segments, complete=True)
    assert planner.claim(obj, T0) is Claim.EXISTS
    assert planner.claim(obj, T0 + 10 * CONFIG.put_start_discard_timeout) is Claim.EXISTS


def test_a_write_keeps_its_key_until_the_discard_timeout_then_is_preempted() -> None:
    planner, segments = _planner()
    obj = _obj(segments, complete=False)
    timeout = CONFIG.put_start_discard_timeout
    assert planner.claim(obj, T0 + timeout - 0.001) is Claim.EXISTS
    assert planner.claim(obj, T0 + timeout) is Claim.PREEMPT


def test_an_object_without_a_live_replica_is_forgotten_complete_or_not() -> None:
    planner, segments = _planner()
    done, writing = _obj(segments, complete=True), _obj(segments, complete=False)
    segments.unmount(segments.live[0])
    assert planner.claim(done, T0) is Claim.FORGET_DEAD
    assert planner.claim(writing, T0) is Claim.FORGET_DEAD


def test_deciding_changes_nothing() -> None:
    planner, segments = _planner()
    obj = _obj(segments, complete=False)
    before = (obj.replicas, obj.complete, obj.put_start_time, segments.live[0].objects)
    assert planner.claim(obj, T0 + 3600) is Claim.PREEMPT
    assert (obj.replicas, obj.complete, obj.put_start_time, segments.live[0].objects) == before
