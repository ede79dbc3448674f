"""A single TCP write runs the caller's `meanwhile` while it waits for the server's answer
(the Store hashes the value there instead of after the write; issue 18, "Speed round 2").

What must hold: the bytes land exactly, `meanwhile` runs once per attempt and only for a
single TCP write, and a `meanwhile` that raises never leaves its connection (with an unread
answer) in the pool.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import xxhash

from kvpool.client import Store
from kvpool.client.datapath import DataPath
from kvpool.protocol.messages import GetReplicaList, ReplicaListReply, Response
from kvpool.rpc.client import RpcClient
from kvpool.transfer import (
    SegmentLocation,
    SegmentMemory,
    TransferEngine,
    TransferOp,
    TransferRequest,
    TransferServer,
)
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401

Make = Callable[..., TransferEngine]


def _served(make_engine: Make, closing: Callable[[Any], Any], mem: SegmentMemory) -> Any:
    server = closing(TransferServer())
    server.add_segment(mem)
    loc = SegmentLocation(mem.name, mem.size, "elsewhere", server.endpoint, "")
    return make_engine({mem.name: loc}, "auto"), server


def test_a_tcp_write_calls_meanwhile_once_and_lands_exactly(
    make_engine: Make, closing: Callable[[Any], Any]
) -> None:
    with SegmentMemory.create("mw", 4 << 20) as mem:
        eng, _ = _served(make_engine, closing, mem)
        data = os.urandom(1 << 20)
        calls: list[int] = []
        eng.transfer([TransferRequest(TransferOp.WRITE, data, "mw", 4096)], None, lambda: None)
        eng.transfer(
            [TransferRequest(TransferOp.WRITE, data, "mw", 4096)],
            None,
            lambda: calls.append(1),
        )
        assert calls == [1]
        assert bytes(mem.buffer[4096 : 4096 + len(data)]) == data
        back = bytearray(len(data))
        eng.transfer([TransferRequest(TransferOp.READ, back, "mw", 4096)], None, calls.clear)
        assert back == data
        assert calls == [1]  # a read does not call it


def test_a_meanwhile_that_raises_closes_its_connection_and_the_next_write_works(
    make_engine: Make, closing: Callable[[Any], Any]
) -> None:
    with SegmentMemory.create("mwr", 1 << 20) as mem:
        eng, _ = _served(make_engine, closing, mem)
        eng.transfer([TransferRequest(TransferOp.WRITE, b"warm", "mwr", 0)])  # route known

        def boom() -> None:
            raise RuntimeError("meanwhile failed")

        with pytest.raises(RuntimeError, match="meanwhile failed"):
            eng.transfer([TransferRequest(TransferOp.WRITE, b"x" * 8192, "mwr", 0)], None, boom)
        # Had the connection gone back to the pool, this write would read the answer left
        # unread above as its own and the next request would be out of step.
        for i in range(3):
            value = bytes([i + 1]) * 5000
            eng.transfer([TransferRequest(TransferOp.WRITE, value, "mwr", 100)])
            back = bytearray(5000)
            eng.transfer([TransferRequest(TransferOp.READ, back, "mwr", 100)])
            assert back == value


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="32MiB")


@pytest.mark.parametrize("mode", ["wait", "nowait"])
@pytest.mark.parametrize("size", [1 << 20, (2 << 20) + 5])
def test_a_large_tcp_put_records_the_checksum_taken_while_it_waited(
    one_node: Pool, mode: str, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    digests: list[int | None] = []
    real = DataPath.write_hashing

    def spy(self: DataPath, view: memoryview, segment: str, offset: int) -> Any:
        got = real(self, view, segment, offset)
        digests.append(got[1])
        return got

    monkeypatch.setattr(DataPath, "write_hashing", spy)
    value = os.urandom(size)
    with Store(one_node.address, protocol="tcp", write_mode=mode) as s:  # type: ignore[arg-type]
        key = f"tcp-{mode}-{size}"
        s.warm_up()
        assert s.put(key, value) is True
        s.flush()
        assert digests == [xxhash.xxh3_64_intdigest(value)]  # taken during the write
        with RpcClient(one_node.address, response_type=Response) as rpc:
            recorded = rpc.call_as(GetReplicaList(key), ReplicaListReply).checksum
        assert recorded == xxhash.xxh3_64_intdigest(value)
        assert s.get(key) == value
        s.remove_all(force=True)
