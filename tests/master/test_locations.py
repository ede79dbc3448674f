"""BatchGetLocations answers exactly what BatchGetReplicaList answers, in compact form.

For any state (objects complete, being written, with replicas on unmounted segments, missing
keys, several replicas) each key's code, size, checksum and replicas (segment, offset, in the
master's order) agree, both grant the same lease and both forget objects whose segments died.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

from .conftest import WRITER, Clock, MakeService, MiB, mount


def _same(svc: MasterService, keys: list[str]) -> None:
    full = svc.handle(m.BatchGetReplicaList(keys))
    compact = svc.handle(m.BatchGetLocations(keys))
    assert isinstance(full, m.BatchReplicaListReply) and isinstance(compact, m.LocationsReply)
    assert compact.codes == [r.code for r in full.results]
    for i, r in enumerate(full.results):
        if r.code != 0:
            assert compact.places[i] == [] and compact.sizes[i] == 0
            continue
        assert compact.sizes[i] == r.size and compact.checksums[i] == r.checksum
        p = compact.places[i]
        got = [(compact.segments[p[k]], p[k + 1]) for k in range(0, len(p), 2)]
        assert got == [(d.segment, d.offset) for d in r.replicas]
        for k in range(0, len(p), 2):
            seg = svc.segments.get(m.SegmentName(compact.segments[p[k]]))
            assert seg is not None and compact.endpoints[p[k]] == seg.endpoint
    assert len(set(compact.segments)) == len(compact.segments)  # each named once
    for r in full.results:
        if r.code == 0:
            assert compact.lease_ttl_ms == r.lease_ttl_ms


def test_mixed_states(make_service: MakeService, clock: Clock) -> None:
    svc = make_service(segments=3)
    for i in range(6):
        cfg = m.ReplicateConfigMsg(replica_num=1 + i % 3)
        assert svc.handle(m.PutStart(WRITER, f"k{i}", 1000 + i, cfg)).code == 0  # type: ignore[attr-defined]
        if i != 4:
            svc.handle(m.PutEnd(WRITER, f"k{i}", i * 11))
    _same(svc, [f"k{i}" for i in range(7)] + ["k0"])
    svc.handle(m.UnmountSegment(m.ClientId("node-1"), m.SegmentName("seg-0")))
    _same(svc, [f"k{i}" for i in range(7)])


def test_lease_is_granted(make_service: MakeService, clock: Clock) -> None:
    svc = make_service()
    svc.handle(m.PutStart(WRITER, "k", 10))
    svc.handle(m.PutEnd(WRITER, "k", 1))
    svc.handle(m.BatchGetLocations(["k"]))
    assert svc.handle(m.Remove("k")) == m.Reply(ErrorCode.OBJECT_HAS_LEASE)
    obj = svc.index.get(m.DEFAULT_TENANT, "k")
    assert obj is not None and obj.lease_deadline == clock() + svc.config.default_kv_lease_ttl


def test_unknown_tenant() -> None:
    svc = MasterService(MasterConfig(seed=1), clock=Clock())
    rep = svc.handle(m.BatchGetLocations(["a", "b"], m.TenantId("nobody")))
    assert isinstance(rep, m.LocationsReply)
    assert rep.codes == [-704, -704] and rep.places == [[], []]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "end", "remove", "unmount"]),
            st.integers(min_value=0, max_value=9),
            st.integers(min_value=1, max_value=3),
        ),
        max_size=40,
    )
)
def test_model_agrees_with_batch_get_replica_list(ops: list[tuple[str, int, int]]) -> None:
    svc = MasterService(MasterConfig(seed=2), clock=Clock())
    for i in range(3):
        mount(svc, f"s{i}", 4 * MiB)
    for op, k, n in ops:
        key = f"k{k}"
        if op == "put":
            svc.handle(m.PutStart(WRITER, key, 100 * n, m.ReplicateConfigMsg(replica_num=n)))
        elif op == "end":
            svc.handle(m.PutEnd(WRITER, key, k))
        elif op == "remove":
            svc.handle(m.Remove(key, force=True))
        else:
            seg = svc.segments.get(m.SegmentName(f"s{n - 1}"))
            if seg is not None:
                svc.handle(m.UnmountSegment(seg.client_id, seg.name))
        _same(svc, [f"k{i}" for i in range(10)])
