"""The real-model job's shape: model sizes, prompts that share prefixes, chunk keys.

Everything here is deterministic from a `JobSpec` (seeded numpy generators, BLAKE2b chunk
hashes from `kvpool.cache.keys.TokenHasher`), so the prefill and the decode engine, started as
separate processes, build the same model and the same prompts and agree on every key. The key of
chunk i chains the key of chunk i-1 with the tokens of chunk i, so a key names the whole prefix up
to its chunk: two prompts share exactly the keys of their common full chunks.

Prompts (token ids; no tokenizer is needed with random weights):

    prefill engine                         decode engine (what it gets later)
    chat:  S + U1 + A1                     system:    S + U_new            (shares S)
    rag:   S + DOC + Q1                    chat+turn: S + U1 + A1 + U2     (shares the whole chat)
                                           rag-q2:    S + DOC + Q2         (shares S + DOC)
                                           rag-q3:    S + DOC + Q3         (shares S + DOC)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvpool.cache.keys import ObjectKey, TokenHasher
from kvpool.errors import InvalidParams

__all__ = [
    "MODEL_SIZES",
    "QUICK_SPEC",
    "JobSpec",
    "ModelSpec",
    "Prompt",
    "chunk_keys",
    "decode_prompts",
    "expected_cached_tokens",
    "prefill_bytes",
    "prefill_prompts",
]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A Llama-architecture config (the fields of transformers' LlamaConfig that matter)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def kv_bytes_per_token(self) -> int:
        """float32 K and V of every layer for one token."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 4


MODEL_SIZES: dict[str, ModelSpec] = {
    # The tests' model: milliseconds per forward.
    "tiny": ModelSpec(64, 176, 2, 4, 2, 1024),
    # The default of `make run`: about 1 s per 1,000 prompt tokens on 2 cores.
    "small": ModelSpec(512, 1408, 8, 8, 4, 32000),
    # Issue #19's reference (~246M parameters): 17-20 s to prefill 2,048 tokens on 2 cores.
    "reference": ModelSpec(1024, 2816, 16, 16, 4, 32000),
}


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What both engines run; every field has a default (`make run`'s)."""

    model_size: str = "small"
    """A key of MODEL_SIZES."""
    prompt_tokens: int = 2048
    """Tokens of the retrieval document (the long shared context)."""
    system_tokens: int = 300
    """Tokens of the system prompt every prompt starts with."""
    turn_tokens: int = 600
    """Tokens of the first user turn of the conversation (and of its answer, a tenth of it)."""
    question_tokens: int = 16
    """Tokens of each question (the uncached tail the decode engine computes)."""
    chunk_tokens: int = 256
    """Tokens per pool object (the unit of prefix reuse)."""
    seed: int = 2026
    """Seed of the weights and of the prompts."""

    def __post_init__(self) -> None:
        if self.model_size not in MODEL_SIZES:
            raise InvalidParams(
                f"model size {self.model_size!r}: expected one of {', '.join(MODEL_SIZES)}"
            )
        for name in (
            "prompt_tokens",
            "system_tokens",
            "turn_tokens",
            "question_tokens",
            "chunk_tokens",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParams(f"JobSpec.{name}: expected an int >= 1, got {value!r}")

    @property
    def model(self) -> ModelSpec:
        return MODEL_SIZES[self.model_size]

    @property
    def model_name(self) -> str:
        """Part of every key: two models (or two seeds) never share an entry."""
        m = self.model
        return (
            f"llama-h{m.hidden_size}-i{m.intermediate_size}-l{m.num_hidden_layers}"
            f"-a{m.num_attention_heads}-kv{m.num_key_value_heads}-v{m.vocab_size}-seed{self.seed}"
        )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


QUICK_SPEC = JobSpec(
    model_size="tiny",
    prompt_tokens=96,
    system_tokens=32,
    turn_tokens=48,
    question_tokens=8,
    chunk_tokens=16,
)
"""The tiny job of `kvpool bench llm --quick` and of the tests: seconds on a CPU, with every part
(system prompt, turns, questions, chunks) there."""


@dataclass(frozen=True, slots=True)
class Prompt:
    name: str
    tokens: np.ndarray  # int64, 1-D
    shares: str
    """What this prompt shares with what the prefill engine saw (for the report)."""


def _tokens(spec: JobSpec, label: str, n: int) -> np.ndarray:
    # One generator per named piece, so changing one length never changes another piece.
    seed = [spec.seed, *label.encode()]
    return np.random.default_rng(seed).integers(0, spec.model.vocab_size, n, dtype=np.int64)


def _parts(spec: JobSpec) -> dict[str, np.ndarray]:
    return {
        "S": _tokens(spec, "system", spec.system_tokens),
        "U1": _tokens(spec, "user-1", spec.turn_tokens),
        "A1": _tokens(spec, "answer-1", max(1, spec.turn_tokens // 10)),
        "U2": _tokens(spec, "user-2", spec.question_tokens),
        "U_new": _tokens(spec, "user-new", spec.question_tokens),
        "DOC": _tokens(spec, "document", spec.prompt_tokens),
        "Q1": _tokens(spec, "question-1", spec.question_tokens),
        "Q2": _tokens(spec, "question-2", spec.question_tokens),
        "Q3": _tokens(spec, "question-3", spec.question_tokens),
    }


def _join(parts: dict[str, np.ndarray], *names: str) -> np.ndarray:
    return np.concatenate([parts[n] for n in names])


def prefill_prompts(spec: JobSpec) -> list[Prompt]:
    """What the prefill engine processes (and stores)."""
    p = _parts(spec)
    return [
        Prompt("chat", _join(p, "S", "U1", "A1"), "system prompt"),
        Prompt("rag", _join(p, "S", "DOC", "Q1"), "system prompt"),
    ]


def decode_prompts(spec: JobSpec) -> list[Prompt]:
    """What the decode engine gets: each shares a prefix with a prefill prompt."""
    p = _parts(spec)
    return [
        Prompt("system", _join(p, "S", "U_new"), "system prompt"),
        Prompt("chat+turn", _join(p, "S", "U1", "A1", "U2"), "the conversation so far"),
        Prompt("rag-q2", _join(p, "S", "DOC", "Q2"), "system prompt + document"),
        Prompt("rag-q3", _join(p, "S", "DOC", "Q3"), "system prompt + document"),
    ]


def chunk_keys(spec: JobSpec, tokens: np.ndarray) -> list[ObjectKey]:
    """One key per full chunk of `tokens`; key i chains key i-1 with the tokens of chunk i."""
    hasher = TokenHasher(spec.chunk_tokens)
    return [ObjectKey(spec.model_name, 0, h) for h in hasher.chunk_hashes(tokens)]


def prefill_bytes(spec: JobSpec) -> int:
    """Bytes the prefill engine stores in the pool (each distinct chunk once)."""
    keys = {k for p in prefill_prompts(spec) for k in chunk_keys(spec, p.tokens)}
    return len(keys) * spec.chunk_tokens * spec.model.kv_bytes_per_token()


def expected_cached_tokens(spec: JobSpec, prompt: Prompt) -> int:
    """Tokens of `prompt` whose KV the decode engine should find in the pool: the full chunks of
    its longest common prefix with a prefill prompt, never its last token (which is computed to
    get the first new token's logits)."""
    best = 0
    for pre in prefill_prompts(spec):
        n = min(len(pre.tokens), len(prompt.tokens))
        same = pre.tokens[:n] == prompt.tokens[:n]
        common = n if same.all() else int(np.argmin(same))
        best = max(best, (common // spec.chunk_tokens) * spec.chunk_tokens)
    return min(best, len(prompt.tokens) - 1)
