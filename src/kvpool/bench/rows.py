"""The rows every `kvpool bench` command reports: one row type, percentiles, medians, table, JSON.

A row is one measured case. Its JSON form, which docs/performance.md and the tests read, always
has `system` (kvpool, limit, a peer), `path` (how the bytes or calls travel: shm, tcp, unix,
memcpy, socket, ...), `op`, `value_size` (bytes), `batch` (keys per call), `ops_per_s`,
`bytes_per_s`, `p50_us` and `p99_us`, then `calls`, `ratio` and `baseline` (the same-run
baseline it is compared with, if any), then what the benchmark adds (`extra`, e.g. `case`,
`keys_per_s`, `verified`, and `mode` for kvpool rows measured in a Store mode: "strict",
"cached", "nowait", "cached+hot"; docs/parts/client.md). Rows that are not a rate carry
`metric` and `value` instead and are plain dicts.

Percentiles are linear interpolation between closest ranks (numpy's default, so the p50 is the
median). A repeated run keeps, per case, the row of the median run (`median_row`), so that its
fields stay consistent with each other.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "RATE_FIELDS",
    "Column",
    "Row",
    "median_row",
    "percentile",
    "render_table",
    "write_json",
]

_R = TypeVar("_R")

RATE_FIELDS = frozenset(
    {"system", "path", "op", "value_size", "batch", "ops_per_s", "bytes_per_s", "p50_us", "p99_us"}
)
"""The fields every rate row's JSON has (what docs/performance.md and the tests read)."""


@dataclass(slots=True)
class Row:
    """One measured case (see the module docstring for what each field means)."""

    system: str
    path: str
    op: str
    value_size: int
    batch: int
    ops_per_s: float
    bytes_per_s: float
    p50_us: float
    p99_us: float
    calls: int = 0
    """Timed calls behind the percentiles."""
    ratio: float | None = None
    """This row's rate as a fraction of `baseline`'s, measured in the same run."""
    baseline: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields of one benchmark only, written after the common ones."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this row: the common fields, then `extra`."""
        return {
            "system": self.system,
            "path": self.path,
            "op": self.op,
            "value_size": self.value_size,
            "batch": self.batch,
            "ops_per_s": self.ops_per_s,
            "bytes_per_s": self.bytes_per_s,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "calls": self.calls,
            "ratio": self.ratio,
            "baseline": self.baseline,
            **self.extra,
        }


def percentile(samples: Iterable[float], q: float) -> float:
    """The `q`-quantile (0..1) of `samples` (any order), interpolated; 0.0 when empty."""
    s = sorted(samples)
    if not s:
        return 0.0
    pos = min(max(q, 0.0), 1.0) * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def median_row(group: Sequence[_R], key: Callable[[_R], float]) -> _R:
    """The member of `group` whose `key` is the (low) median: one whole run's row, not a mix."""
    med = statistics.median_low([key(r) for r in group])
    return next(r for r in group if key(r) == med)


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a printed table: `title`, a format spec for its width and alignment (as in
    `f"{x:>9}"`), and how a row gives its text."""

    title: str
    spec: str
    text: Callable[[Any], str]


def render_table(columns: Sequence[Column], rows: Iterable[Any], sep: str = " ") -> str:
    """A fixed-width table: the header, a rule as wide as it, one line per row."""
    head = sep.join(format(c.title, c.spec) for c in columns)
    lines = [head, "-" * len(head)]
    lines += [sep.join(format(c.text(r), c.spec) for c in columns) for r in rows]
    return "\n".join(lines)


def write_json(path: str, rows: Iterable[Row | Mapping[str, Any]]) -> int:
    """Write `rows` (their JSON form) to `path` as one JSON array; returns how many."""
    out = [r.to_json() if isinstance(r, Row) else dict(r) for r in rows]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return len(out)
