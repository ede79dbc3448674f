"""kvpool.client (see its README or module docstring once written)."""
