"""SGLang's own test of its Mooncake HiCache backend, run against kvpool.

    python sglang_own_test.py shim|native --master HOST:PORT

Runs the five cases of `sglang/srt/mem_cache/storage/mooncake_store/test_mooncake_store.py`
(SGLang 0.5.23) exactly as its `__main__` does: `shim` with SGLang's own `MooncakeStore` on
the kvpool-backed `mooncake.store` (configured through SGLang's MOONCAKE_* environment, as its
docs say), `native` with the same test code and `MooncakeStore` replaced by
`kvpool.engines.sglang.KvpoolHiCacheStorage` (the cases only use the `HiCacheStorage`
interface: set/get/exists and batch_set_v1/batch_get_v1/batch_exists). One JSON line out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("backend", choices=["shim", "native"])
    ap.add_argument("--master", required=True)
    a = ap.parse_args()
    os.environ.update(
        MOONCAKE_MASTER=a.master,
        MOONCAKE_PROTOCOL="tcp",
        MOONCAKE_TE_META_DATA_SERVER="P2PHANDSHAKE",
        MOONCAKE_LOCAL_HOSTNAME="127.0.0.1",
        MOONCAKE_GLOBAL_SEGMENT_SIZE="0",
    )
    from sglang.srt.mem_cache.storage.mooncake_store import test_mooncake_store as t

    opened: list[Any] = []
    if a.backend == "native":
        from kvpool.engines.sglang import KvpoolHiCacheStorage

        def native(config: Any) -> Any:
            extra = {"master": a.master}
            backend = KvpoolHiCacheStorage(dataclasses.replace(config, extra_config=extra))
            opened.append(backend)
            return backend

        t.MooncakeStore = native
    cfg = t.make_hicache_storage_config
    cases = [
        ("single", t.test_single_operation),
        (
            "batch mha tp1",
            lambda: t.test_batch_operation(cfg(is_mla_model=False, tp_rank=0, tp_size=1)),
        ),
        (
            "batch mla tp1",
            lambda: t.test_batch_operation(cfg(is_mla_model=True, tp_rank=0, tp_size=1)),
        ),
        (
            "batch mha tp4",
            lambda: t.test_batch_operation(cfg(is_mla_model=False, tp_rank=1, tp_size=4)),
        ),
        (
            "batch mla tp8",
            lambda: t.test_batch_operation(cfg(is_mla_model=True, tp_rank=3, tp_size=8)),
        ),
    ]
    passed: list[str] = []
    failed: dict[str, str] = {}
    for name, case in cases:
        try:
            case()
            passed.append(name)
        except Exception as exc:  # report every case, as the test's own run would stop at one
            failed[name] = f"{type(exc).__name__}: {exc}"
    for backend in opened:
        backend.close()
    print(json.dumps({"backend": a.backend, "passed": passed, "failed": failed}), flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
