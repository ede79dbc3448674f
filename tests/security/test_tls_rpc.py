"""TLS on the RPC listener (`kvpool.rpc.tls`): served with the CA's certificate, mutual TLS
refuses a client with no certificate or one of another CA, and a plain client gets a clean
refusal, not a hang. Clients stay on TCP here (``unix=False``): the Unix socket is plain."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from kvpool.errors import ErrorCode, InvalidParams, RpcError
from kvpool.rpc.client import RpcClient
from kvpool.rpc.thread import ServerThread
from kvpool.rpc.tls import TlsConfig
from rpc.rpc_testkit import CLUSTER, Add, Response, Sleep, Sum, server_thread
from security.pki import Pki


def _server(cfg: TlsConfig) -> ServerThread:
    return server_thread(tls=cfg.server_context())


@pytest.fixture
def mutual(pki: Pki) -> Iterator[ServerThread]:
    st = _server(TlsConfig(pki.cert, pki.key, pki.ca))
    try:
        yield st
    finally:
        st.stop()


def _client(st: ServerThread, cfg: TlsConfig | None, timeout: float = 10) -> RpcClient:
    return RpcClient(
        st.endpoint,
        response_type=Response,
        cluster_id=CLUSTER,
        client_name="tls",
        unix=False,
        timeout=timeout,
        tls=None if cfg is None else cfg.client_context(),
    )


def test_a_client_with_a_certificate_of_the_ca_is_served(mutual: ServerThread, pki: Pki) -> None:
    with _client(mutual, TlsConfig(pki.cert, pki.key, pki.ca)) as c:
        assert c.call(Add(1, 2)) == Sum(3)
        assert c.transport == "tcp"


def test_server_only_tls_serves_a_client_without_a_certificate(pki: Pki) -> None:
    st = _server(TlsConfig(pki.cert, pki.key))
    try:
        with _client(st, TlsConfig(ca=pki.ca)) as c:
            assert c.call(Add(2, 2)) == Sum(4)
    finally:
        st.stop()


@pytest.mark.parametrize("who", ["no-certificate", "other-ca"])
def test_mutual_tls_refuses_a_client_without_a_certificate_of_the_ca(
    mutual: ServerThread, pki: Pki, who: str
) -> None:
    cfg = (
        TlsConfig(ca=pki.ca)
        if who == "no-certificate"
        else TlsConfig(pki.other_cert, pki.other_key, pki.ca)
    )
    t0 = time.monotonic()
    with _client(mutual, cfg) as c, pytest.raises(RpcError):
        c.call(Add(1, 2))
    assert time.monotonic() - t0 < 5


def test_a_client_that_does_not_trust_the_servers_ca_refuses_it(
    mutual: ServerThread, pki: Pki
) -> None:
    cfg = TlsConfig(pki.cert, pki.key, pki.other_ca)
    with _client(mutual, cfg) as c, pytest.raises(RpcError) as info:
        c.call(Add(1, 2))
    assert "certificate" in str(info.value).lower()


def test_a_plain_client_gets_a_clean_refusal_not_a_hang(mutual: ServerThread) -> None:
    t0 = time.monotonic()
    with _client(mutual, None, timeout=10) as c, pytest.raises(RpcError):
        c.call(Add(1, 2))
    assert time.monotonic() - t0 < 5


def test_the_config_is_validated(pki: Pki) -> None:
    with pytest.raises(InvalidParams):
        TlsConfig(cert=pki.cert)  # no key
    with pytest.raises(InvalidParams):
        TlsConfig(ca="/no/such/ca.pem")
    with pytest.raises(InvalidParams):
        TlsConfig(ca=pki.ca).server_context()  # a server needs a certificate
    with pytest.raises(InvalidParams):
        TlsConfig(pki.cert, pki.key).client_context()  # a client needs a CA
    with pytest.raises(InvalidParams):
        TlsConfig(pki.key, pki.cert).server_context()  # swapped: does not load


def test_a_call_over_tls_times_out_on_time(mutual: ServerThread, pki: Pki) -> None:
    """A TLS socket must not wait inside the ssl module past the call's deadline (on a
    blocking socket it retries a read that the kernel timeout ended, for ever)."""
    with _client(mutual, TlsConfig(pki.cert, pki.key, pki.ca)) as c:
        assert c.call(Add(1, 1)) == Sum(2)
        t0 = time.monotonic()
        with pytest.raises(RpcError) as info:
            c.call(Sleep(3.0, 1), timeout=0.5)
        assert info.value.code == ErrorCode.RPC_TIMEOUT
        assert time.monotonic() - t0 < 2.0
        assert c.call(Add(2, 2)) == Sum(4)  # the connection still serves


def test_concurrent_calls_over_one_tls_connection_all_get_their_replies(
    mutual: ServerThread, pki: Pki
) -> None:
    """Several threads send while one of them reads: every ssl call is made one at a time
    (`TlsStream`). Reading and writing one TLS connection from two threads at once lost
    replies under load (a Store's put waited its whole RPC timeout)."""
    errors: list[BaseException] = []
    with _client(mutual, TlsConfig(pki.cert, pki.key, pki.ca)) as c:

        def work(base: int) -> None:
            try:
                for i in range(150):
                    assert c.call(Add(base, i), timeout=10) == Sum(base + i)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(1000 * t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
    assert errors == []
