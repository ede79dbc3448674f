"""StorageManagerConfig from CLI flags and JSON adapter specs; policies by name."""

from __future__ import annotations

import json
from typing import Any

import click
import pytest
from click.testing import CliRunner

from kvpool.cache.adapters.registry import adapter_types, parse_adapter_config
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.config import StorageManagerConfig, storage_manager_options
from kvpool.cache.keys import ObjectKey
from kvpool.cache.policy import (
    AdapterDescriptor,
    DefaultPrefetchPolicy,
    create_store_policy,
    trim_load_plan_to_prefix,
    validate_load_plan,
)
from kvpool.errors import InvalidParams


def test_from_cli_args_builds_a_validated_config(tmp_path: Any) -> None:
    cfg = StorageManagerConfig.from_cli_args(
        l2_adapter=['{"type":"mock"}', json.dumps({"type": "fs", "base_path": str(tmp_path)})],
        l2_store_policy="skip_l1",
        l2_prefetch_policy="spread",
        l1_size="64MiB",
        l1_read_ttl="30s",
    )
    assert [a.type_name for a in cfg.adapters] == ["mock", "fs"]
    assert cfg.l1.capacity_bytes == 64 << 20 and cfg.l1.read_ttl_s == 30.0
    assert cfg.store_policy == "skip_l1" and cfg.prefetch_policy == "spread"


@pytest.mark.parametrize(
    "spec",
    [
        "not json",
        '{"no_type": 1}',
        '{"type": "nosuch"}',
        '{"type": "fs"}',
        '{"type": "fs", "base_path": "/x", "typo_option": 1}',
        '{"type": "fault", "inner": {"type": "mock"}, "load_failure_rate": 2}',
        '["type", "mock"]',
    ],
)
def test_bad_adapter_specs_fail_at_start_with_invalid_params(spec: str) -> None:
    with pytest.raises(InvalidParams):
        StorageManagerConfig.from_cli_args(l2_adapter=[spec])


def test_unknown_policies_and_bad_limits_are_refused() -> None:
    with pytest.raises(InvalidParams):
        StorageManagerConfig(store_policy="nope")
    with pytest.raises(InvalidParams):
        StorageManagerConfig(prefetch_policy="nope")
    with pytest.raises(InvalidParams):
        StorageManagerConfig(prefetch_max_in_flight=0)
    for timeout in (0.0, -1.0, float("inf"), float("nan"), True):
        with pytest.raises(InvalidParams):
            StorageManagerConfig(prefetch_lookup_timeout_s=timeout)
    with pytest.raises(InvalidParams):
        create_store_policy("nope")


def test_environment_supplies_adapters_when_no_flag_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOL_L2_ADAPTERS", '[{"type": "mock"}]')
    assert [a.type_name for a in StorageManagerConfig.from_cli_args().adapters] == ["mock"]
    assert StorageManagerConfig.from_cli_args(
        l2_adapter=['{"type":"mock","capacity_bytes":"1MiB"}']
    ).adapters[0].to_dict() == {"type": "mock", "capacity_bytes": 1 << 20}
    monkeypatch.setenv("KVPOOL_L2_ADAPTERS", "{oops")
    with pytest.raises(InvalidParams):
        StorageManagerConfig.from_cli_args()


def test_click_options_reach_the_config() -> None:
    seen: list[StorageManagerConfig] = []

    @click.command()
    @storage_manager_options
    def cmd(**kw: Any) -> None:
        seen.append(StorageManagerConfig.from_cli_args(**kw))

    result = CliRunner().invoke(
        cmd,
        ["--l2-adapter", '{"type":"mock"}', "--l2-prefetch-policy", "spread", "--l1-size", "8MiB"],
    )
    assert result.exit_code == 0, result.output
    assert seen[0].prefetch_policy == "spread" and seen[0].l1.capacity_bytes == 8 << 20
    assert seen[0].prefetch_lookup_timeout_s == 30.0
    result = CliRunner().invoke(cmd, ["--l2-prefetch-lookup-timeout", "500ms"])
    assert result.exit_code == 0, result.output
    assert seen[1].prefetch_lookup_timeout_s == 0.5
    bad = CliRunner().invoke(cmd, ["--l2-store-policy", "nope"])
    assert bad.exit_code != 0


def test_every_builtin_type_is_listed_and_parses_lazily() -> None:
    assert {"mock", "fs", "resp", "s3", "kvpool", "plugin", "fault"} <= set(adapter_types())
    assert parse_adapter_config({"type": "mock"}).type_name == "mock"


def test_trim_and_validate_load_plans() -> None:
    n = 6
    found = {0: Bitmap.from_indices(n, [0, 1, 2, 4, 5])}
    plan = DefaultPrefetchPolicy().select_load_plan([], found, [AdapterDescriptor(0, "mock")])
    validate_load_plan(plan, found, n)
    trimmed, p = trim_load_plan_to_prefix(plan, n)
    assert p == 3 and trimmed[0].get_indices_list() == [0, 1, 2]
    with pytest.raises(InvalidParams):
        validate_load_plan({0: Bitmap(n, 4)}, found, n)  # key 3 was not found
    with pytest.raises(InvalidParams):
        validate_load_plan(
            {0: Bitmap(n, 1), 1: Bitmap(n, 1)}, {0: Bitmap(n, 1), 1: Bitmap(n, 1)}, n
        )
    two = {0: Bitmap.from_indices(n, [0, 2]), 1: Bitmap.from_indices(n, [1, 3])}
    assert trim_load_plan_to_prefix(two, n)[1] == 4


def test_object_key_round_trip_in_config_json() -> None:
    k = ObjectKey("a/b", 1, b"\x00\x01")
    assert ObjectKey.from_string(k.to_string()) == k


def test_adapter_modules_and_their_dependencies_load_only_when_configured() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kvpool.cache as c\n"
        "c.create_adapter({'type': 'mock'}).close()\n"
        "heavy = [m for m in ('boto3', 'redis', 'kvpool.client', 'kvpool.cache.adapters.s3',"
        " 'kvpool.cache.adapters.resp', 'kvpool.cache.adapters.pool') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
