"""Units and configuration conventions shared by every component.

Each component keeps one frozen dataclass of its own settings next to its code (for example
`kvpool.master.config.MasterConfig`); this module holds what they share:

* `parse_size("4GiB")`, `parse_duration("30s")`: human units, validated, with the offending
  value in the error; each has a sane maximum (MAX_SIZE, MAX_DURATION_S) so that a typo such
  as "99999999999999999999h" is refused at once instead of overflowing a timer later.
* `env(...)`: the only place kvpool reads environment variables (all named `KVPOOL_*`).

Precedence, everywhere: command-line flag > environment variable > config file > default.
"""

from __future__ import annotations

import math
import os
import re
from typing import Final

from kvpool.errors import InvalidParams

__all__ = [
    "ENV_PREFIX",
    "MAX_DURATION_S",
    "MAX_SIZE",
    "env",
    "format_size",
    "parse_duration",
    "parse_size",
]

ENV_PREFIX = "KVPOOL_"

MAX_SIZE: Final = 1 << 50
"""1 PiB: no size kvpool takes (a segment, an arena, a cache) can be larger."""
MAX_DURATION_S: Final = 365 * 24 * 3600.0
"""One year: no duration kvpool takes (a TTL, a timeout, an interval) can be longer; timers
(`threading.Event.wait`, SO_RCVTIMEO) overflow not far above that."""

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
    "p": 1000**5,
    "pb": 1000**5,
    "pib": 1 << 50,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

_DURATION_UNITS: dict[str, float] = {
    "": 1.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(
    value: str | int, *, name: str = "size", minimum: int = 0, maximum: int = MAX_SIZE
) -> int:
    """Bytes from an int or a string such as "4GiB", "512MB", "16 MiB", "1024".

    Decimal units (KB, MB, GB) are powers of 1000 and binary units (KiB, MiB, GiB) powers of
    1024, as written. Raises `InvalidParams` naming `name` and the value when it is malformed,
    negative, below `minimum` or above `maximum`.
    """
    if isinstance(value, bool):
        raise InvalidParams(f"{name}: expected a size, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m is None or m.group(2).lower() not in _SIZE_UNITS:
            raise InvalidParams(f"{name}: cannot read {value!r} as a size (try '4GiB' or '512MB')")
        n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    else:
        raise InvalidParams(f"{name}: expected a size, got {type(value).__name__} {value!r}")
    if n < minimum:
        raise InvalidParams(f"{name}: {value!r} is below the minimum of {minimum} bytes")
    if n > maximum:
        raise InvalidParams(
            f"{name}: {value!r} is above the maximum of {maximum} bytes ({format_size(maximum)})"
        )
    return n


def parse_duration(
    value: str | float,
    *,
    name: str = "duration",
    minimum: float = 0.0,
    maximum: float = MAX_DURATION_S,
) -> float:
    """Seconds from a number (seconds) or a string such as "30s", "500ms", "10min", "24h".

    Raises `InvalidParams` naming `name` and the value when it is malformed, not finite,
    below `minimum` or above `maximum`."""
    if isinstance(value, bool):
        raise InvalidParams(f"{name}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        s = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m is None or m.group(2).lower() not in _DURATION_UNITS:
            raise InvalidParams(f"{name}: cannot read {value!r} as a duration (try '30s')")
        s = float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    else:
        raise InvalidParams(f"{name}: expected a duration, got {type(value).__name__} {value!r}")
    if math.isnan(s):
        raise InvalidParams(f"{name}: {value!r} is not a duration")
    if s < minimum:
        raise InvalidParams(f"{name}: {value!r} is below the minimum of {minimum:g} s")
    if s > maximum:
        raise InvalidParams(f"{name}: {value!r} is above the maximum of {_seconds(maximum)}")
    return s


def _seconds(x: float) -> str:
    return f"{x:g} s" if x < 1e6 else f"{x / 86400:g} days"


def format_size(n: int | float) -> str:
    """A short human form of a byte count: 4096 → '4.0 KiB'."""
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    raise AssertionError("unreachable")


def env(name: str, default: str | None = None) -> str | None:
    """The value of environment variable KVPOOL_<name>, or `default`."""
    return os.environ.get(ENV_PREFIX + name, default)
