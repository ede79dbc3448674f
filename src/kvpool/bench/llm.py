"""`kvpool bench llm`: time to first token of a real model with and without the pool.

The real-model job (`kvpool.llm`) as a benchmark: an embedded pool, one prefill engine process
(a seeded random-weight Llama, by default issue #19's reference config) that stores the KV cache
of its prompts, then, for each path, a decode engine process that loads the longest cached
prefix of each decode prompt (`kvpool.cache` prefetch: L1, then the pool), rebuilds the
transformers cache and computes the rest, and also recomputes the whole prompt. The decode
prompts are those of `kvpool demo`; by default the system prompt (256 tokens) and the document
(1,792) make a 2,048-token shared context, followed by a 16-token question.

Paths: "auto" (shared memory on this host, the control plane over a Unix socket) and "tcp"
(`protocol="tcp"` and `KVPOOL_RPC_UNIX=0`: every byte through the node's transfer server, as
between hosts). The prefill runs once; the decode engines of both paths read its chunks.

Rows (JSON, `metric`/`value` form): `ttft_s` for system "kvpool" (the median of `--repeat`
loads) and "recompute", `ttft_speedup` (recompute over kvpool) and `logits_max_abs_diff`
(the continuation's logits against the recompute's), each with the prompt, `prompt_tokens`,
`cached_tokens`, `kv_bytes`, `path` and `model`. Exits 1 when a logit differs by more than
`--atol` or a prompt misses its prefix; never asserts a speed.

    kvpool bench llm --json llm.json          # reference model, 2,048-token context (~3 min)
    kvpool bench llm --quick                  # the tiny model, seconds (what the tests run)
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import click

from kvpool.bench.rows import Column, render_table, write_json
from kvpool.client.embedded import EmbeddedPool, PoolSpec
from kvpool.config import format_size
from kvpool.llm.job import JobResult, check_result, run_engine, torch_missing
from kvpool.llm.spec import MODEL_SIZES, QUICK_SPEC, JobSpec

__all__ = ["command", "rows_of"]


def rows_of(spec: JobSpec, path: str, result: JobResult) -> list[dict[str, Any]]:
    """The benchmark's JSON rows for one decode run."""
    out: list[dict[str, Any]] = []
    for r in result.prompts:
        common = {
            "prompt": r["prompt"],
            "prompt_tokens": r["prompt_tokens"],
            "cached_tokens": r["cached_tokens"],
            "kv_bytes": r["kv_bytes"],
            "path": path,
            "model": spec.model_size,
        }
        pool_s, full_s = r["ttft_pool_s"], r["ttft_recompute_s"]
        out.append(
            {
                "metric": "ttft_s",
                "system": "kvpool",
                "value": pool_s,
                **common,
                "load_s": r["load_s"],
                "rebuild_s": r["rebuild_s"],
                "runs": r["runs"],
            }
        )
        out.append({"metric": "ttft_s", "system": "recompute", "value": full_s, **common})
        out.append(
            {
                "metric": "ttft_speedup",
                "system": "kvpool",
                "value": full_s / pool_s if pool_s > 0 else 0.0,
                **common,
            }
        )
        out.append(
            {
                "metric": "logits_max_abs_diff",
                "system": "kvpool",
                "value": r["logits_max_abs_diff"],
                **common,
            }
        )
    return out


_COLUMNS = [
    Column("path", "<5", lambda r: r["path"]),
    Column("prompt", "<10", lambda r: r["prompt"]),
    Column("tokens", ">6", lambda r: str(r["prompt_tokens"])),
    Column("cached", ">6", lambda r: str(r["cached_tokens"])),
    Column("KV MiB", ">7", lambda r: f"{r['kv_bytes'] / 2**20:.1f}"),
    Column("load s", ">7", lambda r: f"{r['load_s']:.3f}"),
    Column("rebuild s", ">9", lambda r: f"{r['rebuild_s']:.3f}"),
    Column("TTFT kvpool s", ">13", lambda r: f"{r['ttft_pool_s']:.3f}"),
    Column("TTFT recompute s", ">16", lambda r: f"{r['ttft_recompute_s']:.3f}"),
    Column("speedup", ">8", lambda r: f"{r['ttft_recompute_s'] / r['ttft_pool_s']:.1f}x"),
    Column("max |dlogit|", ">12", lambda r: f"{r['logits_max_abs_diff']:.3g}"),
]


@click.command(name="llm")
@click.option(
    "--model-size", default="reference", show_default=True, type=click.Choice(list(MODEL_SIZES))
)
@click.option(
    "--prompt-tokens",
    default=1792,
    show_default=True,
    type=click.IntRange(1, 1 << 20),
    help="Tokens of the document (after the system prompt).",
)
@click.option("--system-tokens", default=256, show_default=True, type=click.IntRange(1, 1 << 20))
@click.option("--chunk-tokens", default=256, show_default=True, type=click.IntRange(1, 1 << 20))
@click.option(
    "--repeat",
    default=5,
    show_default=True,
    type=click.IntRange(1, 100),
    help="Cached-prefix loads per prompt (the median is reported).",
)
@click.option(
    "--paths", default="auto,tcp", show_default=True, help="Comma-separated: auto, shm, tcp."
)
@click.option("--atol", default=1e-4, show_default=True, type=click.FloatRange(0.0, 1.0))
@click.option("--quick", is_flag=True, help="The tiny model and short prompts: seconds (tests).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False, writable=True))
def command(  # noqa: PLR0917 - click passes options by name
    model_size: str,
    prompt_tokens: int,
    system_tokens: int,
    chunk_tokens: int,
    repeat: int,
    paths: str,
    atol: float,
    quick: bool,
    json_path: str | None,
) -> None:
    """Time to first token with the pool against a full recompute, on a real (random) Llama."""
    missing = torch_missing()
    if missing is not None:
        raise click.ClickException(f"bench llm needs {missing}: install the llm extra (make llm)")
    path_list = [p.strip() for p in paths.split(",") if p.strip()]
    for p in path_list:
        if p not in ("auto", "shm", "tcp"):
            raise click.BadParameter(f"unknown path {p!r}", param_hint="--paths")
    if quick:
        spec = QUICK_SPEC
        repeat = 1
    else:
        spec = JobSpec(
            model_size=model_size,
            prompt_tokens=prompt_tokens,
            system_tokens=system_tokens,
            turn_tokens=256,
            chunk_tokens=chunk_tokens,
        )
    per_token = spec.model.kv_bytes_per_token()
    click.echo(
        f"model {spec.model_size} ({spec.model.num_hidden_layers} layers, hidden "
        f"{spec.model.hidden_size}); KV {format_size(per_token)}/token, "
        f"{format_size(per_token * spec.chunk_tokens)} per {spec.chunk_tokens}-token chunk"
    )
    rows: list[dict[str, Any]] = []
    table: list[dict[str, Any]] = []
    problems: list[str] = []
    t0 = time.perf_counter()
    with EmbeddedPool(PoolSpec(segment_size=2 << 30)) as pool:
        master = pool.address
        pre = run_engine("prefill", master, spec, echo=click.echo)
        click.echo(
            f"prefill: {pre['tokens']} tokens in {pre['forward_s']:.1f} s, "
            f"{pre['chunks']} chunks stored"
        )
        for path in path_list:
            dec = run_engine("decode", master, spec, protocol=path, repeat=repeat, echo=click.echo)
            result = JobResult(pre, dec)
            problems += [f"{path}: {p}" for p in check_result(spec, result, atol)]
            rows += rows_of(spec, path, result)
            table += [{**r, "path": path} for r in result.prompts]
    click.echo("")
    click.echo(render_table(_COLUMNS, table))
    longest = [r for r in table if r["prompt_tokens"] == max(x["prompt_tokens"] for x in table)]
    if longest:
        click.echo(
            f"\nlongest prompt ({longest[0]['prompt_tokens']} tokens): median speedup "
            f"{statistics.median(r['ttft_recompute_s'] / r['ttft_pool_s'] for r in longest):.1f}x; "
            f"total {time.perf_counter() - t0:.0f} s"
        )
    if json_path:
        write_json(json_path, rows)
    if problems:
        for p in problems:
            click.echo(f"MISMATCH {p}", err=True)
        raise SystemExit(1)
