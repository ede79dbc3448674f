"""What the Store does when things break: dead nodes, failed writes, a restarted master,
corrupted bytes, late reads. Real processes throughout; faults are injected by killing them or
by writing into segment memory, never by mocking the client."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.client import ReplicateConfig, Store
from kvpool.errors import (
    ChecksumMismatch,
    ErrorCode,
    LeaseExpired,
    ObjectNotFound,
    TransferError,
)
from kvpool.protocol.messages import (
    GetReplicaList,
    ReplicaListReply,
    Response,
    Stats,
    StatsReply,
)
from kvpool.rpc.client import RpcClient
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import free_port, kvpool_proc, wait_until


def stats(address: str) -> StatsReply:
    with RpcClient(address, response_type=Response) as rpc:
        return rpc.call_as(Stats(), StatsReply)


def replicas_of(address: str, key: str) -> ReplicaListReply:
    with RpcClient(address, response_type=Response) as rpc:
        return rpc.call_as(GetReplicaList(key), ReplicaListReply)


def test_kill_9_of_a_node_loses_only_what_it_alone_held(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(
        nodes=2, segment_size="16MiB", client_ttl="1s", master_args=("--client-dead-ttl", "1s")
    )
    seg0, seg1 = (e + "/0" for e in p.node_endpoints)
    rng = np.random.default_rng(3)
    only0 = {
        f"only0-{i}": rng.integers(0, 256, 3000 + i, dtype=np.uint8).tobytes() for i in range(5)
    }
    only1 = {
        f"only1-{i}": rng.integers(0, 256, 5000 + i, dtype=np.uint8).tobytes() for i in range(5)
    }
    both = {f"both-{i}": rng.integers(0, 256, 7000 + i, dtype=np.uint8).tobytes() for i in range(5)}
    with Store(p.address) as s:
        for k, v in only0.items():
            assert s.put(k, v, ReplicateConfig(preferred_segments=[seg0]))
        for k, v in only1.items():
            assert s.put(k, v, ReplicateConfig(preferred_segments=[seg1]))
        for k, v in both.items():
            assert s.put(k, v, ReplicateConfig(replica_num=2))
        assert {r.segment for r in replicas_of(p.address, "only0-0").replicas} == {seg0}
        p.kill_node(0)
        # The master notices after client_ttl and drops the replicas on the dead segment.
        wait_until(
            lambda: seg0 not in {x.name for x in stats(p.address).segments},
            timeout=15,
            what="the master to expire the killed node",
        )
        for k in only0:
            with pytest.raises(ObjectNotFound):
                s.get(k)
        assert s.batch_get(list(only1)) == list(only1.values())
        assert s.batch_get(list(both)) == list(both.values())
        for k, v in both.items():
            assert s.get(k) == v


def test_a_put_whose_write_fails_is_revoked_and_leaves_no_trace(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=2, segment_size="16MiB", client_ttl="30s")
    dead = p.node_endpoints[0] + "/0"
    with Store(p.address, protocol="tcp", transfer_timeout=5) as s:
        p.kill_node(0)  # the master still lists its segment for client_ttl
        with pytest.raises(TransferError):
            s.put("k", b"v" * 1000, ReplicateConfig(preferred_segments=[dead]))
        assert s.exists("k") is False
        assert stats(p.address).processing == 0
        codes = s.batch_put(
            ["a", "b"], [b"a" * 10, b"b" * 10], ReplicateConfig(preferred_segments=[dead])
        )
        assert all(c != ErrorCode.OK for c in codes)
        assert s.batch_exists(["a", "b"]) == [False, False]
        assert stats(p.address).processing == 0
        # The keys are free again: a put elsewhere succeeds.
        alive = p.node_endpoints[1] + "/0"
        assert s.put("k", b"second try", ReplicateConfig(preferred_segments=[alive]))
        assert s.get("k") == b"second try"


def test_a_restarted_master_gets_the_segments_back_through_remount(pool: PoolFactory) -> None:  # noqa: F811
    port = free_port()
    address = f"127.0.0.1:{port}"
    master = kvpool_proc("master", "--port", str(port), name="master 1")
    try:
        master.wait_ready()
        with Store(address, segment_size="4MiB", heartbeat_interval=0.1) as s:
            (seg,) = s.segments
            master.kill9()
            master = kvpool_proc("master", "--port", str(port), name="master 2")
            master.wait_ready()
            # The heartbeat fails, reconnects, is told NEED_REMOUNT and remounts.
            wait_until(
                lambda: seg in {x.name for x in stats(address).segments},
                timeout=20,
                what="the store to remount its segment at the new master",
            )
            assert s.put("after-restart", b"hello again")
            assert s.get("after-restart") == b"hello again"
            assert [r.segment for r in replicas_of(address, "after-restart").replicas] == [seg]
    finally:
        master.stop()


def test_corrupted_bytes_fail_the_checksum_unless_checking_is_off(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=0)
    with Store(p.address, segment_size="4MiB") as owner:
        (seg,) = owner.segments
        owner.put("c", b"precious kv cache" * 100)
        (r,) = replicas_of(p.address, "c").replicas
        # Flip a byte of the stored replica, in the owner's own segment memory.
        mem, _ = owner._node.segments[seg]  # type: ignore[index]
        mem.buffer[r.offset + 5] ^= 0xFF
        with pytest.raises(ChecksumMismatch) as info:
            owner.get("c")
        assert info.value.code == ErrorCode.CHECKSUM_MISMATCH
        buf = np.zeros(4096, np.uint8)
        owner.register_buffer(buf)
        assert owner.batch_get_into(["c"], [buf]) == [int(ErrorCode.CHECKSUM_MISMATCH)]
        # A batch hashes each value right after copying it: the bad one is caught, the good
        # one reads back.
        owner.put("fine", b"f" * 1000)
        assert owner.batch_get_into(["c", "fine"], [buf[:2048], buf[2048:]]) == [
            int(ErrorCode.CHECKSUM_MISMATCH),
            1000,
        ]
        with pytest.raises(ChecksumMismatch):
            owner.batch_get(["fine", "c"])
        with Store(p.address, verify_checksum=False) as lax:
            got = lax.get("c")
            assert got != b"precious kv cache" * 100 and len(got) == 1700
            assert lax.batch_get(["c", "fine", "absent"]) == [got, b"f" * 1000, None]
        # The batch fast path (one segment, one replica each) falls back and still names the
        # key: a missing key reads None, the corrupt one raises.
        assert owner.batch_get(["fine", "absent"]) == [b"f" * 1000, None]
        # A large value is copied and hashed chunk by chunk: a flip in its last chunk counts.
        big = np.random.default_rng(9).integers(0, 256, 2 << 20, dtype=np.uint8).tobytes()
        owner.put("big", big)
        assert owner.get("big") == big
        (r,) = replicas_of(p.address, "big").replicas
        mem.buffer[r.offset + len(big) - 1] ^= 0x01
        with pytest.raises(ChecksumMismatch):
            owner.get("big")


def test_a_read_that_outlives_its_lease_is_refused(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="64MiB", master_args=("--default-kv-lease-ttl", "1ms"))
    with Store(p.address, protocol="tcp") as s:
        s.put("slow", b"\1" * (16 << 20))
        with pytest.raises(LeaseExpired) as info:
            s.get("slow")  # 16 MiB over TCP takes well over 1 ms
        assert info.value.code == ErrorCode.LEASE_EXPIRED


def test_a_read_moves_on_to_the_next_replica_when_one_fails(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=2, segment_size="16MiB", client_ttl="30s")
    with Store(p.address, protocol="tcp", transfer_timeout=5) as s:
        values = {f"r{i}": bytes([i]) * (1000 + i) for i in range(6)}
        for k, v in values.items():
            assert s.put(k, v, ReplicateConfig(replica_num=2))
        first = {k: replicas_of(p.address, k).replicas[0].segment for k in values}
        # Kill the node that holds the first-listed replica of r0 (placement is random).
        victim = next(i for i, e in enumerate(p.node_endpoints) if first["r0"] == e + "/0")
        p.kill_node(victim)  # the master still lists both replicas for client_ttl
        on_dead = [k for k in values if first[k] == first["r0"]]
        for k in on_dead:
            assert s.get(k) == values[k]
        assert s.batch_get(list(values)) == list(values.values())


@pytest.mark.parametrize("arena_size", ["0", "4MiB"], ids=["putstart", "arena"])
def test_a_put_interrupted_by_an_unexpected_exception_is_revoked(
    pool: PoolFactory,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    arena_size: str,
) -> None:
    # Fault injection on the data path: anything other than a transfer error code (a concurrent
    # close(), KeyboardInterrupt, a bug) escaping mid-write must leave nothing behind: the
    # PutStart revoked (or a retried put would answer "already exists" for
    # put_start_discard_timeout), or, through an arena, nothing committed and the arena free.
    p = pool(nodes=1, segment_size="16MiB")
    with Store(p.address, arena_size=arena_size) as s:
        data = s._open()

        def broken(*args: object, **kwargs: object) -> list[ErrorCode]:
            raise KeyboardInterrupt

        monkeypatch.setattr(data, "transfer", broken)
        monkeypatch.setattr(data, "move_many", broken)
        with pytest.raises(KeyboardInterrupt):
            s.put("k", b"v" * 1000)
        monkeypatch.undo()
        assert stats(p.address).processing == 0
        assert s.exists("k") is False
        if s._arenas is not None and s._arenas._current is not None:
            assert s._arenas._current.users == 0  # the interrupted put let go of it
        assert s.put("k", b"second try") is True
        assert s.get("k") == b"second try"


def test_a_replica_that_fails_its_checksum_is_reported_dropped_and_copied_again(
    pool: PoolFactory,  # noqa: F811
) -> None:
    # Two segments of two Stores (so the test can reach one replica's memory); replica_num 2.
    p = pool(nodes=1, segment_size="16MiB")
    value = b"precious kv cache" * 100
    with Store(p.address, segment_size="4MiB") as owner:
        (mine,) = owner.segments
        # Preferring this Store's segment puts its replica first in the master's list, so it
        # is the one every reader on this host tries first.
        cfg = ReplicateConfig(replica_num=2, preferred_segments=[mine])
        assert owner.put("c", value, cfg)
        reps = replicas_of(p.address, "c").replicas
        assert len(reps) == 2 and reps[0].segment == mine
        bad = reps[0]
        mem, _ = owner._node.segments[mine]  # type: ignore[index]
        mem.buffer[bad.offset + 5] ^= 0xFF

        # The read fails the checksum on the corrupt replica, reports it, and answers the right
        # bytes from the other one; the master drops the reported replica at once.
        assert owner.get("c") == value
        now = {(r.segment, r.offset) for r in replicas_of(p.address, "c").replicas}
        assert (bad.segment, bad.offset) not in now

        # The master dropped the reported replica and copies the object back to two.
        def repaired() -> bool:
            now = {r.segment: r.offset for r in replicas_of(p.address, "c").replicas}
            if len(now) != 2:
                return False
            off = now[mine]  # the copy back to this segment holds the right bytes again
            return bytes(mem.buffer[off : off + len(value)]) == value

        wait_until(repaired, timeout=20, what="the bad replica to be replaced")
        assert owner.get("c") == value
