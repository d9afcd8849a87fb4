"""Integrations with launchers and frameworks; each imports its framework lazily."""
