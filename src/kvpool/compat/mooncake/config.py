"""`MooncakeConfig` and Mooncake's way of reading sizes and booleans.

Programs written for Mooncake configure it through `mooncake.mooncake_config.MooncakeConfig`:
`load_from_env()` reads `MOONCAKE_CONFIG_PATH` (a JSON file) or the `MOONCAKE_*` environment
variables, and the fields are then passed to `setup()` positionally. This module reads the same
variables and files with the same defaults, so such programs need no change.

Sizes follow Mooncake, not `kvpool.config.parse_size`: in Mooncake "16MB" is 16 MiB (its suffixes
K/KB/M/MB/G/GB/T/TB are all powers of 1024), and a config written for Mooncake must mean the
same amount of memory here. "16MiB" is accepted too.

This is the one place in kvpool that reads environment variables outside `kvpool.config.env`:
their names are Mooncake's (`MOONCAKE_*`, and `LOCAL_HOSTNAME` as Mooncake's own test scripts
set it), which is the point of the module.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

from kvpool.config import parse_size

__all__ = [
    "DEFAULT_GLOBAL_SEGMENT_SIZE",
    "DEFAULT_LOCAL_BUFFER_SIZE",
    "KNOWN_PROTOCOLS",
    "MooncakeConfig",
    "parse_bool",
    "parse_mooncake_size",
    "store_cluster_id",
    "store_hot_cache_size",
    "store_read_mode",
]

log = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB, Mooncake's MooncakeConfig default
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB
DEFAULT_CLUSTER_ID = "mooncake_cluster"
"""Mooncake's cluster id when `MC_STORE_CLUSTER_ID` is unset (the etcd namespace of HA)."""


def store_cluster_id() -> str:
    """The cluster id a Mooncake client uses to find an HA master in etcd:
    `MC_STORE_CLUSTER_ID`, else "mooncake_cluster" (as Mooncake's etcd leader coordinator)."""
    return os.environ.get("MC_STORE_CLUSTER_ID", "").strip() or DEFAULT_CLUSTER_ID


READ_MODE_ENV = "MC_STORE_READ_MODE"
"""kvpool's addition: "cached" opts a compat store into `Store(read_mode="cached")` (reads of
remembered places checked by checksum, for content-hashed keys; docs/parts/client.md); unset or
"strict" keeps Mooncake's semantics."""


def store_read_mode() -> str:
    """The read mode of a compat store: `MC_STORE_READ_MODE` ("strict" or "cached"), else
    "strict"; another value is logged and ignored."""
    mode = os.environ.get(READ_MODE_ENV, "").strip().lower() or "strict"
    if mode not in ("strict", "cached"):
        log.warning("%s=%r is not strict or cached; using strict", READ_MODE_ENV, mode)
        return "strict"
    return mode


HOT_CACHE_ENV = "MC_STORE_LOCAL_HOT_CACHE_SIZE"
"""Mooncake's client hot cache size; kvpool's hot cache (`Store(hot_cache_size=)`) serves
without asking the master, so it is used only with `MC_STORE_READ_MODE=cached`."""


def store_hot_cache_size(read_mode: str) -> int:
    """Bytes of the compat store's hot cache: `MC_STORE_LOCAL_HOT_CACHE_SIZE` (Mooncake's
    sizes) in cached read mode, else 0 (a size given in strict mode, or one that does not
    parse, is logged and ignored)."""
    raw = os.environ.get(HOT_CACHE_ENV, "").strip()
    if not raw:
        return 0
    try:
        size = parse_mooncake_size(raw, name=HOT_CACHE_ENV)
    except ValueError as exc:
        log.warning("%s=%r: %s; no hot cache", HOT_CACHE_ENV, raw, exc)
        return 0
    if size and read_mode != "cached":
        log.warning("%s needs %s=cached in kvpool; no hot cache", HOT_CACHE_ENV, READ_MODE_ENV)
        return 0
    return size


KNOWN_PROTOCOLS = frozenset(
    {
        "tcp",
        "rdma",
        "efa",
        "nvmeof",
        "nvlink",
        "musa",
        "nvlink_intra",
        "hip",
        "barex",
        "cxl",
        "ascend",
        "ub",
        "ubshmem",
        "maca",
        "sunrise_link",
        "rpc_only",
    }
)
"""Protocols Mooncake knows; an unknown one is passed through with a warning, as Mooncake does."""

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_mooncake_size(value: object, *, name: str = "size") -> int:
    """Bytes from an int or a string the way Mooncake reads it: "16MB" = "16 MB" = 16 MiB.

    Raises `kvpool.errors.InvalidParams` (a ValueError) naming `name` when it cannot.
    """
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m is not None:
            number, unit = m.group(1), m.group(2).upper()
            # Mooncake's units are binary whatever they are called: map onto kvpool's KiB/MiB/...
            return parse_size(f"{number}{unit}iB" if unit else number, name=name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return parse_size(value, name=name)  # type: ignore[arg-type]  # it reports the bad type


def parse_bool(value: object) -> bool:
    """A config boolean that may arrive as a bool, a number or a string ("true", "off", ...)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return bool(value)
    if value is None:
        return False
    text = str(value).strip().lower()
    if text in ("", "false", "0", "no", "off", "disable"):
        return False
    if text in ("true", "1", "yes", "on", "enable"):
        return True
    raise ValueError(f"Invalid boolean value: {value!r}")


@dataclass
class MooncakeConfig:
    """The configuration a Mooncake program passes to `setup()` (same fields as Mooncake's).

    Build it with `load_from_env()` or `from_file(path)`, then::

        store.setup(cfg.local_hostname, cfg.metadata_server, cfg.global_segment_size,
                    cfg.local_buffer_size, cfg.protocol, cfg.device_name,
                    cfg.master_server_address)
    """

    local_hostname: str
    """Address this client advertises (a port is chosen when it has none)."""
    metadata_server: str
    """Mooncake's Transfer Engine metadata service; accepted and not needed by kvpool."""
    global_segment_size: int
    """Bytes of memory this process contributes to the pool (0: a pure client)."""
    local_buffer_size: int
    """Bytes of Mooncake's staging buffer: the largest value a copying put accepts."""
    protocol: str
    """Mooncake transport name, lower-cased ("tcp", "rdma", ...)."""
    device_name: str | None
    """RDMA devices (ignored by kvpool)."""
    master_server_address: str
    """"host:port" of the master."""
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(
                f"Invalid protocol: {self.protocol!r}. Protocol must be a non-empty string, "
                "e.g. 'tcp' or 'rdma'."
            )
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            log.warning("Unrecognised protocol %r; passing it through unchanged", self.protocol)
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"Invalid {name}: {getattr(self, name)}. Size must be non-negative."
                )
        for name in ("local_hostname", "metadata_server", "master_server_address"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"Config field {name!r} must be a non-empty string, got {value!r}."
                )

    @staticmethod
    def from_file(file_path: str) -> MooncakeConfig:
        """Load the config from a JSON file (Mooncake's format)."""
        with open(file_path, encoding="utf-8") as f:
            config = json.load(f)
        for name in ("local_hostname", "metadata_server", "master_server_address"):
            if name not in config:
                raise ValueError(f"Missing required config field: {name}")
        offload_path = config.get("ssd_offload_path")
        tenant = config.get("tenant_id")
        return MooncakeConfig(
            local_hostname=config["local_hostname"],
            metadata_server=config["metadata_server"],
            global_segment_size=parse_mooncake_size(
                config.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE),
                name="global_segment_size",
            ),
            local_buffer_size=parse_mooncake_size(
                config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE),
                name="local_buffer_size",
            ),
            protocol=config.get("protocol", "tcp"),
            device_name=config.get("device_name", ""),
            master_server_address=config["master_server_address"],
            enable_ssd_offload=parse_bool(config.get("enable_ssd_offload", False)),
            ssd_offload_path=str(offload_path) if offload_path is not None else "",
            tenant_id=str(tenant) if tenant is not None else "default",
            enable_client_http_server=parse_bool(config.get("enable_client_http_server", False)),
            client_http_port=int(config.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_env() -> MooncakeConfig:
        """The config named by MOONCAKE_CONFIG_PATH, else built from MOONCAKE_* variables.

        MOONCAKE_MASTER is required without a config file. The local hostname comes from
        MOONCAKE_LOCAL_HOSTNAME, else LOCAL_HOSTNAME (what Mooncake's test scripts set),
        else "localhost".
        """
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        master = os.getenv("MOONCAKE_MASTER")
        if not master:
            raise ValueError(
                "Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor 'MOONCAKE_MASTER' "
                "is set."
            )
        hostname = (
            os.getenv("MOONCAKE_LOCAL_HOSTNAME") or os.getenv("LOCAL_HOSTNAME") or "localhost"
        )
        return MooncakeConfig(
            local_hostname=hostname,
            metadata_server=os.getenv("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=parse_mooncake_size(
                os.getenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", str(DEFAULT_GLOBAL_SEGMENT_SIZE)),
                name="MOONCAKE_GLOBAL_SEGMENT_SIZE",
            ),
            local_buffer_size=parse_mooncake_size(
                os.getenv("MOONCAKE_LOCAL_BUFFER_SIZE", str(DEFAULT_LOCAL_BUFFER_SIZE)),
                name="MOONCAKE_LOCAL_BUFFER_SIZE",
            ),
            protocol=os.getenv("MOONCAKE_PROTOCOL", "tcp"),
            device_name=os.getenv("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=parse_bool(os.getenv("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=os.getenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=os.getenv("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=parse_bool(
                os.getenv("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")
            ),
            client_http_port=int(os.getenv("MOONCAKE_CLIENT_HTTP_PORT", "9300")),
        )
