"""What `kvpool bench compare` prints and writes: table, ratios, targets, JSON rows, plot.

Ratios compare throughput (keys/s) measured in the same run. Two kvpool rows are the
numerators: `kvpool/shm` (the default path between processes on one host) and `kvpool/tcp`
(TCP forced). The table shows, for every other row, both `kvpool/shm ÷ this` and
`kvpool/tcp ÷ this`; the ones the project's targets name are listed under the table with
"met" or "MISSED". Nothing here asserts speed.
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
    "render_table",
    "render_targets",
]

KVPOOL_SHM = ("kvpool", "shm")
KVPOOL_TCP = ("kvpool", "tcp")
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

    def applies(self, m: Measurement) -> bool:
        if not self.min_size <= m.value_size <= self.max_size:
            return False
        return self.batched is None or self.batched == (m.batch > 1)


_MIB = 1 << 20
_SMALL = 64 << 10
_MOONCAKE = ("mooncake", "tcp")
# The targets of issue 5, as written there (ratios from one run on the 2-core machines).
TARGETS: tuple[Target, ...] = (
    Target("kvpool/Mooncake, small single ops", KVPOOL_SHM, _MOONCAKE, 1.5, 0, _SMALL, False),
    Target("kvpool/Mooncake, small batches", KVPOOL_SHM, _MOONCAKE, 1.0, 0, _SMALL, True),
    Target("kvpool/Mooncake, >= 1 MiB", KVPOOL_SHM, _MOONCAKE, 3.0, _MIB),
    Target("kvpool shm / memcpy, >= 1 MiB", KVPOOL_SHM, ("limit", "memcpy"), 0.7, _MIB),
    Target("kvpool tcp / raw socket, >= 1 MiB", KVPOOL_TCP, ("limit", "socket"), 0.7, _MIB),
    Target("kvpool/Redis, every row", KVPOOL_SHM, ("redis", "tcp"), 1.0),
)


def _key(m: Measurement) -> tuple[str, int, int]:
    return (m.op, m.value_size, m.batch)


def _index(results: Sequence[Measurement]) -> dict[tuple[str, str, str, int, int], Measurement]:
    return {(m.system, m.path, m.op, m.value_size, m.batch): m for m in results}


def _ratio(num: Measurement | None, den: Measurement) -> float | None:
    if num is None or den.ops_per_s <= 0:
        return None
    return num.ops_per_s / den.ops_per_s


def _fmt_ratio(r: float | None) -> str:
    return "" if r is None else f"{r:.2f}x"


def _fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def render_table(results: Sequence[Measurement], skipped: Sequence[Skipped] = ()) -> str:
    """The text table: one block per (op, case), kvpool first, ratios against kvpool."""
    idx = _index(results)
    header = (
        f"{'op':<4} {'case':<12} {'system/path':<16} {'ops/s':>9} {'GB/s':>7} "
        f"{'p50 us':>9} {'p99 us':>9} {'shm/this':>9} {'tcp/this':>9}"
    )
    lines = [header, "-" * len(header)]
    order = {"kvpool": 0, "mooncake": 1, "redis": 2, "limit": 3}
    groups: dict[tuple[str, int, int], list[Measurement]] = {}
    for m in results:
        groups.setdefault(_key(m), []).append(m)
    for (op, size, batch), rows in sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != "put")
    ):
        shm = idx.get((*KVPOOL_SHM, op, size, batch))
        tcp = idx.get((*KVPOOL_TCP, op, size, batch))
        for m in sorted(rows, key=lambda m: (order.get(m.system, 9), m.path)):
            mine = m.system == "kvpool"
            lines.append(
                f"{op:<4} {case_name(size, batch):<12} {m.label:<16} {_fmt_rate(m.ops_per_s):>9} "
                f"{m.bytes_per_s / _GB:>7.3f} {m.p50_us:>9.1f} {m.p99_us:>9.1f} "
                f"{'' if mine else _fmt_ratio(_ratio(shm, m)):>9} "
                f"{'' if mine else _fmt_ratio(_ratio(tcp, m)):>9}"
            )
        lines.append("")
    lines.append(
        "ops/s counts keys (a batch call moves `batch` keys); p50/p99 are per call; "
        "shm/this = kvpool/shm throughput divided by this row's, tcp/this the same for kvpool/tcp."
    )
    for s in skipped:
        hint = f"; install: {s.install}" if s.install else ""
        lines.append(f"skipped: {s.label}: {s.reason}{hint}")
    return "\n".join(lines)


def _target_ratios(
    target: Target, results: Sequence[Measurement]
) -> list[tuple[Measurement, float]]:
    idx = _index(results)
    out: list[tuple[Measurement, float]] = []
    for m in results:
        if (m.system, m.path) != target.denominator or not target.applies(m):
            continue
        num = idx.get((*target.numerator, m.op, m.value_size, m.batch))
        r = _ratio(num, m)
        if r is not None:
            out.append((m, r))
    return out


def render_targets(results: Sequence[Measurement], targets: Sequence[Target] = TARGETS) -> str:
    """One line per target: the worst ratio among the rows it covers, and met or MISSED."""
    lines = ["targets (throughput ratios in this run):"]
    for t in targets:
        pairs = _target_ratios(t, results)
        if not pairs:
            lines.append(f"  {t.name} >= {t.minimum}: not measured")
            continue
        worst_m, worst = min(pairs, key=lambda p: p[1])
        verdict = "met" if worst >= t.minimum else "MISSED"
        where = f"{worst_m.op} {case_name(worst_m.value_size, worst_m.batch)}"
        every = ", ".join(
            f"{m.op} {case_name(m.value_size, m.batch)} {r:.2f}"
            for m, r in sorted(pairs, key=lambda p: (p[0].value_size, p[0].batch, p[0].op))
        )
        lines.append(
            f"  {t.name} >= {t.minimum}: {verdict} (lowest {worst:.2f} at {where}; {every})"
        )
    return "\n".join(lines)


def json_rows(results: Sequence[Measurement]) -> list[dict[str, Any]]:
    """The rows of design.md "Benchmarks", then one ratio row per (kvpool path, peer, case).

    Ratio rows carry `"metric": "ratio"`, `"value"` (kvpool ÷ peer throughput) and `"peer"`.
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
        }
        for m in results
    ]
    idx = _index(results)
    for m in results:
        if m.system == "kvpool":
            continue
        for mine in (KVPOOL_SHM, KVPOOL_TCP):
            r = _ratio(idx.get((*mine, m.op, m.value_size, m.batch)), m)
            if r is None:
                continue
            rows.append(
                {
                    "system": mine[0],
                    "path": mine[1],
                    "op": m.op,
                    "value_size": m.value_size,
                    "batch": m.batch,
                    "metric": "ratio",
                    "peer": m.label,
                    "value": r,
                }
            )
    return rows


# Fixed styles, so that the same system looks the same in every run's picture.
_STYLES: dict[str, tuple[str, str, str]] = {
    "kvpool/shm": ("C0", "-", "o"),
    "kvpool/tcp": ("C1", "-", "o"),
    "mooncake/tcp": ("C2", "-", "^"),
    "redis/tcp": ("C3", "-", "v"),
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
