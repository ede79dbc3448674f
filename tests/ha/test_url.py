"""kvpool.ha.url: etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID, and clear errors for bad ones."""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidParams
from kvpool.ha import EtcdUrl


@pytest.mark.parametrize(
    ("url", "endpoints", "cluster"),
    [
        ("etcd://127.0.0.1:2379/prod", ("127.0.0.1:2379",), "prod"),
        ("etcd://a:1,b:2,c:3/c1", ("a:1", "b:2", "c:3"), "c1"),
        ("etcd://a:1;b:2/c1", ("a:1", "b:2"), "c1"),  # Mooncake's separator
        ("ETCD://etcd-0.svc.local:2379/kv_pool-1.x", ("etcd-0.svc.local:2379",), "kv_pool-1.x"),
        ("etcd://[::1]:2379/c", ("[::1]:2379",), "c"),
        ("  etcd://h:02379 , g:80/c  ", ("h:2379", "g:80"), "c"),
    ],
)
def test_good_urls_parse(url: str, endpoints: tuple[str, ...], cluster: str) -> None:
    parsed = EtcdUrl.parse(url)
    assert parsed.endpoints == endpoints
    assert parsed.cluster_id == cluster
    assert EtcdUrl.parse(str(parsed)) == parsed


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:2379/c", "expected etcd://HOST:PORT"),
        ("http://127.0.0.1:2379/c", "expected etcd://HOST:PORT"),
        ("etcd://127.0.0.1:2379", "no cluster id"),
        ("etcd://127.0.0.1:2379/", "no cluster id"),
        ("etcd:///c", "no etcd endpoint"),
        ("etcd://127.0.0.1/c", "has no port"),
        ("etcd://127.0.0.1:/c", "has no port"),
        ("etcd://:2379/c", "has no port"),
        ("etcd://h:port/c", "port 'port' is not 1-65535"),
        ("etcd://h:0/c", "port '0' is not 1-65535"),
        ("etcd://h:70000/c", "port '70000' is not 1-65535"),
        ("etcd://a:1,,b:2/c", "empty endpoint"),
        ("etcd://a:1,/c", "empty endpoint"),
        ("etcd://a:1,a:1/c", "listed twice"),
        ("etcd://bad_host!:1/c", "is not a host name"),
        ("etcd://user:pw@h:1/c", "credentials"),
        ("etcd://h:1/c/d", "must not contain '/'"),
        ("etcd://h:1/c?x=1", "query strings"),
        ("etcd://h:1/-c", "cluster id '-c'"),
        ("etcd://h:1/" + "c" * 129, "1-128 letters"),
        ("etcd://h:1/c d", "cluster id 'c d'"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(InvalidParams) as info:
        EtcdUrl.parse(url)
    assert says in info.value.message
    assert repr(url.strip()) in info.value.message or says.startswith("expected")


def test_a_non_string_is_refused() -> None:
    with pytest.raises(InvalidParams, match="expected etcd://"):
        EtcdUrl.parse(2379)  # type: ignore[arg-type]
