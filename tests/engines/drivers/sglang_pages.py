"""SGLang's real host KV pool moving pages through the native kvpool HiCache backend.

Runs under the SGLang environment (scripts/engines/build sglang) with this checkout's src/ on
PYTHONPATH (tests/engines/conftest.py):

    python sglang_pages.py write|read --master HOST:PORT --pages N --seed S [--route native|shim]

Both roles build the same `MHATokenToKVPoolHost` (SGLang's host pool for MHA models, page_first
layout, on CPU over a CPU device pool) and create the storage backend the way SGLang's cache
controller does: `StorageBackendFactory.create_backend("dynamic", config, host_pool)` with the
dynamic-backend config (`native`), or SGLang's built-in `mooncake` backend on the kvpool-backed
`mooncake.store` (`shim`), then `register_mem_pool_host`. `write` fills N pages with seeded
data and stores them with `batch_set_v1`; `read` checks `batch_exists`, loads them with
`batch_get_v1` into other slots of a zeroed pool and compares bit-exact. One JSON line out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

LAYERS, HEADS, HEAD_DIM, PAGE = 4, 2, 64, 16
DTYPE = torch.bfloat16


def host_pool(pages: int) -> Any:
    """SGLang's host pool over a CPU device pool, built as SGLang 0.5.23's cache controller
    does (sglang/srt/mem_cache/storage/aibrix_kvcache/unit_test.py, with keyword arguments)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    device = MHATokenToKVPool(
        size=pages * PAGE * 2,
        page_size=PAGE,
        dtype=DTYPE,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
    )
    return MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2,
        0,
        PAGE,
        "page_first",
        pin_memory=False,
        device_capacity_tokens=device.size
        if device.host_capacity_tokens is None
        else device.host_capacity_tokens,
        start_layer=device.start_layer,
        end_layer=device.end_layer,
        write_back_staging=device.hicache_write_back_staging,
    )


def storage(route: str, master: str, pool: Any) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    if route == "native":
        name = "dynamic"
        extra = {
            "backend_name": "kvpool",
            "module_path": "kvpool.engines.sglang",
            "class_name": "KvpoolHiCacheStorage",
            "interface_v1": 1,
            "master": master,
        }
    else:
        name = "mooncake"
        extra = {
            "master_server_address": master,
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "protocol": "tcp",
            "global_segment_size": 0,
        }
        os.environ.setdefault("MOONCAKE_MASTER", master)
    config = HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="kvpool-engines-test",
        extra_config=extra,
    )
    backend = StorageBackendFactory.create_backend(name, config, pool)
    backend.register_mem_pool_host(pool)
    return backend


def page_view(pool: Any, indices: torch.Tensor) -> torch.Tensor:
    # page_first: kv_buffer is [2, size, layers, heads, head_dim]
    return pool.kv_buffer[:, indices]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["write", "read"])
    ap.add_argument("--master", required=True)
    ap.add_argument("--route", choices=["native", "shim"], default="native")
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="timed rounds (a key set each)")
    a = ap.parse_args()
    pool = host_pool(a.pages)
    backend = storage(a.route, a.master, pool)
    rounds = [
        [f"kvpool-sglang-{a.route}-{a.seed}-{r}-{i}" for i in range(a.pages)]
        for r in range(a.rounds)
    ]
    keys = rounds[0]
    g = torch.Generator().manual_seed(a.seed)
    out: dict[str, Any] = {"route": a.route, "role": a.role, "pages": a.pages}
    write_at = torch.arange(PAGE, (a.pages + 1) * PAGE)
    shape = page_view(pool, write_at).shape
    expected = torch.randn(shape, generator=g).to(DTYPE)
    out["layout"] = list(pool.kv_buffer.shape)
    out["bytes"] = expected.numel() * expected.element_size()
    try:
        if a.role == "write":
            pool.kv_buffer[:, write_at] = expected
            times, stored = [], 0
            for round_keys in rounds:
                t0 = time.perf_counter()
                ok = backend.batch_set_v1(round_keys, write_at)
                times.append(time.perf_counter() - t0)
                stored += sum(ok)
            out["set_s"] = sorted(times)[len(times) // 2]
            out["stored"] = stored // len(rounds)
            passed = stored == a.pages * len(rounds)
        else:
            out["exists"] = backend.batch_exists(keys)
            read_at = torch.arange(pool.size - a.pages * PAGE, pool.size)
            times = []
            for round_keys in reversed(rounds):  # rounds[0] last: its pages are checked below
                pool.kv_buffer.zero_()
                t0 = time.perf_counter()
                ok = backend.batch_get_v1(round_keys, read_at)
                times.append(time.perf_counter() - t0)
            out["get_s"] = sorted(times)[len(times) // 2]
            out["loaded"] = sum(ok)
            got = page_view(pool, read_at)
            out["bit_exact"] = bool(torch.equal(got.view(torch.int16), expected.view(torch.int16)))
            missing = backend.batch_exists([*keys[:2], "kvpool-sglang-never-stored"])
            out["exists_prefix_with_gap"] = missing
            passed = all(ok) and out["bit_exact"] and out["exists"] == a.pages and missing == 2
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    print(json.dumps(out), flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
