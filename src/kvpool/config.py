"""Units and configuration conventions shared by every component.

Each component keeps one frozen dataclass of its own settings next to its code (for example
`kvpool.master.config.MasterConfig`); this module holds what they share:

* `parse_size("4GiB")`, `parse_duration("30s")`: human units, validated, with the offending
  value in the error.
* `env(...)`: the only place kvpool reads environment variables (all named `KVPOOL_*`).

Precedence, everywhere: command-line flag > environment variable > config file > default.
"""

from __future__ import annotations

import os
import re

from kvpool.errors import InvalidParams

__all__ = ["ENV_PREFIX", "env", "format_size", "parse_duration", "parse_size"]

ENV_PREFIX = "KVPOOL_"

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


def parse_size(value: str | int, *, name: str = "size", minimum: int = 0) -> int:
    """Bytes from an int or a string such as "4GiB", "512MB", "16 MiB", "1024".

    Decimal units (KB, MB, GB) are powers of 1000 and binary units (KiB, MiB, GiB) powers of
    1024, as written. Raises `InvalidParams` naming `name` and the value when it is malformed,
    negative or below `minimum`.
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
    return n


def parse_duration(value: str | float, *, name: str = "duration", minimum: float = 0.0) -> float:
    """Seconds from a number (seconds) or a string such as "30s", "500ms", "10min", "24h"."""
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
    if s < minimum:
        raise InvalidParams(f"{name}: {value!r} is below the minimum of {minimum} s")
    return s


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
