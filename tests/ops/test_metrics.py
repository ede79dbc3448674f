"""`RequestCounters`: every request counted once, failures by reply code or exception, batch
items, one request in SAMPLE_EVERY timed; awaitable replies counted when they finish."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvpool.ops.metrics import SAMPLE_EVERY, RequestCounters, op_name
from kvpool.protocol.messages import BatchExistKey, Echo, EchoReply, Reply


def test_counts_requests_failures_and_batch_items() -> None:
    c = RequestCounters()

    def inner(req: Any, conn: Any) -> Any:
        if isinstance(req, BatchExistKey):
            return Reply(-704)
        return EchoReply(b"")

    h = c.wrap(inner)
    for _ in range(40):
        h(Echo(b""), None)
    for _ in range(3):
        h(BatchExistKey(["a", "b", "c"]), None)
    echo, batch = c.kinds[Echo], c.kinds[BatchExistKey]
    assert (echo.requests, echo.failures, echo.items) == (40, 0, 0)
    assert (batch.requests, batch.failures, batch.items) == (3, 3, 9)
    assert sum(echo.buckets) == 40 // SAMPLE_EVERY
    assert c.total("echo") == 40


def test_an_exception_is_a_failure_and_propagates() -> None:
    c = RequestCounters()

    def inner(req: Any, conn: Any) -> Any:
        raise RuntimeError("boom")

    h = c.wrap(inner)
    with pytest.raises(RuntimeError):
        h(Echo(b""), None)
    assert c.kinds[Echo].failures == 1


def test_awaitable_replies_are_counted_when_they_finish() -> None:
    c = RequestCounters()

    async def reply() -> Reply:
        await asyncio.sleep(0)
        return Reply(-1)

    h = c.wrap(lambda req, conn: reply())

    async def main() -> None:
        for _ in range(SAMPLE_EVERY):
            assert (await h(Echo(b""), None)).code == -1

    asyncio.run(main())
    assert c.kinds[Echo].failures == SAMPLE_EVERY
    assert sum(c.kinds[Echo].buckets) == 1


def test_op_names_are_mooncakes_snake_case() -> None:
    assert op_name(BatchExistKey) == "batch_exist_key"
    assert op_name(Echo) == "echo"
