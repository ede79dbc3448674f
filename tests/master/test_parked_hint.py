"""A put refused while memory is parked for a moment (`kvpool.master.parking`) is told when to
ask again, and the range is free for it then, whatever the monitor's tick.

The sources of finished moves and the old ranges of a rewrite stay parked while a read lease
runs (`MetadataCore.release_moved_source`); the monitor frees what is due once a second. A put
that found the memory full of such ranges was refused at once with no retry hint, so on a slow
machine (tests/tiers/test_cached_disk_reads.py under load: moves to disk landing while short
leases ran) a put failed although the pool had room a few milliseconds later. The service runs
on a hand-driven clock here, and no `release_stale` (the monitor) is called.
"""

from __future__ import annotations

from kvpool.errors import ErrorCode
from kvpool.master.parking import PARKED_HINT_S
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

from .conftest import WRITER, Clock, MakeService

MiB = 1 << 20


def start(svc: MasterService, key: str, *, upsert: bool = False) -> m.PutStartReply:
    cls = m.UpsertStart if upsert else m.PutStart
    cfg = m.ReplicateConfigMsg(with_hard_pin=True)  # never evicted: only parking frees room
    reply = svc.handle(cls(WRITER, key, MiB, cfg, m.TenantId("default")))
    assert isinstance(reply, m.PutStartReply)
    return reply


def put(svc: MasterService, key: str, *, upsert: bool = False) -> None:
    assert start(svc, key, upsert=upsert).code == 0
    reply = svc.handle(m.PutEnd(WRITER, key, 1))
    assert isinstance(reply, m.Reply) and reply.code == 0, reply


def rewrite_under_leases(svc: MasterService) -> None:
    """Two objects read (leased) and rewritten: their old ranges are parked until the leases
    end, and the one segment (4 MiB) is full."""
    for key in ("a", "b"):
        put(svc, key)
    for key in ("a", "b"):
        assert svc.handle(m.GetReplicaList(key, m.TenantId("default"))).code == 0  # type: ignore[union-attr]
    for key in ("a", "b"):
        put(svc, key, upsert=True)
    assert svc.memory_usage()[1] == 4 * MiB


def test_a_put_refused_for_memory_parked_a_moment_is_told_when_it_is_freed(
    make_service: MakeService, clock: Clock
) -> None:
    lease = PARKED_HINT_S / 2
    svc = make_service(segments=1, size=4 * MiB, default_kv_lease_ttl=lease)
    rewrite_under_leases(svc)
    refused = start(svc, "c")
    assert refused.code == ErrorCode.NO_AVAILABLE_HANDLE
    assert 0 < refused.retry_after_ms <= lease * 1000 + 1
    clock.advance(refused.retry_after_ms / 1000)
    assert start(svc, "c").code == 0  # freed by the put itself: the monitor has not run


def test_a_put_refused_for_memory_parked_long_fails_at_once_and_is_placed_once_due(
    make_service: MakeService, clock: Clock
) -> None:
    lease = PARKED_HINT_S * 5
    svc = make_service(segments=1, size=4 * MiB, default_kv_lease_ttl=lease)
    rewrite_under_leases(svc)
    refused = start(svc, "c")
    assert (refused.code, refused.retry_after_ms) == (ErrorCode.NO_AVAILABLE_HANDLE, 0)
    clock.advance(lease)
    assert start(svc, "c").code == 0
