"""LMCache 0.5.6 on kvpool: its engine stores a KV cache in one process and another process
retrieves it bit-exact, through kvpool's native connector and through LMCache's own
`mooncakestore://` connector on the kvpool-backed `mooncake.store` (the shim).

Needs the LMCache environment (scripts/engines/build lmcache); skipped without it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvtest.pool import Pool
from kvtest.procs import wait_until

pytestmark = pytest.mark.engine("lmcache")


@pytest.mark.parametrize("route", ["native", "shim", "shim-minimal"])
def test_lmcache_store_then_retrieve_in_another_process(
    engine: Callable[[str], Any], live_pool: Pool, route: str
) -> None:
    lm = engine("lmcache")
    seed = {"native": "11", "shim": "21", "shim-minimal": "41"}[route]
    args = ("--route", route, "--master", live_pool.address, "--tokens", "1024", "--seed", seed)
    stored = lm.run("lmcache_roundtrip.py", "store", *args)
    assert stored["rounds"] == 1
    got = lm.run("lmcache_roundtrip.py", "retrieve", *args)
    assert got["retrieved"] == 1024
    assert got["bit_exact"] is True


def test_lmcache_native_partial_chunk_and_miss(
    engine: Callable[[str], Any], live_pool: Pool
) -> None:
    """A prompt that ends mid-chunk (1000 tokens: three full chunks and 232 tokens) comes back
    whole; a prompt never stored retrieves nothing and the driver says so."""
    lm = engine("lmcache")
    args = ("--route", "native", "--master", live_pool.address, "--tokens", "1000", "--seed", "31")
    lm.run("lmcache_roundtrip.py", "store", *args)
    assert lm.run("lmcache_roundtrip.py", "retrieve", *args)["bit_exact"] is True
    miss = lm.start(
        "lmcache_roundtrip.py",
        "retrieve",
        "--route",
        "native",
        "--master",
        live_pool.address,
        "--tokens",
        "512",
        "--seed",
        "9999",
    )
    wait_until(lambda: not miss.alive(), timeout=120, what="the miss driver to exit")
    assert miss.stop() == 1
    assert '"retrieved": 0' in miss.output(400)
