"""kvpool.engines' engine-independent parts against a live pool: `EngineSettings` (the
backends' pool settings from an engine's config mapping) and `PinnedRegions` (zero-copy
pages by raw address). These need no engine, so they run in every `make test`."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.engines.memory import PinnedRegions, view_at
from kvpool.engines.settings import DEFAULT_MASTER, EngineSettings
from kvpool.errors import ErrorCode, InvalidParams
from kvtest.pool import Pool


def test_settings_from_an_engine_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPOOL_MASTER", raising=False)
    monkeypatch.delenv("MOONCAKE_MASTER", raising=False)
    assert EngineSettings.from_mapping(None).master == DEFAULT_MASTER
    s = EngineSettings.from_mapping(
        {
            "kvpool.master": "127.0.0.1:6000",
            "kvpool.segment_size": "16MiB",
            "kvpool.protocol": "tcp",
            "kvpool.tenant": "t1",
            "chunk_size": 256,  # the engine's own key: ignored
        },
        prefix="kvpool.",
    )
    assert (s.master, s.segment_size, s.protocol, s.tenant) == (
        "127.0.0.1:6000",
        16 << 20,
        "tcp",
        "t1",
    )
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:7000")
    assert EngineSettings.from_mapping({}).master == "127.0.0.1:7000"
    assert s.with_master("127.0.0.1:1").master == "127.0.0.1:1"


@pytest.mark.parametrize(
    ("raw", "word"),
    [
        ({"protocol": "rdma"}, "protocol"),
        ({"segment_size": "lots"}, "segment_size"),
        ({"segment_size": True}, "segment_size"),
        ({"master": ""}, "master"),
        ({"master": 5}, "master"),
        ({"transfer_timeout": -1}, "transfer_timeout"),
        ({"rpc_timeout": "soon"}, "rpc_timeout"),
    ],
)
def test_settings_refuse_what_they_cannot_use(raw: dict[str, object], word: str) -> None:
    with pytest.raises(InvalidParams, match=word):
        EngineSettings.from_mapping(raw)


def test_pinned_regions_move_pages_by_address(live_pool: Pool) -> None:
    store = EngineSettings(master=live_pool.address).open_store()
    try:
        regions = PinnedRegions(store)
        host = np.zeros(64 << 10, dtype=np.uint8)  # a "host pool" of 16 pages of 4 KiB
        base = host.ctypes.data
        assert regions.register(base, host.nbytes) is True
        assert regions.register(base + 4096, 4096) is False  # inside: nothing to do
        with pytest.raises(InvalidParams, match="overlap"):
            regions.register(base - 4096, 8192)
        host[: 4 * 4096] = np.random.default_rng(1).integers(0, 255, 4 * 4096, dtype=np.uint8)
        keys = [f"page-{i}" for i in range(4)]
        addrs = [base + i * 4096 for i in range(4)]
        assert regions.put(keys, addrs, [4096] * 4) == [True] * 4
        # Stored before: still True (the pool keeps the first value of a key).
        assert regions.put(keys[:1] * 2, addrs[:1] * 2, [4096] * 2) == [True, True]
        got = regions.get([*keys, "never"], [base + (8 + i) * 4096 for i in range(5)], [4096] * 5)
        assert got[:4] == [4096] * 4
        assert got[4] == int(ErrorCode.OBJECT_NOT_FOUND)
        assert np.array_equal(host[8 * 4096 : 12 * 4096], host[: 4 * 4096])
        # Memory outside the registered region works too (a copy more on get).
        other = np.zeros(4096, dtype=np.uint8)
        assert regions.get(keys[1:2], [other.ctypes.data], [4096]) == [4096]
        assert np.array_equal(other, host[4096:8192])
        small = np.zeros(1024, dtype=np.uint8)
        assert regions.get(keys[:1], [small.ctypes.data], [1024]) == [int(ErrorCode.INVALID_PARAMS)]
        assert regions.exists([keys[0], "never"]) == [True, False]
        with pytest.raises(InvalidParams):
            regions.put(keys, addrs, [4096])
        with pytest.raises(InvalidParams):
            view_at(0, 16)
        regions.close()
        assert regions.covers(base, 16) is False
    finally:
        store.close()
