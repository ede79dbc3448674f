"""The model and its KV cache: build, run, cut into chunks, rebuild (torch + transformers).

torch and transformers are imported inside each function, never at import time, so that this
module can be named (type hints, `kvpool demo --help`) without the `llm` extra installed.

The model is transformers' `LlamaForCausalLM` with random weights drawn after
`torch.manual_seed(seed)`: every process that builds it gets the same weights (checked through
`weights_digest`). float32, eval mode, the default attention kernel (SDPA on CPU).

A chunk's pool object holds every layer's K and V for its `chunk_tokens` tokens, one float32
array of shape (layers, 2, kv_heads, chunk_tokens, head_dim): the layout of transformers'
DynamicCache tensors (batch, kv_heads, tokens, head_dim) without the batch, so a rebuild is one
concatenation per layer. One object per chunk (not per layer): the engine loads whole prefixes,
never single layers, so per-layer objects would only multiply the keys by the layer count.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvpool.llm.spec import JobSpec, ModelSpec

__all__ = [
    "build_model",
    "chunk_arrays",
    "chunk_shape",
    "forward",
    "rebuild_cache",
    "weights_digest",
]


def build_model(spec: JobSpec) -> Any:
    """A seeded random-weight LlamaForCausalLM in eval mode (the same weights in every process)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    m = spec.model
    config = LlamaConfig(
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads,
        vocab_size=m.vocab_size,
        max_position_embeddings=max(8192, 2 * _longest_prompt(spec)),
    )
    torch.manual_seed(spec.seed)
    model: Any = LlamaForCausalLM(config)  # Any: typed only where transformers is installed
    model.eval()
    return model


def _longest_prompt(spec: JobSpec) -> int:
    return spec.system_tokens + max(spec.prompt_tokens, spec.turn_tokens * 2) + spec.question_tokens


def weights_digest(model: Any) -> str:
    """A short hash of every parameter's bytes: equal in two processes iff the weights are."""
    h = hashlib.blake2b(digest_size=8)
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _cache_kwarg(model: Any) -> str:
    # transformers 5.2x renamed `past_key_values` to `cache` (the old name warns); take what
    # this version's forward declares.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward(
    model: Any,
    tokens: np.ndarray,
    cache: Any = None,
    on_layer: Callable[[], None] | None = None,
) -> tuple[Any, Any]:
    """Run `tokens` (1-D int64) after `cache` (a DynamicCache or None); returns (logits of each
    new token as a (tokens, vocab) float32 tensor, the cache after them). `on_layer` is called
    after each decoder layer (progress bars)."""
    import torch
    from transformers import DynamicCache

    ids = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)).unsqueeze(0)
    if cache is None:
        cache = DynamicCache(config=model.config)
    hooks = []
    if on_layer is not None:
        cb = on_layer
        for layer in model.model.layers:
            hooks.append(layer.register_forward_hook(lambda *_: cb()))
    try:
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True, **{_cache_kwarg(model): cache})
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0], cache


def _layer_kv(cache: Any, layer: int) -> tuple[Any, Any]:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[layer].keys, layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]  # transformers 4.x


def chunk_shape(m: ModelSpec, chunk_tokens: int) -> tuple[int, ...]:
    """The shape of one chunk's object: (layers, 2, kv_heads, chunk_tokens, head_dim)."""
    return (m.num_hidden_layers, 2, m.num_key_value_heads, chunk_tokens, m.head_dim)


def chunk_arrays(
    cache: Any, m: ModelSpec, chunk_tokens: int, first: int, count: int
) -> list[np.ndarray]:
    """Chunks first..first+count-1 of `cache` as contiguous float32 arrays (one copy each)."""
    import torch

    out = []
    for c in range(first, first + count):
        lo, hi = c * chunk_tokens, (c + 1) * chunk_tokens
        per_layer = []
        for layer in range(m.num_hidden_layers):
            k, v = _layer_kv(cache, layer)
            per_layer.append(torch.stack((k[0, :, lo:hi], v[0, :, lo:hi])))
        out.append(torch.stack(per_layer).contiguous().numpy())
    return out


def rebuild_cache(model: Any, chunks: Sequence[np.ndarray], tokens: int) -> Any:
    """A DynamicCache holding the first `tokens` tokens of `chunks` (arrays of chunk_shape).

    One concatenation per layer and K/V is the only copy: the concatenated tensors become the
    layer's cache directly (`DynamicCache.update` on an empty layer would copy them once more,
    64 MiB for 2,048 tokens of the reference model)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    views = [torch.from_numpy(c) for c in chunks]
    n_layers = views[0].shape[0] if views else 0
    for layer in range(n_layers):
        k = torch.cat([v[layer, 0] for v in views], dim=1)[:, :tokens].unsqueeze(0)
        v_ = torch.cat([v[layer, 1] for v in views], dim=1)[:, :tokens].unsqueeze(0)
        _set_layer(cache, layer, k, v_)
    return cache


def _set_layer(cache: Any, layer: int, k: Any, v: Any) -> None:
    layers = getattr(cache, "layers", None)
    if layers is not None and layer < len(layers) and hasattr(layers[layer], "keys"):
        # transformers 5.x: initialise the layer with an empty update, then hand it the tensors.
        cache.update(k[:, :, :0], v[:, :, :0], layer)
        layers[layer].keys, layers[layer].values = k, v
    else:
        cache.update(k, v, layer)
