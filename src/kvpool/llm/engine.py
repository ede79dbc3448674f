"""One engine process of the real-model job: `python -m kvpool.llm.engine prefill|decode`.

    python -m kvpool.llm.engine prefill --master HOST:PORT --spec JSON [--protocol tcp]
    python -m kvpool.llm.engine decode  --master HOST:PORT --spec JSON [--repeat N]

Both build the same seeded model and a `kvpool.cache.StorageManager` whose L1 is this process's
memory and whose one L2 is the pool (the `kvpool` adapter).

prefill: for each prefill prompt, one forward pass over the whole prompt (a progress bar
advances per decoder layer), then every full chunk's KV goes into L1 (`store`); the store
controller copies it to the pool; the engine waits until the pool has all of it.

decode: for each decode prompt, twice:
  * with the pool: chunk keys → `submit_prefetch_task` (L1 first, then the pool, contiguous
    prefix only) → read the prefetched chunks → rebuild a DynamicCache → forward the uncached
    tail → first token. That wall time is the TTFT with the pool.
  * recompute: one forward pass over the whole prompt (TTFT without the pool).
The logits of the tail must equal the recompute's at the same positions (max abs diff <= atol,
0.0 by default: the same kernels on the same machine give the same bits).

Each prints progress on stderr and, last, one line `RESULT {json}` on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvpool.cache.adapters.registry import parse_adapter_config
from kvpool.cache.config import StorageManagerConfig
from kvpool.cache.l1 import L1Config, L1Status
from kvpool.cache.manager import StorageManager
from kvpool.cache.memory import MemoryLayout
from kvpool.demo.progress import ProgressBar
from kvpool.errors import ErrorCode, KVPoolError
from kvpool.llm import model as mdl
from kvpool.llm.spec import JobSpec, chunk_keys, decode_prompts, prefill_prompts

__all__ = ["main", "run_decode", "run_prefill"]


def _manager(master: str, protocol: str, spec: JobSpec) -> StorageManager:
    m = spec.model
    chunk_bytes = m.kv_bytes_per_token() * spec.chunk_tokens
    longest = (
        spec.system_tokens + max(spec.prompt_tokens, spec.turn_tokens * 2) + spec.question_tokens
    )
    # Room for four times the longest prompt's chunks (the prefill stores two prompts), so
    # nothing is evicted from L1 before the pool has it.
    capacity = max(64 << 20, 4 * (longest // spec.chunk_tokens + 1) * chunk_bytes)
    adapter = {"type": "kvpool", "master": master, "protocol": protocol, "key_prefix": "llm/"}
    return StorageManager(
        StorageManagerConfig(
            l1=L1Config(capacity_bytes=capacity), adapters=(parse_adapter_config(adapter),)
        )
    )


def _layout(spec: JobSpec) -> MemoryLayout:
    return MemoryLayout((mdl.chunk_shape(spec.model, spec.chunk_tokens),), ("float32",))


def _bar(label: str, total: int, progress: bool) -> ProgressBar | None:
    return ProgressBar(label, total, unit="layers") if progress else None


def _on_layer(bar: ProgressBar | None) -> Callable[[], None] | None:
    if bar is None:
        return None
    return lambda: bar.advance(1)


def run_prefill(
    sm: StorageManager, model: Any, spec: JobSpec, progress: bool = True
) -> dict[str, Any]:
    out: dict[str, Any] = {"prompts": 0, "tokens": 0, "chunks": 0, "bytes": 0, "forward_s": 0.0}
    layout = _layout(spec)
    n_layers = spec.model.num_hidden_layers
    for prompt in prefill_prompts(spec):
        bar = _bar(f"prefill {prompt.name}", n_layers, progress)
        t0 = time.perf_counter()
        try:
            _, cache = mdl.forward(model, prompt.tokens, on_layer=_on_layer(bar))
        finally:
            if bar is not None:
                bar.close()
        out["forward_s"] += time.perf_counter() - t0
        keys = chunk_keys(spec, prompt.tokens)
        arrays = mdl.chunk_arrays(cache, spec.model, spec.chunk_tokens, 0, len(keys))
        statuses = sm.store(keys, [a.reshape(-1).data.cast("B") for a in arrays], layout)
        new = sum(s is L1Status.OK for s in statuses)
        out["prompts"] += 1
        out["tokens"] += len(prompt.tokens)
        out["chunks"] += new
        out["bytes"] += new * layout.nbytes
    t0 = time.perf_counter()
    if not sm.wait_stores(timeout=300):
        raise KVPoolError("the pool did not take every chunk within 300 s", ErrorCode.RPC_TIMEOUT)
    out["store_wait_s"] = time.perf_counter() - t0
    stats = sm.store_stats()
    out["store_failures"] = stats.failed_keys + stats.submit_errors + stats.skipped_keys
    return out


def _first_token(logits: Any) -> int:
    return int(logits[-1].argmax())


def _with_pool(sm: StorageManager, model: Any, spec: JobSpec, tokens: np.ndarray) -> dict[str, Any]:
    layout = _layout(spec)
    t0 = time.perf_counter()
    keys = chunk_keys(spec, tokens)
    hits = 0
    cache = None
    if keys:
        handle = sm.submit_prefetch_task(keys, layout)
        hits = sm.wait_prefetch(handle, timeout=120)
    t_loaded = time.perf_counter()
    cached = min(hits * spec.chunk_tokens, len(tokens) - 1)
    if cached > 0:
        with sm.read_prefetched_results(keys[:hits]) as objs:
            cache = mdl.rebuild_cache(model, [o.arrays()[0] for o in objs], cached)
    if hits:
        sm.finish_read_prefetched(keys[:hits])
    t_rebuilt = time.perf_counter()
    logits, _ = mdl.forward(model, tokens[cached:], cache)
    first = _first_token(logits)
    t_end = time.perf_counter()
    return {
        "cached_tokens": cached,
        "hit_chunks": hits,
        "kv_bytes": hits * layout.nbytes,
        "load_s": t_loaded - t0,
        "rebuild_s": t_rebuilt - t_loaded,
        "ttft_s": t_end - t0,
        "first_token": first,
        "logits": logits,
    }


def run_decode(
    sm: StorageManager,
    model: Any,
    spec: JobSpec,
    *,
    repeat: int = 1,
    recompute_repeat: int = 1,
    progress: bool = True,
) -> list[dict[str, Any]]:
    rows = []
    n_layers = spec.model.num_hidden_layers
    prompts = decode_prompts(spec)
    # An engine maps the pool's segments once, at start-up, not on its first request: one
    # untimed load of the first prompt's prefix does that here.
    _with_pool(sm, model, spec, prompts[0].tokens)
    for prompt in prompts:
        runs = [_with_pool(sm, model, spec, prompt.tokens) for _ in range(repeat)]
        pool = runs[0]
        cached = pool["cached_tokens"]
        recompute_s = []
        full = None
        for i in range(recompute_repeat):
            bar = _bar(f"recompute {prompt.name}", n_layers, progress and i == 0)
            t0 = time.perf_counter()
            try:
                full, _ = mdl.forward(model, prompt.tokens, on_layer=_on_layer(bar))
                first = _first_token(full)
            finally:
                if bar is not None:
                    bar.close()
            recompute_s.append(time.perf_counter() - t0)
        assert full is not None
        diff = max(float((r["logits"] - full[cached:]).abs().max()) for r in runs)
        rows.append(
            {
                "prompt": prompt.name,
                "shares": prompt.shares,
                "prompt_tokens": len(prompt.tokens),
                "cached_tokens": cached,
                "hit_chunks": pool["hit_chunks"],
                "kv_bytes": pool["kv_bytes"],
                "load_s": statistics.median(r["load_s"] for r in runs),
                "rebuild_s": statistics.median(r["rebuild_s"] for r in runs),
                "ttft_pool_s": statistics.median(r["ttft_s"] for r in runs),
                "ttft_recompute_s": statistics.median(recompute_s),
                "logits_max_abs_diff": diff,
                "same_first_token": all(r["first_token"] == first for r in runs),
                "runs": repeat,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpool.llm.engine")
    parser.add_argument("role", choices=["prefill", "decode"])
    parser.add_argument("--master", required=True)
    parser.add_argument("--spec", required=True, help="JobSpec as JSON")
    parser.add_argument("--protocol", default="auto", choices=["auto", "shm", "tcp"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--recompute-repeat", type=int, default=1)
    parser.add_argument("--no-progress", action="store_true")
    ns = parser.parse_args(argv)
    if ns.protocol == "tcp":
        os.environ["KVPOOL_RPC_UNIX"] = "0"  # the control plane over TCP too, as between hosts
    spec = JobSpec(**json.loads(ns.spec))
    t0 = time.perf_counter()
    model = mdl.build_model(spec)
    result: dict[str, Any] = {
        "role": ns.role,
        "weights": mdl.weights_digest(model),
        "build_s": time.perf_counter() - t0,
    }
    with _manager(ns.master, ns.protocol, spec) as sm:
        if ns.role == "prefill":
            result.update(run_prefill(sm, model, spec, progress=not ns.no_progress))
        else:
            result["prompts"] = run_decode(
                sm,
                model,
                spec,
                repeat=ns.repeat,
                recompute_repeat=ns.recompute_repeat,
                progress=not ns.no_progress,
            )
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
