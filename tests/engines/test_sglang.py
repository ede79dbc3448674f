"""SGLang 0.5.23 on kvpool: its own Mooncake HiCache test through the shim, the same cases on
the native backend, and its real host KV pool (`MHATokenToKVPoolHost`) moving pages between two
processes through a live pool, natively (loaded as SGLang's `dynamic` backend) and through its
built-in `mooncake` backend on the shim.

Needs the SGLang environment (scripts/engines/build sglang); skipped without it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvtest.pool import Pool

pytestmark = pytest.mark.engine("sglang")

CASES = ["single", "batch mha tp1", "batch mla tp1", "batch mha tp4", "batch mla tp8"]


@pytest.mark.parametrize("backend", ["shim", "native"])
def test_sglang_own_mooncake_store_test(
    engine: Callable[[str], Any], live_pool: Pool, backend: str
) -> None:
    sg = engine("sglang")
    got = sg.run("sglang_own_test.py", backend, "--master", live_pool.address)
    assert got["failed"] == {}
    assert got["passed"] == CASES


@pytest.mark.parametrize("route", ["native", "shim"])
def test_sglang_host_pool_pages_between_processes(
    engine: Callable[[str], Any], live_pool: Pool, route: str
) -> None:
    sg = engine("sglang")
    seed = "1" if route == "native" else "2"
    args = ("--route", route, "--master", live_pool.address, "--pages", "32", "--seed", seed)
    wrote = sg.run("sglang_pages.py", "write", *args)
    assert wrote["stored"] == 32
    read = sg.run("sglang_pages.py", "read", *args)
    assert read["exists"] == 32
    assert read["loaded"] == 32
    assert read["bit_exact"] is True
    assert read["exists_prefix_with_gap"] == 2
