"""Importers and shape rules, one module per op family; importing this package fills the tables."""

from polykit.compiler.ops import elementwise  # noqa: F401
