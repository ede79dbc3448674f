"""A whole pool with mutual TLS and credentials: `kvpool master` and `kvpool node` child
processes given `--tls-cert/--tls-key/--tls-ca` (and an auth file / token file), a `Store`
given the same files and a client token puts and gets over TCP (RPC and transfers both on
TLS), `kvpool status` reads it; a Store without TLS, or with another CA's certificate, is
refused promptly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool import Store
from kvpool.errors import KVPoolError
from kvtest.procs import Proc, kvpool_proc, run_kvpool, wait_until
from security.pki import Pki

NODE = "tls-pool-node-token-000000000000001"
CLIENT = "tls-pool-client-token-0000000000002"
ADMIN = "tls-pool-admin-token-00000000000003"


def _tls_args(pki: Pki) -> list[str]:
    return ["--tls-cert", pki.cert, "--tls-key", pki.key, "--tls-ca", pki.ca]


@pytest.fixture(scope="module")
def pool(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("tlspool")
    auth = tmp / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {NODE}, tenant: a, role: node}}\n"
        f"  - {{token: {CLIENT}, tenant: a, role: client}}\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
    )
    node_token = tmp / "node.token"
    node_token.write_text(NODE + "\n")
    admin_token = tmp / "admin.token"
    admin_token.write_text(ADMIN + "\n")
    master = kvpool_proc(
        "master", "--port", "0", "--auth-file", str(auth), *_tls_args(pki), name="master"
    )
    node: Proc | None = None
    try:
        address = master.wait_ready()
        node = kvpool_proc(
            "node",
            "--master",
            address,
            "--segment-size",
            "32MiB",
            "--token-file",
            str(node_token),
            *_tls_args(pki),
            name="node",
        )
        node.wait_ready(timeout=60)
        yield address, admin_token
    finally:
        if node is not None:
            assert node.stop() == 0, node.output()
        assert master.stop() == 0, master.output()


def _store(address: str, pki: Pki, **kw: str) -> Store:
    args = {"tls_ca": pki.ca, "tls_cert": pki.cert, "tls_key": pki.key, **kw}
    # The RPC on TCP (the Unix socket is plain): the test is about TLS.
    return Store(address, token=CLIENT, protocol="tcp", rpc_timeout=10, **args)


def test_a_store_puts_and_gets_over_tls(
    pool: tuple[str, Path], pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVPOOL_RPC_UNIX", "0")
    with _store(pool[0], pki) as store:
        value = bytes(range(256)) * (16 << 12)  # 16 MiB: striped over TLS connections
        store.put("tls-big", value)
        assert store.get("tls-big") == value
        store.put("tls-small", b"s" * 100)
        assert store.get("tls-small") == b"s" * 100


def test_status_reads_the_pool_over_tls(pool: tuple[str, Path], pki: Pki) -> None:
    address, admin_token = pool
    args = ["status", "--master", address, "--json", "--token-file", str(admin_token)]
    done = run_kvpool(*args, *_tls_args(pki), env={"KVPOOL_RPC_UNIX": "0", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert '"segments"' in done.stdout


@pytest.mark.parametrize("who", ["plain", "other-ca"])
def test_a_store_without_tls_or_with_another_cas_certificate_is_refused_promptly(
    pool: tuple[str, Path], pki: Pki, monkeypatch: pytest.MonkeyPatch, who: str
) -> None:
    monkeypatch.setenv("KVPOOL_RPC_UNIX", "0")
    t0 = time.monotonic()
    with pytest.raises(KVPoolError):
        if who == "plain":
            Store(pool[0], token=CLIENT, rpc_timeout=5).close()
        else:
            _store(pool[0], pki, tls_cert=pki.other_cert, tls_key=pki.other_key).close()
    assert time.monotonic() - t0 < 10


def test_cached_reads_hear_removals_over_tls(
    pool: tuple[str, Path], pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The invalidation stream's non-blocking poll reads a TLS connection through its stream
    (an SSLSocket takes no recv flags): another client's remove reaches a cached reader."""
    monkeypatch.setenv("KVPOOL_RPC_UNIX", "0")
    with _store(pool[0], pki) as writer, _store(pool[0], pki, read_mode="cached") as reader:
        writer.put("tls-cached", b"c" * 4096)
        assert reader.get("tls-cached") == b"c" * 4096
        assert reader.get("tls-cached") == b"c" * 4096  # from the remembered place
        writer.remove("tls-cached", force=True)

        def gone() -> bool:
            try:
                reader.get("tls-cached")
            except KVPoolError:
                return True
            return False

        wait_until(gone, timeout=10, what="the remove heard over TLS")
