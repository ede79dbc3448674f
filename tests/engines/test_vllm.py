"""vLLM 0.33's Mooncake store connector on kvpool, the code paths that run on a CPU: its set-up
with a tenant, the worker's buffer registration and key/buffer layout, the sending thread's
exists-then-put, the receiving thread's multi-buffer get in another process (bit-exact), the
replica-tier lookup, and the cache reset's remove_all (tests/engines/drivers/vllm_store_calls.py
says which vLLM functions it drives). vLLM itself needs a GPU: see docs/engines.md.

Needs the vLLM environment (scripts/engines/build vllm); skipped without it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvtest.pool import Pool
from kvtest.procs import wait_until

pytestmark = pytest.mark.engine("vllm")


def test_vllm_mooncake_store_calls_save_load_reset(
    engine: Callable[[str], Any], live_pool: Pool
) -> None:
    vl = engine("vllm")
    args = ("--master", live_pool.address, "--seed", "7", "--tenant", "vllm-a")
    saved = vl.run("vllm_store_calls.py", "save", *args)
    assert saved["register_buffer"] == [0] * 4
    assert all(r >= 0 for r in saved["put"]) and saved["exists_after"] == [1] * saved["keys"]
    loaded = vl.run("vllm_store_calls.py", "load", *args)
    assert loaded["bit_exact"] is True
    assert loaded["tiers"] == ["memory"]
    # Another tenant sees none of it.
    other = vl.start(
        "vllm_store_calls.py",
        "load",
        "--master",
        live_pool.address,
        "--seed",
        "7",
        "--tenant",
        "vllm-b",
    )
    wait_until(lambda: not other.alive(), timeout=180, what="the other tenant's load")
    assert other.stop() == 1
    reset = vl.run("vllm_store_calls.py", "reset", *args)
    assert reset["exists_after"] == [0] * reset["keys"]
