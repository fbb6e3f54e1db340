"""The part of Polygraphy's API that polykit provides under Polygraphy's names (polykit.compat)."""

from polykit.compat.polygraphy import func  # noqa: F401  (`from polygraphy import func`)

__version__ = "polykit-compat"
