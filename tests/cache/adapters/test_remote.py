"""resp and s3 specifics against the real servers: values that were tampered with on the server
are refused, prefixes keep deployments apart, an unreachable server fails tasks, not threads."""

from __future__ import annotations

import os
from typing import Any

import pytest

from kvpool.cache.adapters.blocking import BlockingAdapter
from kvpool.cache.adapters.registry import create_adapter
from kvpool.cache.adapters.threaded import ThreadedAdapter
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryLayout, MemoryObj
from kvtest.procs import free_port


def obj(key: ObjectKey, data: bytes) -> MemoryObj:
    o = MemoryObj(key, MemoryLayout.of_bytes(len(data)))
    o.write(data)
    return o


def test_resp_refuses_a_value_changed_on_the_server(redis_server: str) -> None:
    import redis

    host, port = redis_server.rsplit(":", 1)
    a = create_adapter({"type": "resp", "host": host, "port": int(port), "key_prefix": "t1:"})
    r = redis.Redis(host=host, port=int(port))
    try:
        drv = BlockingAdapter(a)
        k = ObjectKey("m", 0, b"\x01")
        assert drv.store([k], [obj(k, b"A" * 1000)]).ok
        name = "t1:" + k.to_string()
        raw = bytearray(r.get(name) or b"")
        raw[-1] ^= 1
        r.set(name, bytes(raw))
        dest = MemoryObj(k, MemoryLayout.of_bytes(1000))
        assert drv.load([k], [dest]) == Bitmap(1)
        # Another prefix is another namespace.
        b = create_adapter({"type": "resp", "host": host, "port": int(port), "key_prefix": "t2:"})
        try:
            assert BlockingAdapter(b).lookup_and_lock([k]) == Bitmap(1)
        finally:
            b.close()
    finally:
        r.close()
        a.close()


def test_unreachable_redis_fails_tasks_and_lookups_per_key() -> None:
    port = free_port()  # nothing listens here
    a = create_adapter({"type": "resp", "port": port, "socket_timeout_s": 1.0})
    try:
        drv = BlockingAdapter(a)
        k = ObjectKey("m", 0, b"\x02")
        res = drv.store([k], [obj(k, b"x" * 10)])
        assert not res.ok and res.error
        assert drv.lookup_and_lock([k]) == Bitmap(1)
        assert drv.load([k], [MemoryObj(k, MemoryLayout.of_bytes(10))]) == Bitmap(1)
    finally:
        a.close()


def test_s3_refuses_a_tampered_object_and_deletes_unlocked_keys(s3_endpoint: str) -> None:
    import boto3

    bucket = "t-" + os.urandom(4).hex()
    spec: dict[str, Any] = {
        "type": "s3",
        "endpoint_url": s3_endpoint,
        "bucket": bucket,
        "create_bucket": True,
        "access_key_id": "test",
        "secret_access_key": "test",
        "prefix": "p/",
    }
    a = create_adapter(spec)
    assert isinstance(a, ThreadedAdapter)
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    try:
        drv = BlockingAdapter(a)
        ks = [ObjectKey("m/x", 0, bytes([i])) for i in range(3)]
        assert drv.store(ks, [obj(k, bytes([i]) * 5000) for i, k in enumerate(ks)]).ok
        client.put_object(Bucket=bucket, Key="p/" + ks[0].to_string(), Body=b"garbage")
        dest = [MemoryObj(k, MemoryLayout.of_bytes(5000)) for k in ks]
        assert drv.load(ks, dest).get_indices_list() == [1, 2]
        assert drv.lookup_and_lock([ks[1]]) == Bitmap(1, 1)
        assert a.delete(ks[1:]) == [False, True]  # ks[1] is locked by the lookup
        drv.unlock([ks[1]])
        assert drv.lookup_and_lock(ks).get_indices_list() == [0, 1]
        drv.unlock(ks[:2])
    finally:
        client.close()
        a.close()


@pytest.mark.parametrize("bad", [{"type": "s3"}, {"type": "s3", "bucket": "b", "timeout_s": 0}])
def test_s3_config_is_validated(bad: dict[str, Any]) -> None:
    from kvpool.errors import InvalidParams

    with pytest.raises(InvalidParams):
        create_adapter(bad)


def test_plugin_errors_name_the_module_and_class(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvpool.errors import InvalidParams

    (tmp_path / "not_an_adapter.py").write_text("class Thing:\n    pass\n\nclass Boom:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in (
        {"type": "plugin", "module_path": "no_such_module_xyz", "class_name": "A"},
        {"type": "plugin", "module_path": "not_an_adapter", "class_name": "Thing"},
        {"type": "plugin", "module_path": "not_an_adapter", "class_name": "Missing"},
        {"type": "plugin", "module_path": "not_an_adapter", "class_name": "not valid"},
    ):
        with pytest.raises(InvalidParams, match="plugin"):
            create_adapter(spec)


def test_two_engines_share_chunks_through_the_kvpool_pool(kvpool_master_for_l2: str) -> None:
    from kvpool.cache.config import StorageManagerConfig
    from kvpool.cache.keys import TokenHasher
    from kvpool.cache.manager import StorageManager

    spec = {
        "type": "kvpool",
        "master": kvpool_master_for_l2,
        "key_prefix": f"e{os.urandom(4).hex()}/",
    }
    tokens = list(range(5000, 5000 + 64 * 5 + 7))
    layout = MemoryLayout(((2, 64, 8),), ("float16",))
    values = [os.urandom(layout.nbytes) for _ in range(5)]
    with StorageManager(StorageManagerConfig(adapters=(spec,))) as prefill:  # type: ignore[arg-type]
        keys = TokenHasher(chunk_size=64).keys("org/m", 0, tokens)
        prefill.store(keys, values, layout)
        assert prefill.wait_stores(20) and prefill.store_stats().stored_keys == 5
    with StorageManager(StorageManagerConfig(adapters=(spec,))) as decode:  # type: ignore[arg-type]
        keys = TokenHasher(chunk_size=64).keys("org/m", 0, tokens)
        h = decode.submit_prefetch_task(keys, layout)
        assert decode.wait_prefetch(h, 20) == 5
        with decode.read_prefetched_results(keys) as objs:
            assert [bytes(o.buffer) for o in objs] == values
            assert objs[0].arrays()[0].shape == (2, 64, 8)
        decode.finish_read_prefetched(keys)
