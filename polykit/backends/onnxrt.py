"""The ONNX Runtime runner: the comparison baseline (`polykit run --onnxrt`).

onnxruntime is imported only when a session is made, so `polykit --help` stays fast.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from polykit.backends.base import BaseRunner, RunnerError, TensorMeta, resolve
from polykit.backends.loaders import BaseLoader

#: onnxruntime type strings -> numpy dtype names
_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(int8)": "int8", "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
    "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32", "tensor(uint64)": "uint64",
    "tensor(bool)": "bool", "tensor(string)": "object",
}

_PROVIDER_ALIASES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "trt": "TensorrtExecutionProvider"}


def provider_names(providers: Sequence[str] | None) -> list[str]:
    """Full provider names from short ones ("cpu" -> "CPUExecutionProvider"); default CPU."""
    names = [_PROVIDER_ALIASES.get(p.lower(), p) for p in (providers or ())]
    return names or ["CPUExecutionProvider"]


class SessionFromOnnx(BaseLoader):
    """An onnxruntime.InferenceSession from a path, bytes, ModelProto, Graph or loader of one."""

    def __init__(self, model: Any, providers: Sequence[str] | None = None):
        self.model = model
        self.providers = tuple(providers or ())

    def __call__(self) -> Any:
        import onnxruntime as ort

        value = resolve(self.model)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, (str, bytes)):
            from polykit.backends.loaders import _model_proto

            value = _model_proto(value).SerializeToString()
        where = value if isinstance(value, str) else "onnxruntime session"
        if isinstance(value, str):
            from polykit.errors import ModelLoadError
            from polykit.files import require_file

            require_file(value, "model file", ModelLoadError)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            return ort.InferenceSession(value, sess_options=options, providers=provider_names(self.providers))
        except Exception as exc:  # onnxruntime raises its own exception types
            raise RunnerError(
                f"onnxruntime cannot load the model: {exc}",
                where=where,
                hint="check the model with `polykit inspect model`; use --providers to pick providers",
            ) from exc


class OnnxrtRunner(BaseRunner):
    """Runs a model with ONNX Runtime. `sess` is an InferenceSession or a loader of one."""

    reads_feeds_only = True  # (the Comparator need not copy its feeds)

    def __init__(self, sess: Any, name: str = "onnxrt"):
        super().__init__(name)
        self._sess_arg = sess
        self.sess: Any = None

    def activate_impl(self) -> None:
        self.sess = resolve(self._sess_arg)

    def deactivate_impl(self) -> None:
        self.sess = None

    def get_input_metadata_impl(self) -> dict[str, TensorMeta]:
        meta = {}
        for i in self.sess.get_inputs():
            shape = None if i.shape is None else tuple(d if isinstance(d, int) else (d or None) for d in i.shape)
            meta[i.name] = TensorMeta(i.name, _ORT_TYPES.get(i.type, i.type), shape)
        return meta

    def output_names(self) -> list[str]:
        return [o.name for o in self.sess.get_outputs()]

    def infer_impl(self, feed_dict: dict[str, Any]) -> dict[str, Any]:
        names = self.output_names()
        try:
            values = self.sess.run(names, feed_dict)
        except Exception as exc:
            raise RunnerError(f"onnxruntime failed to run: {exc}", where=f"runner {self.name!r}",
                              hint="check the feeds' names, shapes and dtypes against the model's inputs") from exc
        return dict(zip(names, values))
