"""kvpool.protocol (see its README or module docstring once written)."""
