"""`kvpool up --auth-file --token-file` with mutual TLS: the master it starts has the tokens,
its node proves the token over TLS, its status line shows the pool, and a Store needs a token
and a certificate of the CA to use it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from kvpool import Store
from kvpool.errors import KVPoolError, Unauthenticated
from kvtest.procs import kvpool_up, run_kvpool
from security.pki import Pki

NODE = "up-node-token-0000000000000000001"
CLIENT = "up-client-token-00000000000000002"


def test_up_with_credentials_and_tls_serves_only_clients_that_have_both(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {NODE}, tenant: a, role: node}}\n"
        f"  - {{token: {CLIENT}, tenant: a, role: client}}\n"
    )
    token = tmp_path / "node.token"
    token.write_text(NODE + "\n")
    tls = ["--tls-cert", pki.cert, "--tls-key", pki.key, "--tls-ca", pki.ca]
    up = kvpool_up("--refresh", "0.1s", "--auth-file", str(auth), "--token-file", str(token), *tls)
    try:
        address = up.wait_ready(timeout=60)
        monkeypatch.setenv("KVPOOL_RPC_UNIX", "0")  # the Store on TCP: TLS
        files = {"tls_ca": pki.ca, "tls_cert": pki.cert, "tls_key": pki.key}
        with Store(address, token=CLIENT, protocol="tcp", **files) as s:
            s.put("k", b"secure" * 1000)
            assert s.get("k") == b"secure" * 1000
        up.wait_for_line(r", 1 objects .* 1 segment\(s\)", timeout=20)  # it proved its token
        with pytest.raises(Unauthenticated):
            Store(address, **files).close()
        with pytest.raises(KVPoolError):
            Store(address, token=CLIENT, rpc_timeout=5).close()  # no TLS
        os.kill(up.pid, signal.SIGINT)
        assert up.popen.wait(timeout=30) == 0
    finally:
        up.stop()


def test_up_with_an_auth_file_needs_a_token(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {NODE}, tenant: a, role: node}}\n")
    env = {k: v for k, v in os.environ.items() if k != "KVPOOL_AUTH_TOKEN"}
    out = run_kvpool("up", "--port", "0", "--auth-file", str(auth), env=env)
    assert out.returncode == 2 and "--token-file" in out.stderr
