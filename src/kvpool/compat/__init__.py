"""kvpool.compat (see its README or module docstring once written)."""
