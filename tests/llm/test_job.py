"""The real-model job end to end: a real pool, a prefill engine process that stores, a decode
engine process that loads the prefixes and matches a full recompute; the command and the bench."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvpool.client.embedded import EmbeddedPool, PoolSpec
from kvpool.llm.job import check_result, run_job
from kvpool.llm.spec import decode_prompts, expected_cached_tokens
from kvtest.llm import TINY_SPEC as SPEC

TINY = [
    "--model-size", "tiny", "--prompt-tokens", "96", "--system-tokens", "32",
    "--question-tokens", "8", "--chunk-tokens", "16",
]  # fmt: skip


@pytest.mark.parametrize("protocol", ["auto", "tcp"])
def test_decode_engine_loads_what_prefill_stored_and_matches_a_recompute(protocol: str) -> None:
    with EmbeddedPool(PoolSpec(segment_size=64 << 20)) as pool:
        result = run_job(SPEC, pool.address, protocol=protocol, progress=False, echo=lambda _: None)
    assert result.prefill["weights"] == result.decode["weights"]
    assert result.prefill["chunks"] > 0 and result.prefill["store_failures"] == 0
    rows = {r["prompt"]: r for r in result.prompts}
    for p in decode_prompts(SPEC):
        row = rows[p.name]
        assert row["cached_tokens"] == expected_cached_tokens(SPEC, p) > 0
        assert row["kv_bytes"] == row["hit_chunks"] * 16 * SPEC.model.kv_bytes_per_token()
        assert row["logits_max_abs_diff"] <= 1e-5, row  # 0.0 here; see docs/parts/perf-llm.md
        assert row["same_first_token"]
    assert check_result(SPEC, result, atol=0.0) == []


def test_kvpool_demo_runs_the_model_and_prints_one_row_per_prompt(tmp_path: Path) -> None:
    out_json = tmp_path / "demo.json"
    args = [sys.executable, "-m", "kvpool", "demo", *TINY, "--segment-size", "64MiB"]
    out = subprocess.run(
        [*args, "--json", str(out_json)], capture_output=True, text=True, timeout=180, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo: ok" in out.stdout
    for name in ("system", "chat+turn", "rag-q2", "rag-q3"):
        assert any(line.startswith(name + " ") for line in out.stdout.splitlines()), out.stdout
    assert "prefill chat" in out.stderr  # the progress bar
    rows = json.loads(out_json.read_text())
    assert {r["metric"] for r in rows} == {"ttft_s", "ttft_speedup", "logits_max_abs_diff"}


def test_bench_llm_quick_writes_the_rows_of_both_paths(tmp_path: Path) -> None:
    out_json = tmp_path / "llm.json"
    out = subprocess.run(
        [sys.executable, "-m", "kvpool", "bench", "llm", "--quick", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(out_json.read_text())
    assert {r["path"] for r in rows} == {"auto", "tcp"}
    assert {(r["metric"], r["system"]) for r in rows} == {
        ("ttft_s", "kvpool"),
        ("ttft_s", "recompute"),
        ("ttft_speedup", "kvpool"),
        ("logits_max_abs_diff", "kvpool"),
    }
    for r in rows:
        assert r["prompt_tokens"] > r["cached_tokens"] > 0 and r["kv_bytes"] > 0
        if r["metric"] == "logits_max_abs_diff":
            assert r["value"] <= 1e-5
