"""`polygraphy.backend.onnxrt`: OnnxrtRunner and SessionFromOnnx are polykit's own (the same
arguments: a session or a loader of one, a model path, bytes or ModelProto, `providers`)."""

from __future__ import annotations

from typing import Any

from polykit.backends.onnxrt import OnnxrtRunner as _OnnxrtRunner
from polykit.backends.onnxrt import SessionFromOnnx


class OnnxrtRunner(_OnnxrtRunner):
    """Polygraphy's OnnxrtRunner(sess, name=None)."""

    def __init__(self, sess: Any, name: str | None = None):
        super().__init__(sess, name=name or "onnxrt")


def session_from_onnx(model: Any, providers: Any = None) -> Any:
    return SessionFromOnnx(model, providers)()


__all__ = ["OnnxrtRunner", "SessionFromOnnx", "session_from_onnx"]
