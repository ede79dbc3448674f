"""vLLM 0.33's Mooncake store connector code on CPU tensors, on the kvpool-backed shim.

    python vllm_store_calls.py save|load|reset --master HOST:PORT --seed S [--tenant T]

vLLM itself does not run without a GPU here, so this drives the parts of its
`MooncakeStoreConnector` (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/) that
do on a CPU, with vLLM's own code wherever it exists:

* set-up: `vllm.distributed.mooncake_store.setup_mooncake_store` with a `MooncakeStoreConfig`
  (standalone-store mode, a `tenant_id`) on `mooncake.store.MooncakeDistributedStore`;
* the worker's KV registration: `register_buffer(storage.data_ptr(), storage.nbytes())` of
  each CPU KV cache tensor, and `RankLocalStoreLayout.register_kv_caches` /
  `prepare_values` / `key_for` (vLLM's key and buffer layout for a rank's blocks);
* `save`: the sending thread's calls, `batch_is_exist` then `batch_put_from_multi_buffers`
  of the missing chunks with a `ReplicateConfig`, as `KVCacheStoreSendingThread` makes them;
* `load` (another process): the receiving thread's `batch_get_into_multi_buffers` into zeroed
  caches, the tier lookup `_get_replica_tiers_by_key` (`batch_get_replica_desc`), bit-exact
  comparison of every block;
* `reset`: `remove_all(force=True)`, as the connector's cache reset does, then
  `batch_is_exist` finds nothing.

It also imports the connector, its scheduler and its worker modules (`MooncakeStoreConnector`,
`MooncakeStoreScheduler`, `MooncakeStoreWorker`), which is what a reduced vLLM install on CPU
allows. One JSON line out.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

LAYERS, BLOCKS, BLOCK, HEADS, HEAD = 4, 16, 16, 2, 64
DTYPE = torch.float16
CHUNKS = 8  # blocks saved


def caches(seed: int | None) -> list[torch.Tensor]:
    """vLLM's CPU-shaped KV cache per layer: [2, blocks, block_size, heads, head] (K and V)."""
    g = torch.Generator().manual_seed(seed or 0)
    out = []
    for _ in range(LAYERS):
        t = torch.randn(2, BLOCKS, BLOCK, HEADS, HEAD, generator=g).to(DTYPE)
        out.append(t if seed is not None else torch.zeros_like(t))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["save", "load", "reset"])
    ap.add_argument("--master", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tenant", default="vllm-test")
    a = ap.parse_args()

    # The connector's modules import on CPU (what vLLM loads for kv_connector=MooncakeStoreConnector).
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import (
        connector,
        scheduler,
        worker,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (
        KeyMetadata,
        RankLocalStoreLayout,
    )
    from vllm.distributed.mooncake_store import MooncakeStoreConfig, setup_mooncake_store
    from vllm.v1.core.kv_cache_utils import BlockHash

    assert connector.MooncakeStoreConnector and scheduler.MooncakeStoreScheduler
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    out: dict[str, Any] = {"role": a.role}
    store = MooncakeDistributedStore()
    config = MooncakeStoreConfig(
        metadata_server="P2PHANDSHAKE",
        master_server_address=a.master,
        protocol="tcp",
        device_name="",
        mode="standalone-store",
        global_segment_size=0,
        local_buffer_size=64 << 20,
        tenant_id=a.tenant,
    )
    setup_mooncake_store(store, config, "127.0.0.1")  # raises unless setup returns 0

    kv = caches(a.seed if a.role == "save" else None)
    registered = [
        store.register_buffer(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        for t in kv
    ]
    out["register_buffer"] = registered
    layout = RankLocalStoreLayout(
        KeyMetadata(model_name="kvpool-vllm-test", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0),
        block_size=BLOCK,
        hash_block_size=BLOCK,
    )
    # vLLM registers each layer's K and V caches: [blocks, block_size, heads, head] apiece.
    per_layer = [half for t in kv for half in (t[0], t[1])]
    layout.register_kv_caches(per_layer, BLOCKS)
    chunks = [(i * BLOCK, (i + 1) * BLOCK) for i in range(CHUNKS)]
    block_ids = list(range(2, 2 + CHUNKS))  # blocks 2..9 of the cache
    addrs, sizes, _ = layout.prepare_values(chunks, block_ids, [0] * CHUNKS)
    hashes = [BlockHash(f"{a.seed}-{i}".encode().ljust(32, b".")) for i in range(CHUNKS)]
    keys = [layout.key_for(0, h) for h in hashes]
    out["keys"] = len(keys)
    out["buffers_per_key"] = len(addrs[0])
    try:
        if a.role == "save":
            exists = store.batch_is_exist(keys)
            missing = [i for i, e in enumerate(exists) if e != 1]
            rc = ReplicateConfig()
            res = store.batch_put_from_multi_buffers(
                [keys[i] for i in missing],
                [addrs[i] for i in missing],
                [sizes[i] for i in missing],
                rc,
            )
            out["put"] = list(res)
            out["exists_after"] = list(store.batch_is_exist(keys))
            ok = all(r >= 0 for r in res) and all(e == 1 for e in out["exists_after"])
        elif a.role == "load":
            res = store.batch_get_into_multi_buffers(keys, addrs, sizes)
            out["get"] = list(res)
            tiers = worker._get_replica_tiers_by_key(store, keys)
            out["tiers"] = sorted(set(tiers.values()))
            want = caches(a.seed)
            exact = all(
                torch.equal(got[:, b].view(torch.int16), ref[:, b].view(torch.int16))
                for got, ref in zip(kv, want, strict=True)
                for b in block_ids
            )
            out["bit_exact"] = exact
            ok = exact and all(r == sum(s) for r, s in zip(res, sizes, strict=True))
        else:
            out["removed"] = store.remove_all(force=True)
            out["exists_after"] = list(store.batch_is_exist(keys))
            ok = all(e != 1 for e in out["exists_after"])
    finally:
        store.close()
    print(json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
