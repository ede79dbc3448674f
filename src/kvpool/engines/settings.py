"""EngineSettings: which pool an engine backend connects to, and how.

The engines hand their backends a plain mapping (SGLang's `--hicache-storage-backend-extra-config`
JSON, LMCache's `extra_config`); `EngineSettings.from_mapping` reads the keys below from it (each
optionally under a prefix such as "kvpool."), falls back to the environment for the master, and
refuses anything it cannot use with `InvalidParams` naming the key:

    master          "host:port" or "etcd://HOST:PORT/CLUSTER" (else $KVPOOL_MASTER, else
                    $MOONCAKE_MASTER, else 127.0.0.1:50051)
    tenant          the pool tenant (default "default")
    protocol        "auto", "shm" or "tcp"
    segment_size    bytes this engine process lends to the pool (default 0: a pure client)
    token           credential for a master with an auth file (else $KVPOOL_AUTH_TOKEN)
    key_prefix      prepended to every key this backend writes (default "")
    transfer_timeout / rpc_timeout   seconds
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kvpool.client import Store
from kvpool.config import parse_size
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["DEFAULT_MASTER", "EngineSettings"]

log = logging.getLogger(__name__)

DEFAULT_MASTER: Final = "127.0.0.1:50051"
_PROTOCOLS: Final = ("auto", "shm", "tcp")
_KEYS: Final = frozenset(
    {
        "master",
        "tenant",
        "protocol",
        "segment_size",
        "token",
        "key_prefix",
        "transfer_timeout",
        "rpc_timeout",
    }
)


def _text(raw: Mapping[str, object], key: str, default: str) -> str:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidParams(f"{key}: expected a string, got {type(value).__name__}")
    return value


def _seconds(raw: Mapping[str, object], key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidParams(f"{key}: expected seconds, got {value!r}")
    try:
        seconds = float(value)
    except ValueError as exc:
        raise InvalidParams(f"{key}: expected seconds, got {value!r}") from exc
    if not 0 < seconds <= 3600:
        raise InvalidParams(f"{key}: {seconds} s is outside (0, 3600]")
    return seconds


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The pool connection of one engine backend (see the module docstring)."""

    master: str = DEFAULT_MASTER
    tenant: str = "default"
    protocol: str = "auto"
    segment_size: int = 0
    token: str = ""
    key_prefix: str = ""
    transfer_timeout: float = 30.0
    rpc_timeout: float = 10.0

    @classmethod
    def from_mapping(cls, config: Mapping[str, object] | None, prefix: str = "") -> EngineSettings:
        """The settings named in `config` (keys `prefix + name`); other keys are ignored, as
        the engines keep their own options in the same mapping."""
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise InvalidParams(f"config: expected a mapping, got {type(config).__name__}")
        raw = {
            k[len(prefix) :]: v
            for k, v in config.items()
            if isinstance(k, str) and k.startswith(prefix) and k[len(prefix) :] in _KEYS
        }
        env_master = os.environ.get("KVPOOL_MASTER") or os.environ.get("MOONCAKE_MASTER")
        master = _text(raw, "master", env_master or DEFAULT_MASTER).strip()
        if not master:
            raise InvalidParams("master: empty")
        protocol = _text(raw, "protocol", "auto")
        if protocol not in _PROTOCOLS:
            raise InvalidParams(f"protocol: {protocol!r} is not one of {', '.join(_PROTOCOLS)}")
        segment = raw.get("segment_size", 0)
        if isinstance(segment, bool) or not isinstance(segment, int | str):
            raise InvalidParams(f"segment_size: expected bytes, got {segment!r}")
        return cls(
            master=master,
            tenant=_text(raw, "tenant", "default") or "default",
            protocol=protocol,
            segment_size=parse_size(segment, name="segment_size"),
            token=_text(raw, "token", ""),
            key_prefix=_text(raw, "key_prefix", ""),
            transfer_timeout=_seconds(raw, "transfer_timeout", 30.0),
            rpc_timeout=_seconds(raw, "rpc_timeout", 10.0),
        )

    def with_master(self, master: str) -> EngineSettings:
        """These settings pointed at `master` ("host:port")."""
        if not master:
            raise InvalidParams("master: empty")
        return EngineSettings(
            master,
            self.tenant,
            self.protocol,
            self.segment_size,
            self.token,
            self.key_prefix,
            self.transfer_timeout,
            self.rpc_timeout,
        )

    def open_store(self) -> Store:
        """A Store connected with these settings and its pool's segments opened (`warm_up`,
        so an engine's first pages do not pay for mapping them); the caller closes it."""
        store = Store(
            self.master,
            segment_size=self.segment_size,
            tenant=self.tenant,
            protocol=self.protocol,
            token=self.token,
            transfer_timeout=self.transfer_timeout,
            rpc_timeout=self.rpc_timeout,
        )
        try:
            store.warm_up()
        except KVPoolError as exc:  # a pool without segments yet: opened on first use
            log.info("warm_up: %s", exc)
        return store
