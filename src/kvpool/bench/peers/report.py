"""What `kvpool bench compare` prints and writes: table, ratios, targets, JSON rows, plot.

Ratios compare kvpool with every other row measured in the same run. Two kvpool rows are the
numerators: `kvpool/shm` (the default path between processes on one host) and `kvpool/tcp`
(TCP forced). Each ratio comes two ways:

* by throughput: kvpool's keys/s ÷ the peer's (medians over rounds), what the targets use;
* by p50: the peer's median call time ÷ kvpool's. A neighbour that takes the CPU for a few ms
  moves the mean (so the throughput) of whoever was running, but hardly the median; when the
  two ratios disagree, the machine was noisy during that case.

The targets of the issue are listed under the table with "met" or "MISSED". Nothing here
asserts speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.bench.peers.workload import Measurement, case_name, size_name

__all__ = [
    "TARGETS",
    "Skipped",
    "Target",
    "json_rows",
    "plot",
    "render_markdown",
    "render_table",
    "render_targets",
]

KVPOOL_SHM = ("kvpool", "shm")
KVPOOL_TCP = ("kvpool", "tcp")
KVPOOL_SHM_FAST = ("kvpool", "shm+fast")
"""kvpool's faster modes for content-addressed keys (`KvpoolDriver(fast=True)`)."""
KVPOOL_TCP_FAST = ("kvpool", "tcp+fast")
_NUMERATORS = (KVPOOL_SHM, KVPOOL_TCP, KVPOOL_SHM_FAST, KVPOOL_TCP_FAST)
_GB = 1e9


@dataclass(frozen=True, slots=True)
class Skipped:
    """A system that did not run, why, and the command that would install it."""

    label: str
    reason: str
    install: str = ""


@dataclass(frozen=True, slots=True)
class Target:
    """`numerator ÷ denominator >= minimum` on throughput, for the cases `applies` accepts."""

    name: str
    numerator: tuple[str, str]
    denominator: tuple[str, str]
    minimum: float
    min_size: int = 0
    max_size: int = 1 << 62
    batched: bool | None = None  # True: batch calls only, False: single only, None: both
    op: str = ""  # "put" or "get" only; "" both

    def applies(self, m: Measurement) -> bool:
        if not self.min_size <= m.value_size <= self.max_size:
            return False
        if self.op and m.op != self.op:
            return False
        return self.batched is None or self.batched == (m.batch > 1)


_MIB = 1 << 20
_SMALL = 64 << 10
_MOONCAKE = ("mooncake", "tcp")
_REDIS_UNIX = ("redis", "unix")
# The targets of issue 5, as written there (ratios from one run on the 2-core machines).
TARGETS: tuple[Target, ...] = (
    Target("kvpool/Mooncake, small single ops", KVPOOL_SHM, _MOONCAKE, 1.5, 0, _SMALL, False),
    Target("kvpool/Mooncake, small batches", KVPOOL_SHM, _MOONCAKE, 1.0, 0, _SMALL, True),
    Target("kvpool/Mooncake, >= 1 MiB", KVPOOL_SHM, _MOONCAKE, 3.0, _MIB),
    Target("kvpool shm / memcpy, >= 1 MiB", KVPOOL_SHM, ("limit", "memcpy"), 0.7, _MIB),
    Target("kvpool tcp / raw socket, >= 1 MiB", KVPOOL_TCP, ("limit", "socket"), 0.7, _MIB),
    Target("kvpool/Redis, every row", KVPOOL_SHM, ("redis", "tcp"), 1.0),
    # Not in the issue: Redis over a Unix socket, as kvpool's control plane is on one host.
    Target("kvpool/Redis over a Unix socket, every row", KVPOOL_SHM, ("redis", "unix"), 1.0),
    # Issue 18: the faster modes (rows "shm+fast" / "tcp+fast"), strict stays >= 1.0 above.
    Target("fast shm / memcpy, >= 1 MiB", KVPOOL_SHM_FAST, ("limit", "memcpy"), 0.7, _MIB),
    Target("fast tcp / raw socket, 1 MiB", KVPOOL_TCP_FAST, ("limit", "socket"), 0.7, _MIB, _MIB),
    Target(
        "fast/Redis unix, small single ops", KVPOOL_SHM_FAST, _REDIS_UNIX, 1.2, 0, _SMALL, False
    ),
    Target("fast/Redis unix, small batches", KVPOOL_SHM_FAST, _REDIS_UNIX, 1.5, 0, _SMALL, True),
    Target(
        "fast/Redis unix, small single gets",
        KVPOOL_SHM_FAST,
        _REDIS_UNIX,
        2.0,
        0,
        _SMALL,
        False,
        op="get",
    ),
)


def _key(m: Measurement) -> tuple[str, int, int]:
    return (m.op, m.value_size, m.batch)


def _index(results: Sequence[Measurement]) -> dict[tuple[str, str, str, int, int], Measurement]:
    return {(m.system, m.path, m.op, m.value_size, m.batch): m for m in results}


def _ratio(num: Measurement | None, den: Measurement) -> float | None:
    """kvpool ÷ peer by throughput (higher is better for kvpool)."""
    if num is None or den.ops_per_s <= 0:
        return None
    return num.ops_per_s / den.ops_per_s


def _p50_ratio(num: Measurement | None, den: Measurement) -> float | None:
    """peer p50 ÷ kvpool p50: the same direction as `_ratio` (higher is better for kvpool)."""
    if num is None or num.p50_us <= 0:
        return None
    return den.p50_us / num.p50_us


def _fmt_ratio(r: float | None) -> str:
    return "" if r is None else f"{r:.2f}"


def _fmt_pair(num: Measurement | None, den: Measurement) -> str:
    r, p = _ratio(num, den), _p50_ratio(num, den)
    return "" if r is None or p is None else f"{r:.2f} / {p:.2f}"


def _fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


_ORDER = {"kvpool": 0, "mooncake": 1, "redis": 2, "limit": 3}


def _blocks(
    results: Sequence[Measurement],
) -> list[tuple[str, int, int, list[Measurement]]]:
    """(op, size, batch, rows) per case: small sizes first, put before get, kvpool first."""
    groups: dict[tuple[str, int, int], list[Measurement]] = {}
    for m in results:
        groups.setdefault(_key(m), []).append(m)
    out = []
    for (op, size, batch), rows in sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != "put")
    ):
        rows.sort(key=lambda m: (_ORDER.get(m.system, 9), m.path))
        out.append((op, size, batch, rows))
    return out


_LEGEND = (
    "api: the client call measured, the fastest of the system's ways (timed at warm-up). "
    "ops/s counts keys (a batch call moves `batch` keys); p50/p99 are per call. "
    "shm÷ and tcp÷: kvpool/shm (kvpool/tcp) over this row, by throughput / by p50 call time; "
    "above 1 means kvpool is faster."
)


def render_table(results: Sequence[Measurement], skipped: Sequence[Skipped] = ()) -> str:
    """The text table: one block per (op, case), kvpool first, ratios against kvpool."""
    idx = _index(results)
    header = (
        f"{'op':<4} {'case':<11} {'system/path':<15} {'api':<14} {'ops/s':>7} {'GB/s':>7} "
        f"{'p50 us':>8} {'p99 us':>8} {'shm÷ thru / p50':>16} {'tcp÷ thru / p50':>16}"
    )
    lines = [header, "-" * len(header)]
    for op, size, batch, rows in _blocks(results):
        shm = idx.get((*KVPOOL_SHM, op, size, batch))
        tcp = idx.get((*KVPOOL_TCP, op, size, batch))
        for m in rows:
            mine = m.system == "kvpool"
            lines.append(
                f"{op:<4} {case_name(size, batch):<11} {m.label:<15} {m.api[:14]:<14} "
                f"{_fmt_rate(m.ops_per_s):>7} "
                f"{m.bytes_per_s / _GB:>7.3f} {m.p50_us:>8.0f} {m.p99_us:>8.0f} "
                f"{'' if mine else _fmt_pair(shm, m):>16} {'' if mine else _fmt_pair(tcp, m):>16}"
            )
        lines.append("")
    lines.append(_LEGEND)
    for s in skipped:
        hint = f"; install: {s.install}" if s.install else ""
        lines.append(f"skipped: {s.label}: {s.reason}{hint}")
    return "\n".join(lines)


def render_markdown(results: Sequence[Measurement], skipped: Sequence[Skipped] = ()) -> str:
    """The same table in Markdown, for docs/performance.md."""
    idx = _index(results)
    lines = [
        "| op | case | system/path | api | ops/s | GB/s | p50 µs | p99 µs "
        "| kvpool shm ÷ this (thru / p50) | kvpool tcp ÷ this (thru / p50) |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for op, size, batch, rows in _blocks(results):
        shm = idx.get((*KVPOOL_SHM, op, size, batch))
        tcp = idx.get((*KVPOOL_TCP, op, size, batch))
        for m in rows:
            mine = m.system == "kvpool"
            label = f"**{m.label}**" if mine else m.label
            lines.append(
                f"| {op} | {case_name(size, batch)} | {label} | `{m.api}` | {_fmt_rate(m.ops_per_s)} "
                f"| {m.bytes_per_s / _GB:.3f} | {m.p50_us:.0f} | {m.p99_us:.0f} "
                f"| {'' if mine else _fmt_pair(shm, m)} | {'' if mine else _fmt_pair(tcp, m)} |"
            )
    lines.append("")
    lines.append(_LEGEND)
    for s in skipped:
        hint = f" (install: `{s.install}`)" if s.install else ""
        lines.append(f"\nSkipped: {s.label}: {s.reason}{hint}")
    return "\n".join(lines)


def _target_ratios(
    target: Target, results: Sequence[Measurement]
) -> list[tuple[Measurement, float, float]]:
    idx = _index(results)
    out: list[tuple[Measurement, float, float]] = []
    for m in results:
        if (m.system, m.path) != target.denominator or not target.applies(m):
            continue
        num = idx.get((*target.numerator, m.op, m.value_size, m.batch))
        r, p = _ratio(num, m), _p50_ratio(num, m)
        if r is not None and p is not None:
            out.append((m, r, p))
    return out


def render_targets(results: Sequence[Measurement], targets: Sequence[Target] = TARGETS) -> str:
    """One line per target: met or MISSED by the worst throughput ratio among its rows (and,
    for reading a noisy run, the verdict by p50), then every row's ratios."""
    lines = ["targets (kvpool ÷ peer in this run; per row: throughput / p50):"]
    for t in targets:
        triples = _target_ratios(t, results)
        if not triples:
            lines.append(f"  {t.name} >= {t.minimum}: not measured")
            continue
        worst_m, worst, _ = min(triples, key=lambda x: x[1])
        worst_p50 = min(x[2] for x in triples)
        verdict = "met" if worst >= t.minimum else "MISSED"
        verdict_p50 = "met" if worst_p50 >= t.minimum else "MISSED"
        where = f"{worst_m.op} {case_name(worst_m.value_size, worst_m.batch)}"
        every = ", ".join(
            f"{m.op} {case_name(m.value_size, m.batch)} {r:.2f}/{p:.2f}"
            for m, r, p in sorted(triples, key=lambda x: (x[0].value_size, x[0].batch, x[0].op))
        )
        lines.append(
            f"  {t.name} >= {t.minimum}: {verdict} (lowest {worst:.2f} at {where}; "
            f"by p50 {verdict_p50}, lowest {worst_p50:.2f})\n      {every}"
        )
    return "\n".join(lines)


def json_rows(results: Sequence[Measurement]) -> list[dict[str, Any]]:
    """The benchmark rows (`kvpool.bench.rows`' common fields, plus `rounds`, `calls`, `api`),
    then one ratio row per (kvpool path, peer, case).

    Ratio rows carry `"metric": "ratio"`, `"value"` (kvpool ÷ peer throughput), `"value_p50"`
    (peer p50 ÷ kvpool p50) and `"peer"`.
    """
    rows: list[dict[str, Any]] = [
        {
            "system": m.system,
            "path": m.path,
            "op": m.op,
            "value_size": m.value_size,
            "batch": m.batch,
            "ops_per_s": m.ops_per_s,
            "bytes_per_s": m.bytes_per_s,
            "p50_us": m.p50_us,
            "p99_us": m.p99_us,
            "rounds": m.rounds,
            "calls": m.calls,
            "api": m.api,
            **({"mode": m.mode} if m.mode else {}),
        }
        for m in results
    ]
    idx = _index(results)
    for m in results:
        if m.system == "kvpool":
            continue
        for mine in _NUMERATORS:
            num = idx.get((*mine, m.op, m.value_size, m.batch))
            r, p = _ratio(num, m), _p50_ratio(num, m)
            if r is None or p is None or num is None:
                continue
            rows.append(
                {
                    "system": mine[0],
                    "path": mine[1],
                    "mode": num.mode,
                    "op": m.op,
                    "value_size": m.value_size,
                    "batch": m.batch,
                    "metric": "ratio",
                    "peer": m.label,
                    "value": r,
                    "value_p50": p,
                }
            )
    return rows


# Fixed styles, so that the same system looks the same in every run's picture.
_STYLES: dict[str, tuple[str, str, str]] = {
    "kvpool/shm": ("C0", "-", "o"),
    "kvpool/tcp": ("C1", "-", "o"),
    "mooncake/tcp": ("C2", "-", "^"),
    "redis/tcp": ("C3", "-", "v"),
    "redis/unix": ("C3", "--", "v"),
    "limit/memcpy": ("0.45", "--", "."),
    "limit/socket": ("0.1", ":", "."),
}


def plot(results: Sequence[Measurement], path: str, title: str = "") -> None:
    """Throughput (GB/s, log) by value size per system/path: put and get side by side.

    Single-value cases are lines; batch cases are open squares at their value size. The limits
    are grey dashed (memcpy) and dotted (socket) lines. Needs matplotlib (extra `plot`).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    try:
        order = list(_STYLES)
        labels = sorted(
            {m.label for m in results},
            key=lambda s: (order.index(s) if s in order else len(order), s),
        )
        sizes = sorted({m.value_size for m in results})
        for ax, op in zip(axes, ("put", "get"), strict=True):
            for i, label in enumerate(labels):
                color, line, marker = _STYLES.get(label, (f"C{4 + i}", "-", "o"))
                single = sorted(
                    (m for m in results if m.label == label and m.op == op and m.batch == 1),
                    key=lambda m: m.value_size,
                )
                if single:
                    ax.plot(
                        [m.value_size for m in single],
                        [m.bytes_per_s / _GB for m in single],
                        linestyle=line,
                        marker=marker,
                        color=color,
                        label=label,
                    )
                batches = [m for m in results if m.label == label and m.op == op and m.batch > 1]
                if batches:
                    ax.scatter(
                        [m.value_size for m in batches],
                        [m.bytes_per_s / _GB for m in batches],
                        marker="s",
                        facecolors="none",
                        edgecolors=color,
                        s=70,
                        label=f"{label}, batch {batches[0].batch}" if op == "get" else None,
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(sizes, [size_name(s) for s in sizes])
            ax.minorticks_off()
            ax.set_xlabel("value size")
            ax.set_title(op)
            ax.grid(True, which="major", alpha=0.3)
        axes[0].set_ylabel("GB/s (1e9 bytes/s), log scale")
        axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
        if title:
            fig.suptitle(title, fontsize="medium")
        fig.tight_layout()
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
