"""`EtcdUrl`: the address of a highly available cluster, `etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID`.

Masters, nodes and clients are given this instead of a master's HOST:PORT: the endpoints of one
etcd cluster (any of them will do; `;` separates them too, as in Mooncake's
`etcd://h1:2379;h2:2379`) and the id of the kvpool cluster whose keys (`kvpool.ha.keys`) to
use. Hosts may be names, IPv4 addresses or bracketed IPv6 addresses; the port is required.
Every malformed part is an `InvalidParams` that quotes the part and says what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpool.errors import InvalidParams
from kvpool.ha.keys import validate_name

__all__ = ["EtcdUrl"]

SCHEME = "etcd://"
FORM = "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID"

_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?)$")


def _endpoint(text: str, url: str) -> str:
    if not text:
        raise InvalidParams(f"{url!r}: empty endpoint in the list (expected {FORM})")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port or host.endswith(":"):
        raise InvalidParams(f"{url!r}: endpoint {text!r} has no port (expected HOST:PORT)")
    if not _HOST.match(host):
        raise InvalidParams(f"{url!r}: endpoint {text!r}: {host!r} is not a host name or address")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidParams(f"{url!r}: endpoint {text!r}: port {port!r} is not 1-65535")
    return f"{host}:{int(port)}"


@dataclass(frozen=True)
class EtcdUrl:
    """A parsed `etcd://` address: etcd endpoints ("HOST:PORT") and the kvpool cluster id."""

    endpoints: tuple[str, ...]
    cluster_id: str

    @classmethod
    def parse(cls, url: str) -> EtcdUrl:
        if not isinstance(url, str):
            raise InvalidParams(f"expected {FORM}, got {type(url).__name__} {url!r}")
        text = url.strip()
        if not text.lower().startswith(SCHEME):
            raise InvalidParams(f"{url!r}: expected {FORM}")
        rest = text[len(SCHEME) :]
        if "?" in rest or "#" in rest:
            raise InvalidParams(f"{url!r}: query strings and fragments are not allowed ({FORM})")
        hosts, slash, cluster = rest.partition("/")
        if not slash or not cluster:
            raise InvalidParams(f"{url!r}: no cluster id after the endpoints ({FORM})")
        if "/" in cluster:
            raise InvalidParams(f"{url!r}: cluster id {cluster!r} must not contain '/'")
        if "@" in hosts:
            raise InvalidParams(f"{url!r}: credentials in the URL are not supported")
        if not hosts:
            raise InvalidParams(f"{url!r}: no etcd endpoint ({FORM})")
        endpoints = tuple(_endpoint(p.strip(), url) for p in re.split(r"[,;]", hosts))
        if len(set(endpoints)) != len(endpoints):
            raise InvalidParams(f"{url!r}: an endpoint is listed twice")
        try:
            validate_name("cluster id", cluster)
        except InvalidParams as exc:
            raise InvalidParams(f"{url!r}: {exc.message}") from None
        return cls(endpoints, cluster)

    def __str__(self) -> str:
        return f"{SCHEME}{','.join(self.endpoints)}/{self.cluster_id}"
