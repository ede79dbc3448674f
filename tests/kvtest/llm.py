"""The tiny real-model job the tests under tests/llm run (kvpool.llm.spec.JobSpec): small
enough for a CPU in seconds, with every part (system prompt, turns, questions, chunks) there."""

from __future__ import annotations

from kvpool.llm.spec import JobSpec

__all__ = ["TINY_SPEC"]

TINY_SPEC = JobSpec(
    model_size="tiny",
    prompt_tokens=96,
    system_tokens=32,
    turn_tokens=48,
    question_tokens=8,
    chunk_tokens=16,
)
