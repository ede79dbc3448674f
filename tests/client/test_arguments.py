"""Every argument of `Store`, `StoreConfig`, `ReplicateConfig` and the put methods: a bad value
raises `InvalidParams` naming the argument and the value, never another exception.

`StoreConfig` is checked before anything connects, so most cases need no pool; the cases that
only show once connected (the address to serve on, a segment larger than the machine, a put's
config) run against one node.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.client import AsyncStore, ReplicateConfig, Store, StoreConfig
from kvpool.config import parse_duration, parse_size
from kvpool.errors import InvalidParams
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="16MiB")


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("master", "nowhere", ["master", "nowhere"]),
        ("master", "x:99999", ["master", "99999"]),
        ("master", 5, ["master"]),
        ("segment_size", "1XB", ["segment_size", "1XB"]),
        ("segment_size", 100, ["segment_size", "100", "4096"]),
        ("segment_size", "1000TiB", ["segment_size", "1000.0 TiB", "memory"]),
        ("segment_size", "99999999999PiB", ["segment_size", "maximum"]),
        ("segment_size", 1.5, ["segment_size", "1.5"]),
        ("arena_size", -1, ["arena_size", "-1"]),
        ("local_buffer_size", "lots", ["local_buffer_size", "lots"]),
        ("host", 5, ["host", "5"]),
        ("host", "", ["host"]),
        ("tenant", "", ["tenant"]),
        ("tenant", "t" * 1000, ["tenant", "255"]),
        ("cluster_id", "", ["cluster_id"]),
        ("cluster_id", 5, ["cluster_id"]),
        ("protocol", "rdma", ["protocol", "rdma"]),
        ("protocol", ["tcp"], ["protocol"]),
        ("verify_checksum", "x", ["verify_checksum", "'x'"]),
        ("rpc_timeout", "x", ["rpc_timeout", "'x'"]),
        ("rpc_timeout", float("inf"), ["rpc_timeout", "inf"]),
        ("rpc_timeout", float("nan"), ["rpc_timeout", "nan"]),
        ("rpc_timeout", 0, ["rpc_timeout", "0"]),
        ("transfer_timeout", "x", ["transfer_timeout", "'x'"]),
        ("transfer_timeout", 1e12, ["transfer_timeout", "1000000000000", "31536000"]),
        ("heartbeat_interval", 1e12, ["heartbeat_interval", "3600"]),
        ("heartbeat_interval", True, ["heartbeat_interval", "True"]),
        ("task_poll_interval", -1, ["task_poll_interval", "-1"]),
    ],
)
def test_a_bad_store_argument_is_invalid_params_naming_it(
    field: str, value: Any, words: list[str]
) -> None:
    with pytest.raises(InvalidParams) as info:
        StoreConfig(**{field: value})
    for word in words:
        assert word in info.value.message, info.value.message
    with pytest.raises(InvalidParams):  # the Store's keywords are the same fields
        Store(**{field: value})


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"replica_num": 0}, ["replica_num", "0"]),
        ({"replica_num": "2"}, ["replica_num", "'2'"]),
        ({"soft_pin_action": "pin"}, ["soft_pin_action", "pin"]),
        ({"soft_pin_action": 7}, ["soft_pin_action", "7"]),
        ({"soft_pin_action": "ENABLE", "soft_pin_ttl_ms": -1}, ["soft_pin_ttl_ms", "-1"]),
        ({"soft_pin_action": "ENABLE", "soft_pin_ttl_ms": 10**15}, ["soft_pin_ttl_ms", "maximum"]),
        ({"soft_pin_ttl_ms": 5}, ["soft_pin_ttl_ms", "ENABLE"]),
        ({"with_hard_pin": "yes"}, ["with_hard_pin", "yes"]),
        ({"preferred_segments": "seg"}, ["preferred_segments", "seg"]),
        ({"preferred_segments": [""]}, ["preferred_segments"]),
        ({"prefer_alloc_in_same_node": 1}, ["prefer_alloc_in_same_node", "1"]),
        ({"group_ids": "abc"}, ["group_ids", "abc"]),
    ],
)
def test_a_bad_replicate_config_is_invalid_params_naming_it(
    kwargs: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(InvalidParams) as info:
        ReplicateConfig(**kwargs)
    for word in words:
        assert word in info.value.message, info.value.message


@pytest.mark.parametrize("workers", [0, "x", 1.5, True, 10**6])
def test_async_store_workers_must_be_a_small_positive_int(workers: Any) -> None:
    with pytest.raises(InvalidParams, match="workers"):
        AsyncStore(workers=workers)


def test_sizes_and_durations_have_sane_maxima() -> None:
    with pytest.raises(InvalidParams, match=r"--client-ttl.*maximum"):
        parse_duration("99999999999999999999h", name="--client-ttl")
    with pytest.raises(InvalidParams, match="not a duration"):
        parse_duration(float("nan"))
    with pytest.raises(InvalidParams, match="maximum"):
        parse_duration(float("inf"))
    with pytest.raises(InvalidParams, match=r"x.*maximum"):
        parse_size("2PiB", name="x")
    assert parse_duration("24h") == 86400.0
    assert parse_size("1TiB") == 1 << 40


def test_what_only_a_connected_store_can_refuse_names_the_argument(one_node: Pool) -> None:
    with pytest.raises(InvalidParams, match=r"host.*8\.8\.8\.8"):
        Store(one_node.address, host="8.8.8.8", segment_size="1MiB")
    with Store(one_node.address) as s:
        with pytest.raises(InvalidParams, match=r"size: 1000\.0 TiB.*memory"):
            s.mount_segment("1000TiB")
        with pytest.raises(InvalidParams, match=r"config.*ReplicateConfig.*dict"):
            s.put("k", b"v", config={"replica_num": 2})  # type: ignore[arg-type]
        with pytest.raises(InvalidParams, match=r"config.*int"):
            s.batch_put(["a"], [b"x"], config=5)  # type: ignore[arg-type]
        with pytest.raises(InvalidParams, match="path"):
            s.mount_segment("1MiB", path=5)  # type: ignore[arg-type]
        with pytest.raises(InvalidParams, match="segment_name"):
            s.batch_replica_clear(["k"], 5)  # type: ignore[arg-type]
        assert not s.exists("k")
        # The master refuses a soft pin above its --max-kv-soft-pin-ttl (24h): the message
        # says which value and which limit, not only the key.
        two_days = ReplicateConfig(soft_pin_action="ENABLE", soft_pin_ttl_ms=48 * 3600 * 1000)
        with pytest.raises(InvalidParams) as info:
            s.put("sp", b"v", two_days)
        assert "soft_pin_ttl_ms=172800000" in info.value.message
        assert "--max-kv-soft-pin-ttl" in info.value.message
        with pytest.raises(InvalidParams, match="soft_pin_ttl_ms=172800000"):
            s.upsert("sp", b"v", two_days)
