"""The main job's workload: prompts, token-prefix chunk keys and synthetic KV-cache tensors.

What an inference engine keeps in the pool is the KV cache of processed prompt prefixes. A prompt
is cut into chunks of `chunk_tokens` tokens; chunk *i* is identified by a hash of every token up to
and including it (a chained xxh3_64, as vLLM and LMCache do), so two prompts that share a prefix
share the keys of that prefix and nothing else. Each chunk stores one object per layer: the layer's
K and V for those tokens, a float16 array of shape (2, chunk_tokens, kv_heads, head_dim).

Everything here is deterministic from the `WorkloadSpec` (seeded generators, stable hashes, never
Python's `hash()`), so the prefill process and the decode process, started separately, agree on
the prompts, the keys and the exact bytes: the decode side regenerates the expected tensor of a
chunk from its hash and compares it with what it read back from the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

import numpy as np
import numpy.typing as npt
import xxhash

from kvpool.errors import InvalidParams

__all__ = [
    "ChunkHash",
    "Prompt",
    "WorkloadSpec",
    "chunk_hashes",
    "chunk_key",
    "decode_prompts",
    "fill_kv",
    "prefill_prompts",
]

ChunkHash = NewType("ChunkHash", int)
"""xxh3_64 of a token prefix, chained chunk by chunk."""

_ROOT_SEED = 0x6B7670_6F6F6C  # "kvpool": the chain's starting value, same in every process


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The shape of the demo's model and prompts; the defaults write about 300 MiB."""

    layers: int = 32
    """Transformer layers: one pool object per layer per chunk."""
    chunk_tokens: int = 256
    """Tokens per chunk (the unit of prefix reuse)."""
    kv_heads: int = 8
    """Key/value heads per layer."""
    head_dim: int = 64
    """Elements per head."""
    system_chunks: int = 1
    """Chunks of the system prompt every prompt starts with (shared by all of them)."""
    prompts: int = 4
    """Prompts the prefill instance processes."""
    prompt_chunks: int = 4
    """Chunks of each prompt after the system prompt."""
    new_prompts: int = 2
    """Prompts the decode instance sees that prefill never saw (they share only the system prompt)."""
    extra_chunks: int = 1
    """Chunks the decode instance's follow-up turns add after a cached prompt (misses)."""
    model: str = "demo-llama"
    """Part of every key, so that two models never share entries."""
    seed: int = 2026
    """Seed of the token generator."""

    def __post_init__(self) -> None:
        for name in ("layers", "chunk_tokens", "kv_heads", "head_dim", "prompts", "prompt_chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidParams(f"WorkloadSpec.{name}: expected an int >= 1, got {value!r}")
        for name in ("system_chunks", "new_prompts", "extra_chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise InvalidParams(f"WorkloadSpec.{name}: expected an int >= 0, got {value!r}")
        if not self.model or "/" in self.model:
            raise InvalidParams(
                f"WorkloadSpec.model: expected a name without '/', got {self.model!r}"
            )

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        """Shape of one layer's KV for one chunk: (K and V, tokens, heads, head_dim)."""
        return (2, self.chunk_tokens, self.kv_heads, self.head_dim)

    @property
    def object_bytes(self) -> int:
        """Bytes of one pool object (one layer of one chunk, float16)."""
        return 2 * self.chunk_tokens * self.kv_heads * self.head_dim * 2

    @property
    def prefill_bytes(self) -> int:
        """Bytes the prefill instance writes (distinct chunks x layers x object size)."""
        distinct = self.system_chunks + self.prompts * self.prompt_chunks
        return distinct * self.layers * self.object_bytes


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request: a name for the report and its token ids."""

    name: str
    tokens: npt.NDArray[np.int32]


def _tokens(rng: np.random.Generator, chunks: int, spec: WorkloadSpec) -> npt.NDArray[np.int32]:
    return rng.integers(0, 32000, size=chunks * spec.chunk_tokens, dtype=np.int32)


def prefill_prompts(spec: WorkloadSpec) -> list[Prompt]:
    """The prompts the prefill instance computes: a shared system prompt, then each its own."""
    rng = np.random.default_rng(spec.seed)
    system = _tokens(rng, spec.system_chunks, spec)
    return [
        Prompt(f"prompt-{i}", np.concatenate([system, _tokens(rng, spec.prompt_chunks, spec)]))
        for i in range(spec.prompts)
    ]


def decode_prompts(spec: WorkloadSpec) -> list[Prompt]:
    """What the decode instance sees: follow-up turns of every prefill prompt (their prefix is
    cached, the new turn is not) and prompts prefill never saw (only the system prompt is cached)."""
    rng = np.random.default_rng(spec.seed + 1)
    out = [
        Prompt(f"{p.name}+turn", np.concatenate([p.tokens, _tokens(rng, spec.extra_chunks, spec)]))
        for p in prefill_prompts(spec)
    ]
    system = prefill_prompts(spec)[0].tokens[: spec.system_chunks * spec.chunk_tokens]
    new_chunks = max(spec.prompt_chunks, 1)
    out.extend(
        Prompt(f"new-{i}", np.concatenate([system, _tokens(rng, new_chunks, spec)]))
        for i in range(spec.new_prompts)
    )
    return out


def chunk_hashes(tokens: npt.NDArray[np.int32], spec: WorkloadSpec) -> list[ChunkHash]:
    """The chained prefix hash of every full chunk of `tokens` (a trailing partial chunk has
    no key: it is recomputed, never cached)."""
    out: list[ChunkHash] = []
    prev = _ROOT_SEED
    n = len(tokens) // spec.chunk_tokens
    for i in range(n):
        chunk = tokens[i * spec.chunk_tokens : (i + 1) * spec.chunk_tokens]
        h = xxhash.xxh3_64_intdigest(chunk.tobytes(), seed=prev)
        out.append(ChunkHash(h))
        prev = h
    return out


def chunk_key(spec: WorkloadSpec, h: ChunkHash, layer: int) -> str:
    """The pool key of one layer of one chunk."""
    return f"{spec.model}/{h:016x}/L{layer:02d}"


def fill_kv(spec: WorkloadSpec, h: ChunkHash, layer: int, out: npt.NDArray[np.float16]) -> None:
    """Write the synthetic KV tensor of (chunk, layer) into `out` (shape `spec.kv_shape`).

    Stands in for the attention computation: any process can regenerate it from the chunk hash,
    which is what lets decode verify the bytes it read end to end.
    """
    rng = np.random.default_rng([h, layer])
    # Random bit patterns below 0x3C00 are the float16 values in [0, 1): no NaN or Inf, and
    # generating integers is several times faster than normal floats (the demo makes hundreds
    # of MiB of them in each process).
    out.view(np.uint16)[...] = rng.integers(0, 0x3C00, size=spec.kv_shape, dtype=np.uint16)
