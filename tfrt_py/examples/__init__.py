"""Bundled example models (``make demo`` runs the CLI on them; ``make_models`` rebuilds them)."""
