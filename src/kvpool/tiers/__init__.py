"""kvpool.tiers (see its README or module docstring once written)."""
