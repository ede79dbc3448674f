"""`mooncake.engine` on kvpool: the host-memory part of Mooncake's Transfer Engine.

SGLang imports `mooncake.engine.TransferEngine` when it starts; this is
kvpool.compat.mooncake.transfer_engine (register memory, sync reads and writes over TCP, probes).
See the kvpool repository's docs/compat.md.
"""

from __future__ import annotations

from kvpool.compat.mooncake.transfer_engine import TransferEngine

__all__ = ["TransferEngine"]
