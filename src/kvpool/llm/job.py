"""The real-model job (`kvpool demo`, `make run`): the embedded pool, a prefill engine, a
decode engine, and the report.

`run_engine` starts one engine process (`kvpool.llm.engine`) and returns its RESULT; `run_job`
starts the pool (unless given one), runs prefill then decode, and returns both results. The
command (`kvpool.cli.demo`) and the benchmark (`kvpool.bench.llm`) print them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from kvpool.errors import KVPoolError
from kvpool.llm.spec import JobSpec

__all__ = ["EngineFailed", "JobResult", "check_result", "run_engine", "run_job", "torch_missing"]


class EngineFailed(KVPoolError):
    """An engine process exited non-zero or printed no RESULT line."""


@dataclass(slots=True)
class JobResult:
    prefill: dict[str, Any]
    decode: dict[str, Any]
    pool_pids: list[int] = field(default_factory=list)

    @property
    def prompts(self) -> list[dict[str, Any]]:
        return list(self.decode["prompts"])


def torch_missing() -> str | None:
    """The missing module's name when the `llm` extra is not installed, else None."""
    import importlib.util

    for name in ("torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            return name
    return None


def run_engine(
    role: str,
    master: str,
    spec: JobSpec,
    *,
    protocol: str = "auto",
    repeat: int = 1,
    recompute_repeat: int = 1,
    progress: bool = True,
    echo: Any = print,
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Run one engine process; its stderr (progress bars) goes to ours, stdout lines to `echo`."""
    args = [sys.executable, "-m", "kvpool.llm.engine", role, "--master", master]
    args += ["--spec", json.dumps(spec.to_dict()), "--protocol", protocol]
    args += ["--repeat", str(repeat), "--recompute-repeat", str(recompute_repeat)]
    if not progress:
        args.append("--no-progress")
    proc = subprocess.run(args, stdout=subprocess.PIPE, text=True, timeout=timeout, check=False)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
        else:
            echo(line)
    if proc.returncode != 0 or result is None:
        raise EngineFailed(f"the {role} engine failed (exit {proc.returncode})")
    return dict(result)


def run_job(
    spec: JobSpec,
    master: str,
    *,
    protocol: str = "auto",
    repeat: int = 1,
    progress: bool = True,
    echo: Any = print,
) -> JobResult:
    """Prefill then decode against the pool at `master`."""
    pre = run_engine("prefill", master, spec, protocol=protocol, progress=progress, echo=echo)
    dec = run_engine(
        "decode", master, spec, protocol=protocol, repeat=repeat, progress=progress, echo=echo
    )
    return JobResult(pre, dec)


def check_result(spec: JobSpec, result: JobResult, atol: float = 0.0) -> list[str]:
    """Every problem the job found (empty: all good)."""
    from kvpool.llm.spec import decode_prompts, expected_cached_tokens

    problems = []
    if result.prefill["weights"] != result.decode["weights"]:
        problems.append("the two engines built different weights")
    if result.prefill.get("store_failures"):
        problems.append(f"{result.prefill['store_failures']} chunks failed to reach the pool")
    expected = {p.name: expected_cached_tokens(spec, p) for p in decode_prompts(spec)}
    for row in result.prompts:
        name = row["prompt"]
        if row["logits_max_abs_diff"] > atol:
            problems.append(
                f"{name}: logits differ from the recompute by {row['logits_max_abs_diff']:.3g} "
                f"(tolerance {atol:g})"
            )
        if not row["same_first_token"]:
            problems.append(f"{name}: the first token differs from the recompute's")
        if row["cached_tokens"] != expected[name]:
            problems.append(
                f"{name}: {row['cached_tokens']} cached tokens, expected {expected[name]}"
            )
    return problems
