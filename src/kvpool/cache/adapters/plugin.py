"""`plugin`: any L2Adapter subclass from an importable module, without registering it.

    {"type": "plugin", "module_path": "my_company.l2", "class_name": "MyAdapter",
     "adapter_params": {"endpoint": "..."}}

The class is instantiated as `MyAdapter(**adapter_params)`. It must subclass `L2Adapter`, and it
should pass the conformance suite (tests/cache/adapters/test_conformance.py shows how to run it
against a module given by path). Import or construction errors are reported as InvalidParams
naming the module and class, at start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpool.cache.adapters.base import L2Adapter
from kvpool.cache.adapters.registry import AdapterConfig, register_adapter
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["PluginAdapterConfig", "create_plugin_adapter"]


@dataclass(frozen=True)
class PluginAdapterConfig(AdapterConfig):
    module_path: str = ""
    """Dotted module name, importable from sys.path."""
    class_name: str = ""
    """An L2Adapter subclass defined in that module."""
    adapter_params: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the class's constructor."""

    def __post_init__(self) -> None:
        if not isinstance(self.module_path, str) or not self.module_path:
            raise InvalidParams(f'plugin adapter needs "module_path", got {self.module_path!r}')
        if not isinstance(self.class_name, str) or not self.class_name.isidentifier():
            raise InvalidParams(
                f'plugin adapter needs a "class_name" identifier, got {self.class_name!r}'
            )
        if not isinstance(self.adapter_params, Mapping):
            raise InvalidParams(
                f"plugin.adapter_params must be an object, got {self.adapter_params!r}"
            )


def create_plugin_adapter(config: PluginAdapterConfig) -> L2Adapter:
    where = f"{config.module_path}.{config.class_name}"
    try:
        module = importlib.import_module(config.module_path)
    except ImportError as exc:
        raise InvalidParams(f"plugin adapter: cannot import {config.module_path!r}: {exc}") from exc
    cls = getattr(module, config.class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, L2Adapter):
        raise InvalidParams(f"plugin adapter: {where} is not an L2Adapter subclass")
    try:
        adapter = cls(**dict(config.adapter_params))
    except KVPoolError:
        raise
    except Exception as exc:
        raise InvalidParams(
            f"plugin adapter: {where}({dict(config.adapter_params)!r}) failed: {exc}"
        ) from exc
    return adapter


register_adapter("plugin", PluginAdapterConfig, create_plugin_adapter)
