"""The real-model job's prompts and chunk keys (numpy only: these run without torch)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kvpool.errors import InvalidParams
from kvpool.llm.job import JobResult, check_result
from kvpool.llm.spec import (
    JobSpec,
    chunk_keys,
    decode_prompts,
    expected_cached_tokens,
    prefill_bytes,
    prefill_prompts,
)
from kvtest.llm import TINY_SPEC as SPEC


def test_key_of_a_chunk_chains_every_token_before_it() -> None:
    tokens = prefill_prompts(SPEC)[1].tokens
    keys = chunk_keys(SPEC, tokens)
    changed = tokens.copy()
    changed[3] += 1  # a token of the first chunk: every key changes
    assert not set(keys) & set(chunk_keys(SPEC, changed))
    tail = tokens.copy()
    tail[-1] += 1  # a token of the last full chunk or the partial tail: earlier keys stay
    assert chunk_keys(SPEC, tail)[:-1] == keys[:-1]


def test_only_full_chunks_have_keys() -> None:
    tokens = prefill_prompts(SPEC)[0].tokens
    assert len(chunk_keys(SPEC, tokens)) == len(tokens) // SPEC.chunk_tokens
    assert chunk_keys(SPEC, tokens[: SPEC.chunk_tokens - 1]) == []


def test_keys_name_the_model_so_two_models_never_share_them() -> None:
    tokens = prefill_prompts(SPEC)[0].tokens
    other = JobSpec(**{**SPEC.to_dict(), "seed": SPEC.seed + 1})  # type: ignore[arg-type]
    assert chunk_keys(SPEC, tokens)[0] != chunk_keys(other, tokens)[0]


def test_decode_prompts_share_the_intended_prefixes() -> None:
    pre = {p.name: p.tokens for p in prefill_prompts(SPEC)}
    dec = {p.name: p.tokens for p in decode_prompts(SPEC)}
    s = SPEC.system_tokens
    assert all(np.array_equal(t[:s], pre["chat"][:s]) for t in dec.values())
    assert np.array_equal(dec["chat+turn"][: len(pre["chat"])], pre["chat"])
    doc = s + SPEC.prompt_tokens
    assert np.array_equal(dec["rag-q2"][:doc], pre["rag"][:doc])
    assert not np.array_equal(dec["rag-q2"][doc:], dec["rag-q3"][doc:])
    cached = {p.name: expected_cached_tokens(SPEC, p) for p in decode_prompts(SPEC)}
    assert cached == {
        "system": 32,  # the system prompt's two full chunks
        "chat+turn": (32 + 48 + 4) // 16 * 16,  # the conversation's full chunks
        "rag-q2": 128,  # system prompt and document
        "rag-q3": 128,
    }


def test_prompts_and_keys_are_the_same_in_another_process() -> None:
    code = (
        "from kvpool.llm.spec import *\n"
        f"spec = JobSpec(**{SPEC.to_dict()!r})\n"
        "p = decode_prompts(spec)[2]\n"
        "print(p.tokens.tobytes().hex()); print(chunk_keys(spec, p.tokens)[-1].to_string())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    tokens, key = out.stdout.split()
    p = decode_prompts(SPEC)[2]
    assert bytes.fromhex(tokens) == p.tokens.tobytes()
    assert key == chunk_keys(SPEC, p.tokens)[-1].to_string()


@pytest.mark.parametrize("kw", [{"model_size": "huge"}, {"chunk_tokens": 0}, {"prompt_tokens": -1}])
def test_bad_specs_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidParams):
        JobSpec(**kw)  # type: ignore[arg-type]


def test_prefill_bytes_count_each_distinct_chunk_once() -> None:
    chunks = {k for p in prefill_prompts(SPEC) for k in chunk_keys(SPEC, p.tokens)}
    shared = SPEC.system_tokens // SPEC.chunk_tokens
    total = sum(len(p.tokens) // SPEC.chunk_tokens for p in prefill_prompts(SPEC))
    assert len(chunks) == total - shared
    assert prefill_bytes(SPEC) == len(chunks) * SPEC.chunk_tokens * SPEC.model.kv_bytes_per_token()


def _row(name: str, cached: int, diff: float = 0.0, same: bool = True) -> dict[str, object]:
    return {
        "prompt": name,
        "cached_tokens": cached,
        "logits_max_abs_diff": diff,
        "same_first_token": same,
    }


def test_check_result_names_every_problem() -> None:
    good = [_row(p.name, expected_cached_tokens(SPEC, p)) for p in decode_prompts(SPEC)]
    pre = {"weights": "a", "store_failures": 0}
    assert check_result(SPEC, JobResult(pre, {"weights": "a", "prompts": good})) == []
    bad = [
        _row("system", 32, diff=1e-3),
        _row("chat+turn", 0),
        _row("rag-q2", 128, same=False),
        good[3],
    ]
    problems = check_result(SPEC, JobResult(pre, {"weights": "b", "prompts": bad}), atol=1e-4)
    assert len(problems) == 4
    assert "different weights" in problems[0]
    assert "system: logits differ" in problems[1]
    assert "chat+turn: 0 cached tokens, expected 80" in problems[2]
    assert "rag-q2: the first token differs" in problems[3]
