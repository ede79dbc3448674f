"""`kvpool demo` (what `make run` runs): the pool doing the job it exists for.

By default, with a real model (`kvpool.llm`, needs the `llm` extra: torch and transformers):

1. Start the embedded pool (a master and one storage node, child processes).
2. Run a prefill engine (its own process): a seeded random-weight Llama model computes the KV
   cache of long prompts; every full chunk goes into the pool.
3. Run a decode engine (another process) on prompts sharing those prefixes: it loads the longest
   cached prefix, rebuilds the model's cache and continues; per prompt it prints the cached
   tokens, the time to first token with and without the pool, and the largest difference
   between its logits and a full recompute's.
4. Exit 0 only when every prompt found the prefix it should and every logit matched.

With `--synthetic`, the same flow moves synthetic float16 tensors instead (no torch needed):
a bandwidth demo with every byte checked.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import click

from kvpool.cli.params import Address, Size
from kvpool.client.embedded import EmbeddedPool, PoolSpec
from kvpool.client.node import MIN_SEGMENT_SIZE
from kvpool.client.validation import check_segment_size
from kvpool.config import format_size
from kvpool.demo.workload import WorkloadSpec, decode_prompts
from kvpool.errors import KVPoolError
from kvpool.llm.spec import MODEL_SIZES, JobSpec, prefill_bytes

__all__ = ["demo"]

_D = WorkloadSpec()
_COUNT = click.IntRange(1, 1 << 20)
_COUNT0 = click.IntRange(0, 1 << 20)


@contextlib.contextmanager
def _pool(master: str | None, size: int) -> Iterator[str]:
    """`master`, or the address of an embedded pool of one `size` segment started for the
    block (and stopped after it, also on failure)."""
    if master is not None:
        yield master
        return
    pool = EmbeddedPool(PoolSpec(segment_size=size))
    try:
        click.echo(f"starting the embedded pool ({format_size(size)} segment) ...")
        try:
            address = pool.start()
        except KVPoolError as exc:
            raise click.ClickException(f"cannot start the embedded pool: {exc}") from exc
        assert pool.master is not None
        pids = [pool.master.pid] + [n.pid for n in pool.nodes]
        click.echo(f"embedded pool pids: {' '.join(map(str, pids))}")
        yield address
    finally:
        pool.close()


def _run_worker(role: str, master: str, spec: WorkloadSpec, protocol: str) -> dict[str, Any]:
    args = [sys.executable, "-m", "kvpool.demo.worker", role, "--master", master]
    args += ["--protocol", protocol]
    for f in fields(WorkloadSpec):
        args += ["--" + f.name.replace("_", "-"), str(getattr(spec, f.name))]
    # stderr (the progress bar) goes straight to the terminal; stdout carries the RESULT line.
    proc = subprocess.run(args, stdout=subprocess.PIPE, text=True, timeout=600, check=False)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
        else:
            click.echo(line)
    if proc.returncode != 0 or result is None:
        raise click.ClickException(f"the {role} process failed (exit {proc.returncode})")
    return dict(result)


_J = JobSpec()
_SYNTHETIC_ONLY = ("layers", "kv_heads", "head_dim", "prompts", "prompt_chunks", "new_prompts")
_MODEL_ONLY = ("model_size", "prompt_tokens", "system_tokens", "question_tokens", "repeat", "atol")


@click.command()
@click.option(
    "--synthetic",
    is_flag=True,
    help="Move synthetic float16 tensors instead of running a model (no torch needed).",
)
@click.option(
    "--model-size",
    default=_J.model_size,
    show_default=True,
    type=click.Choice(list(MODEL_SIZES)),
    help="Model: tiny (tests), small, reference (issue #19's ~246M-parameter Llama).",
)
@click.option(
    "--prompt-tokens",
    default=_J.prompt_tokens,
    show_default=True,
    type=_COUNT,
    help="Model: tokens of the shared retrieval document.",
)
@click.option(
    "--system-tokens",
    default=_J.system_tokens,
    show_default=True,
    type=_COUNT,
    help="Model: tokens of the shared system prompt.",
)
@click.option(
    "--question-tokens",
    default=_J.question_tokens,
    show_default=True,
    type=_COUNT,
    help="Model: tokens of each new question (computed, never cached).",
)
@click.option(
    "--repeat",
    default=3,
    show_default=True,
    type=click.IntRange(1, 100),
    help="Model: time each cached-prefix load this many times (the median is shown).",
)
@click.option(
    "--atol",
    default=1e-4,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="Model: the largest logit difference from a full recompute that passes (see docs).",
)
@click.option(
    "--segment-size",
    default="1GiB",
    show_default=True,
    type=Size(minimum=MIN_SEGMENT_SIZE),
    help="Memory of the pool's node.",
)
@click.option(
    "--master",
    default=None,
    type=Address(),
    help="Use this running pool instead of starting one.",
)
@click.option(
    "--protocol", default="auto", show_default=True, type=click.Choice(["auto", "shm", "tcp"])
)
@click.option("--chunk-tokens", default=_D.chunk_tokens, show_default=True, type=_COUNT)
@click.option("--layers", default=_D.layers, show_default=True, type=_COUNT, help="Synthetic.")
@click.option("--kv-heads", default=_D.kv_heads, show_default=True, type=_COUNT, help="Synthetic.")
@click.option("--head-dim", default=_D.head_dim, show_default=True, type=_COUNT, help="Synthetic.")
@click.option("--prompts", default=_D.prompts, show_default=True, type=_COUNT, help="Synthetic.")
@click.option(
    "--prompt-chunks", default=_D.prompt_chunks, show_default=True, type=_COUNT, help="Synthetic."
)
@click.option(
    "--new-prompts", default=_D.new_prompts, show_default=True, type=_COUNT0, help="Synthetic."
)
@click.option(
    "--json",
    "json_path",
    default=None,
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the report as JSON rows.",
)
@click.pass_context
def demo(
    ctx: click.Context,
    *,
    synthetic: bool,
    model_size: str,
    prompt_tokens: int,
    system_tokens: int,
    question_tokens: int,
    repeat: int,
    atol: float,
    segment_size: int,
    master: str | None,
    protocol: str,
    layers: int,
    chunk_tokens: int,
    kv_heads: int,
    head_dim: int,
    prompts: int,
    prompt_chunks: int,
    new_prompts: int,
    json_path: str | None,
) -> None:
    """Prefill writes KV cache into the pool; another process reuses the cached prefixes.

    By default a real model (a seeded random-weight Llama, needs torch and transformers: the
    `llm` extra, which `make run` installs) runs in both processes, and the decode side checks its
    logits against a full recompute. `--synthetic` moves synthetic float16 tensors instead.
    Options marked "Model:" apply to the real model, "Synthetic." to --synthetic.
    """
    wrong = _MODEL_ONLY if synthetic else _SYNTHETIC_ONLY
    for name in wrong:
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            flag = "--" + name.replace("_", "-")
            why = "applies to the real model only" if synthetic else "needs --synthetic"
            raise click.UsageError(f"{flag} {why}")
    if master is None:  # before anything is imported or started, in both modes
        try:
            check_segment_size(segment_size, "--segment-size")
        except KVPoolError as exc:
            raise click.UsageError(exc.message) from exc
    if not synthetic:
        _real_model(
            JobSpec(
                model_size=model_size,
                prompt_tokens=prompt_tokens,
                system_tokens=system_tokens,
                question_tokens=question_tokens,
                chunk_tokens=chunk_tokens,
            ),
            segment_size=segment_size,
            master=master,
            protocol=protocol,
            repeat=repeat,
            atol=atol,
            json_path=json_path,
        )
        return
    try:
        spec = WorkloadSpec(
            layers=layers,
            chunk_tokens=chunk_tokens,
            kv_heads=kv_heads,
            head_dim=head_dim,
            prompts=prompts,
            prompt_chunks=prompt_chunks,
            new_prompts=new_prompts,
        )
        size = (
            segment_size
            if master is not None
            else check_segment_size(segment_size, "--segment-size")
        )
    except KVPoolError as exc:
        raise click.UsageError(exc.message) from exc
    if master is None and spec.prefill_bytes > size:
        raise click.BadParameter(
            f"the workload writes {format_size(spec.prefill_bytes)}, more than the "
            f"{format_size(size)} segment",
            param_hint="--segment-size",
        )
    t_start = time.perf_counter()
    with _pool(master, size) as address:
        click.echo(
            f"pool at {address}; workload: {spec.layers} layers x {spec.chunk_tokens}-token "
            f"chunks, {format_size(spec.object_bytes)} per object, "
            f"{format_size(spec.prefill_bytes)} to write"
        )
        pre = _run_worker("prefill", address, spec, protocol)
        dec = _run_worker("decode", address, spec, protocol)
    elapsed = time.perf_counter() - t_start
    hit_ratio = dec["hit_tokens"] / dec["tokens"] if dec["tokens"] else 0.0
    expected_hits = _expected_hit_tokens(spec)
    checksum_failures = pre["checksum_failures"] + dec["checksum_failures"]
    rows = [
        ("prefill (put)", pre),
        ("decode (get)", dec),
    ]
    click.echo("")
    click.echo(
        f"{'instance':<14} {'objects':>8} {'MiB':>9} {'seconds':>8} {'GB/s':>7} {'errors':>7}"
    )
    for name, r in rows:
        click.echo(
            f"{name:<14} {r['objects']:>8} {r['bytes'] / 2**20:>9.1f} {r['seconds']:>8.3f} "
            f"{r['gb_per_s']:>7.2f} {r['errors']:>7}"
        )
    click.echo("")
    click.echo(
        f"prefill reused {pre['skipped_objects']} objects of the shared system prompt; "
        f"decode hit ratio {hit_ratio:.1%} ({dec['hit_tokens']} of {dec['tokens']} prompt tokens "
        f"from the pool, {len(decode_prompts(spec))} prompts)"
    )
    click.echo(
        f"checksum failures: {checksum_failures}; byte mismatches: {dec['mismatches']}; "
        f"total time {elapsed:.1f} s"
    )
    if json_path:
        out = [
            {
                "system": "kvpool",
                "path": protocol,
                "op": op,
                "value_size": spec.object_bytes,
                "batch": spec.layers,
                "ops_per_s": r["objects"] / r["seconds"] if r["seconds"] else 0.0,
                "bytes_per_s": r["gb_per_s"] * 1e9,
            }
            for op, r in (("put", pre), ("get", dec))
        ]
        out.append({"system": "kvpool", "metric": "hit_ratio", "value": hit_ratio})
        try:
            with open(json_path, "w") as fh:
                json.dump(out, fh, indent=1)
        except OSError as exc:
            raise click.ClickException(f"cannot write --json {json_path}: {exc}") from exc
    ok = (
        checksum_failures == 0
        and dec["mismatches"] == 0
        and pre["errors"] == 0
        and dec["errors"] == 0
        and dec["hit_tokens"] == expected_hits
    )
    if not ok:
        raise click.ClickException(
            f"the demo found problems (expected {expected_hits} hit tokens, got "
            f"{dec['hit_tokens']}; see the table above)"
        )
    click.echo("demo: ok")


def _expected_hit_tokens(spec: WorkloadSpec) -> int:
    """Follow-up turns hit their whole original prompt; new prompts hit the system prompt."""
    per_prompt = (spec.system_chunks + spec.prompt_chunks) * spec.chunk_tokens
    return spec.prompts * per_prompt + spec.new_prompts * spec.system_chunks * spec.chunk_tokens


def _real_model(
    spec: JobSpec,
    *,
    segment_size: int,
    master: str | None,
    protocol: str,
    repeat: int,
    atol: float,
    json_path: str | None,
) -> None:
    from kvpool.llm.job import check_result, run_job, torch_missing

    missing = torch_missing()
    if missing is not None:
        raise click.ClickException(
            f"the real-model demo needs {missing} (the llm extra: `make run` installs it, or "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu && "
            "pip install -e '.[llm]'); `kvpool demo --synthetic` runs without it"
        )
    m = spec.model
    size = (
        segment_size if master is not None else check_segment_size(segment_size, "--segment-size")
    )
    if master is None and prefill_bytes(spec) > size:
        raise click.BadParameter(
            f"the prefill engine stores {format_size(prefill_bytes(spec))} of KV cache, more than "
            f"the {format_size(size)} segment",
            param_hint="--segment-size",
        )
    t_start = time.perf_counter()
    with _pool(master, size) as address:
        click.echo(
            f"pool at {address}; model: Llama {spec.model_size} (hidden {m.hidden_size}, "
            f"{m.num_hidden_layers} layers, {m.num_key_value_heads} KV heads, random weights, "
            f"seed {spec.seed}), {spec.chunk_tokens}-token chunks of "
            f"{format_size(m.kv_bytes_per_token() * spec.chunk_tokens)}"
        )
        try:
            result = run_job(spec, address, protocol=protocol, repeat=repeat, echo=click.echo)
        except KVPoolError as exc:
            raise click.ClickException(exc.message) from exc
    pre = result.prefill
    click.echo(
        f"\nprefill engine: {pre['prompts']} prompts, {pre['tokens']} tokens in "
        f"{pre['forward_s']:.1f} s; stored {pre['chunks']} chunks ({format_size(pre['bytes'])}) "
        f"in the pool"
    )
    click.echo("")
    head = (
        f"{'prompt':<10} {'shares':<26} {'tokens':>6} {'cached':>6} {'KV MiB':>7} "
        f"{'TTFT pool':>10} {'TTFT recompute':>15} {'speedup':>8} {'max |dlogit|':>12}"
    )
    click.echo(head)
    click.echo("-" * len(head))
    for r in result.prompts:
        speedup = r["ttft_recompute_s"] / r["ttft_pool_s"] if r["ttft_pool_s"] else 0.0
        click.echo(
            f"{r['prompt']:<10} {r['shares']:<26} {r['prompt_tokens']:>6} {r['cached_tokens']:>6} "
            f"{r['kv_bytes'] / 2**20:>7.1f} {r['ttft_pool_s']:>9.3f}s "
            f"{r['ttft_recompute_s']:>14.3f}s {speedup:>7.1f}x {r['logits_max_abs_diff']:>12.3g}"
        )
    problems = check_result(spec, result, atol)
    click.echo(f"\ntotal time {time.perf_counter() - t_start:.1f} s")
    if json_path:
        from kvpool.bench.llm import rows_of
        from kvpool.bench.rows import write_json

        try:
            write_json(json_path, rows_of(spec, protocol, result))
        except OSError as exc:
            raise click.ClickException(f"cannot write --json {json_path}: {exc}") from exc
    if problems:
        for p in problems:
            click.echo(f"MISMATCH {p}", err=True)
        raise click.ClickException(f"the demo found {len(problems)} problem(s)")
    click.echo(f"demo: ok (every continuation matched a full recompute within {atol:g})")
