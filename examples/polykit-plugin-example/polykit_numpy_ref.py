"""An example polykit plugin: the `--numpy-ref` runner.

It imports the model into polykit's graph IR and evaluates it node by node with the
numpy reference kernels (no plan, no fusion, no memory planning), which makes it a
handy third opinion next to `--trt` and `--onnxrt`:

    pip install -e examples/polykit-plugin-example      # or: export POLYKIT_PLUGINS=polykit_numpy_ref
    polykit run model.onnx --numpy-ref --onnxrt
"""

from __future__ import annotations

from typing import Any

from polykit.backends.base import BaseRunner, RunnerRequest, RunnerSpec, TensorMeta
from polykit.plugins import hookimpl


class NumpyRefRunner(BaseRunner):
    """Evaluates a polykit Graph with the reference kernels."""

    def __init__(self, model: str, input_shapes: dict[str, tuple[int, ...]] | None = None):
        super().__init__("numpy-ref")
        self.model = model
        self.input_shapes = dict(input_shapes or {})
        self.graph: Any = None

    def activate_impl(self) -> None:
        from polykit.compiler.graph.infer import infer_shapes
        from polykit.compiler.graph.onnx_import import load_onnx

        self.graph = load_onnx(self.model)
        for name, shape in self.input_shapes.items():
            self.graph.set_value(self.graph.value(name).with_(shape=tuple(shape)))
        infer_shapes(self.graph)

    def deactivate_impl(self) -> None:
        self.graph = None

    def get_input_metadata_impl(self) -> dict[str, TensorMeta]:
        meta = {}
        for name in self.graph.inputs:
            v = self.graph.value(name)
            meta[name] = TensorMeta(name, str(v.dtype), v.shape)
        return meta

    def infer_impl(self, feed_dict: dict[str, Any]) -> dict[str, Any]:
        from polykit.compiler.graph.evaluator import evaluate_graph

        return evaluate_graph(self.graph, feed_dict)


def make_runner(request: RunnerRequest) -> BaseRunner:
    return NumpyRefRunner(request.model, dict(request.input_shapes))


@hookimpl
def polykit_runners() -> list[RunnerSpec]:
    return [RunnerSpec("numpy-ref", ("--numpy-ref",), make_runner, "graph evaluated node by node with numpy (example plugin)")]
