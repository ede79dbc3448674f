"""kvpool.bench (see its README or module docstring once written)."""
