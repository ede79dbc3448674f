"""The demo's workload is deterministic across processes and shares exactly the prefixes it should."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kvpool.demo.workload import (
    WorkloadSpec,
    chunk_hashes,
    chunk_key,
    decode_prompts,
    fill_kv,
    prefill_prompts,
)
from kvpool.errors import InvalidParams

SPEC = WorkloadSpec(layers=2, chunk_tokens=16, kv_heads=2, head_dim=8, prompts=3, prompt_chunks=2)


def test_prompts_share_only_the_system_prompt() -> None:
    hs = [chunk_hashes(p.tokens, SPEC) for p in prefill_prompts(SPEC)]
    assert all(len(h) == SPEC.system_chunks + SPEC.prompt_chunks for h in hs)
    assert len({h[0] for h in hs}) == 1  # the system chunk
    assert len({h[1] for h in hs}) == len(hs)  # then each its own


def test_follow_up_turns_extend_their_prompt_and_new_prompts_share_the_system_prompt() -> None:
    pre = {p.name: chunk_hashes(p.tokens, SPEC) for p in prefill_prompts(SPEC)}
    dec = {p.name: chunk_hashes(p.tokens, SPEC) for p in decode_prompts(SPEC)}
    for name, h in pre.items():
        follow = dec[name + "+turn"]
        assert follow[: len(h)] == h and len(follow) == len(h) + SPEC.extra_chunks
    system = pre["prompt-0"][0]
    news = [h for n, h in dec.items() if n.startswith("new-")]
    assert len(news) == SPEC.new_prompts
    assert all(h[0] == system and h[1] not in pre["prompt-0"] for h in news)


def test_a_partial_chunk_has_no_key() -> None:
    tokens = prefill_prompts(SPEC)[0].tokens
    assert len(chunk_hashes(tokens[:-1], SPEC)) == len(chunk_hashes(tokens, SPEC)) - 1


def test_keys_and_tensors_are_the_same_in_another_process() -> None:
    h = chunk_hashes(prefill_prompts(SPEC)[1].tokens, SPEC)[-1]
    here = np.empty(SPEC.kv_shape, np.float16)
    fill_kv(SPEC, h, 1, here)
    code = (
        "import numpy as np\n"
        "from kvpool.demo.workload import *\n"
        f"spec = WorkloadSpec(**{SPEC_KW!r})\n"
        "h = chunk_hashes(prefill_prompts(spec)[1].tokens, spec)[-1]\n"
        "a = np.empty(spec.kv_shape, np.float16); fill_kv(spec, h, 1, a)\n"
        "print(chunk_key(spec, h, 1)); print(a.tobytes().hex())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    key, data = out.stdout.split()
    assert key == chunk_key(SPEC, h, 1)
    assert bytes.fromhex(data) == here.tobytes()
    assert np.isfinite(here).all()


SPEC_KW = {
    "layers": 2,
    "chunk_tokens": 16,
    "kv_heads": 2,
    "head_dim": 8,
    "prompts": 3,
    "prompt_chunks": 2,
}


def test_sizes() -> None:
    assert SPEC.object_bytes == 2 * 16 * 2 * 8 * 2
    assert SPEC.prefill_bytes == (1 + 3 * 2) * 2 * SPEC.object_bytes
    default = WorkloadSpec()
    assert 200 << 20 <= default.prefill_bytes <= 600 << 20  # "a few hundred MiB"


@pytest.mark.parametrize(
    "kw", [{"layers": 0}, {"chunk_tokens": -1}, {"new_prompts": -1}, {"model": "a/b"}]
)
def test_bad_specs_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidParams):
        WorkloadSpec(**kw)  # type: ignore[arg-type]
