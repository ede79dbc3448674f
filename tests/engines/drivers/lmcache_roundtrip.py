"""LMCache's own engine storing a KV cache in one process and retrieving it in another.

Runs under the LMCache environment (scripts/engines/build lmcache), with this checkout's src/
and compat/mooncake-shim/src on PYTHONPATH (tests/engines/conftest.py sets it up):

    python lmcache_roundtrip.py store|retrieve --route native|shim --master HOST:PORT \\
        --tokens N --seed S [--repeat R]

`store` runs `LMCacheEngine.store` on a seeded random KV cache and waits until LMCache's
remote puts have reached the pool; `retrieve` runs `LMCacheEngine.retrieve` into zeroed
memory and checks every retrieved token bit-exact against the same seeded cache. The KV cache
lives in CPU memory: `CpuConnector` is the engine's "GPU connector", copying between that
memory and LMCache's chunks. Prints one JSON line with the outcome and the timings.

Routes: `native` is kvpool's own connector (kvpool.engines.lmcache, a remote storage plugin);
`shim` is LMCache's `mooncakestore://` connector on the kvpool-backed `mooncake.store`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata

LAYERS, HEADS, HEAD_SIZE, CHUNK = 4, 2, 64, 256
DTYPE = torch.float16


class CpuConnector(GPUConnectorInterface):  # type: ignore[misc]
    """LMCache's connector to a KV cache of shape [layers, 2, tokens, heads, head_size] on CPU."""

    def __init__(self) -> None:
        self.kvcaches: Any = None

    def _kv(self, kwargs: dict[str, Any]) -> torch.Tensor:
        kv = kwargs.get("kvcaches", self.kvcaches)
        assert kv is not None, "kvcaches not given"
        return kv

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        kv = self._kv(kwargs)[:, :, start:end]  # layers, 2, t, heads, hs
        t = kv.permute(1, 0, 2, 3, 4).reshape(2, LAYERS, end - start, HEADS * HEAD_SIZE)
        memory_obj.tensor.copy_(t)

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        kv = self._kv(kwargs)
        src = memory_obj.tensor.reshape(2, LAYERS, end - start, HEADS, HEAD_SIZE)
        kv[:, :, start:end].copy_(src.permute(1, 0, 2, 3, 4))

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, s, e, **kwargs)

    def batched_to_gpu(
        self, memory_objs: Any = None, starts: Any = None, ends: Any = None, **kwargs: Any
    ) -> None:
        for obj, s, e in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, s, e, **kwargs)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HEADS * HEAD_SIZE])


def config_for(route: str, master: str, instance: str) -> Any:
    base: dict[str, Any] = {
        "chunk_size": CHUNK,
        "local_cpu": True,
        "max_local_cpu_size": 0.25,
        "remote_serde": "naive",
        "lmcache_instance_id": instance,
        "save_unfull_chunk": True,
    }
    if route == "native":
        base["remote_storage_plugins"] = ["kvpool"]
        base["extra_config"] = {
            "remote_storage_plugin.kvpool.module_path": "kvpool.engines.lmcache",
            "remote_storage_plugin.kvpool.class_name": "KvpoolConnectorAdapter",
            "kvpool.master": master,
        }
    elif route == "shim":
        # The full Mooncake config LMCache documents.
        base["remote_url"] = f"mooncakestore://{master}/"
        base["extra_config"] = {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "protocol": "tcp",
            "master_server_address": master,
            "global_segment_size": 0,
            "local_buffer_size": 64 << 20,
            "transfer_timeout": 10,
            "save_chunk_meta": False,
        }
    elif route == "shim-minimal":
        # What a user writes first: the URL, and no local_hostname, metadata_server, protocol
        # or master_server_address (the compat layer takes the master from the URL and
        # Mooncake's defaults for the rest). This process contributes no memory, so what it
        # stores outlives it (a contributing store's objects go with its segment).
        base["remote_url"] = f"mooncakestore://{master}/"
        base["extra_config"] = {"global_segment_size": 0, "save_chunk_meta": False}
    else:
        raise SystemExit(f"unknown route {route}")
    return LMCacheEngineConfig.from_dict(base)


def make_engine(route: str, master: str, role: str) -> Any:
    config = config_for(route, master, f"kvpool-{route}-{role}")
    metadata = LMCacheMetadata(
        model_name="kvpool-engines-test",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=DTYPE,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_SIZE),
        chunk_size=CHUNK,
    )
    engine = LMCacheEngineBuilder.get_or_create(
        config.lmcache_instance_id,
        config,
        metadata,
        CpuConnector(),
        lambda t, r: None,
        lambda o, r: o,
    )
    post = getattr(engine, "post_init", None)
    if post is not None:
        post()
    return engine, config.lmcache_instance_id


def seeded(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 32000, (tokens,), generator=g)
    kv = torch.randn(LAYERS, 2, tokens, HEADS, HEAD_SIZE, generator=g).to(DTYPE)
    return ids, kv


def remote_hits(engine: Any, ids: torch.Tensor) -> int:
    """Tokens of `ids` LMCache's remote backend holds (not counting its local CPU copy)."""
    for name, backend in engine.storage_manager.storage_backends.items():
        if name.startswith("RemoteBackend"):
            keys = [key for _, _, key in engine.token_database.process_tokens(tokens=ids)]
            n = backend.batched_contains(keys)
            return min(len(ids), n * CHUNK)
    raise SystemExit("no RemoteBackend in LMCache's storage manager")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["store", "retrieve"])
    ap.add_argument("--route", choices=["native", "shim", "shim-minimal"], required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="sequences (seeds seed..seed+R-1)")
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    engine, instance = make_engine(a.route, a.master, a.role)
    out: dict[str, Any] = {"route": a.route, "role": a.role, "tokens": a.tokens}
    times: list[float] = []
    try:
        for r in range(a.rounds):
            ids, kv = seeded(a.tokens, a.seed + r)
            out["bytes"] = kv.numel() * kv.element_size()
            if a.role == "store":
                t0 = time.perf_counter()
                engine.store(ids, kvcaches=kv)
                deadline = time.monotonic() + a.timeout
                while (held := remote_hits(engine, ids)) < a.tokens:
                    if time.monotonic() > deadline:
                        out["error"] = f"the pool holds {held} of {a.tokens} tokens"
                        break
                    time.sleep(0.005)
                times.append(time.perf_counter() - t0)
            else:
                got = torch.zeros_like(kv)
                t0 = time.perf_counter()
                mask = engine.retrieve(ids, kvcaches=got)
                times.append(time.perf_counter() - t0)
                out["retrieved"] = int(mask.sum())
                out["bit_exact"] = bool(torch.equal(got.view(torch.int16), kv.view(torch.int16)))
                if not out["bit_exact"] or out["retrieved"] != a.tokens:
                    out["error"] = (
                        f"round {r}: {out['retrieved']} tokens, bit-exact {out['bit_exact']}"
                    )
            if "error" in out:
                break
        out[f"{a.role}_s"] = sorted(times)[len(times) // 2]
        out["rounds"] = len(times)
    finally:
        LMCacheEngineBuilder.destroy(instance)
    print(json.dumps(out), flush=True)
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
