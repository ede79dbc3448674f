"""The HTTP ops port of a master and of a node speaks HTTPS when the process has `--tls-*`
(every TCP listener is TLS then): a client with the CA and a certificate reads `/health` and
`/metrics`; with mutual TLS (`--tls-ca`) a client without a certificate, or with another CA's,
is refused, and plain HTTP gets no answer."""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from kvtest.procs import Proc, kvpool_proc
from security.pki import Pki


def _tls(pki: Pki) -> list[str]:
    return ["--tls-cert", pki.cert, "--tls-key", pki.key, "--tls-ca", pki.ca]


@pytest.fixture(scope="module")
def servers(pki: Pki) -> Iterator[tuple[str, str]]:
    """(master's HTTP host:port, node's HTTP host:port), both on TLS."""
    master = kvpool_proc("master", "--port", "0", "--http-port", "0", *_tls(pki), name="master")
    node: Proc | None = None
    try:
        address = master.wait_ready()
        m = master.wait_for_line(r"http listening on (\S+):(\d+)")
        node = kvpool_proc(
            "node",
            "--master",
            address,
            "--segment-size",
            "8MiB",
            "--http-port",
            "0",
            *_tls(pki),
            name="node",
        )
        node.wait_ready(timeout=60)
        n = node.wait_for_line(r"http listening on (\S+):(\d+)")
        yield f"{m.group(1)}:{m.group(2)}", f"{n.group(1)}:{n.group(2)}"
    finally:
        if node is not None:
            assert node.stop() == 0, node.output()
        assert master.stop() == 0, master.output()


def _context(ca: str, cert: str | None, key: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None and key is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


@pytest.mark.parametrize("which", [0, 1], ids=["master", "node"])
def test_the_ops_port_speaks_https(servers: tuple[str, str], pki: Pki, which: int) -> None:
    ctx = _context(pki.ca, pki.cert, pki.key)
    with urllib.request.urlopen(f"https://{servers[which]}/health", context=ctx, timeout=10) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"https://{servers[which]}/metrics", context=ctx, timeout=10) as r:
        assert r.status == 200
        assert b"# TYPE" in r.read()


@pytest.mark.parametrize("which", [0, 1], ids=["master", "node"])
@pytest.mark.parametrize("who", ["no-cert", "other-ca", "plain"])
def test_the_ops_port_refuses_clients_without_the_pools_certificate(
    servers: tuple[str, str], pki: Pki, which: int, who: str
) -> None:
    host, port = servers[which].rsplit(":", 1)
    if who == "plain":
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        with pytest.raises((OSError, http.client.HTTPException)):
            conn.request("GET", "/health")
            conn.getresponse()
        conn.close()
        return
    if who == "no-cert":
        ctx = _context(pki.ca, None, None)
    else:
        ctx = _context(pki.ca, pki.other_cert, pki.other_key)
    with pytest.raises((OSError, urllib.error.URLError)):
        urllib.request.urlopen(f"https://{servers[which]}/health", context=ctx, timeout=10)
