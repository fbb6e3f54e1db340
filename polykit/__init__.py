"""polykit: an ONNX inference engine with its own kernels, and a debugging toolkit on the same core."""

__version__ = "0.1.0"

from polykit.errors import PolykitError  # noqa: E402,F401
