"""The master's rules, one test per rule, against the plain service on a hand-driven clock.

Names read as the rule they pin. No sockets here: `MasterService.handle(request)` is the whole
surface; tests/master/test_server.py runs the same service behind a real RPC server.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import xxhash

from kvpool.errors import ErrorCode, InvalidParams
from kvpool.master.config import MasterConfig
from kvpool.master.hooks import NoopReclaimHooks, ReclaimTarget
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

NODE = m.ClientId("node-1")
WRITER = m.ClientId("writer-1")
OTHER = m.ClientId("writer-2")
HOST = m.HostId("host-a")
MiB = 1 << 20

OK = 0
E = ErrorCode


def mount(
    svc: MasterService,
    name: str,
    size: int = 16 * MiB,
    client: m.ClientId = NODE,
    host: m.HostId = HOST,
) -> int:
    info = m.SegmentInfo(m.SegmentName(name), size, host, f"127.0.0.1:{len(name)}", "")
    reply = svc.handle(m.MountSegment(client, host, info))
    assert isinstance(reply, m.Reply)
    return reply.code


def start(
    svc: MasterService,
    key: str,
    size: int = 4096,
    client: m.ClientId = WRITER,
    upsert: bool = False,
    tenant: str = "default",
    **cfg: object,
) -> m.PutStartReply:
    config = m.ReplicateConfigMsg(**cfg)  # type: ignore[arg-type]
    cls = m.UpsertStart if upsert else m.PutStart
    reply = svc.handle(cls(client, key, size, config, m.TenantId(tenant)))
    assert isinstance(reply, m.PutStartReply)
    return reply


def end(svc: MasterService, key: str, client: m.ClientId = WRITER, checksum: int | None = 1) -> int:
    reply = svc.handle(m.PutEnd(client, key, checksum))
    assert isinstance(reply, m.Reply)
    return reply.code


def put(svc: MasterService, key: str, size: int = 4096, **cfg: object) -> m.PutStartReply:
    r = start(svc, key, size, **cfg)
    assert r.code == OK, r
    assert end(svc, key) == OK
    return r


def get(svc: MasterService, key: str, tenant: str = "default") -> m.ReplicaListReply:
    reply = svc.handle(m.GetReplicaList(key, m.TenantId(tenant)))
    assert isinstance(reply, m.ReplicaListReply)
    return reply


def remove(svc: MasterService, key: str, force: bool = False) -> int:
    reply = svc.handle(m.Remove(key, force))
    assert isinstance(reply, m.Reply)
    return reply.code


def used(svc: MasterService) -> int:
    return svc.memory_usage()[1]


# ============================================================== PutStart validation


def test_put_start_with_empty_key_is_invalid_params(svc: MasterService) -> None:
    assert start(svc, "").code == E.INVALID_PARAMS


def test_put_start_with_zero_size_is_invalid_params(svc: MasterService) -> None:
    assert start(svc, "k", size=0).code == E.INVALID_PARAMS


def test_put_start_with_negative_size_is_invalid_params(svc: MasterService) -> None:
    assert start(svc, "k", size=-5).code == E.INVALID_PARAMS


def test_put_start_with_zero_replicas_is_invalid_params(svc: MasterService) -> None:
    assert start(svc, "k", replica_num=0).code == E.INVALID_PARAMS


def test_put_start_with_more_replicas_than_allowed_is_invalid_params(svc: MasterService) -> None:
    assert start(svc, "k", replica_num=svc.config.max_replicas + 1).code == E.INVALID_PARAMS


def test_soft_pin_ttl_with_preserve_is_invalid_params(svc: MasterService) -> None:
    r = start(svc, "k", soft_pin_action=m.SoftPinAction.PRESERVE, soft_pin_ttl_ms=1000)
    assert r.code == E.INVALID_PARAMS


def test_soft_pin_ttl_with_disable_is_invalid_params(svc: MasterService) -> None:
    r = start(svc, "k", soft_pin_action=m.SoftPinAction.DISABLE, soft_pin_ttl_ms=1000)
    assert r.code == E.INVALID_PARAMS


def test_soft_pin_ttl_above_max_is_invalid_params(svc: MasterService) -> None:
    too_long = int(svc.config.max_kv_soft_pin_ttl * 1000) + 1
    r = start(svc, "k", soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=too_long)
    assert r.code == E.INVALID_PARAMS


def test_negative_soft_pin_ttl_is_invalid_params(svc: MasterService) -> None:
    r = start(svc, "k", soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=-1)
    assert r.code == E.INVALID_PARAMS


def test_group_ids_not_one_per_key_is_invalid_params(svc: MasterService) -> None:
    assert start(svc, "k", group_ids=["a", "b"]).code == E.INVALID_PARAMS


def test_put_start_with_empty_client_id_is_invalid_params(svc: MasterService) -> None:
    assert start(svc, "k", client=m.ClientId("")).code == E.INVALID_PARAMS


def test_put_start_with_empty_tenant_is_invalid_params(svc: MasterService) -> None:
    assert start(svc, "k", tenant="").code == E.INVALID_PARAMS


def test_invalid_put_start_changes_nothing(svc: MasterService) -> None:
    start(svc, "k", replica_num=0)
    assert len(svc.index) == 0 and used(svc) == 0


def test_put_start_without_segments_is_no_available_handle(make_service: object) -> None:
    svc = make_service(segments=0)  # type: ignore[operator]
    assert start(svc, "k").code == E.NO_AVAILABLE_HANDLE


def test_put_start_larger_than_every_segment_is_no_available_handle(svc: MasterService) -> None:
    assert start(svc, "k", size=17 * MiB).code == E.NO_AVAILABLE_HANDLE
    assert len(svc.index) == 0


# ============================================================== soft pin / hard pin / group


def test_enable_without_ttl_pins_for_the_default_from_put_end(
    svc: MasterService, clock: object
) -> None:
    start(svc, "k", soft_pin_action=m.SoftPinAction.ENABLE)
    obj = svc.index.get("default", "k")
    assert obj is not None and obj.soft_pin_deadline is None  # runs from first readability
    clock.advance(5)  # type: ignore[attr-defined]
    end(svc, "k")
    assert obj.soft_pin_deadline == clock() + svc.config.default_kv_soft_pin_ttl  # type: ignore[operator]


def test_enable_with_ttl_pins_for_that_ttl(svc: MasterService, clock: object) -> None:
    put(svc, "k", soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=2500)
    obj = svc.index.get("default", "k")
    assert obj is not None and obj.soft_pin_deadline == clock() + 2.5  # type: ignore[operator]


def test_hard_pin_is_stored_on_the_object(svc: MasterService) -> None:
    put(svc, "k", with_hard_pin=True)
    obj = svc.index.get("default", "k")
    assert obj is not None and obj.hard_pin


def test_group_id_is_stored_and_never_changes_the_shard(svc: MasterService) -> None:
    put(svc, "k", group_ids=["g1"])
    obj = svc.index.get("default", "k")
    assert obj is not None and obj.group_id == "g1"
    assert obj.shard == svc.index.shard_of("default", "k")


def test_group_membership_is_immutable(svc: MasterService) -> None:
    put(svc, "k", group_ids=["g1"])
    assert start(svc, "k", upsert=True, group_ids=["g2"]).code == E.INVALID_PARAMS
    assert start(svc, "k", upsert=True, group_ids=["g1"]).code == OK


# ============================================================== sharding


def test_shard_is_a_stable_xxhash_of_tenant_and_key(svc: MasterService) -> None:
    n = svc.config.num_shards
    seed = xxhash.xxh3_64_intdigest(b"default")
    assert svc.index.shard_of("default", "abc") == xxhash.xxh3_64_intdigest(b"abc", seed) % n
    # Same answer in another interpreter with another hash seed: never Python's hash().
    code = (
        "from kvpool.master.metadata import ObjectIndex;"
        f"print(ObjectIndex({n}).shard_of('default', 'abc'), ObjectIndex({n}).shard_of('t2', 'abc'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [str(svc.index.shard_of("default", "abc")), str(svc.index.shard_of("t2", "abc"))]


def test_tenants_are_separate_namespaces(svc: MasterService) -> None:
    assert start(svc, "k", tenant="a").code == OK
    assert start(svc, "k", tenant="b").code == OK
    assert get(svc, "k", tenant="c").code == E.OBJECT_NOT_FOUND


# ============================================================== put lifecycle


def test_put_start_answers_processing_replicas_on_distinct_segments(
    make_service: object,
) -> None:
    svc = make_service(segments=3)  # type: ignore[operator]
    r = start(svc, "k", replica_num=3)
    assert r.code == OK and len(r.replicas) == 3
    assert len({d.segment for d in r.replicas}) == 3
    assert all(d.status is m.ReplicaStatus.PROCESSING and d.size == 4096 for d in r.replicas)
    assert all(d.offset % svc.config.alignment == 0 for d in r.replicas)
    assert len({d.replica_id for d in r.replicas}) == 3


def test_replica_num_is_best_effort(svc: MasterService) -> None:
    r = start(svc, "k", replica_num=5)
    assert r.code == OK and len(r.replicas) == 2  # only two segments


def test_put_start_of_a_complete_object_is_object_already_exists(svc: MasterService) -> None:
    put(svc, "k")
    assert start(svc, "k").code == E.OBJECT_ALREADY_EXISTS


def test_put_start_of_a_recent_put_start_is_object_already_exists(
    svc: MasterService, clock: object
) -> None:
    start(svc, "k")
    clock.advance(svc.config.put_start_discard_timeout - 1)  # type: ignore[attr-defined]
    assert start(svc, "k", client=OTHER).code == E.OBJECT_ALREADY_EXISTS


def test_stale_put_start_is_preempted_and_its_space_parked_until_release(
    svc: MasterService, clock: object
) -> None:
    first = start(svc, "k", size=MiB)
    clock.advance(svc.config.put_start_discard_timeout)  # type: ignore[attr-defined]
    second = start(svc, "k", size=MiB, client=OTHER)
    assert second.code == OK
    assert used(svc) == 2 * MiB  # the old space is parked, not reused
    assert end(svc, "k", client=WRITER) == E.ILLEGAL_CLIENT  # the old writer lost the key
    assert end(svc, "k", client=OTHER) == OK
    svc.release_stale()
    assert used(svc) == 2 * MiB
    clock.advance(svc.config.put_start_release_timeout - svc.config.put_start_discard_timeout)  # type: ignore[attr-defined]
    svc.release_stale()
    assert used(svc) == MiB
    assert first.replicas[0].offset != second.replicas[0].offset or (
        first.replicas[0].segment != second.replicas[0].segment
    )


@pytest.mark.parametrize("upsert", [False, True])
def test_a_put_refused_for_space_leaves_a_stale_write_of_the_key_alone(
    svc: MasterService, clock: object, upsert: bool
) -> None:
    # Decide, claim, then take the key: a put that may preempt a stale write but finds no
    # space answers NO_AVAILABLE_HANDLE and changes nothing; the stale writer may finish.
    assert start(svc, "k", size=MiB, client=OTHER).code == OK
    clock.advance(svc.config.put_start_discard_timeout + 1)  # type: ignore[attr-defined]
    before = used(svc)
    too_big = 64 * MiB  # larger than any segment: no allocation can succeed
    assert start(svc, "k", size=too_big, upsert=upsert).code == E.NO_AVAILABLE_HANDLE
    assert used(svc) == before and svc.parked() == []
    assert end(svc, "k", client=OTHER) == OK
    assert get(svc, "k").code == OK


def test_unfinished_put_start_is_released_after_release_timeout(
    svc: MasterService, clock: object
) -> None:
    assert svc.handle(m.ReMountSegment(WRITER, m.HostId("h"))).code == OK  # a registered Store
    start(svc, "k", size=MiB)
    clock.advance(svc.config.put_start_release_timeout - 1)  # type: ignore[attr-defined]
    assert svc.release_stale() == 0 and used(svc) == MiB
    clock.advance(1)  # type: ignore[attr-defined]
    assert svc.release_stale() == 1
    assert used(svc) == 0 and get(svc, "k").code == E.OBJECT_NOT_FOUND


def test_a_put_start_of_a_client_that_never_registered_is_released_after_the_discard_timeout(
    svc: MasterService, clock: object
) -> None:
    # issue #15: a flood of PutStarts from an id no Store registered held the pool for 600 s.
    start(svc, "k", size=MiB, client=m.ClientId("never-registered"))
    clock.advance(svc.config.put_start_discard_timeout - 1)  # type: ignore[attr-defined]
    assert svc.release_stale() == 0 and used(svc) == MiB
    clock.advance(1)  # type: ignore[attr-defined]
    assert svc.release_stale() == 1
    assert used(svc) == 0 and get(svc, "k").code == E.OBJECT_NOT_FOUND


def test_put_end_of_unknown_key_is_object_not_found(svc: MasterService) -> None:
    assert end(svc, "nope") == E.OBJECT_NOT_FOUND


def test_put_end_by_another_client_is_illegal_client(svc: MasterService) -> None:
    start(svc, "k")
    assert end(svc, "k", client=OTHER) == E.ILLEGAL_CLIENT
    assert get(svc, "k").code == E.REPLICA_IS_NOT_READY


def test_repeated_put_end_is_a_successful_no_op(svc: MasterService) -> None:
    put(svc, "k")
    assert end(svc, "k", checksum=99) == OK
    assert get(svc, "k").checksum == 1  # the first PutEnd's checksum stands


def test_put_end_makes_replicas_complete_and_records_the_checksum(svc: MasterService) -> None:
    start(svc, "k", replica_num=2)
    assert end(svc, "k", checksum=2**64 - 1) == OK
    r = get(svc, "k")
    assert r.code == OK and r.checksum == 2**64 - 1 and r.size == 4096
    assert [d.status for d in r.replicas] == [m.ReplicaStatus.COMPLETE] * 2


def test_put_revoke_frees_everything_the_put_start_took(svc: MasterService) -> None:
    start(svc, "k", size=MiB, replica_num=2)
    assert used(svc) == 2 * MiB
    reply = svc.handle(m.PutRevoke(WRITER, "k"))
    assert isinstance(reply, m.Reply) and reply.code == OK
    assert used(svc) == 0 and len(svc.index) == 0
    assert start(svc, "k").code == OK  # the key is free again


def test_put_revoke_of_a_complete_object_is_invalid_write(svc: MasterService) -> None:
    put(svc, "k")
    reply = svc.handle(m.PutRevoke(WRITER, "k"))
    assert isinstance(reply, m.Reply) and reply.code == E.INVALID_WRITE
    assert get(svc, "k").code == OK


def test_put_revoke_by_another_client_is_illegal_client(svc: MasterService) -> None:
    start(svc, "k")
    reply = svc.handle(m.PutRevoke(OTHER, "k"))
    assert isinstance(reply, m.Reply) and reply.code == E.ILLEGAL_CLIENT


def test_put_revoke_of_unknown_key_is_object_not_found(svc: MasterService) -> None:
    reply = svc.handle(m.PutRevoke(WRITER, "k"))
    assert isinstance(reply, m.Reply) and reply.code == E.OBJECT_NOT_FOUND


# ============================================================== upsert


def test_upsert_of_an_absent_key_is_a_put(svc: MasterService) -> None:
    r = start(svc, "k", upsert=True)
    assert r.code == OK and end(svc, "k") == OK and get(svc, "k").code == OK


def test_upsert_of_the_same_size_rewrites_in_place(svc: MasterService) -> None:
    first = put(svc, "k", size=MiB)
    second = start(svc, "k", size=MiB, upsert=True, client=OTHER)
    assert second.code == OK
    assert [(d.segment, d.offset) for d in second.replicas] == [
        (d.segment, d.offset) for d in first.replicas
    ]
    assert used(svc) == MiB
    assert get(svc, "k").code == E.REPLICA_IS_NOT_READY  # unreadable while rewritten
    assert end(svc, "k", client=OTHER, checksum=7) == OK
    assert get(svc, "k").checksum == 7


def test_upsert_of_another_size_reallocates(svc: MasterService) -> None:
    put(svc, "k", size=MiB)
    r = start(svc, "k", size=2 * MiB, upsert=True)
    assert r.code == OK and r.replicas[0].size == 2 * MiB
    assert used(svc) == 2 * MiB
    end(svc, "k")
    assert get(svc, "k").size == 2 * MiB


def test_upsert_of_another_size_is_a_new_generation_for_the_hooks(clock: object) -> None:
    hooks = RecordingHooks()
    svc = MasterService(MasterConfig(seed=1), clock=clock, hooks=hooks)  # type: ignore[arg-type]
    mount(svc, "only", size=16 * MiB)
    put(svc, "k", size=MiB, group_ids=["g"], with_hard_pin=True)
    first = svc.index.get("default", "k")
    start(svc, "k", size=MiB, upsert=True)  # same size: same record
    end(svc, "k")
    assert svc.index.get("default", "k") is first
    start(svc, "k", size=2 * MiB, upsert=True)
    second = svc.index.get("default", "k")
    assert second is not first and second is not None
    assert (second.group_id, second.hard_pin, len(svc.index)) == ("g", True, 1)
    assert hooks.events.count(("removed", "k")) == 1
    end(svc, "k")
    assert hooks.events[-1] == ("complete", "k") and used(svc) == 2 * MiB


def test_upsert_of_another_size_under_a_read_lease_parks_the_old_range_until_it_ends(
    make_service: object, clock: object
) -> None:
    svc: MasterService = make_service(segments=1)  # type: ignore[operator]
    first = put(svc, "k", size=4096)
    old = (first.replicas[0].segment, first.replicas[0].offset)
    lease = get(svc, "k").lease_ttl_ms / 1000  # a reader may copy from `old` until then
    assert start(svc, "k", size=8192, upsert=True).code == OK
    other = start(svc, "other", size=4096)
    assert other.code == OK
    assert (other.replicas[0].segment, other.replicas[0].offset) != old
    assert used(svc) == 4096 + 8192 + 4096
    clock.advance(lease)  # type: ignore[attr-defined]
    svc.release_stale()
    assert used(svc) == 8192 + 4096


def test_upsert_of_the_same_size_under_a_read_lease_writes_new_ranges(
    make_service: object, clock: object
) -> None:
    svc: MasterService = make_service(segments=1)  # type: ignore[operator]
    first = put(svc, "k", size=4096)
    lease = get(svc, "k").lease_ttl_ms / 1000
    second = start(svc, "k", size=4096, upsert=True)
    assert second.code == OK
    assert second.replicas[0].offset != first.replicas[0].offset  # not under the reader
    assert end(svc, "k", checksum=7) == OK and get(svc, "k").checksum == 7
    assert used(svc) == 2 * 4096
    clock.advance(lease)  # type: ignore[attr-defined]
    svc.release_stale()
    assert used(svc) == 4096


def test_upsert_without_room_for_the_new_size_keeps_the_old_value(svc: MasterService) -> None:
    put(svc, "k", size=MiB)
    assert start(svc, "k", size=17 * MiB, upsert=True).code == E.NO_AVAILABLE_HANDLE
    assert get(svc, "k").code == OK and get(svc, "k").size == MiB


def test_upsert_while_a_put_is_in_flight_is_object_replica_busy(svc: MasterService) -> None:
    start(svc, "k")
    assert start(svc, "k", upsert=True, client=OTHER).code == E.OBJECT_REPLICA_BUSY


def test_upsert_revoke_drops_the_half_rewritten_object(svc: MasterService) -> None:
    put(svc, "k", size=MiB)
    start(svc, "k", size=MiB, upsert=True)
    reply = svc.handle(m.PutRevoke(WRITER, "k"))
    assert isinstance(reply, m.Reply) and reply.code == OK
    assert get(svc, "k").code == E.OBJECT_NOT_FOUND and used(svc) == 0


def test_upsert_disable_unpins(svc: MasterService) -> None:
    put(svc, "k", soft_pin_action=m.SoftPinAction.ENABLE)
    start(svc, "k", upsert=True, soft_pin_action=m.SoftPinAction.DISABLE)
    end(svc, "k")
    obj = svc.index.get("default", "k")
    assert obj is not None and obj.soft_pin_deadline is None


# ============================================================== batch forms


def test_batch_put_start_answers_one_result_per_key(svc: MasterService) -> None:
    put(svc, "exists")
    reply = svc.handle(m.BatchPutStart(WRITER, ["a", "", "exists", "b"], [10, 10, 10, 0]))
    assert isinstance(reply, m.BatchPutStartReply)
    assert [r.code for r in reply.results] == [
        OK,
        E.INVALID_PARAMS,
        E.OBJECT_ALREADY_EXISTS,
        E.INVALID_PARAMS,
    ]


def test_batch_put_start_with_sizes_not_one_per_key_is_invalid_params(svc: MasterService) -> None:
    reply = svc.handle(m.BatchPutStart(WRITER, ["a", "b"], [10]))
    assert isinstance(reply, m.BatchPutStartReply)
    assert [r.code for r in reply.results] == [E.INVALID_PARAMS] * 2
    assert len(svc.index) == 0


def test_batch_put_start_gives_each_key_its_group(svc: MasterService) -> None:
    cfg = m.ReplicateConfigMsg(group_ids=["g1", "g2"])
    svc.handle(m.BatchPutStart(WRITER, ["a", "b"], [10, 10], cfg))
    a, b = svc.index.get("default", "a"), svc.index.get("default", "b")
    assert a is not None and b is not None and (a.group_id, b.group_id) == ("g1", "g2")


def test_batch_put_end_and_revoke_answer_one_code_per_key(svc: MasterService) -> None:
    svc.handle(m.BatchPutStart(WRITER, ["a", "b", "c"], [10, 10, 10]))
    reply = svc.handle(m.BatchPutEnd(WRITER, ["a", "nope", "b"], [1, 2, 3]))
    assert isinstance(reply, m.BatchReply)
    assert reply.codes == [OK, E.OBJECT_NOT_FOUND, OK]
    reply = svc.handle(m.BatchPutRevoke(WRITER, ["c", "a", "nope"]))
    assert isinstance(reply, m.BatchReply)
    assert reply.codes == [OK, E.INVALID_WRITE, E.OBJECT_NOT_FOUND]
    assert get(svc, "b").checksum == 3


def test_batch_put_end_with_checksums_not_one_per_key_is_invalid_params(
    svc: MasterService,
) -> None:
    svc.handle(m.BatchPutStart(WRITER, ["a", "b"], [10, 10]))
    reply = svc.handle(m.BatchPutEnd(WRITER, ["a", "b"], [1]))
    assert isinstance(reply, m.BatchReply) and reply.codes == [E.INVALID_PARAMS] * 2


def test_batch_upsert_start_answers_one_result_per_key(svc: MasterService) -> None:
    put(svc, "a", size=100)
    reply = svc.handle(m.BatchUpsertStart(WRITER, ["a", "b"], [100, 200]))
    assert isinstance(reply, m.BatchPutStartReply)
    assert [r.code for r in reply.results] == [OK, OK]


# ============================================================== reads and leases


def test_get_replica_list_of_unknown_key_is_object_not_found(svc: MasterService) -> None:
    assert get(svc, "nope").code == E.OBJECT_NOT_FOUND


def test_get_replica_list_while_only_processing_replicas_is_replica_is_not_ready(
    svc: MasterService,
) -> None:
    start(svc, "k")
    assert get(svc, "k").code == E.REPLICA_IS_NOT_READY


def test_get_replica_list_grants_a_lease_of_max_old_and_now_plus_ttl(
    svc: MasterService, clock: object
) -> None:
    put(svc, "k")
    obj = svc.index.get("default", "k")
    assert obj is not None
    r = get(svc, "k")
    assert r.lease_ttl_ms == 10_000
    t0 = clock()  # type: ignore[operator]
    assert obj.lease_deadline == t0 + 10.0
    obj.lease_deadline = t0 + 100.0  # a longer lease is never shortened
    get(svc, "k")
    assert obj.lease_deadline == t0 + 100.0


def test_get_replica_list_answers_only_replicas_on_live_segments(svc: MasterService) -> None:
    r = put(svc, "k", replica_num=2)
    dead = r.replicas[0].segment
    svc.handle(m.UnmountSegment(NODE, dead))
    got = get(svc, "k")
    assert got.code == OK and [d.segment for d in got.replicas] == [r.replicas[1].segment]


def test_exist_key_is_true_for_readable_objects_and_grants_a_lease(
    svc: MasterService, clock: object
) -> None:
    put(svc, "k")
    start(svc, "in-flight")
    reply = svc.handle(m.BatchExistKey(["k", "in-flight", "nope"]))
    assert isinstance(reply, m.BatchExistReply)
    assert [(r.code, r.exists) for r in reply.results] == [(OK, True), (OK, False), (OK, False)]
    obj = svc.index.get("default", "k")
    assert obj is not None and obj.lease_deadline == clock() + 10.0  # type: ignore[operator]
    single = svc.handle(m.ExistKey("k"))
    assert isinstance(single, m.ExistReply) and single.exists


def test_get_size_answers_the_size_and_the_read_codes(svc: MasterService) -> None:
    put(svc, "k", size=1234)
    start(svc, "w")
    sizes = [svc.handle(m.GetSize(k)) for k in ("k", "w", "nope")]
    assert [(s.code, s.size) for s in sizes] == [  # type: ignore[attr-defined]
        (OK, 1234),
        (E.REPLICA_IS_NOT_READY, 0),
        (E.OBJECT_NOT_FOUND, 0),
    ]


def test_batch_get_replica_list_answers_one_result_per_key(svc: MasterService) -> None:
    put(svc, "a")
    start(svc, "b")
    reply = svc.handle(m.BatchGetReplicaList(["a", "b", "c"]))
    assert isinstance(reply, m.BatchReplicaListReply)
    assert [r.code for r in reply.results] == [OK, E.REPLICA_IS_NOT_READY, E.OBJECT_NOT_FOUND]


# ============================================================== removal


def test_remove_of_a_leased_object_is_object_has_lease(svc: MasterService) -> None:
    put(svc, "k")
    get(svc, "k")
    assert remove(svc, "k") == E.OBJECT_HAS_LEASE
    assert get(svc, "k").code == OK


def test_forced_remove_ignores_the_lease(svc: MasterService) -> None:
    put(svc, "k", size=MiB)
    get(svc, "k")
    assert remove(svc, "k", force=True) == OK
    assert get(svc, "k").code == E.OBJECT_NOT_FOUND and used(svc) == 0


def test_remove_succeeds_once_the_lease_expired(svc: MasterService, clock: object) -> None:
    put(svc, "k")
    get(svc, "k")
    clock.advance(10.0)  # type: ignore[attr-defined]
    assert remove(svc, "k") == OK


def test_put_end_leaves_the_object_unleased(svc: MasterService) -> None:
    put(svc, "k")
    assert remove(svc, "k") == OK  # PutEnd grants lease max(old, now): already expired


def test_remove_of_an_in_flight_put_is_replica_is_not_ready(svc: MasterService) -> None:
    start(svc, "k")
    assert remove(svc, "k") == E.REPLICA_IS_NOT_READY


def test_forced_remove_of_an_in_flight_put_parks_its_space(
    svc: MasterService, clock: object
) -> None:
    start(svc, "k", size=MiB)
    assert remove(svc, "k", force=True) == OK
    assert used(svc) == MiB and len(svc.index) == 0
    clock.advance(svc.config.put_start_release_timeout)  # type: ignore[attr-defined]
    svc.release_stale()
    assert used(svc) == 0


def test_remove_of_unknown_key_is_object_not_found(svc: MasterService) -> None:
    assert remove(svc, "nope") == E.OBJECT_NOT_FOUND


def test_hard_pinned_object_is_still_removable(svc: MasterService) -> None:
    put(svc, "k", with_hard_pin=True)
    assert remove(svc, "k") == OK


def test_batch_remove_answers_one_code_per_key(svc: MasterService) -> None:
    put(svc, "a")
    put(svc, "b")
    get(svc, "b")
    reply = svc.handle(m.BatchRemove(["a", "b", "c"]))
    assert isinstance(reply, m.BatchReply)
    assert reply.codes == [OK, E.OBJECT_HAS_LEASE, E.OBJECT_NOT_FOUND]


def test_remove_all_skips_leased_objects_unless_forced(svc: MasterService) -> None:
    for k in ("a", "b", "c"):
        put(svc, k)
    get(svc, "c")
    start(svc, "w")
    reply = svc.handle(m.RemoveAll())
    assert isinstance(reply, m.CountReply) and (reply.code, reply.count) == (OK, 2)
    reply = svc.handle(m.RemoveAll(force=True))
    assert isinstance(reply, m.CountReply) and reply.count == 2  # c and the in-flight w
    assert len(svc.index) == 0


def test_remove_all_stays_in_its_tenant(svc: MasterService) -> None:
    put(svc, "a")
    start(svc, "a", tenant="t2")
    end_reply = svc.handle(m.PutEnd(WRITER, "a", 1, m.TenantId("t2")))
    assert isinstance(end_reply, m.Reply) and end_reply.code == OK
    svc.handle(m.RemoveAll(tenant=m.TenantId("t2")))
    assert get(svc, "a").code == OK and get(svc, "a", tenant="t2").code == E.OBJECT_NOT_FOUND


def test_remove_by_regex_counts_the_matching_unleased_objects(svc: MasterService) -> None:
    for k in ("layer-1", "layer-2", "other", "layer-3"):
        put(svc, k)
    get(svc, "layer-3")
    reply = svc.handle(m.RemoveByRegex("^layer-"))
    assert isinstance(reply, m.CountReply) and reply.count == 2
    assert get(svc, "other").code == OK and get(svc, "layer-3").code == OK


def test_remove_by_invalid_regex_is_invalid_params(svc: MasterService) -> None:
    reply = svc.handle(m.RemoveByRegex("(unclosed"))
    assert isinstance(reply, m.CountReply) and reply.code == E.INVALID_PARAMS


def test_remove_by_a_catastrophic_regex_stops_with_invalid_params_and_the_count_so_far(
    svc: MasterService,
) -> None:
    # `^(a|aa)+$` backtracks exponentially on "aaa...b": unguarded, this one key holds the
    # master's loop for seconds (minutes a few characters later).
    evil = "a" * 36 + "b"
    names = [f"x-{i}" for i in range(20)]
    for k in [*names, evil]:
        put(svc, k)
    t0 = time.perf_counter()
    reply = svc.handle(m.RemoveByRegex("^(a|aa)+$|^x-"))
    elapsed = time.perf_counter() - t0
    assert isinstance(reply, m.CountReply) and reply.code == E.INVALID_PARAMS
    assert elapsed < 1.0, elapsed  # about regex_match_budget (0.1 s), not seconds
    # The keys matched before the overrun stay removed, and the count says how many.
    removed = [k for k in names if svc.index.get("default", k) is None]
    assert reply.count == len(removed)
    assert get(svc, evil).code == OK


def test_regex_match_budget_must_be_positive() -> None:
    with pytest.raises(InvalidParams, match="regex_match_budget"):
        MasterConfig(regex_match_budget=0.0)


# ============================================================== segments


def test_mount_registers_the_client_and_is_idempotent(svc: MasterService) -> None:
    assert mount(svc, "seg-0") == OK  # the fixture mounted it already: same segment again
    assert len(svc.segments) == 2
    ping = svc.handle(m.Ping(NODE))
    assert isinstance(ping, m.PingReply) and ping.client_status is m.ClientStatus.OK


def test_mounting_a_name_another_client_owns_is_segment_already_exists(
    svc: MasterService,
) -> None:
    assert mount(svc, "seg-0", client=OTHER) == E.SEGMENT_ALREADY_EXISTS


def test_mount_with_empty_name_or_tiny_size_is_invalid_params(svc: MasterService) -> None:
    assert mount(svc, "") == E.INVALID_PARAMS
    assert mount(svc, "tiny", size=1) == E.INVALID_PARAMS


def test_remount_registers_a_client_without_segments(svc: MasterService) -> None:
    reply = svc.handle(m.ReMountSegment(WRITER, HOST, []))
    assert isinstance(reply, m.Reply) and reply.code == OK
    ping = svc.handle(m.Ping(WRITER))
    assert isinstance(ping, m.PingReply) and ping.client_status is m.ClientStatus.OK


def test_remount_is_idempotent_and_mounts_what_is_missing(svc: MasterService) -> None:
    infos = [
        m.SegmentInfo(m.SegmentName("n2-a"), MiB, HOST, "e", ""),
        m.SegmentInfo(m.SegmentName("n2-b"), MiB, HOST, "e", ""),
    ]
    for _ in range(2):
        reply = svc.handle(m.ReMountSegment(OTHER, HOST, infos))
        assert isinstance(reply, m.Reply) and reply.code == OK
    assert len(svc.segments) == 4


def test_unmount_by_another_client_is_illegal_client(svc: MasterService) -> None:
    reply = svc.handle(m.UnmountSegment(OTHER, m.SegmentName("seg-0")))
    assert isinstance(reply, m.Reply) and reply.code == E.ILLEGAL_CLIENT
    assert len(svc.segments) == 2


def test_unmount_of_an_unknown_segment_succeeds(svc: MasterService) -> None:
    reply = svc.handle(m.UnmountSegment(NODE, m.SegmentName("nope")))
    assert isinstance(reply, m.Reply) and reply.code == OK


def test_unmount_drops_its_replicas_and_objects_left_without_one_disappear(
    make_service: object,
) -> None:
    svc: MasterService = make_service(segments=1)  # type: ignore[operator]
    mount(svc, "seg-x", client=OTHER)
    for i in range(20):
        put(svc, f"k{i}", replica_num=2)
    only_here = start(svc, "solo", preferred_segments=[m.SegmentName("seg-0")])
    assert only_here.replicas[0].segment == "seg-0" and end(svc, "solo") == OK
    svc.handle(m.UnmountSegment(NODE, m.SegmentName("seg-0")))
    assert get(svc, "solo").code == E.OBJECT_NOT_FOUND
    assert all(get(svc, f"k{i}").code == OK for i in range(20))
    assert svc.sweep_needed
    for _ in svc.sweep_dead():
        pass
    assert len(svc.index) == 20
    obj = svc.index.get("default", "k0")
    assert obj is not None and [r.segment.name for r in obj.replicas] == ["seg-x"]


def test_remove_all_does_not_count_objects_already_gone_with_their_segment(
    svc: MasterService,
) -> None:
    for i in range(5):
        put(svc, f"gone{i}", preferred_segments=[m.SegmentName("seg-1")])
    put(svc, "stays", preferred_segments=[m.SegmentName("seg-0")])
    svc.handle(m.UnmountSegment(NODE, m.SegmentName("seg-1")))
    reply = svc.handle(m.RemoveAll(force=True))
    assert isinstance(reply, m.CountReply) and reply.count == 1
    assert len(svc.index) == 0


def test_sweep_removes_objects_of_a_dead_segment_from_the_count(svc: MasterService) -> None:
    for i in range(10):
        put(svc, f"k{i}", preferred_segments=[m.SegmentName("seg-1")])
    svc.handle(m.UnmountSegment(NODE, m.SegmentName("seg-1")))
    steps = list(svc.sweep_dead())
    assert steps[-1] == 10 and len(svc.index) == 0


def test_get_segment_answers_its_info_or_segment_not_found(svc: MasterService) -> None:
    reply = svc.handle(m.GetSegment(m.SegmentName("seg-0")))
    assert isinstance(reply, m.SegmentReply) and reply.segment is not None
    assert reply.segment.client_id == NODE and reply.segment.size == 16 * MiB
    reply = svc.handle(m.GetSegment(m.SegmentName("nope")))
    assert isinstance(reply, m.SegmentReply) and reply.code == E.SEGMENT_NOT_FOUND


def test_a_segment_remounted_after_unmount_starts_empty(svc: MasterService) -> None:
    put(svc, "k", preferred_segments=[m.SegmentName("seg-0")])
    svc.handle(m.UnmountSegment(NODE, m.SegmentName("seg-0")))
    assert mount(svc, "seg-0") == OK
    assert get(svc, "k").code == E.OBJECT_NOT_FOUND  # the old mount's replica stays dead
    assert svc.segments.get(m.SegmentName("seg-0")).allocator.allocated == 0  # type: ignore[union-attr]


# ============================================================== liveness


def test_ping_from_an_unknown_client_answers_need_remount(svc: MasterService) -> None:
    reply = svc.handle(m.Ping(m.ClientId("stranger")))
    assert isinstance(reply, m.PingReply)
    assert reply.code == OK and reply.client_status is m.ClientStatus.NEED_REMOUNT


def test_pinging_keeps_a_client_alive(svc: MasterService, clock: object) -> None:
    for _ in range(30):
        clock.advance(1.0)  # type: ignore[attr-defined]
        svc.handle(m.Ping(NODE))
        assert svc.expire_clients() == []
    assert len(svc.segments) == 2


def test_a_silent_client_is_expired_with_its_segments_replicas_and_puts(
    make_service: object, clock: object
) -> None:
    svc: MasterService = make_service(segments=1)  # type: ignore[operator]
    mount(svc, "other-seg", client=OTHER)
    svc.handle(m.ReMountSegment(WRITER, HOST, []))
    put(svc, "on-node", preferred_segments=[m.SegmentName("seg-0")])
    start(svc, "in-flight", size=MiB, preferred_segments=[m.SegmentName("other-seg")])
    clock.advance(svc.config.client_ttl - 0.5)  # type: ignore[attr-defined]
    svc.handle(m.Ping(OTHER))
    assert svc.expire_clients() == []
    clock.advance(1.0)  # type: ignore[attr-defined]
    svc.handle(m.Ping(OTHER))
    assert sorted(svc.expire_clients()) == sorted([NODE, WRITER])
    assert svc.segments.get(m.SegmentName("seg-0")) is None
    assert get(svc, "on-node").code == E.OBJECT_NOT_FOUND
    assert get(svc, "in-flight").code == E.OBJECT_NOT_FOUND  # preempted
    # Its range stays parked (the silent writer may still be writing) until the release time.
    other_seg = svc.segments.get(m.SegmentName("other-seg"))
    assert other_seg is not None and other_seg.allocator.allocated == MiB
    clock.advance(svc.config.put_start_release_timeout)  # type: ignore[attr-defined]
    svc.release_stale()
    assert other_seg.allocator.allocated == 0
    reply = svc.handle(m.Ping(NODE))
    assert isinstance(reply, m.PingReply) and reply.client_status is m.ClientStatus.NEED_REMOUNT


def test_a_stall_of_the_monitor_is_not_the_clients_silence(
    svc: MasterService, clock: object
) -> None:
    ttl = svc.config.client_ttl
    assert svc.check_liveness() == []
    # The master's loop was stuck for 2.5 TTLs: the clients' pings sat unread meanwhile.
    clock.advance(2.5 * ttl)  # type: ignore[attr-defined]
    assert svc.check_liveness() == []
    assert len(svc.segments) == 2
    # From then on the usual rule: silent for a whole TTL (monitor ticks every second).
    elapsed = 0.0
    while not svc.check_liveness():
        clock.advance(1.0)  # type: ignore[attr-defined]
        elapsed += 1.0
        assert elapsed <= ttl + 1
    assert elapsed >= ttl - 1 and len(svc.segments) == 0


def test_monitor_jitter_does_not_keep_a_silent_client_alive(
    make_service: object, clock: object
) -> None:
    # A TTL as short as the monitor's period, on a busy machine where every tick comes late:
    # that lateness is jitter, not a stall, and must not postpone the silent node forever.
    svc: MasterService = make_service(client_ttl=1.0, monitor_interval=1.0)  # type: ignore[operator]
    assert svc.check_liveness() == []
    ticks = 0
    while len(svc.segments) > 0:
        clock.advance(1.3)  # type: ignore[attr-defined]
        svc.check_liveness()
        ticks += 1
        assert ticks <= 3, "the silent node was never expired"


def test_an_expired_clients_unfinished_put_keeps_its_range_parked_until_release(
    make_service: object, clock: object
) -> None:
    svc: MasterService = make_service(segments=1)  # type: ignore[operator]
    w1 = m.ClientId("w1")
    svc.handle(m.ReMountSegment(w1, HOST, []))
    first = start(svc, "a", client=w1)
    at = (first.replicas[0].segment, first.replicas[0].offset)
    clock.advance(svc.config.client_ttl + 1)  # type: ignore[attr-defined]
    svc.handle(m.Ping(NODE))
    assert svc.expire_clients() == [w1]
    assert get(svc, "a").code == E.OBJECT_NOT_FOUND
    # w1 may still be writing into `at`: nothing else may be placed there yet.
    later = start(svc, "b")
    assert later.code == OK and (later.replicas[0].segment, later.replicas[0].offset) != at
    assert end(svc, "b") == OK
    assert [(r.segment.name, r.offset) for r, _ in svc.parked()] == [at]
    clock.advance(svc.config.put_start_release_timeout)  # type: ignore[attr-defined]
    svc.handle(m.Ping(NODE))
    svc.release_stale()
    assert svc.parked() == [] and used(svc) == 4096


def test_ping_with_empty_client_id_is_invalid_params(svc: MasterService) -> None:
    reply = svc.handle(m.Ping(m.ClientId("")))
    assert isinstance(reply, m.PingReply) and reply.code == E.INVALID_PARAMS


# ============================================================== placement


def test_preferred_segments_are_tried_first(make_service: object) -> None:
    svc: MasterService = make_service(segments=4)  # type: ignore[operator]
    for i in range(10):
        r = start(svc, f"k{i}", preferred_segments=[m.SegmentName("seg-3")])
        assert r.replicas[0].segment == "seg-3"


def test_a_full_preferred_segment_falls_back_to_the_strategy(make_service: object) -> None:
    svc: MasterService = make_service(segments=2, size=MiB)  # type: ignore[operator]
    assert start(svc, "big", size=MiB, preferred_segments=[m.SegmentName("seg-0")]).code == OK
    r = start(svc, "next", preferred_segments=[m.SegmentName("seg-0")])
    assert r.code == OK and r.replicas[0].segment == "seg-1"


def test_random_placement_spreads_over_segments(make_service: object) -> None:
    svc: MasterService = make_service(segments=4)  # type: ignore[operator]
    segs = {start(svc, f"k{i}").replicas[0].segment for i in range(100)}
    assert len(segs) == 4


def test_free_ratio_first_picks_the_emptiest_segment(make_service: object) -> None:
    svc: MasterService = make_service(segments=3, allocation_strategy="free_ratio_first")  # type: ignore[operator]
    start(svc, "fill0", size=8 * MiB, preferred_segments=[m.SegmentName("seg-0")])
    start(svc, "fill2", size=4 * MiB, preferred_segments=[m.SegmentName("seg-2")])
    assert start(svc, "k").replicas[0].segment == "seg-1"
    assert start(svc, "k2", size=9 * MiB).replicas[0].segment == "seg-1"
    assert start(svc, "k3").replicas[0].segment == "seg-2"


def test_local_first_places_on_the_writers_host(make_service: object) -> None:
    svc: MasterService = make_service(segments=0, allocation_strategy="local_first")  # type: ignore[operator]
    for i in range(3):
        mount(svc, f"far-{i}", client=m.ClientId(f"far-{i}"), host=m.HostId("host-far"))
    mount(svc, "near", client=m.ClientId("near"), host=m.HostId("host-near"))
    svc.handle(m.ReMountSegment(WRITER, m.HostId("host-near"), []))
    for i in range(10):
        assert start(svc, f"k{i}").replicas[0].segment == "near"


def test_prefer_alloc_in_same_node_places_locally_under_random(make_service: object) -> None:
    svc: MasterService = make_service(segments=0)  # type: ignore[operator]
    for i in range(3):
        mount(svc, f"far-{i}", client=m.ClientId(f"far-{i}"), host=m.HostId("host-far"))
    mount(svc, "near", client=m.ClientId("near"), host=m.HostId("host-near"))
    svc.handle(m.ReMountSegment(WRITER, m.HostId("host-near"), []))
    for i in range(10):
        r = start(svc, f"k{i}", prefer_alloc_in_same_node=True)
        assert r.replicas[0].segment == "near"


# ============================================================== reclaim hooks


class RecordingHooks(NoopReclaimHooks):
    """Records every call; `reclaim_for` evicts the oldest evictable object it saw complete."""

    def __init__(self) -> None:
        self.target: ReclaimTarget | None = None
        self.events: list[tuple[str, str]] = []
        self.completed: list[ObjectMeta] = []

    def attach(self, target: ReclaimTarget) -> None:
        self.target = target

    def on_replica_complete(self, obj: ObjectMeta, replica: Replica) -> None:
        self.events.append(("complete", obj.key))
        self.completed.append(obj)

    def on_access(self, obj: ObjectMeta) -> None:
        self.events.append(("access", obj.key))

    def on_object_removed(self, obj: ObjectMeta) -> None:
        self.events.append(("removed", obj.key))

    def reclaim_for(self, bytes_needed: int) -> int:
        self.events.append(("reclaim", str(bytes_needed)))
        assert self.target is not None
        now = self.target.now()
        for obj in self.completed:
            if self.target.evictable(obj, now):
                self.completed.remove(obj)
                return self.target.evict(obj)
        return 0


def test_hooks_see_completion_access_removal_and_direct_reclaim(clock: object) -> None:
    hooks = RecordingHooks()
    svc = MasterService(MasterConfig(seed=1), clock=clock, hooks=hooks)  # type: ignore[arg-type]
    assert hooks.target is svc
    mount(svc, "only", size=2 * MiB)
    put(svc, "a", size=MiB)
    put(svc, "b", size=MiB)
    get(svc, "b")
    # The pool is full: PutStart asks reclaim once, which evicts "a" (b is leased), and retries.
    r = start(svc, "c", size=MiB)
    assert r.code == OK
    assert get(svc, "a").code == E.OBJECT_NOT_FOUND
    assert hooks.events == [
        ("complete", "a"),
        ("complete", "b"),
        ("access", "b"),
        ("reclaim", str(MiB)),
        ("removed", "a"),
    ]
    # Nothing evictable now: one reclaim call, no retry success.
    assert start(svc, "d", size=MiB).code == E.NO_AVAILABLE_HANDLE
    assert hooks.events[-1] == ("reclaim", str(MiB))


def test_no_reclaim_is_asked_for_an_object_larger_than_every_segment(clock: object) -> None:
    hooks = RecordingHooks()
    svc = MasterService(MasterConfig(seed=1), clock=clock, hooks=hooks)  # type: ignore[arg-type]
    mount(svc, "only", size=2 * MiB)
    put(svc, "a", size=MiB)
    assert start(svc, "huge", size=3 * MiB).code == E.NO_AVAILABLE_HANDLE
    assert ("reclaim", str(3 * MiB)) not in hooks.events
    assert get(svc, "a").code == OK


def test_evictable_refuses_leased_hard_pinned_and_in_flight_objects(
    svc: MasterService, clock: object
) -> None:
    put(svc, "pinned", with_hard_pin=True)
    put(svc, "leased")
    get(svc, "leased")
    start(svc, "in-flight")
    put(svc, "free")
    now = clock()  # type: ignore[operator]
    verdict = {
        k: svc.evictable(svc.index.get("default", k), now)  # type: ignore[arg-type]
        for k in ("pinned", "leased", "in-flight", "free")
    }
    assert verdict == {"pinned": False, "leased": False, "in-flight": False, "free": True}


# ============================================================== stats and config


def test_stats_report_segments_clients_and_objects(svc: MasterService) -> None:
    put(svc, "a", size=MiB, preferred_segments=[m.SegmentName("seg-0")])
    start(svc, "b", preferred_segments=[m.SegmentName("seg-1")])
    reply = svc.handle(m.Stats())
    assert isinstance(reply, m.StatsReply)
    assert reply.objects == 2 and reply.processing == 1
    seg0 = next(s for s in reply.segments if s.name == "seg-0")
    assert seg0.used == MiB and seg0.objects == 1 and seg0.capacity == 16 * MiB
    assert [c.client_id for c in reply.clients] == [NODE]
    assert reply.capacity == 32 * MiB


@pytest.mark.parametrize(
    "field, value",
    [
        ("eviction_high_watermark_ratio", 1.5),
        ("eviction_ratio", -0.1),
        ("client_ttl", 0),
        ("default_kv_lease_ttl", -1),
        ("put_start_release_timeout", 1.0),
        ("num_shards", 0),
        ("alignment", 48),
        ("allocation_strategy", "nearest"),
        ("default_kv_soft_pin_ttl", 10**9),
    ],
)
def test_master_config_rejects_bad_values(field: str, value: object) -> None:
    from kvpool.errors import InvalidParams

    with pytest.raises(InvalidParams, match=field):
        MasterConfig(**{field: value})  # type: ignore[arg-type]


def test_echo_answers_its_payload(svc: MasterService) -> None:
    reply = svc.handle(m.Echo(b"abc"))
    assert isinstance(reply, m.EchoReply) and reply.payload == b"abc"


def test_per_object_records_are_slotted_and_the_key_is_stored_once(svc: MasterService) -> None:
    key = "-".join(["a-long-key-made-at-run-time", str(id(svc))])  # not interned
    put(svc, key)
    obj = svc.index.get("default", key)
    assert obj is not None
    assert not hasattr(obj, "__dict__") and not hasattr(obj.replicas[0], "__dict__")
    # The index's dict key is the object's own key string, not a second copy.
    shard = svc.index.tenant("default").shards[obj.shard]  # type: ignore[union-attr]
    (stored,) = [k for k in shard if k == key]
    assert stored is obj.key


def test_mounting_a_known_name_with_another_size_is_segment_already_exists(
    svc: MasterService,
) -> None:
    assert mount(svc, "seg-0", size=32 * MiB) == E.SEGMENT_ALREADY_EXISTS


def test_upsert_enable_repins_from_the_next_put_end(svc: MasterService, clock: object) -> None:
    put(svc, "k")
    start(svc, "k", upsert=True, soft_pin_action=m.SoftPinAction.ENABLE, soft_pin_ttl_ms=1000)
    clock.advance(3)  # type: ignore[attr-defined]
    end(svc, "k")
    obj = svc.index.get("default", "k")
    assert obj is not None and obj.soft_pin_deadline == clock() + 1.0  # type: ignore[operator]


def test_a_late_put_end_or_revoke_of_a_taken_over_put_leaves_the_new_put_alone(
    svc: MasterService, clock: object
) -> None:
    # Two threads of one Store (one client id) put the same key: the first stalls past the
    # discard timeout and the second takes the key over. The first's late PutEnd / PutRevoke
    # name its own put (its first replica id) and must not finish or undo the second.
    old = start(svc, "k", size=MiB)
    clock.advance(svc.config.put_start_discard_timeout + 1)  # type: ignore[attr-defined]
    new = start(svc, "k", size=MiB)
    assert old.code == OK and new.code == OK
    old_id, new_id = old.replicas[0].replica_id, new.replicas[0].replica_id
    assert old_id != new_id  # the old ranges stay parked: never handed out again meanwhile
    revoke = svc.handle(m.PutRevoke(WRITER, "k", replica_id=old_id))
    assert revoke == m.Reply(E.ILLEGAL_CLIENT)
    late = svc.handle(m.PutEnd(WRITER, "k", 111, replica_id=old_id))
    assert late == m.Reply(E.ILLEGAL_CLIENT)
    batch = svc.handle(m.BatchPutEnd(WRITER, ["k"], [111], replica_ids=[old_id]))
    assert isinstance(batch, m.BatchReply) and batch.codes == [E.ILLEGAL_CLIENT]
    assert get(svc, "k").code == E.REPLICA_IS_NOT_READY  # still the new put's, unfinished
    assert svc.handle(m.PutEnd(WRITER, "k", 222, replica_id=new_id)) == m.Reply(OK)
    got = get(svc, "k")
    assert got.code == OK and got.checksum == 222


def test_a_revoke_after_a_failed_write_parks_the_ranges_instead_of_freeing_them(
    svc: MasterService, clock: object
) -> None:
    # A node that took part of the bytes may be frozen, not dead, and write them when it
    # wakes: the ranges of a put revoked for a failed write stay allocated until the release
    # timeout, so no other put is placed under the late bytes.
    r = start(svc, "k", size=MiB)
    rid = r.replicas[0].replica_id
    assert svc.handle(m.PutRevoke(WRITER, "k", replica_id=rid, park=True)) == m.Reply(OK)
    assert get(svc, "k").code == E.OBJECT_NOT_FOUND
    assert used(svc) == MiB  # parked
    other = start(svc, "other", size=MiB, client=OTHER)
    assert (other.replicas[0].segment, other.replicas[0].offset) != (
        r.replicas[0].segment,
        r.replicas[0].offset,
    )
    assert end(svc, "other", client=OTHER) == OK
    assert used(svc) == 2 * MiB
    clock.advance(svc.config.put_start_release_timeout + 1)  # type: ignore[attr-defined]
    svc.release_stale()
    assert used(svc) == MiB  # the parked ranges went back; "other" stays
