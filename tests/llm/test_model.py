"""The model side: seeded weights, KV chunks out of a forward pass and a cache rebuilt from them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvpool.llm import model as mdl  # noqa: E402
from kvpool.llm.spec import JobSpec, prefill_prompts  # noqa: E402
from kvtest.llm import TINY_SPEC as SPEC  # noqa: E402


@pytest.fixture(scope="module")
def model() -> object:
    return mdl.build_model(SPEC)


def test_the_same_seed_builds_the_same_weights(model: object) -> None:
    assert mdl.weights_digest(model) == mdl.weights_digest(mdl.build_model(SPEC))
    other = JobSpec(**{**SPEC.to_dict(), "seed": 1})  # type: ignore[arg-type]
    assert mdl.weights_digest(model) != mdl.weights_digest(mdl.build_model(other))


def test_chunks_hold_every_layer_and_rebuild_the_same_cache(model: object) -> None:
    tokens = prefill_prompts(SPEC)[1].tokens
    _, cache = mdl.forward(model, tokens)
    n = len(tokens) // SPEC.chunk_tokens
    chunks = mdl.chunk_arrays(cache, SPEC.model, SPEC.chunk_tokens, 0, n)
    assert [c.shape for c in chunks] == [mdl.chunk_shape(SPEC.model, SPEC.chunk_tokens)] * n
    assert all(c.flags.c_contiguous for c in chunks)
    keep = n * SPEC.chunk_tokens - 5  # a prefix that ends inside a chunk
    rebuilt = mdl.rebuild_cache(model, chunks, keep)
    for layer in range(SPEC.model.num_hidden_layers):
        k0, v0 = mdl._layer_kv(cache, layer)
        k1, v1 = mdl._layer_kv(rebuilt, layer)
        assert torch.equal(k1, k0[:, :, :keep]) and torch.equal(v1, v0[:, :, :keep])


def test_continuing_from_a_rebuilt_cache_gives_the_recompute_logits(model: object) -> None:
    tokens = prefill_prompts(SPEC)[1].tokens
    cached = 64
    _, cache = mdl.forward(model, tokens[:80])
    chunks = mdl.chunk_arrays(cache, SPEC.model, SPEC.chunk_tokens, 0, cached // 16)
    tail, _ = mdl.forward(model, tokens[cached:], mdl.rebuild_cache(model, chunks, cached))
    full, _ = mdl.forward(model, tokens)
    assert tail.shape == (len(tokens) - cached, SPEC.model.vocab_size)
    assert float((tail - full[cached:]).abs().max()) <= 1e-5


def test_forward_reports_each_layer(model: object) -> None:
    seen: list[int] = []
    mdl.forward(model, prefill_prompts(SPEC)[0].tokens[:20], on_layer=lambda: seen.append(1))
    assert len(seen) == SPEC.model.num_hidden_layers
