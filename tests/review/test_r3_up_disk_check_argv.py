"""Review finding (round 3): `kvpool up` accepts a disk-check interval its own node refuses.

src/kvpool/cli/tiers.py `DiskCheck.argv` passes a float option on to `kvpool node` as
`repr(v)`. `kvpool up --disk-check-interval 50us` parses to 4.9999999999999996e-05 s (in the
option's range, 0-3600 s), whose repr is in exponent form; the node's `Duration` parser reads
no exponents ("cannot read '4.9999999999999996e-05' as a duration"), so the node exits with a
usage error and `kvpool up` fails with INTERNAL_ERROR. Any interval under 0.1 ms does this
(repr switches to exponents below 1e-4). Suggested fix: pass a unit the parser reads (e.g.
f"{v * 1e6:.6f}us" or f"{v!r}s" after checking the parser takes it), or parse floats there.
"""

from __future__ import annotations

from pathlib import Path

from kvpool.client import Store
from kvtest.procs import kvpool_up


def test_up_starts_with_a_sub_millisecond_disk_check_interval(tmp_path: Path) -> None:
    up = kvpool_up(
        "--offload-dir",
        str(tmp_path / "disk"),
        "--offload-size",
        "8MiB",
        "--disk-check-interval",
        "50us",
    )
    try:
        address = up.wait_ready(timeout=60)
        with Store(address, rpc_timeout=10.0) as s:
            assert s.put("k", b"v" * 4096)
            assert s.get("k") == b"v" * 4096
    finally:
        up.stop()
