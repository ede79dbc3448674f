"""`kvpool demo` (what `make run` runs): the pool doing the job it exists for.

1. Start the embedded pool (a master and one storage node, child processes).
2. Run a prefill instance (its own process) that writes the KV cache of a few prompts.
3. Run a decode instance (another process) that finds the longest cached prefix of its prompts,
   reads it back and checks every byte.
4. Print a report (objects, bytes, hit ratio, GB/s per direction, checksum failures) and stop
   everything; exit 0 only when every byte came back right.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
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

__all__ = ["demo"]

_D = WorkloadSpec()
_COUNT = click.IntRange(1, 1 << 20)
_COUNT0 = click.IntRange(0, 1 << 20)


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


@click.command()
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
@click.option("--layers", default=_D.layers, show_default=True, type=_COUNT)
@click.option("--chunk-tokens", default=_D.chunk_tokens, show_default=True, type=_COUNT)
@click.option("--kv-heads", default=_D.kv_heads, show_default=True, type=_COUNT)
@click.option("--head-dim", default=_D.head_dim, show_default=True, type=_COUNT)
@click.option("--prompts", default=_D.prompts, show_default=True, type=_COUNT)
@click.option("--prompt-chunks", default=_D.prompt_chunks, show_default=True, type=_COUNT)
@click.option("--new-prompts", default=_D.new_prompts, show_default=True, type=_COUNT0)
@click.option(
    "--json",
    "json_path",
    default=None,
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the report as JSON rows.",
)
def demo(
    *,
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
    """Prefill writes KV cache into the pool; another process reuses the cached prefixes."""
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
    pool = EmbeddedPool(PoolSpec(segment_size=size)) if master is None else None
    try:
        if pool is not None:
            click.echo(f"starting the embedded pool ({format_size(size)} segment) ...")
            try:
                master = pool.start()
            except KVPoolError as exc:
                raise click.ClickException(f"cannot start the embedded pool: {exc}") from exc
            assert pool.master is not None
            pids = [pool.master.pid] + [n.pid for n in pool.nodes]
            click.echo(f"embedded pool pids: {' '.join(map(str, pids))}")
        assert master is not None
        click.echo(
            f"pool at {master}; workload: {spec.layers} layers x {spec.chunk_tokens}-token chunks, "
            f"{format_size(spec.object_bytes)} per object, {format_size(spec.prefill_bytes)} to write"
        )
        pre = _run_worker("prefill", master, spec, protocol)
        dec = _run_worker("decode", master, spec, protocol)
    finally:
        if pool is not None:
            pool.close()
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
