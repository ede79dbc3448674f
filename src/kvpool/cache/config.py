"""`StorageManagerConfig` and the command-line flags that build it.

Flags (usable by any click command through `@storage_manager_options`):

    --l1-size 4GiB                  L1 capacity
    --l1-write-ttl 600s / --l1-read-ttl 300s / --l1-eviction-watermark 0.8
    --l2-adapter '<json>'           repeatable; one adapter per flag, in priority order
    --l2-store-policy NAME          default | skip_l1 | any registered store policy
    --l2-prefetch-policy NAME       default | spread | any registered prefetch policy
    --l2-prefetch-max-in-flight 8
    --l2-prefetch-lookup-timeout 30s

Adapter JSON is validated here (type known, options known and valid) so that a typo fails at
start-up with the offending text, not at the first store. Precedence as everywhere in kvpool:
flag > environment (`KVPOOL_L2_ADAPTERS`, a JSON list, read through kvpool.config.env) > default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from kvpool.cache.adapters.registry import AdapterConfig, parse_adapter_config
from kvpool.cache.l1 import L1Config
from kvpool.cache.policy import prefetch_policy_names, store_policy_names
from kvpool.config import env, parse_duration, parse_size
from kvpool.errors import InvalidParams

__all__ = ["StorageManagerConfig", "storage_manager_options"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class StorageManagerConfig:
    """Everything a StorageManager needs; every field has a default."""

    l1: L1Config = field(default_factory=L1Config)
    """L1 capacity, TTLs and eviction watermark."""
    adapters: tuple[AdapterConfig, ...] = ()
    """L2 adapters in priority order (the default prefetch policy prefers earlier ones)."""
    store_policy: str = "default"
    """Name of the registered StorePolicy."""
    prefetch_policy: str = "default"
    """Name of the registered PrefetchPolicy."""
    prefetch_max_in_flight: int = 8
    """Prefetch requests worked on at once; more are queued."""
    prefetch_lookup_timeout_s: float = 30.0
    """Seconds a prefetch waits for an adapter's lookup before it plans without it (as a
    miss); an orphaned lookup (nobody waits for it) is polled that long again, then dropped."""
    store_max_keys_per_task: int = 16
    """Keys per store task: larger groups are split so an adapter's workers share them."""

    def __post_init__(self) -> None:
        if not isinstance(self.l1, L1Config):
            raise InvalidParams(f"StorageManagerConfig.l1 must be an L1Config, got {self.l1!r}")
        object.__setattr__(self, "adapters", tuple(parse_adapter_config(a) for a in self.adapters))
        if self.store_policy not in store_policy_names():
            raise InvalidParams(
                f"unknown store policy {self.store_policy!r}; known: {store_policy_names()}"
            )
        if self.prefetch_policy not in prefetch_policy_names():
            raise InvalidParams(
                f"unknown prefetch policy {self.prefetch_policy!r}; known: {prefetch_policy_names()}"
            )
        for name in ("prefetch_max_in_flight", "store_max_keys_per_task"):
            m = getattr(self, name)
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise InvalidParams(f"{name} must be an int >= 1, got {m!r}")
        t = self.prefetch_lookup_timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf:
            raise InvalidParams(
                f"prefetch_lookup_timeout_s must be a finite number of seconds > 0, got {t!r}"
            )

    @classmethod
    def from_cli_args(
        cls,
        *,
        l2_adapter: Sequence[str | Mapping[str, Any]] = (),
        l2_store_policy: str = "default",
        l2_prefetch_policy: str = "default",
        l2_prefetch_max_in_flight: int = 8,
        l2_prefetch_lookup_timeout: str | float = 30.0,
        l1_size: str | int = "1GiB",
        l1_write_ttl: str | float = 600.0,
        l1_read_ttl: str | float = 300.0,
        l1_eviction_watermark: float = 0.8,
    ) -> StorageManagerConfig:
        """Build from flag values (strings as typed); the environment fills absent adapters."""
        specs: list[str | Mapping[str, Any]] = list(l2_adapter)
        if not specs:
            raw = env("L2_ADAPTERS")
            if raw:
                try:
                    listed = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise InvalidParams(f"KVPOOL_L2_ADAPTERS is not valid JSON: {raw!r}") from exc
                if not isinstance(listed, list):
                    raise InvalidParams("KVPOOL_L2_ADAPTERS must be a JSON list of adapter objects")
                specs = listed
        return cls(
            l1=L1Config(
                capacity_bytes=parse_size(l1_size, name="--l1-size", minimum=1),
                write_ttl_s=parse_duration(l1_write_ttl, name="--l1-write-ttl"),
                read_ttl_s=parse_duration(l1_read_ttl, name="--l1-read-ttl"),
                eviction_watermark=float(l1_eviction_watermark),
            ),
            adapters=tuple(parse_adapter_config(s) for s in specs),
            store_policy=l2_store_policy,
            prefetch_policy=l2_prefetch_policy,
            prefetch_max_in_flight=l2_prefetch_max_in_flight,
            prefetch_lookup_timeout_s=parse_duration(
                l2_prefetch_lookup_timeout, name="--l2-prefetch-lookup-timeout"
            ),
        )


def storage_manager_options(fn: F) -> F:
    """Add the storage-manager flags to a click command (its callback gets them as kwargs
    named like `from_cli_args`' parameters)."""
    options = [
        click.option("--l1-size", default="1GiB", show_default=True, help="L1 capacity."),
        click.option(
            "--l1-write-ttl",
            default="600s",
            show_default=True,
            help="Abandon unfinished writes after.",
        ),
        click.option(
            "--l1-read-ttl", default="300s", show_default=True, help="Void read locks after."
        ),
        click.option(
            "--l1-eviction-watermark",
            default=0.8,
            show_default=True,
            type=float,
            help="Evict LRU above.",
        ),
        click.option(
            "--l2-adapter",
            multiple=True,
            metavar="JSON",
            help='An L2 adapter, e.g. \'{"type":"fs","base_path":"/data"}\' (repeatable).',
        ),
        click.option(
            "--l2-store-policy",
            default="default",
            show_default=True,
            type=click.Choice(store_policy_names()),
            help="Which adapters store which keys.",
        ),
        click.option(
            "--l2-prefetch-policy",
            default="default",
            show_default=True,
            type=click.Choice(prefetch_policy_names()),
            help="Which adapter loads which key.",
        ),
        click.option(
            "--l2-prefetch-max-in-flight",
            default=8,
            show_default=True,
            type=click.IntRange(min=1),
            help="Prefetch requests worked on at once.",
        ),
        click.option(
            "--l2-prefetch-lookup-timeout",
            default="30s",
            show_default=True,
            help="Plan a prefetch without an L2 lookup that has not answered after.",
        ),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn
