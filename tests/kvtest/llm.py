"""The tiny real-model job the tests under tests/llm run: the one `kvpool bench llm --quick`
runs (`kvpool.llm.spec.QUICK_SPEC`), small enough for a CPU in seconds, with every part (system
prompt, turns, questions, chunks) there."""

from __future__ import annotations

from kvpool.llm.spec import QUICK_SPEC

__all__ = ["TINY_SPEC"]

TINY_SPEC = QUICK_SPEC
