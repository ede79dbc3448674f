"""kvpool.cache (see its README or module docstring once written)."""
