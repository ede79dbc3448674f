"""The arguments of `MooncakeDistributedStore.setup()`, in both of Mooncake's forms, validated.

* Positional (the wheel's signature): seven required arguments, then optional ones::

      setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
            protocol, rdma_devices, master_server_addr, engine=None,
            enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
            enable_client_http_server=False, client_http_port=9300)

  Too few arguments raise TypeError, as pybind11 does.
* A dict (the wheel's dict form): sizes may be human-readable ("16MB", Mooncake's binary
  units); defaults 16 MiB, "tcp", "127.0.0.1:50051" as the wheel's, and, unlike the wheel
  (which answers -600 without them), `local_hostname` "localhost" and `metadata_server`
  "P2PHANDSHAKE", `MooncakeConfig`'s defaults: LMCache forwards only the keys its config names
  and ignores setup's answer, so a refused minimal config lost every put silently.
  `master_server_address` (MooncakeConfig's and LMCache's name) is read as
  `master_server_addr`, `device_name` as `rdma_devices`; called from LMCache, the master of
  its `mooncakestore://HOST:PORT` URL wins (`lmcache_url.py`).

Either way the result is one frozen `SetupParams`; a bad value raises `InvalidParams` (setup
returns -600), as Mooncake's setup does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kvpool.compat.mooncake.config import (
    KNOWN_PROTOCOLS,
    parse_bool,
    parse_mooncake_size,
    store_cluster_id,
)
from kvpool.compat.mooncake.lmcache_url import lmcache_master
from kvpool.errors import InvalidParams

__all__ = ["SetupParams", "from_dict", "from_positional", "pool_master_address", "split_hostname"]

log = logging.getLogger(__name__)

DEFAULT_SIZE = 16 << 20
DEFAULT_MASTER = "127.0.0.1:50051"
DEFAULT_HOSTNAME = "localhost"
P2P = "P2PHANDSHAKE"
MIN_SEGMENT = 1024
"""Mooncake: a non-zero global segment must be at least 1 KiB."""
MAX_LOCAL_BUFFER = 1 << 40


@dataclass(frozen=True, slots=True)
class SetupParams:
    """What setup() was asked for (Mooncake's names)."""

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    rdma_devices: str
    master_server_addr: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self) -> None:
        if not self.local_hostname:
            raise InvalidParams("local_hostname: must not be empty")
        if not self.metadata_server:
            raise InvalidParams("metadata_server: must not be empty")
        if 0 < self.global_segment_size < MIN_SEGMENT:
            raise InvalidParams(
                f"global_segment_size: {self.global_segment_size} must be 0 or at least "
                f"{MIN_SEGMENT}"
            )
        if self.global_segment_size < 0:
            raise InvalidParams(f"global_segment_size: {self.global_segment_size} is negative")
        if not 0 <= self.local_buffer_size <= MAX_LOCAL_BUFFER:
            raise InvalidParams(f"local_buffer_size: {self.local_buffer_size} is out of range")
        if not self.master_server_addr:
            raise InvalidParams("master_server_addr: must not be empty")
        if not self.tenant_id:
            raise InvalidParams("tenant_id: must not be empty")
        if self.protocol not in KNOWN_PROTOCOLS:
            log.warning(
                "protocol %r is unknown to Mooncake; kvpool picks its own path", self.protocol
            )


def _size(value: object, name: str) -> int:
    return parse_mooncake_size(value, name=name)


def from_positional(  # noqa: PLR0917  (Mooncake's positional signature)
    local_hostname: str,
    metadata_server: str,
    global_segment_size: int | str,
    local_buffer_size: int | str,
    protocol: str,
    rdma_devices: str,
    master_server_addr: str,
    engine: object = None,
    enable_ssd_offload: bool = False,
    ssd_offload_path: str = "",
    tenant_id: str = "default",
    enable_client_http_server: bool = False,
    client_http_port: int = 9300,
) -> SetupParams:
    """The positional form (a missing required argument is a TypeError from Python itself)."""
    if engine is not None:
        log.info("setup: the Transfer Engine passed as `engine` is not used by kvpool")
    return SetupParams(
        local_hostname=str(local_hostname),
        metadata_server=str(metadata_server),
        global_segment_size=_size(global_segment_size, "global_segment_size"),
        local_buffer_size=_size(local_buffer_size, "local_buffer_size"),
        protocol=str(protocol).strip().lower(),
        rdma_devices=str(rdma_devices or ""),
        master_server_addr=str(master_server_addr),
        enable_ssd_offload=parse_bool(enable_ssd_offload),
        ssd_offload_path=str(ssd_offload_path or ""),
        tenant_id=str(tenant_id),
        enable_client_http_server=parse_bool(enable_client_http_server),
        client_http_port=int(client_http_port),
    )


def from_dict(config: Mapping[str, object]) -> SetupParams:
    """The dict form; values are read as strings, as Mooncake converts them with str()."""

    def get(name: str, default: object = None) -> object:
        value = config.get(name, default)
        return default if value is None else value

    try:
        port = int(str(get("client_http_port", 9300)))
        ssd = parse_bool(get("enable_ssd_offload", False))
        http = parse_bool(get("enable_client_http_server", False))
    except ValueError as exc:
        raise InvalidParams(f"setup: {exc}") from exc
    # "master_server_address" is MooncakeConfig's (and LMCache's) name for the same thing.
    master = str(get("master_server_addr", get("master_server_address", DEFAULT_MASTER)))
    url_master = lmcache_master()
    if url_master is not None and url_master != master:
        log.info("setup: the master of LMCache's mooncakestore:// URL, %s", url_master)
        master = url_master
    for name, default in (("local_hostname", DEFAULT_HOSTNAME), ("metadata_server", P2P)):
        if get(name) in (None, ""):
            log.info("setup: no %r in the config; %r, as MooncakeConfig defaults it", name, default)
    return SetupParams(
        local_hostname=str(get("local_hostname") or DEFAULT_HOSTNAME),
        metadata_server=str(get("metadata_server") or P2P),
        global_segment_size=_size(get("global_segment_size", DEFAULT_SIZE), "global_segment_size"),
        local_buffer_size=_size(get("local_buffer_size", DEFAULT_SIZE), "local_buffer_size"),
        protocol=str(get("protocol", "tcp")).strip().lower(),
        rdma_devices=str(get("rdma_devices", get("device_name", ""))),
        master_server_addr=master,
        enable_ssd_offload=ssd,
        ssd_offload_path=str(get("ssd_offload_path", "")),
        tenant_id=str(get("tenant_id", "default")),
        enable_client_http_server=http,
        client_http_port=port,
    )


def split_hostname(hostname: str) -> tuple[str, int | None]:
    """("host", port) from "host:port", "[v6]:port", "host" or a bare IPv6 address."""
    if hostname.startswith("["):
        host, _, rest = hostname[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if hostname.count(":") == 1:
        host, _, port = hostname.partition(":")
        if port.isdigit() and 0 < int(port) < 65536:
            return host, int(port)
        raise InvalidParams(f"local_hostname: bad port in {hostname!r}")
    return hostname, None


def pool_master_address(address: str, cluster_id: str | None = None) -> str:
    """kvpool's master address for Mooncake's `master_server_addr`.

    "host:port" passes through. Mooncake's HA form, `etcd://h1:2379;h2:2379` (endpoints
    separated by ';', or ','), becomes kvpool's `etcd://h1:2379,h2:2379/CLUSTER_ID`, the
    cluster id being `cluster_id` or, as Mooncake's clients find it, `MC_STORE_CLUSTER_ID` or
    "mooncake_cluster". An `etcd://` address that already names its cluster (kvpool's form)
    passes through. Other schemes (`redis://`, ...) pass through too, for the Store to refuse.
    """
    text = address.strip()
    if not text.lower().startswith("etcd://"):
        return text
    rest = text[len("etcd://") :]
    hosts_part, slash, cluster_part = rest.partition("/")
    hosts = [h.strip() for h in re.split(r"[;,]", hosts_part) if h.strip()]
    if not hosts:
        raise InvalidParams(f"master_server_addr: no etcd endpoint in {address!r}")
    cluster = cluster_part.strip("/") if slash and cluster_part.strip("/") else None
    cluster = cluster or cluster_id or store_cluster_id()
    return f"etcd://{','.join(hosts)}/{cluster}"
