"""Reference kernels, one module per op family; importing this package fills the table."""

from polykit.kernels.reference import elementwise  # noqa: F401
