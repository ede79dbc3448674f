"""Adapter registry: `{"type": NAME, ...}` JSON → config dataclass → adapter instance.

Each adapter module registers itself when imported (`register_adapter(name, ConfigCls,
factory)`); the registry knows the module of each built-in type and imports it only when that
type is configured, so a missing optional dependency (boto3, redis) only matters to the users
of that adapter. Third-party adapters register the same way, or come in through the `plugin`
type without registering at all.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

from kvpool.cache.adapters.base import L2Adapter
from kvpool.errors import InvalidParams

__all__ = [
    "AdapterConfig",
    "adapter_types",
    "create_adapter",
    "parse_adapter_config",
    "register_adapter",
]

# Built-in types and the module that registers each, imported on first use.
_BUILTIN_MODULES: dict[str, str] = {
    "mock": "kvpool.cache.adapters.mock",
    "fs": "kvpool.cache.adapters.fs",
    "resp": "kvpool.cache.adapters.resp",
    "s3": "kvpool.cache.adapters.s3",
    "kvpool": "kvpool.cache.adapters.pool",
    "plugin": "kvpool.cache.adapters.plugin",
    "fault": "kvpool.cache.adapters.fault",
}


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
    """Base of every adapter's config: a frozen dataclass built from the JSON object.

    `from_dict` refuses unknown keys (a typo must not silently fall back to a default); each
    subclass validates its values in `__post_init__`.
    """

    type_name: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(data) - known - {"type"})
        if extra:
            raise InvalidParams(
                f"adapter {cls.type_name!r}: unknown option(s) {extra}; known: {sorted(known)}"
            )
        try:
            return cls(**{k: v for k, v in data.items() if k != "type"})
        except TypeError as exc:
            raise InvalidParams(f"adapter {cls.type_name!r}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, **dataclasses.asdict(self)}


AdapterFactory = Callable[[Any], L2Adapter]

_lock = threading.Lock()
_types: dict[str, tuple[type[AdapterConfig], AdapterFactory]] = {}


def register_adapter(name: str, config_cls: type[AdapterConfig], factory: AdapterFactory) -> None:
    """Make `{"type": name}` build `factory(config_cls.from_dict(json))`."""
    if not name or not isinstance(name, str):
        raise InvalidParams(f"adapter type name must be a non-empty str, got {name!r}")
    with _lock:
        config_cls.type_name = name
        _types[name] = (config_cls, factory)


def _resolve(name: str) -> tuple[type[AdapterConfig], AdapterFactory]:
    with _lock:
        row = _types.get(name)
    if row is not None:
        return row
    module = _BUILTIN_MODULES.get(name)
    if module is None:
        raise InvalidParams(f"unknown L2 adapter type {name!r}; known: {adapter_types()}")
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise InvalidParams(
            f"L2 adapter type {name!r} needs a package that is not installed: {exc}"
        ) from exc
    with _lock:
        row = _types.get(name)
    if row is None:  # pragma: no cover - a built-in module that forgot to register
        raise InvalidParams(f"module {module} did not register adapter type {name!r}")
    return row


def adapter_types() -> list[str]:
    """Every known type name (built-in and registered)."""
    with _lock:
        return sorted(set(_BUILTIN_MODULES) | set(_types))


def _as_dict(spec: Mapping[str, Any] | str) -> Mapping[str, Any]:
    if isinstance(spec, str):
        try:
            data = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise InvalidParams(f"--l2-adapter is not valid JSON: {spec!r} ({exc})") from exc
    else:
        data = spec
    if not isinstance(data, Mapping) or not isinstance(data.get("type"), str):
        raise InvalidParams(f'an L2 adapter spec is a JSON object with a "type", got {spec!r}')
    return data


def parse_adapter_config(spec: Mapping[str, Any] | str | AdapterConfig) -> AdapterConfig:
    """Validate a spec (JSON text, dict or config) into its adapter's config dataclass."""
    if isinstance(spec, AdapterConfig):
        return spec
    data = _as_dict(spec)
    config_cls, _ = _resolve(str(data["type"]))
    return config_cls.from_dict(data)


def create_adapter(spec: Mapping[str, Any] | str | AdapterConfig) -> L2Adapter:
    """Build the adapter a spec describes (importing its module on first use)."""
    config = parse_adapter_config(spec)
    _, factory = _resolve(config.type_name)
    return factory(config)
