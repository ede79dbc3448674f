"""`kvpool drain --token-file` against a master with an auth file: the admin token gets the
drain asked (here of a segment that is not mounted), no token gets UNAUTHENTICATED."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kvtest.procs import kvpool_proc, run_kvpool

ADMIN = "drain-admin-token-000000000000001"


def test_drain_proves_its_token_file(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n")
    token = tmp_path / "admin.token"
    token.write_text(ADMIN + "\n")
    with kvpool_proc("master", "--port", "0", "--auth-file", str(auth)) as master:
        address = master.wait_ready()

        def drain(*extra: str) -> subprocess.CompletedProcess[str]:
            args = ["drain", "--master", address, "--segment", "nowhere", *extra]
            return run_kvpool(*args, env={"PATH": "/usr/bin:/bin"})

        proven = drain("--token-file", str(token))
        assert proven.returncode != 0 and "no segment 'nowhere'" in proven.stderr
        refused = drain()
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr
