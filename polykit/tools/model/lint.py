"""`polykit check lint MODEL [-o report.json]`: what is wrong with an ONNX model, in the JSON
report Polygraphy's `check lint` writes (polygraphy/tools/check/subtool/lint.py):

    {"summary": {"passing": [node, ...], "failing": [node, ...]},
     "lint_entries": [{"level": "exception"|"warning"|"info", "source": ..., "message": ...,
                       "nodes": [node]}, ...]}       # "nodes" only where an entry is about nodes

The checks: onnx.checker on the model (source "onnx_checker"); onnx's shape inference node by
node in topological order, so each node whose input shapes or types do not fit is named
(source "onnx_shape_inference"; Polygraphy runs each node in onnxruntime instead, polykit
needs no data), nodes that read a failing node's output being neither passing nor failing;
graph inputs and nodes that no graph output depends on (source "onnx_graphsurgeon", as
Polygraphy words them), initializers nothing reads, and ops polykit has no implementation
of (source "polykit").
"""

from __future__ import annotations

from typing import Any

EXCEPTION, WARNING = "exception", "warning"


class LintReport:
    """The report's entries and the per-node verdicts, in Polygraphy's shape."""

    def __init__(self) -> None:
        self.passing: list[str] = []
        self.failing: list[str] = []
        self.entries: list[dict[str, Any]] = []

    def add(self, level: str, source: str, message: str, node: str | None = None) -> None:
        self.entries.append({"level": level, "source": source, "message": message, **({"nodes": [node]} if node else {})})

    @property
    def passed(self) -> bool:
        return not any(e["level"] == EXCEPTION for e in self.entries)

    def to_json(self) -> dict[str, Any]:
        return {"summary": {"passing": self.passing, "failing": self.failing}, "lint_entries": self.entries}


def read_unchecked(path: str) -> Any:
    """The onnx.ModelProto at `path`, not checked (the linter reports what the checker says);
    ModelLoadError when the file is not an ONNX protobuf."""
    import onnx
    from google.protobuf.message import DecodeError

    from polykit.errors import ModelLoadError
    from polykit.files import require_file

    file = require_file(path, "model file", ModelLoadError)
    try:
        return onnx.load(str(file))
    except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError, OSError) as exc:
        raise ModelLoadError(f"cannot parse the ONNX protobuf: {exc}", where=str(file),
                             hint="the file is not an ONNX model or is corrupt; re-export it") from None


def lint(model: Any) -> LintReport:
    """Lint an onnx.ModelProto (module docstring)."""
    report = LintReport()
    graph = model.graph
    _name_nodes(graph)
    _check(model, report)
    if not graph.node:
        report.add(WARNING, "onnx_loader", "ONNX model has no nodes")
        return report
    _infer_node_by_node(model, report)
    _unused(graph, report)
    _unsupported(model, report)
    return report


def _name_nodes(graph: Any) -> None:
    """Name nameless nodes `<op>_<index>` (Polygraphy names them too), so entries can name them."""
    for i, node in enumerate(graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"


def _check(model: Any, report: LintReport) -> None:
    import onnx

    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as exc:
        message = str(exc).strip()
        if "Bad node spec for node" not in message:  # node errors: shape inference names the node
            report.add(EXCEPTION, "onnx_checker", message.splitlines()[0] if message else type(exc).__name__)


def _infer_node_by_node(model: Any, report: LintReport) -> None:
    import onnx
    from onnx import defs, helper, shape_inference

    from polykit.tools.model.onnx_edits import toposorted

    graph = model.graph
    opsets = {o.domain or "": o.version for o in model.opset_import}
    known = {vi.name: vi.type for vi in (*graph.input, *graph.value_info)}
    for t in graph.initializer:
        known[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    functions = {(f.domain, f.name) for f in model.functions}
    broken: set[str] = set()
    for node in toposorted(graph):
        if any(i in broken for i in node.input if i):
            broken.update(node.output)
            continue
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if (node.domain, node.op_type) in functions or not defs.has(node.op_type, domain):
            broken.update(o for o in node.output if o not in known)  # a custom op: its outputs' types are unknown
            continue
        try:
            schema = defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
            inputs = {i: known[i] for i in node.input if i in known}
            known.update(shape_inference.infer_node_outputs(schema, node, inputs))
            report.passing.append(node.name)
        except (onnx.shape_inference.InferenceError, onnx.defs.SchemaError, RuntimeError, ValueError) as exc:
            report.failing.append(node.name)
            report.add(EXCEPTION, "onnx_shape_inference", _message(exc), node.name)
            broken.update(node.output)


def _message(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split("] ", 1)[1] if text.startswith("[") and "] " in text else text


def _unused(graph: Any, report: LintReport) -> None:
    """Graph inputs and nodes no graph output depends on; initializers nothing reads."""
    producers = {o: n for n in graph.node for o in n.output if o}
    needed, live, stack = set(), set(), [o.name for o in graph.output]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producers.get(name)
        if node is not None and id(node) not in live:
            live.add(id(node))
            stack += [i for i in node.input if i]
            stack += [n for a in node.attribute if a.type == a.GRAPH for n in _outer_reads(a.g)]
    initializers = {t.name for t in graph.initializer}
    for i in sorted(i.name for i in graph.input if i.name not in needed and i.name not in initializers):
        report.add(WARNING, "onnx_graphsurgeon", f"Input: '{i}' does not affect outputs, can be removed.")
    for node in sorted((n for n in graph.node if id(n) not in live), key=lambda n: n.name):
        report.add(WARNING, "onnx_graphsurgeon", "Does not affect outputs, can be removed.", node.name)
    read = {i for n in graph.node for i in n.input} | {n for node in graph.node for a in node.attribute
                                                        if a.type == a.GRAPH for n in _outer_reads(a.g)}
    for name in sorted(initializers - read - {o.name for o in graph.output}):
        report.add(WARNING, "polykit", f"Initializer: '{name}' is read by no node, can be removed.")


def _outer_reads(body: Any) -> set[str]:
    """Names a subgraph reads from outside itself."""
    own = {i.name for i in body.input} | {t.name for t in body.initializer} | {o for n in body.node for o in n.output}
    reads = {i for n in body.node for i in n.input if i} | {o.name for o in body.output}
    for node in body.node:
        for a in node.attribute:
            if a.type == a.GRAPH:
                reads |= _outer_reads(a.g)
    return reads - own


def _unsupported(model: Any, report: LintReport) -> None:
    """A warning per op (domain, type) that polykit's engine has no implementation of."""
    from polykit.compiler.ops.registry import find_importer, is_supported, load_ops

    load_ops()
    opsets = {o.domain or "": o.version for o in model.opset_import}
    functions = {(f.domain, f.name) for f in model.functions}
    missing: dict[tuple[str, str], list[str]] = {}
    for node in model.graph.node:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if (node.domain, node.op_type) in functions:
            continue
        if find_importer(domain, node.op_type, opsets.get(domain, 1)) is None and not is_supported(domain, node.op_type):
            missing.setdefault((domain, node.op_type), []).append(node.name)
    for (domain, op), nodes in missing.items():
        for name in nodes:
            report.add(WARNING, "polykit", f"Op: {(domain + '::') if domain else ''}{op} | polykit's engine has no "
                                           "implementation of this op (onnxruntime may run it)", name)
