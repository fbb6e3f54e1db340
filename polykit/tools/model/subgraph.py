"""Extract a subgraph of an ONNX model between named tensors (`polykit surgeon extract`).

    sub = extract("model.onnx", inputs=["/blocks/Relu_output_0"], outputs=["logits"])
    sub = extract(model, inputs=[TensorSpec("x", (1, 3, 224, 224), np.dtype("float32"))],
                  outputs=[TensorSpec("y")])

The subgraph holds the nodes that compute `outputs` from `inputs` (walking back from each
output until an input or an initializer; a graph input met on the way that is not among
`inputs` is an error), copied as they are in the model, with the initializers they read,
the model's opsets, IR version and metadata. Shapes and dtypes left out (None, "auto" on
the command line) come from polykit's own shape inference of the whole model
(polykit.compiler.graph.infer through onnx_import.load_onnx), computed once per Extractor, so
`debug reduce` extracts many subgraphs of one model cheaply.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import Shape
from polykit.compiler.ir.subgraphs import outer_names
from polykit.errors import UsageError

log = logging.getLogger("polykit")

_AUTO = "auto"
_INPUT = re.compile(r"^(?P<name>.+):(?P<shape>\[[^\[\]]*\]|auto):(?P<dtype>[A-Za-z0-9_]+)$")
_DIM = re.compile(r"^(?:\d+|[A-Za-z_][\w.]*|\?)$")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor by name; `shape` (dims: int, symbolic str, None unknown) and `dtype` None mean
    "auto": from polykit's shape inference."""

    name: str
    shape: Shape = None
    dtype: np.dtype | None = None


def parse_dtype(text: str, where: str) -> np.dtype | None:
    """"auto" -> None; a numpy dtype name ("float32", "int64", "bool", "float16") -> that dtype."""
    if text == _AUTO:
        return None
    try:
        dtype = np.dtype(text)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biufc" or text.isdigit():
        raise UsageError(f"{where}: {text!r} is not a dtype", hint="use a numpy dtype name (float32, int64, ...) or auto")
    return dtype


def parse_input_spec(text: str) -> TensorSpec:
    """Polygraphy's `NAME:SHAPE|auto:DTYPE|auto` (`x:[1,3,224,224]:float32`, `x:auto:auto`);
    a bare NAME is all auto. Dims: integers, symbolic names, or ? (unknown)."""
    m = _INPUT.match(text.strip())
    if m is None:
        return TensorSpec(text.strip())
    where = f"--inputs {text!r}"
    shape = None
    if m["shape"] != _AUTO:
        dims = [d.strip() for d in m["shape"][1:-1].split(",") if d.strip()]
        if not all(_DIM.match(d) for d in dims):
            raise UsageError(f"{where}: the shape {m['shape']} has a dim that is not a number, a name or ?",
                             hint="e.g. --inputs x:[1,3,224,224]:float32 or x:[batch,3,224,224]:auto")
        shape = tuple(int(d) if d.isdigit() else None if d == "?" else d for d in dims)
    return TensorSpec(m["name"], shape, parse_dtype(m["dtype"], where))


def parse_output_spec(text: str) -> TensorSpec:
    """`NAME:DTYPE|auto` (`logits:float32`, `y:auto`) or a bare NAME (tensor names may hold ':',
    so the last part counts as a dtype only when it is one or auto)."""
    name, sep, last = text.strip().rpartition(":")
    if sep and name and (last == _AUTO or _is_dtype(last)):
        return TensorSpec(name, None, parse_dtype(last, f"--outputs {text!r}"))
    return TensorSpec(text.strip())


def _is_dtype(text: str) -> bool:
    try:
        return np.dtype(text).kind in "biufc" and not text.isdigit()
    except TypeError:
        return False


def extract(model: Any, inputs: Sequence[TensorSpec | str], outputs: Sequence[TensorSpec | str],
            constants: Mapping[str, np.ndarray] | None = None) -> Any:
    """The subgraph of `model` (a path or onnx.ModelProto) from `inputs` to `outputs` (module
    docstring; `constants`: Extractor.extract)."""
    return Extractor(model).extract(inputs, outputs, constants)


def describe_io(model: Any) -> dict[str, Any]:
    """{"nodes": [names], "inputs"/"outputs": [{"name", "dtype", "shape"}]} of an onnx.ModelProto."""
    from polykit.compiler.ir import dtypes

    def io(vi) -> dict:
        t = vi.type.tensor_type
        dtype = dtypes.ONNX_TO_NUMPY.get(t.elem_type)
        shape = [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in t.shape.dim] \
            if t.HasField("shape") else None
        return {"name": vi.name, "dtype": None if dtype is None else dtype.name, "shape": shape}

    return {"nodes": [n.name for n in model.graph.node], "inputs": [io(i) for i in model.graph.input],
            "outputs": [io(o) for o in model.graph.output]}


class Extractor:
    """One model read and shape-inferred once; `extract` cuts subgraphs of it.

    `graph`: polykit's graph of `model` with its shapes already inferred (`inspect capability`
    exports the graph it judged and passes it), so it is not imported again."""

    def __init__(self, model: Any, graph: Any = None):
        from polykit.backends.loaders import GraphFromOnnx, _model_proto

        self.model = _model_proto(model)
        self.graph = graph if graph is not None else GraphFromOnnx(self.model, check_supported=False)()
        g = self.model.graph
        self.producers = {out: i for i, node in enumerate(g.node) for out in node.output if out}
        self.initializers = {t.name: t for t in g.initializer}
        self.graph_inputs = [i.name for i in g.input if i.name not in self.initializers]
        self.value_infos = {vi.name: vi for vi in list(g.value_info) + list(g.input) + list(g.output)}

    def tensor_names(self) -> set[str]:
        """Every tensor a subgraph may start or end at: graph inputs, initializers, node outputs."""
        return set(self.graph_inputs) | set(self.initializers) | set(self.producers)

    def nodes_between(self, inputs: Iterable[str], outputs: Iterable[str]) -> list[int]:
        """Indices of the nodes that compute `outputs` from `inputs`, in topological order."""
        stop = set(inputs) | {""}
        order: list[int] = []
        seen: set[str] = set()
        for output in outputs:
            stack: list[tuple[str, bool]] = [(output, False)]
            while stack:
                name, expanded = stack.pop()
                if expanded:
                    order.append(self.producers[name])
                    continue
                if name in seen or name in stop or name in self.initializers:
                    continue
                seen.add(name)
                if name not in self.producers:
                    raise UsageError(f"the subgraph needs the graph input {name!r}, which is not among its inputs",
                                     where=f"model {self.model.graph.name!r}",
                                     hint=f"add it to --inputs (e.g. --inputs {name}:auto:auto)")
                node = self.model.graph.node[self.producers[name]]
                stack.append((name, True))
                stack.extend((t, False) for t in reversed([*node.input, *outer_names(node)]))
        return list(dict.fromkeys(order))

    def extract(self, inputs: Sequence[TensorSpec | str], outputs: Sequence[TensorSpec | str],
                constants: Mapping[str, np.ndarray] | None = None) -> Any:
        """The subgraph from `inputs` to `outputs` (module docstring); `constants` name tensors
        that it holds as initializers of the given values instead of computing them."""
        from onnx import helper, numpy_helper

        ins = [TensorSpec(s) if isinstance(s, str) else s for s in inputs]
        outs = [TensorSpec(s) if isinstance(s, str) else s for s in outputs]
        constants = dict(constants or {})
        self._check_names(ins, outs)
        stops = [s.name for s in ins] + list(constants)
        nodes = [self.model.graph.node[i] for i in self.nodes_between(stops, [s.name for s in outs])]
        read = {t for node in nodes for t in (*node.input, *outer_names(node))}
        unused = [s.name for s in ins if s.name not in read and s.name not in {o.name for o in outs}]
        if unused:
            log.warning("subgraph inputs %s are read by none of its nodes (kept as inputs)", ", ".join(map(repr, unused)))
        input_names = {s.name for s in ins}
        written = {t for node in nodes for t in node.output}
        inner = [vi for name, vi in self.value_infos.items() if name in written and name not in {o.name for o in outs}]
        kept = read | {o.name for o in outs}
        graph = helper.make_graph(
            nodes, self.model.graph.name, [self._value_info(s, "input") for s in ins],
            [self._value_info(s, "output") for s in outs],
            [t for name, t in self.initializers.items() if name in kept and name not in input_names]
            + [numpy_helper.from_array(np.asarray(value), name) for name, value in constants.items() if name in kept],
            value_info=inner)
        m = self.model
        sub = helper.make_model(graph, opset_imports=list(m.opset_import), functions=list(m.functions),
                                producer_name=m.producer_name, producer_version=m.producer_version, domain=m.domain,
                                model_version=m.model_version, doc_string=m.doc_string)
        sub.ir_version = m.ir_version
        sub.metadata_props.extend(m.metadata_props)
        return sub

    def _check_names(self, ins: list[TensorSpec], outs: list[TensorSpec]) -> None:
        known = self.tensor_names()
        for specs, option in ((ins, "--inputs"), (outs, "--outputs")):
            names = [s.name for s in specs]
            if not names and option == "--outputs":
                raise UsageError("a subgraph needs at least one output", hint="e.g. --outputs y:auto")
            twice = sorted({n for n in names if names.count(n) > 1})
            missing = [n for n in names if n not in known]
            if twice or missing:
                raise UsageError(f"{option} names {'twice' if twice else 'no tensor of the model'}: "
                                 f"{', '.join(map(repr, twice or missing))}", where=f"model {self.model.graph.name!r}",
                                 hint="tensor names are the inputs, initializers and node outputs of the model")

    def _value_info(self, spec: TensorSpec, role: str) -> Any:
        from onnx import helper

        from polykit.compiler.ir import dtypes

        known = self.graph.value(spec.name)
        dtype = spec.dtype or known.dtype
        shape = spec.shape if spec.shape is not None else known.shape
        if dtype is None:
            raise UsageError(f"subgraph {role} {spec.name!r}: polykit's shape inference does not know its dtype",
                             hint=f"give it: --{role}s {spec.name}:" + ("auto:float32" if role == "input" else "float32"))
        return helper.make_tensor_value_info(spec.name, dtypes.to_onnx(dtype), None if shape is None else list(shape))

