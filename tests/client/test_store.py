"""The Store against a real pool: a master and two `kvpool node` processes on loopback.

The test process is the client (its Store talks to the master over TCP and reads the nodes'
segments through shared memory); one test adds a second client process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from kvpool.client import AsyncStore, HealthStatus, ReplicateConfig, Store
from kvpool.errors import (
    ErrorCode,
    InvalidParams,
    NoSpace,
    ObjectHasLease,
    ObjectNotFound,
    StoreClosed,
)
from kvpool.protocol.messages import GetReplicaList, ReplicaListReply, Response
from kvpool.rpc.client import RpcClient
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.stores import emptied_after

SEGMENT = "32MiB"


@pytest.fixture(scope="module")
def two_nodes(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=2, segment_size=SEGMENT)


@pytest.fixture
def store(two_nodes: Pool) -> Iterator[Store]:
    with emptied_after(two_nodes.address) as s:
        yield s


def replicas_of(address: str, key: str) -> ReplicaListReply:
    with RpcClient(address, response_type=Response) as rpc:
        return rpc.call_as(GetReplicaList(key), ReplicaListReply)


# ---------------------------------------------------------------- put / get


@pytest.mark.parametrize("size", [1, 4096, (1 << 20) + 3, 5 << 20])
def test_put_then_get_returns_the_same_bytes(store: Store, size: int) -> None:
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert store.put(f"v{size}", value) is True
    assert store.get(f"v{size}") == value
    assert store.get_size(f"v{size}") == size


def test_put_accepts_any_buffer(store: Store) -> None:
    arr = np.arange(1000, dtype=np.float32)
    store.put("np", arr)
    store.put("ba", bytearray(b"abc"))
    store.put("mv", memoryview(b"xyz123")[2:])
    assert np.frombuffer(store.get("np"), np.float32).tolist() == arr.tolist()
    assert store.get("ba") == b"abc"
    assert store.get("mv") == b"z123"


def test_put_is_insert_if_absent_and_upsert_overwrites(store: Store) -> None:
    assert store.put("k", b"first") is True
    assert store.put("k", b"second") is False
    assert store.get("k") == b"first"
    store.upsert("k", b"third")  # same size: in place
    assert store.get("k") == b"third"
    store.upsert("k", b"a much longer value than before")  # another size: reallocated
    assert store.get("k") == b"a much longer value than before"
    store.upsert("fresh", b"new key")
    assert store.get("fresh") == b"new key"


def test_get_of_a_missing_key_raises_object_not_found(store: Store) -> None:
    with pytest.raises(ObjectNotFound) as info:
        store.get("nope")
    assert info.value.code == ErrorCode.OBJECT_NOT_FOUND
    assert isinstance(info.value, KeyError)
    with pytest.raises(ObjectNotFound):
        store.get_size("nope")
    assert store.exists("nope") is False


def test_replica_num_2_lands_on_two_distinct_segments(store: Store, two_nodes: Pool) -> None:
    store.put("two", b"x" * 10_000, ReplicateConfig(replica_num=2))
    reply = replicas_of(two_nodes.address, "two")
    assert reply.code == 0
    assert len({r.segment for r in reply.replicas}) == 2
    assert store.get("two") == b"x" * 10_000


def test_preferred_segment_is_used(store: Store, two_nodes: Pool) -> None:
    seg = two_nodes.node_endpoints[1] + "/0"
    store.put("pref", b"p" * 100, ReplicateConfig(preferred_segments=[seg]))
    assert [r.segment for r in replicas_of(two_nodes.address, "pref").replicas] == [seg]


# ---------------------------------------------------------------- batches


def test_batch_put_and_batch_get_report_key_by_key(store: Store) -> None:
    store.put("old", b"old value")
    codes = store.batch_put(["a", "old", "b"], [b"A" * 10, b"new value", b"B" * 5000])
    assert codes == [ErrorCode.OK, ErrorCode.OBJECT_ALREADY_EXISTS, ErrorCode.OK]
    got = store.batch_get(["a", "missing", "old", "b"])
    assert got == [b"A" * 10, None, b"old value", b"B" * 5000]
    assert store.batch_exists(["a", "missing", "b"]) == [True, False, True]
    assert store.batch_upsert(["a", "c"], [b"a2", b"c2"]) == [ErrorCode.OK, ErrorCode.OK]
    assert store.batch_get(["a", "c"]) == [b"a2", b"c2"]
    assert store.batch_get([]) == []


def test_batch_of_64_small_values(store: Store) -> None:
    keys = [f"small-{i}" for i in range(64)]
    values = [bytes([i]) * 4096 for i in range(64)]
    assert store.batch_put(keys, values) == [ErrorCode.OK] * 64
    assert store.batch_get(keys) == values


def test_zero_copy_put_from_and_get_into(store: Store) -> None:
    src = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)
    dst = np.zeros(4 << 20, dtype=np.uint8)
    store.register_buffer(src)
    store.register_buffer(dst)
    try:
        assert store.put_from("zc", src[: 2 << 20]) is True
        assert store.get_into("zc", dst) == 2 << 20
        assert np.array_equal(dst[: 2 << 20], src[: 2 << 20])
        assert store.batch_put_from(["z1", "z2"], [src[:100], src[100:1100]]) == [ErrorCode.OK] * 2
        n = store.batch_get_into(["z1", "nope", "z2"], [dst[:100], dst[100:200], dst[1000:3000]])
        assert n == [100, int(ErrorCode.OBJECT_NOT_FOUND), 1000]
        assert np.array_equal(dst[1000:2000], src[100:1100])
    finally:
        store.unregister_buffer(src)
        store.unregister_buffer(dst)


def test_data_written_by_another_client_process_reads_back(store: Store, two_nodes: Pool) -> None:
    code = (
        "import sys\n"
        "from kvpool.client import Store\n"
        "with Store(sys.argv[1]) as s:\n"
        "    assert s.put('from-other', bytes(range(256)) * 1000)\n"
        "    assert s.batch_put(['o1', 'o2'], [b'1' * 70000, b'2' * 3]) == [0, 0]\n"
    )
    subprocess.run([sys.executable, "-c", code, two_nodes.address], check=True, timeout=60)
    assert store.get("from-other") == bytes(range(256)) * 1000
    assert store.batch_get(["o1", "o2"]) == [b"1" * 70000, b"2" * 3]


# ---------------------------------------------------------------- remove


def test_remove_respects_read_leases_unless_forced(store: Store) -> None:
    store.put("r", b"v")
    store.get("r")  # grants a lease
    with pytest.raises(ObjectHasLease):
        store.remove("r")
    store.remove("r", force=True)
    assert store.exists("r") is False
    with pytest.raises(ObjectNotFound):
        store.remove("r")


def test_batch_remove_remove_all_and_by_regex(store: Store) -> None:
    store.batch_put(["p1", "p2", "q1", "q2", "q3"], [b"x"] * 5)
    assert store.batch_remove(["p1", "nope"]) == [ErrorCode.OK, ErrorCode.OBJECT_NOT_FOUND]
    assert store.remove_by_regex("^q") == 3
    assert store.remove_all() == 1
    assert store.batch_exists(["p1", "p2", "q1"]) == [False, False, False]


def test_remove_by_regex_takes_what_the_master_takes(store: Store) -> None:
    # The master matches with the `regex` package; the Store's check before sending must not
    # refuse what it accepts (Unicode properties such as \p{L}, which `re` does not know).
    store.batch_put(["letters", "digits1", "ünï"], [b"x"] * 3)
    assert store.remove_by_regex(r"^\p{L}+$") == 2
    assert store.remove_by_regex(r"\p{N}{2}") == 0  # no key has two digits in a row
    assert store.batch_exists(["letters", "digits1", "ünï"]) == [False, True, False]
    with pytest.raises(InvalidParams):
        store.remove_by_regex(r"\p{NoSuchProperty}")  # refused by both, before it is sent


# ---------------------------------------------------------------- bad input


def test_bad_input_gets_a_precise_error_and_leaves_nothing(store: Store) -> None:
    with pytest.raises(InvalidParams):
        store.put("", b"x")
    with pytest.raises(InvalidParams):
        store.put("empty", b"")
    with pytest.raises(InvalidParams):
        store.put(b"bytes-key", b"x")  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        store.put("x" * 5000, b"x")
    with pytest.raises(InvalidParams):
        store.batch_put(["a", "b"], [b"x"])
    with pytest.raises(InvalidParams):
        store.batch_put(["a", "a"], [b"x", b"y"])
    with pytest.raises(InvalidParams):
        store.remove_by_regex("(")
    with pytest.raises(InvalidParams):
        store.batch_put(["a", "b"], [b"x", b"y"], ReplicateConfig(group_ids=["g"]))
    assert store.batch_exists(["empty", "a", "b"]) == [False, False, False]


def test_a_value_larger_than_the_pool_is_no_space(store: Store) -> None:
    with pytest.raises(NoSpace) as info:
        store.put("huge", b"\0" * (65 << 20))
    assert info.value.code == ErrorCode.NO_AVAILABLE_HANDLE
    assert store.exists("huge") is False
    codes = store.batch_put(["fits", "huge"], [b"ok", b"\0" * (65 << 20)])
    assert codes == [ErrorCode.OK, ErrorCode.NO_AVAILABLE_HANDLE]
    assert store.get("fits") == b"ok"


def test_buffers_must_be_registered_and_large_enough(store: Store) -> None:
    buf = np.zeros(1000, np.uint8)
    with pytest.raises(InvalidParams):
        store.put_from("u", buf)
    with pytest.raises(InvalidParams):
        store.get_into("u", buf)
    store.put("big", b"b" * 2000)
    store.register_buffer(buf)
    try:
        with pytest.raises(InvalidParams):
            store.get_into("big", buf)  # 1000 bytes for a 2000-byte value
        assert store.batch_get_into(["big"], [buf]) == [int(ErrorCode.INVALID_PARAMS)]
        with pytest.raises(InvalidParams):
            store.get_into("big", bytes(2000))  # read-only memory
        with pytest.raises(InvalidParams):
            store.batch_get_into(["big", "x"], [buf])
        with pytest.raises(InvalidParams):
            store.register_buffer(buf[10:20])  # overlaps what is registered
    finally:
        store.unregister_buffer(buf)
    with pytest.raises(InvalidParams):
        store.unregister_buffer(buf)


# ---------------------------------------------------------------- lifecycle


def test_close_is_idempotent_and_later_calls_raise(two_nodes: Pool) -> None:
    s = Store(two_nodes.address)
    assert s.health_check() is HealthStatus.HEALTHY
    s.close()
    s.close()
    assert s.health_check() is HealthStatus.CLOSED
    for call in (lambda: s.get("k"), lambda: s.put("k", b"v"), lambda: s.exists("k")):
        with pytest.raises(StoreClosed):
            call()


def test_a_store_with_a_segment_contributes_it_and_unmounts_on_close(two_nodes: Pool) -> None:
    with Store(two_nodes.address, segment_size="8MiB") as own, Store(two_nodes.address) as other:
        (seg,) = own.segments
        other.put("on-own", b"o" * 5000, ReplicateConfig(preferred_segments=[seg]))
        assert [r.segment for r in replicas_of(two_nodes.address, "on-own").replicas] == [seg]
        assert own.get("on-own") == b"o" * 5000  # a local memcpy
        assert other.get("on-own") == b"o" * 5000  # through the owner's shared memory
    with Store(two_nodes.address) as s:
        assert s.exists("on-own") is False  # its only replica left with the segment


def test_an_unreachable_master_fails_fast_with_an_rpc_error() -> None:
    from kvtest.procs import free_port

    with pytest.raises(Exception) as info:
        Store(f"127.0.0.1:{free_port()}", rpc_timeout=2)
    assert getattr(info.value, "code", None) in (ErrorCode.RPC_FAIL, ErrorCode.RPC_TIMEOUT)


def test_async_store_has_the_same_methods(two_nodes: Pool) -> None:
    async def main() -> None:
        async with AsyncStore(two_nodes.address) as s:
            assert await s.put("async", b"value") is True
            got = await asyncio.gather(*(s.get("async") for _ in range(8)))
            assert got == [b"value"] * 8
            assert await s.batch_put(["a1", "a2"], [b"1", b"2"]) == [ErrorCode.OK] * 2
            assert await s.batch_get(["a1", "a2", "a3"]) == [b"1", b"2", None]
            assert await s.health_check() is HealthStatus.HEALTHY
            assert await s.remove_all(force=True) == 3
        assert await s.health_check() is HealthStatus.CLOSED
        with pytest.raises(StoreClosed):
            await s.get("async")

    asyncio.run(main())


def test_memory_registered_by_address_serves_zero_copy_calls(store: Store) -> None:
    from kvpool.transfer.registration import view_at

    arr = np.zeros(8192, dtype=np.uint8)
    arr[:4096] = np.random.default_rng(5).integers(1, 256, 4096, dtype=np.uint8)
    addr = arr.ctypes.data
    store.register_buffer(addr, arr.nbytes)  # as a torch tensor's data_ptr() would be
    try:
        assert store.put_from("by-addr", view_at(addr, 4096)) is True
        assert store.get_into("by-addr", view_at(addr + 4096, 4096)) == 4096
        assert np.array_equal(arr[4096:], arr[:4096])
    finally:
        store.unregister_buffer(addr)
    with pytest.raises(InvalidParams):
        store.put_from("by-addr-2", view_at(addr, 4096))


def test_one_store_serves_many_threads_at_once(store: Store) -> None:
    import threading

    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(50):
                key = f"t{t}-{i}"
                value = bytes([t, i]) * (100 + 37 * i)
                assert store.put(key, value)
                assert store.get(key) == value
            keys = [f"t{t}-{i}" for i in range(50)]
            got = store.batch_get(keys)
            assert got == [bytes([t, i]) * (100 + 37 * i) for i in range(50)]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors[0]
    assert not any(th.is_alive() for th in threads)
