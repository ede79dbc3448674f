"""The strict small read in one call (`Reader.read` -> `DataPath.read_mapped` ->
`TransferEngine.held_mapping`): one memory replica on a segment this process already maps is
copied without a `SegmentHold`, and the guarantees stay: a clobbered replica fails its checksum
(and is reported), a segment not mapped yet or reached over TCP takes the general path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvpool.client import Store
from kvpool.errors import ChecksumMismatch, ErrorCode
from kvpool.protocol.messages import GetReplicaList, ReplicaListReply
from kvpool.transfer.engine import TransferEngine
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401

SIZE = 4096


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="64MiB")


@pytest.fixture
def store(one_node: Pool) -> Iterator[Store]:
    with Store(one_node.address, segment_size=0) as s:
        yield s
        s.remove_all(force=True)


def _holds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = TransferEngine.hold_segment

    def counting(self: TransferEngine, name: str) -> object:
        calls.append(name)
        return real(self, name)

    monkeypatch.setattr(TransferEngine, "hold_segment", counting)
    return calls


def test_a_mapped_small_read_takes_no_segment_hold(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = bytes(range(256)) * (SIZE // 256)
    buf = bytearray(SIZE)
    store.register_buffer(memoryview(buf))
    try:
        assert store.put("strict-read-a", value)
        assert store.get_into("strict-read-a", memoryview(buf)) == SIZE  # maps the segment
        assert bytes(buf) == value
        buf[:] = bytes(SIZE)
        holds = _holds(monkeypatch)
        assert store.get_into("strict-read-a", memoryview(buf)) == SIZE
        assert bytes(buf) == value
        assert store.get("strict-read-a") == value
        assert store.put_from("strict-read-b", memoryview(buf))  # a write: the same
        assert store.get("strict-read-b") == value
        assert holds == []  # the old path took one hold per read and per write
    finally:
        store.unregister_buffer(memoryview(buf))


def test_a_clobbered_replica_still_fails_its_checksum(store: Store) -> None:
    value = b"\x5a" * SIZE
    assert store.put("strict-read-bad", value)
    assert store.get("strict-read-bad") == value
    rl = store._node.rpc.call_as(
        GetReplicaList("strict-read-bad", store._reader.tenant), ReplicaListReply
    )
    replica = rl.replicas[0]
    engine = store._open().engine
    with engine.hold_segment(replica.segment) as hold:
        hold.buffer[replica.offset] ^= 0xFF  # the bytes under the recorded checksum change
    with pytest.raises(ChecksumMismatch):
        store.get("strict-read-bad")


def test_a_tcp_store_reads_through_the_general_path(one_node: Pool) -> None:
    value = b"\x33" * SIZE
    with Store(one_node.address, segment_size=0, protocol="tcp") as s:
        try:
            assert s.put("strict-read-tcp", value)
            assert s.get("strict-read-tcp") == value
            assert s.get("strict-read-tcp") == value
        finally:
            s.remove_all(force=True)


def _batch(store: Store, prefix: str, n: int) -> tuple[list[str], list[bytes]]:
    keys = [f"{prefix}-{i:02d}" for i in range(n)]
    values = [bytes([i + 1]) * SIZE for i in range(n)]
    assert all(c == 0 for c in store.batch_put(keys, values))
    return keys, values


def test_a_mapped_batch_read_takes_no_segment_hold(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, values = _batch(store, "strict-batch", 8)
    buf = bytearray(SIZE * 9)
    whole = memoryview(buf)
    store.register_buffer(whole)
    try:
        views = [whole[i * SIZE : (i + 1) * SIZE] for i in range(9)]
        assert store.batch_get_into(keys[:1], views[:1]) == [SIZE]  # maps the segment
        holds = _holds(monkeypatch)
        got = store.batch_get_into([*keys, "strict-batch-missing"], views)
        assert got == [SIZE] * 8 + [int(ErrorCode.OBJECT_NOT_FOUND)]
        assert [bytes(v) for v in views[:8]] == values
        assert holds == []  # the old path held the segment once per batch
    finally:
        store.unregister_buffer(whole)


def test_a_batch_off_the_common_case_answers_per_key(store: Store) -> None:
    keys, values = _batch(store, "strict-batch-odd", 4)
    rl = store._node.rpc.call_as(GetReplicaList(keys[1], store._reader.tenant), ReplicaListReply)
    replica = rl.replicas[0]
    with store._open().engine.hold_segment(replica.segment) as hold:
        hold.buffer[replica.offset] ^= 0xFF  # key 1 fails its checksum
    buf = bytearray(SIZE * 4)
    whole = memoryview(buf)
    store.register_buffer(whole)
    try:
        views = [whole[i * SIZE : (i + 1) * SIZE] for i in range(4)]
        views[3] = views[3][: SIZE // 2]  # key 3's buffer is too small
        got = store.batch_get_into(keys, views)
        assert got[0] == SIZE and got[2] == SIZE
        assert got[1] == int(ErrorCode.CHECKSUM_MISMATCH)
        assert got[3] == int(ErrorCode.INVALID_PARAMS)
        assert bytes(views[0]) == values[0] and bytes(views[2]) == values[2]
    finally:
        store.unregister_buffer(whole)
