"""The ops HTTP server of a master or node in tests (`--http-port 0`): its address, as the
process prints it, and its Prometheus text at /metrics."""

from __future__ import annotations

import re
import urllib.request

from kvtest.procs import Proc

__all__ = ["http_base", "metrics_text", "samples"]

#: One sample line of the Prometheus text format: name, {labels} (optional), value.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def http_base(proc: Proc) -> str:
    """ "http://HOST:PORT" of `proc`'s ops HTTP server, from its `http listening on` line."""
    m = proc.wait_for_line(r"http listening on (\S+):(\d+)")
    return f"http://{m.group(1)}:{m.group(2)}"


def metrics_text(base: str) -> str:
    """The body of GET `base`/metrics (10 s at most)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text: str = r.read().decode()
    return text


def samples(text: str) -> dict[str, float]:
    """Each sample of a /metrics body: "name{labels}" (or "name") -> its value."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out
