"""The L2 adapter contract (seed 003's invariants), written once and run against every adapter.

LMCache repeats these checks per adapter; here each case is parametrized over the adapter kinds,
each backed by a real store: memory (mock), files under tmp_path (fs), a real redis-server
(resp), moto's S3 server over HTTP (s3), the failure-injecting proxy in pass-through mode
(fault), a third-party module loaded by path (plugin) and the kvpool pool itself (kvpool).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvpool.cache.adapters.base import L2Adapter, L2TaskId
from kvpool.cache.adapters.blocking import BlockingAdapter
from kvpool.cache.adapters.registry import create_adapter
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryLayout, MemoryObj
from kvpool.errors import InvalidParams, StoreClosed
from kvtest.procs import wait_until

ADAPTER_KINDS = ["mock", "fs", "resp", "s3", "fault", "plugin", "kvpool"]

PLUGIN_SOURCE = '''
from kvpool.cache.adapters.mock import MockAdapter


class ThirdPartyAdapter(MockAdapter):
    """Stands for an adapter shipped outside kvpool, loaded by module path."""

    def __init__(self, **params):
        super().__init__()
        self.params = params
'''


def _spec(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> dict[str, Any]:
    if kind == "mock":
        return {"type": "mock"}
    if kind == "fs":
        return {"type": "fs", "base_path": str(tmp_path / "l2")}
    if kind == "resp":
        host, port = request.getfixturevalue("redis_server").rsplit(":", 1)
        return {"type": "resp", "host": host, "port": int(port)}
    if kind == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = "conf-" + os.urandom(4).hex()
        return {
            "type": "s3",
            "endpoint_url": endpoint,
            "bucket": bucket,
            "create_bucket": True,
            "access_key_id": "test",
            "secret_access_key": "test",
        }
    if kind == "fault":
        return {"type": "fault", "inner": {"type": "mock"}, "seed": 7, "max_delay_s": 0.005}
    if kind == "plugin":
        mod = tmp_path / "third_party_l2.py"
        mod.write_text(PLUGIN_SOURCE)
        request.getfixturevalue("monkeypatch").syspath_prepend(str(tmp_path))
        return {
            "type": "plugin",
            "module_path": "third_party_l2",
            "class_name": "ThirdPartyAdapter",
            "adapter_params": {"region": "test"},
        }
    if kind == "kvpool":
        master = request.getfixturevalue("kvpool_master_for_l2")
        # One pool serves the whole session: a fresh key prefix keeps each test's keys apart.
        return {"type": "kvpool", "master": master, "key_prefix": f"t{os.urandom(4).hex()}/"}
    raise AssertionError(kind)


@pytest.fixture(params=ADAPTER_KINDS)
def make_adapter(
    request: pytest.FixtureRequest, tmp_path: Any
) -> Iterator[Callable[[], L2Adapter]]:
    """Builds adapters of one kind (all sharing one store); closes every one at teardown."""
    spec = _spec(request.param, request, tmp_path)
    made: list[L2Adapter] = []

    def make() -> L2Adapter:
        adapter = create_adapter(spec)
        made.append(adapter)
        return adapter

    try:
        yield make
    finally:
        for a in made:
            a.close()


@pytest.fixture
def adapter(make_adapter: Callable[[], L2Adapter]) -> L2Adapter:
    return make_adapter()


def keys_for(n: int, model: str = "org/model v1", start: int = 0) -> list[ObjectKey]:
    return [ObjectKey(model, 3, (start + i).to_bytes(8, "big")) for i in range(n)]


def objs_with(
    keys: list[ObjectKey], size: int = 4096, fill: Callable[[int], bytes] | None = None
) -> list[MemoryObj]:
    out = []
    for i, k in enumerate(keys):
        o = MemoryObj(k, MemoryLayout.of_bytes(size))
        o.write(fill(i) if fill else os.urandom(size))
        out.append(o)
    return out


def empty_like(objs: list[MemoryObj]) -> list[MemoryObj]:
    out = []
    for o in objs:
        e = MemoryObj(o.key, o.layout)
        e.array[:] = 0xEE
        out.append(e)
    return out


def assert_no_locks_left(adapter: L2Adapter) -> None:
    """Adapters that expose their lock table (mock, the threaded ones) must show it empty."""
    table = getattr(adapter, "locked_keys", None)
    if callable(table):
        assert table() == {}


def test_three_event_fds_are_distinct_within_and_across_adapters(
    make_adapter: Callable[[], L2Adapter],
) -> None:
    a, b = make_adapter(), make_adapter()
    fds = [*a.event_fds(), *b.event_fds()]
    assert all(isinstance(fd, int) and fd >= 0 for fd in fds)
    assert len(set(fds)) == 6


def test_task_ids_are_unique_per_adapter(adapter: L2Adapter) -> None:
    ks = keys_for(4)
    objs = objs_with(ks, 64)
    ids = []
    lookups = []
    for _ in range(5):
        ids.append(adapter.submit_store_task(ks, objs))
        lookups.append(adapter.submit_lookup_and_lock_task(ks))
        ids.append(lookups[-1])
    assert len(set(ids)) == len(ids)
    drv = BlockingAdapter(adapter)
    for tid in lookups:  # release exactly what each lookup locked
        found = drv._wait(
            adapter.get_lookup_and_lock_event_fd(),
            lambda tid=tid: adapter.query_lookup_and_lock_result(tid),
            "lookup",
        )
        drv.unlock(found.gather(ks))
    assert_no_locks_left(adapter)


def test_store_then_lookup_then_load_round_trips_bytes_exactly(adapter: L2Adapter) -> None:
    drv = BlockingAdapter(adapter)
    ks = keys_for(8)
    objs = objs_with(ks, 16 << 10)
    result = drv.store(ks, objs)
    assert result.ok, result.error
    assert drv.adapter.pop_completed_store_tasks() == {}  # reported exactly once
    found = drv.lookup_and_lock(ks)
    assert found == Bitmap(8, 8)
    dest = empty_like(objs)
    loaded = drv.load(ks, dest)
    drv.unlock(ks)
    assert loaded == Bitmap(8, 8)
    for src, dst in zip(objs, dest, strict=True):
        assert bytes(dst.buffer) == bytes(src.buffer)
    assert_no_locks_left(adapter)


def test_lookup_reports_missing_present_and_mixed_keys(adapter: L2Adapter) -> None:
    drv = BlockingAdapter(adapter)
    ks = keys_for(6, start=100)
    present = [ks[0], ks[2], ks[5]]
    assert drv.store(present, objs_with(present, 128)).ok
    assert drv.lookup_and_lock([ks[1]]) == Bitmap(1)
    assert drv.lookup_and_lock([ks[2]]) == Bitmap(1, 1)
    mixed = drv.lookup_and_lock(ks)
    assert mixed.get_indices_list() == [0, 2, 5]
    drv.unlock(present)
    drv.unlock([ks[2]])
    assert_no_locks_left(adapter)


def test_load_sets_only_bits_of_keys_that_exist_with_the_right_size(adapter: L2Adapter) -> None:
    drv = BlockingAdapter(adapter)
    ks = keys_for(3, start=200)
    src = objs_with(ks[:2], 256)
    assert drv.store(ks[:2], src).ok
    dest = [
        MemoryObj(ks[0], MemoryLayout.of_bytes(256)),
        MemoryObj(ks[1], MemoryLayout.of_bytes(512)),
        MemoryObj(ks[2], MemoryLayout.of_bytes(256)),
    ]
    loaded = drv.load(ks, dest)
    assert loaded.get_indices_list() == [0]  # key 1: wrong size; key 2: missing
    assert bytes(dest[0].buffer) == bytes(src[0].buffer)


def test_query_results_are_one_shot_and_unknown_ids_answer_none(adapter: L2Adapter) -> None:
    drv = BlockingAdapter(adapter)
    ks = keys_for(2, start=300)
    objs = objs_with(ks, 64)
    assert drv.store(ks, objs).ok
    tid = adapter.submit_lookup_and_lock_task(ks)
    first = drv._wait(
        adapter.get_lookup_and_lock_event_fd(),
        lambda: adapter.query_lookup_and_lock_result(tid),
        "lookup",
    )
    assert first == Bitmap(2, 2)
    assert adapter.query_lookup_and_lock_result(tid) is None
    lid = adapter.submit_load_task(ks, empty_like(objs))
    got = drv._wait(adapter.get_load_event_fd(), lambda: adapter.query_load_result(lid), "load")
    assert got == Bitmap(2, 2)
    assert adapter.query_load_result(lid) is None
    assert adapter.query_lookup_and_lock_result(L2TaskId(10**9)) is None
    assert adapter.query_load_result(L2TaskId(10**9)) is None
    drv.unlock(ks)


def test_unlock_of_never_locked_keys_is_harmless(adapter: L2Adapter) -> None:
    drv = BlockingAdapter(adapter)
    ks = keys_for(3, start=400)
    adapter.submit_unlock(ks)  # never stored, never locked
    adapter.submit_unlock([])
    objs = objs_with(ks, 64)
    assert drv.store(ks, objs).ok
    adapter.submit_unlock(ks)  # stored, not locked
    assert drv.lookup_and_lock(ks) == Bitmap(3, 3)
    drv.unlock(ks)
    adapter.submit_unlock(ks)  # one more than was taken
    assert drv.load(ks, empty_like(objs)) == Bitmap(3, 3)


def test_submits_validate_their_arguments(adapter: L2Adapter) -> None:
    ks = keys_for(2)
    with pytest.raises(InvalidParams):
        adapter.submit_store_task(ks, objs_with(ks[:1], 8))
    with pytest.raises(InvalidParams):
        adapter.submit_lookup_and_lock_task(["not a key"])  # type: ignore[list-item]
    with pytest.raises(InvalidParams):
        adapter.submit_load_task(ks, [])


def test_concurrent_store_and_prefetch_threads_never_see_wrong_bytes(adapter: L2Adapter) -> None:
    drv = BlockingAdapter(adapter)
    ks = keys_for(24, start=500)

    def fill(i: int) -> bytes:
        return bytes([i % 251]) * 2048

    objs = objs_with(ks, 2048, fill)
    errors: list[BaseException] = []
    done = threading.Event()
    loaded_any = []

    def storer() -> None:
        try:
            for i in range(0, len(ks), 4):
                assert drv.store(ks[i : i + 4], objs[i : i + 4]).ok
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            done.set()

    def prefetcher() -> None:
        try:
            for _ in range(200):  # bounded
                found = drv.lookup_and_lock(ks)
                hits = found.gather(ks)
                dest = [MemoryObj(k, MemoryLayout.of_bytes(2048)) for k in hits]
                loaded = drv.load(hits, dest)
                drv.unlock(hits)
                for i in loaded:
                    idx = ks.index(hits[i])
                    assert bytes(dest[i].buffer) == fill(idx)
                    loaded_any.append(idx)
                if done.is_set() and found.popcount() == len(ks):
                    return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=storer), threading.Thread(target=prefetcher)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert drv.lookup_and_lock(ks).popcount() == len(ks)
    drv.unlock(ks)
    assert loaded_any


def test_close_during_in_flight_work_is_clean_and_final(
    make_adapter: Callable[[], L2Adapter],
) -> None:
    before = threading.active_count()
    a = make_adapter()
    ks = keys_for(16, start=600)
    objs = objs_with(ks, 8192)
    for i in range(0, 16, 2):
        a.submit_store_task(ks[i : i + 2], objs[i : i + 2])
        a.submit_lookup_and_lock_task(ks)
        a.submit_load_task(ks[:2], empty_like(objs[:2]))
    fds = a.event_fds()
    a.close()
    a.close()  # idempotent
    with pytest.raises(StoreClosed):
        a.submit_store_task(ks[:1], objs[:1])
    with pytest.raises(StoreClosed):
        a.submit_lookup_and_lock_task(ks[:1])
    for fd in fds:  # closed (the number may already be reused, but not by an eventfd of ours)
        assert not _is_eventfd(fd)
    wait_until(
        lambda: threading.active_count() <= before, timeout=10, what="adapter threads to end"
    )


def _is_eventfd(fd: int) -> bool:
    try:
        return "eventfd" in os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
