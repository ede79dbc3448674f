"""The two inference instances of the main job, each run as its own process.

`python -m kvpool.demo.worker prefill --master HOST:PORT [spec options]` plays a prefill instance:
for every prompt it finds the prefix already in the pool (the shared system prompt, after the
first prompt), "computes" the KV cache of the rest (`workload.fill_kv`) and writes it, one batch
of `layers` objects per chunk, from one registered buffer (zero-copy `batch_put_from`).

`python -m kvpool.demo.worker decode ...` plays another instance that receives follow-up turns
and new prompts: it finds the longest cached prefix of each (one `batch_exists` over every key of
the prompt), reads that prefix back into a registered buffer (`batch_get_into`), compares every
byte with the tensor regenerated from the chunk hash, and counts what it would have to recompute.

Each prints a progress bar on stderr and, last, one line `RESULT {json}` on stdout that
`kvpool demo` reads for its report. Only the time spent in pool calls is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, fields

import numpy as np
import numpy.typing as npt

from kvpool.client.store import Store
from kvpool.demo.progress import ProgressBar
from kvpool.demo.workload import (
    ChunkHash,
    WorkloadSpec,
    chunk_hashes,
    chunk_key,
    decode_prompts,
    fill_kv,
    prefill_prompts,
)
from kvpool.errors import ErrorCode

__all__ = ["WorkerResult", "cached_prefix", "main", "run_decode", "run_prefill"]


@dataclass(slots=True)
class WorkerResult:
    """What one instance did, as the report shows it."""

    role: str
    objects: int = 0
    """Objects written (prefill) or read (decode)."""
    bytes: int = 0
    """Bytes moved through the pool."""
    seconds: float = 0.0
    """Time inside pool data calls (put or get)."""
    tokens: int = 0
    """Prompt tokens seen."""
    hit_tokens: int = 0
    """Tokens whose KV cache came from the pool."""
    skipped_objects: int = 0
    """Prefill: objects already in the pool, not written again."""
    checksum_failures: int = 0
    """Reads the store refused with CHECKSUM_MISMATCH."""
    mismatches: int = 0
    """Objects whose bytes differ from the regenerated tensor (must be 0)."""
    errors: int = 0
    """Other per-key failures."""

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def cached_prefix(store: Store, spec: WorkloadSpec, hashes: list[ChunkHash]) -> int:
    """How many leading chunks have every layer in the pool (one batch_exists for the prompt)."""
    if not hashes:
        return 0
    keys = [chunk_key(spec, h, layer) for h in hashes for layer in range(spec.layers)]
    present = store.batch_exists(keys)
    for i in range(len(hashes)):
        if not all(present[i * spec.layers : (i + 1) * spec.layers]):
            return i
    return len(hashes)


def _chunk_buffer(spec: WorkloadSpec) -> npt.NDArray[np.float16]:
    return np.empty((spec.layers, *spec.kv_shape), dtype=np.float16)


def run_prefill(store: Store, spec: WorkloadSpec, progress: bool = True) -> WorkerResult:
    res = WorkerResult("prefill")
    buf = _chunk_buffer(spec)
    store.register_buffer(buf)
    views = [memoryview(buf[layer]).cast("B") for layer in range(spec.layers)]
    bar = ProgressBar("prefill", spec.prefill_bytes) if progress else None
    try:
        for prompt in prefill_prompts(spec):
            hashes = chunk_hashes(prompt.tokens, spec)
            res.tokens += len(prompt.tokens)
            have = cached_prefix(store, spec, hashes)
            res.hit_tokens += have * spec.chunk_tokens
            res.skipped_objects += have * spec.layers
            for h in hashes[have:]:
                for layer in range(spec.layers):
                    fill_kv(spec, h, layer, buf[layer])
                keys = [chunk_key(spec, h, layer) for layer in range(spec.layers)]
                t0 = time.perf_counter()
                codes = store.batch_put_from(keys, views)
                res.seconds += time.perf_counter() - t0
                for code in codes:
                    if code in (ErrorCode.OK, ErrorCode.OBJECT_ALREADY_EXISTS):
                        res.objects += 1
                        res.bytes += spec.object_bytes
                    else:
                        res.errors += 1
                if bar is not None:
                    bar.advance(spec.layers * spec.object_bytes)
    finally:
        if bar is not None:
            bar.close()
        store.unregister_buffer(buf)
    return res


def run_decode(store: Store, spec: WorkloadSpec, progress: bool = True) -> WorkerResult:
    res = WorkerResult("decode")
    buf = _chunk_buffer(spec)
    expected = _chunk_buffer(spec)
    store.register_buffer(buf)
    views = [memoryview(buf[layer]).cast("B") for layer in range(spec.layers)]
    prompts = decode_prompts(spec)
    plans = []
    for prompt in prompts:
        hashes = chunk_hashes(prompt.tokens, spec)
        plans.append((prompt, hashes, cached_prefix(store, spec, hashes)))
    total = sum(n for _, _, n in plans) * spec.layers * spec.object_bytes
    bar = ProgressBar("decode", total) if progress else None
    try:
        for prompt, hashes, have in plans:
            res.tokens += len(prompt.tokens)
            res.hit_tokens += have * spec.chunk_tokens
            for h in hashes[:have]:
                keys = [chunk_key(spec, h, layer) for layer in range(spec.layers)]
                t0 = time.perf_counter()
                sizes = store.batch_get_into(keys, views)
                res.seconds += time.perf_counter() - t0
                for layer, n in enumerate(sizes):
                    if n == spec.object_bytes:
                        res.objects += 1
                        res.bytes += n
                        fill_kv(spec, h, layer, expected[layer])
                        if not np.array_equal(
                            buf[layer].view(np.uint16), expected[layer].view(np.uint16)
                        ):
                            res.mismatches += 1
                    elif n == ErrorCode.CHECKSUM_MISMATCH:
                        res.checksum_failures += 1
                    else:
                        res.errors += 1
                if bar is not None:
                    bar.advance(spec.layers * spec.object_bytes)
    finally:
        if bar is not None:
            bar.close()
        store.unregister_buffer(buf)
    return res


def _spec_args(parser: argparse.ArgumentParser) -> None:
    for f in fields(WorkloadSpec):
        default = f.default
        parser.add_argument(
            "--" + f.name.replace("_", "-"), type=type(default), default=default, dest=f.name
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpool.demo.worker")
    parser.add_argument("role", choices=["prefill", "decode"])
    parser.add_argument("--master", required=True)
    parser.add_argument("--protocol", default="auto")
    parser.add_argument("--no-progress", action="store_true")
    _spec_args(parser)
    ns = parser.parse_args(argv)
    spec = WorkloadSpec(**{f.name: getattr(ns, f.name) for f in fields(WorkloadSpec)})
    with Store(ns.master, protocol=ns.protocol) as store:
        # An engine maps the pool's segments once, at start-up, not on its first request.
        store.warm_up()
        run = run_prefill if ns.role == "prefill" else run_decode
        res = run(store, spec, progress=not ns.no_progress)
    out = asdict(res)
    out["gb_per_s"] = res.gb_per_s
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
