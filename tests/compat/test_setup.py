"""setup() in every form Mooncake accepts, MooncakeConfig, ReplicateConfig, and life-cycle edges.

Runs against both backends (conftest.py). Rows that cannot run on the real wheel say why in their
skip: an unreachable master costs Mooncake 90 s, and most calls before setup() crash it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from kvtest.procs import free_port, wait_until

# Seven positional arguments then the optional ones, as in store_py.cpp.
OPTIONAL = (None, False, "", "default", False, 9300)


def _only(backend: Any, name: str, why: str) -> None:
    if backend.name != name:
        pytest.skip(f"{backend.name}: {why}")


def _roundtrip(store: Any, key: str = "setup-probe") -> None:
    assert store.put(key, b"ok") == 0
    assert store.get(key) == b"ok"


def test_positional_setup_gives_the_hostname_a_port(backend: Any) -> None:
    store = backend.new()
    assert store.setup(*backend.setup_args()) == 0
    host, _, port = store.get_hostname().rpartition(":")
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    assert store.health_check() == 0
    _roundtrip(store)


def test_positional_setup_takes_the_optional_arguments(backend: Any) -> None:
    store = backend.new()
    assert store.setup(*backend.setup_args(), *OPTIONAL) == 0
    _roundtrip(store)


def test_a_hostname_with_a_port_keeps_it(backend: Any) -> None:
    port = free_port()
    store = backend.new()
    assert store.setup(*backend.setup_args(hostname=f"127.0.0.1:{port}")) == 0
    assert store.get_hostname() == f"127.0.0.1:{port}"
    _roundtrip(store)


@pytest.mark.parametrize("size", ["16MB", "16 MB", "16mb", str(16 << 20), 16 << 20])
def test_dict_setup_reads_human_sizes(backend: Any, size: object) -> None:
    store = backend.new()
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": backend.metadata_server,
        "global_segment_size": size,
        "local_buffer_size": size,
        "protocol": "tcp",
        "master_server_addr": backend.master,
    }
    assert store.setup(config) == 0
    assert store.get_hostname().startswith("127.0.0.1:")
    _roundtrip(store)


@pytest.mark.parametrize(
    "change",
    [
        {"global_segment_size": "50%"},
        {"global_segment_size": 100},  # non-zero but under 1 KiB
        {"local_buffer_size": "lots"},
    ],
    ids=["percent", "tiny-segment", "bad-buffer"],
)
def test_dict_setup_refuses_bad_values_with_minus_600(backend: Any, change: dict[str, Any]) -> None:
    config: dict[str, Any] = {
        "local_hostname": "127.0.0.1",
        "metadata_server": backend.metadata_server,
        "master_server_addr": backend.master,
    }
    for k, v in change.items():
        if v is None:
            del config[k]
        else:
            config[k] = v
    store = backend.new()
    assert store.setup(config) == -600
    assert store.health_check() == 1


@pytest.mark.parametrize("missing", ["metadata_server", "local_hostname"])
def test_dict_setup_without_a_required_key(backend: Any, missing: str) -> None:
    """The wheel refuses a dict without `local_hostname` or `metadata_server` (-600); kvpool
    takes MooncakeConfig's defaults ("localhost", "P2PHANDSHAKE") instead, because LMCache
    forwards only the keys its config names and ignores setup's answer (docs/compat.md,
    "Differs on purpose")."""
    config: dict[str, Any] = {
        "local_hostname": "127.0.0.1",
        "metadata_server": backend.metadata_server,
        "master_server_addr": backend.master,
    }
    del config[missing]
    store = backend.new()
    if backend.name == "mooncake":
        assert store.setup(config) == -600
        assert store.health_check() == 1
        return
    assert store.setup(config) == 0
    if missing == "local_hostname":
        assert store.get_hostname().startswith("localhost:")
    _roundtrip(store)


def test_p2phandshake_needs_no_metadata_server(backend: Any) -> None:
    store = backend.new()
    args = list(backend.setup_args())
    args[1] = "P2PHANDSHAKE"
    assert store.setup(*args) == 0
    _roundtrip(store)


@pytest.mark.parametrize("form", ["etcd://127.0.0.1:1", "127.0.0.1:1", "redis://127.0.0.1:1"])
def test_every_metadata_server_form_is_accepted_and_not_needed(backend: Any, form: str) -> None:
    _only(backend, "kvpool", "Mooncake needs a live etcd/redis metadata service for these forms")
    store = backend.new()
    args = list(backend.setup_args())
    args[1] = form
    assert store.setup(*args) == 0
    _roundtrip(store)


def test_a_pure_client_contributes_no_segment(backend: Any) -> None:
    holder = backend.store()
    client = backend.store(segment=0)
    _roundtrip(client, "pure-client")
    holder.close()
    client2 = backend.store(segment=0)
    # With no segment left in the pool, a put has nowhere to go.
    assert client2.put("nowhere", b"x") == -200


def test_setup_again_after_close(backend: Any) -> None:
    store = backend.store()
    _roundtrip(store)
    assert store.close() == 0
    assert store.setup(*backend.setup_args()) == 0
    assert store.health_check() == 0
    _roundtrip(store, "after-reopen")


def test_an_unreachable_master_fails_setup_within_seconds(backend: Any) -> None:
    _only(backend, "kvpool", "Mooncake retries for about 90 s before it returns -1")
    store = backend.new()
    args = list(backend.setup_args())
    args[6] = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    rc = store.setup(*args)
    assert rc < 0
    assert time.monotonic() - started < 10
    assert store.health_check() == 1


def test_calls_before_setup_answer_instead_of_crashing(backend: Any) -> None:
    store = backend.new()
    # The calls the real wheel survives (most others segfault it).
    assert store.health_check() == 1
    assert store.get("k") == b""
    assert store.put_from("k", 4096, 10) < 0
    assert store.close() == 0
    if backend.name != "kvpool":
        return
    unavailable = -1010
    assert store.put("k", b"v") == unavailable
    assert store.upsert("k", b"v") == unavailable
    assert store.is_exist("k") == unavailable
    assert store.batch_is_exist(["k"]) == [unavailable]
    assert store.get_size("k") == unavailable
    assert store.remove("k") == unavailable
    assert store.remove_all() == unavailable
    assert store.get_into("k", 4096, 10) == unavailable
    assert store.get_batch(["a", "b"]) == [b""]
    assert store.get_buffer("k") is None
    assert store.register_buffer(4096, 10) == unavailable
    assert store.get_hostname() == ""


def test_calls_after_close_answer_instead_of_crashing(backend: Any) -> None:
    _only(backend, "kvpool", "most calls on a closed Mooncake store segfault")
    store = backend.store()
    assert store.close() == 0
    assert store.put("k", b"v") == -1010
    assert store.get_into("k", 4096, 10) == -1010
    assert store.batch_put_from(["a", "b"], [1, 2], [1, 1]) == [-1010, -1010]
    assert store.remove_by_regex(".*") == -1010


# --------------------------------------------------------------------------------------------
# MooncakeConfig: the environment variables and file format of mooncake/mooncake_config.py

ENV = (
    "MOONCAKE_CONFIG_PATH",
    "MOONCAKE_MASTER",
    "MOONCAKE_TE_META_DATA_SERVER",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MOONCAKE_DEVICE",
    "MOONCAKE_LOCAL_HOSTNAME",
    "LOCAL_HOSTNAME",
    "MOONCAKE_TENANT_ID",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _setup_from(store: Any, cfg: Any) -> int:
    return int(
        store.setup(
            cfg.local_hostname,
            cfg.metadata_server,
            cfg.global_segment_size,
            cfg.local_buffer_size,
            cfg.protocol,
            cfg.device_name,
            cfg.master_server_address,
        )
    )


def test_config_from_the_environment_sets_up_a_store(
    backend: Any, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("MOONCAKE_MASTER", backend.master)
    clean_env.setenv("MOONCAKE_TE_META_DATA_SERVER", backend.metadata_server)
    clean_env.setenv("MOONCAKE_PROTOCOL", "TCP")
    clean_env.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "16mb")
    clean_env.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "8MB")
    clean_env.setenv("MOONCAKE_DEVICE", "")
    clean_env.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    clean_env.setenv("MOONCAKE_TENANT_ID", "default")
    cfg = backend.config_cls.load_from_env()
    assert cfg.master_server_address == backend.master
    assert cfg.metadata_server == backend.metadata_server
    assert cfg.protocol == "tcp"  # normalised to lower case
    assert cfg.global_segment_size == 16 << 20  # Mooncake's MB is MiB
    assert cfg.local_buffer_size == 8 << 20
    assert cfg.local_hostname == "127.0.0.1"
    assert cfg.tenant_id == "default"
    store = backend.new()
    assert _setup_from(store, cfg) == 0
    _roundtrip(store)


def test_config_defaults_and_required_master(backend: Any, clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError):
        backend.config_cls.load_from_env()
    clean_env.setenv("MOONCAKE_MASTER", "127.0.0.1:50051")
    cfg = backend.config_cls.load_from_env()
    assert cfg.local_hostname == "localhost"
    assert cfg.metadata_server == "P2PHANDSHAKE"
    assert cfg.global_segment_size == 3355443200
    assert cfg.local_buffer_size == 1073741824
    assert cfg.protocol == "tcp"


def test_config_from_a_file(backend: Any, clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "mooncake.json"
    path.write_text(
        json.dumps(
            {
                "local_hostname": "127.0.0.1",
                "metadata_server": "P2PHANDSHAKE",
                "global_segment_size": "16MB",
                "local_buffer_size": 1 << 20,
                "protocol": "tcp",
                "device_name": "",
                "master_server_address": backend.master,
            }
        )
    )
    clean_env.setenv("MOONCAKE_CONFIG_PATH", str(path))
    cfg = backend.config_cls.load_from_env()
    assert cfg.global_segment_size == 16 << 20 and cfg.local_buffer_size == 1 << 20
    store = backend.new()
    assert _setup_from(store, cfg) == 0
    _roundtrip(store)


def test_config_reads_local_hostname_as_mooncake_tests_set_it(
    backend: Any, clean_env: pytest.MonkeyPatch
) -> None:
    _only(backend, "kvpool", "the wheel reads only MOONCAKE_LOCAL_HOSTNAME")
    clean_env.setenv("MOONCAKE_MASTER", backend.master)
    clean_env.setenv("LOCAL_HOSTNAME", "127.0.0.1")
    assert backend.config_cls.load_from_env().local_hostname == "127.0.0.1"
    clean_env.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.2")
    assert backend.config_cls.load_from_env().local_hostname == "127.0.0.2"


# --------------------------------------------------------------------------------------------
# ReplicateConfig and the enums


def test_replicate_config_defaults_and_text(backend: Any) -> None:
    mod = backend.module
    cfg = mod.ReplicateConfig()
    assert cfg.replica_num == 1 and cfg.nof_replica_num == 0 and cfg.dfs_replica_num == 0
    assert cfg.soft_pin_action == mod.SoftPinAction.PRESERVE
    assert cfg.soft_pin_ttl_ms is None and cfg.group_ids is None
    assert cfg.with_hard_pin is False and cfg.prefer_alloc_in_same_node is False
    assert cfg.preferred_segments == [] and cfg.preferred_segment == ""
    assert cfg.data_type == mod.ObjectDataType.UNKNOWN
    assert str(cfg) == (
        "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, "
        "soft_pin_action: PRESERVE, soft_pin_ttl_ms: default, with_hard_pin: 0, "
        "preferred_segments: [], preferred_nof_segments: [], prefer_alloc_in_same_node: 0, "
        "data_type: UNKNOWN }"
    )
    cfg.replica_num = 2
    cfg.soft_pin_action = mod.SoftPinAction.ENABLE
    cfg.soft_pin_ttl_ms = 500
    cfg.with_hard_pin = True
    cfg.preferred_segments = ["a:1", "b:2"]
    cfg.preferred_segment = "x:1"
    cfg.group_ids = ["g1"]
    cfg.data_type = mod.ObjectDataType.KVCACHE
    assert str(cfg) == (
        "ReplicateConfig: { replica_num: 2, nof_replica_num: 0, dfs_replica_num: 0, "
        "soft_pin_action: ENABLE, soft_pin_ttl_ms: 500, with_hard_pin: 1, "
        "preferred_segments: [a:1, b:2], preferred_segment (deprecated): x:1, "
        "preferred_nof_segments: [], prefer_alloc_in_same_node: 0, data_type: KVCACHE, "
        "group_ids: [g1] }"
    )


@pytest.mark.parametrize("field,value", [("soft_pin_ttl_ms", -1), ("replica_num", -1)])
def test_replicate_config_refuses_negative_numbers(backend: Any, field: str, value: int) -> None:
    cfg = backend.module.ReplicateConfig()
    with pytest.raises(TypeError):
        setattr(cfg, field, value)


def test_enums_have_mooncakes_numbers(backend: Any) -> None:
    mod = backend.module
    assert [int(x) for x in (mod.SoftPinAction.PRESERVE, mod.SoftPinAction.ENABLE)] == [0, 1]
    assert int(mod.SoftPinAction.DISABLE) == 2
    assert int(mod.ReplicaStatus.COMPLETE) == 3 and int(mod.ReplicaStatus.FAILED) == 5
    assert int(mod.ObjectDataType.KVCACHE) == 1 and int(mod.ObjectDataType.GENERAL) == 9
    assert mod.SoftPinAction.ENABLE.name == "ENABLE"


def test_old_with_soft_pin_field_maps_to_soft_pin_action(backend: Any) -> None:
    _only(backend, "kvpool", "0.3.13 dropped with_soft_pin (releases up to 0.3.12 had it)")
    mod = backend.module
    cfg = mod.ReplicateConfig()
    assert cfg.with_soft_pin is False
    cfg.with_soft_pin = True
    assert cfg.soft_pin_action == mod.SoftPinAction.ENABLE and cfg.with_soft_pin is True
    cfg.with_soft_pin = False
    assert cfg.soft_pin_action == mod.SoftPinAction.PRESERVE
    store = backend.store()
    cfg.with_soft_pin = True
    assert store.put("old-style-pin", b"x", cfg) == 0
    assert store.get("old-style-pin") == b"x"


def test_health_check_reports_a_lost_master(private_cluster: Any) -> None:
    store = private_cluster.backend.store()
    assert store.health_check() == 0
    private_cluster.stop_master()
    wait_until(lambda: store.health_check() == 2, timeout=30, what="health_check() == 2")
    assert store.get("anything") == b""
    assert store.close() == 0
    assert store.health_check() == 1
