"""Shared pytest fixtures live in their own modules; this file only wires them in."""

pytest_plugins = ["tests.fixtures_checkpoints", "tests.fixtures_hub"]
