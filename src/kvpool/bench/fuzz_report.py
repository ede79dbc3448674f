"""The table `kvpool bench fuzz` prints: one line a row, with what each metric's row means."""

from __future__ import annotations

from typing import Any

from kvpool.bench.rows import Column, render_table

__all__ = ["format_table"]


def _detail(r: dict[str, Any]) -> str:
    m = r["metric"]
    if m == "frames":
        return f"{r['frames_per_s']}/s, {sum(r['sessions'].values())} sessions {r['outcomes']}"
    if m == "scenario_s":
        return f"fuzz {r['fuzz_s']} s, settle {r['settle_s']} s, seed {r['seed']}"
    if m == "crashes":
        return f"died {r['died']}, tracebacks {sum(len(v) for v in r['tracebacks'].values())}"
    if m == "hangs":
        return f"of {r['probes']} probes (slowest {r['slowest_s']} s, limit {r['hang_s']} s)"
    if m == "serves_after":
        return str(r["detail"])
    if m == "replies_missing":
        return f"of {r['owed']} owed"
    if m == "flood":
        return (
            f"opened in {r.get('open_s')} s, refused {r.get('refused')} over cap {r.get('cap')}, "
            f"half left to the sweep"
        )
    if m == "slowloris_probe_s":
        failed = ", probe FAILED" if r["probe_failed"] else ""
        what = "half-sent headers" if r["kind"] == "header" else "writes without payload"
        return f"{r['kind']}: a probe behind {r['connections']} {what}{failed}"
    if m == "held_closed_by_server":
        ours = sum(r["closed_by_us"].values())
        return f"of {sum(r['opened'].values())} held ({ours} of them closed by the benchmark)"
    if "tolerance" in r:
        return f"baseline {r['baseline']}, peak {r['peak']}, tolerance {r['tolerance']}"
    return ""


_COLUMNS = (
    Column("metric", "<22", lambda r: r["metric"]),
    Column("target", "<9", lambda r: r.get("target", "")),
    Column("value", ">9", lambda r: str(r["value"])),
    Column(" detail", "", lambda r: f" {_detail(r)}"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    return "\n".join(line.rstrip() for line in render_table(_COLUMNS, rows).splitlines())
