"""LMCache's Mooncake connector, replayed against kvpool's `setup(dict)` and `bind_to_numa_node`.

LMCache 0.5.x (lmcache/v1/storage_backend/connector/mooncakestore_connector.py) builds a setup
dict from its `extra_config` (only the keys it names, `mooncake_`-prefixed ones stripped, plus
its own defaults for the sizes, "tcp" and `device_name`), calls `bind_to_numa_node` from
`mooncake.store` when it knows the GPU's node, then `store.setup(dict)`, falling back to the
positional form only on TypeError, and ignores setup's answer. `remote_url:
mooncakestore://HOST:PORT/` is not passed on. The replay below runs that sequence in a module
named like LMCache's (what `kvpool.compat.mooncake.lmcache_url` recognises), with LMCache's
real shape of config object, against a live kvpool master. kvpool only: the wheel ignores the
URL and refuses the minimal config (tests/compat/test_setup.py).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import kvpool.compat.mooncake as compat
from kvtest.procs import Proc, kvpool_proc

CONNECTOR_MODULE = "lmcache.v1.storage_backend.connector.mooncakestore_connector"

# The connector's sequence, in a module that LMCache's name is given to (exec'd below).
_REPLAY = """
_DEFAULTS = {"global_segment_size": "3355443200", "local_buffer_size": "1073741824",
             "protocol": "tcp", "device_name": ""}
_PASSTHROUGH = {"local_hostname", "metadata_server", "global_segment_size",
                "local_buffer_size", "protocol", "device_name", "master_server_address"}


def build_setup_dict(extra):
    plain = {k: str(v) for k, v in extra.items() if k in _PASSTHROUGH and v is not None}
    plain.update({k[len("mooncake_"):]: str(v) for k, v in extra.items()
                  if k.startswith("mooncake_") and v is not None})
    for k, v in _DEFAULTS.items():
        plain.setdefault(k, v)
    return plain


class StoreConfig:
    def __init__(self, setup_config):
        self.setup_config = setup_config


def setup_store(store, config):
    # LMCache's module-level helper: its `config` is the store config, which has no URL.
    try:
        store.setup(config.setup_config)  # the answer is ignored, as LMCache does
    except TypeError:
        raise AssertionError("the dict form must not raise TypeError")


def connect(store_cls, bind, lmcache_config, numa_id):
    store = store_cls()
    config = StoreConfig(build_setup_dict(lmcache_config.extra_config))
    if numa_id is not None:
        bind(numa_id)
    setup_store(store, config)
    return store
"""


@dataclass
class _EngineConfig:
    """The two attributes of LMCache's `LMCacheEngineConfig` the connector reads."""

    remote_url: str | None
    extra_config: dict[str, Any] = field(default_factory=dict)


def _connector() -> types.ModuleType:
    module = types.ModuleType(CONNECTOR_MODULE)
    exec(compile(_REPLAY, f"<{CONNECTOR_MODULE}>", "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    proc: Proc = kvpool_proc("master", "--host", "127.0.0.1", "--port", "0")
    try:
        yield proc.wait_ready(timeout=30)
    finally:
        proc.stop()


SMALL = {"mooncake_global_segment_size": "16MB", "mooncake_local_buffer_size": "16MB"}


def _connect(config: _EngineConfig, numa_id: int | None = None) -> Any:
    return _connector().connect(
        compat.MooncakeDistributedStore, compat.bind_to_numa_node, config, numa_id
    )


def test_a_minimal_config_and_the_url_make_a_working_store(master: str) -> None:
    store = _connect(_EngineConfig(f"mooncakestore://{master}/", dict(SMALL)), numa_id=0)
    try:
        assert store.health_check() == 0
        assert store.get_hostname().startswith("localhost:")  # MooncakeConfig's default
        assert store.put("lmcache-minimal", b"kv" * 100) == 0
        # Another store of the URL's master sees it: the URL named the pool.
        other = compat.MooncakeDistributedStore()
        assert other.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) == 0
        try:
            assert other.get("lmcache-minimal") == b"kv" * 100
        finally:
            other.close()
    finally:
        store.close()


def test_the_url_wins_over_a_master_the_config_names(master: str) -> None:
    extra = {**SMALL, "master_server_address": "127.0.0.1:1", "local_hostname": "127.0.0.1"}
    store = _connect(_EngineConfig(f"mooncakestore://{master}/?device=", extra))
    try:
        assert store.health_check() == 0
        assert store.put("lmcache-url", b"u") == 0
    finally:
        store.close()


def test_the_url_comes_from_the_environment_when_the_config_has_none(
    master: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMCACHE_REMOTE_URL", f"mooncakestore://{master}/")
    store = _connect(_EngineConfig(None, dict(SMALL)))
    try:
        assert store.health_check() == 0
    finally:
        store.close()


def test_the_url_is_not_read_outside_lmcache(master: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMCACHE_REMOTE_URL", f"mooncakestore://{master}/")
    store = compat.MooncakeDistributedStore()
    try:
        # No master in the dict and no LMCache caller: Mooncake's default, where none listens.
        config = {"global_segment_size": 0, "master_server_addr": "127.0.0.1:1"}
        assert store.setup(config) != 0
    finally:
        store.close()


def test_bind_to_numa_node_answers_none_as_the_wheel(caplog: pytest.LogCaptureFixture) -> None:
    assert compat.bind_to_numa_node(0) is None
    with caplog.at_level(logging.WARNING, logger="kvpool.compat.mooncake.numa"):
        assert compat.bind_to_numa_node(4096) is None
    assert "Invalid NUMA node" in caplog.text
    for bad in ("0", 1.5, None):
        with pytest.raises(TypeError):
            compat.bind_to_numa_node(bad)  # type: ignore[arg-type]
