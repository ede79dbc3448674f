"""`kvpool client --token-file --tls-*`: the per-host standalone client joins a pool that has
credentials and TLS with its token and certificate (its dummies act with them); without the
token it is refused with a clear error instead of serving."""

from __future__ import annotations

from pathlib import Path

from kvtest.procs import kvpool_proc, wait_until
from security.pki import Pki

CLIENT = "standalone-client-token-000000000001"


def test_kvpool_client_proves_its_token_over_tls(pki: Pki, tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {CLIENT}, tenant: a, role: node}}\n")
    token = tmp_path / "client.token"
    token.write_text(CLIENT + "\n")
    tls = ["--tls-cert", pki.cert, "--tls-key", pki.key, "--tls-ca", pki.ca]
    with kvpool_proc("master", "--port", "0", "--auth-file", str(auth), *tls) as master:
        address = master.wait_ready()
        env = {"KVPOOL_RPC_UNIX": "0"}  # its RPC on TCP, so TLS is used
        common = ["client", "--master", address, "--port", "0", "--segment-size", "8MiB"]
        with kvpool_proc(*common, "--token-file", str(token), *tls, env=env) as ok:
            ok.wait_for_line(r"kvpool client listening on", timeout=60)
        with kvpool_proc(*common, *tls, env=env) as refused:
            wait_until(lambda: not refused.alive(), timeout=60, what="the refusal")
            assert refused.stop() != 0
            assert "UNAUTHENTICATED" in refused.output(), refused.output()
