"""Fixtures: the shared CLI test models (tests/cli_models.py)."""

from tests.cli_models import add_mul, bad_mlp, dyn_model, fault_plugin, mlp, fresh_plugins  # noqa: F401  (pytest fixtures)
