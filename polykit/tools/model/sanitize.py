"""`polykit surgeon sanitize`: fold constants with polykit's compiler, keep the model's own form.

    clean = sanitize("model.onnx", fold_constants=True)            # same opset, same IR version
    clean = sanitize("model.onnx", upgrade_opset=21)

polykit imports a model into its canonical opset form (polykit.compiler.graph.onnx_import), where
nodes of older opsets are rewritten. The sanitized model is not that form: it keeps every
node of the original model whose outputs the compiler's folding and dead-code passes left
to a node (as the original wrote it, so its opset and IR version stay valid), drops the
others, and holds the initializers the kept nodes read (the original tensors, and the
folded ones). `upgrade_opset` then converts it with onnx.version_converter (upward: the
converter's well-trodden direction) and raises the IR version as far as that opset needs.
"""

from __future__ import annotations

from typing import Any

from polykit.errors import UsageError


def sanitize(model: Any, *, fold_constants: bool = False, upgrade_opset: int | None = None) -> Any:
    """The sanitized onnx.ModelProto of `model` (a path or ModelProto; module docstring)."""
    import onnx
    from onnx import numpy_helper

    from polykit.backends.loaders import GraphFromOnnx, _model_proto, fold_graph_constants
    from polykit.compiler.ir.subgraphs import outer_names

    original = _model_proto(model)
    graph = GraphFromOnnx(original, check_supported=False)().copy()
    opset = int(graph.metadata.get("original_opset", graph.opset))
    if upgrade_opset is not None and upgrade_opset < opset:
        raise UsageError(f"--upgrade-opset {upgrade_opset} is below the model's opset {opset}",
                         where=f"model {original.graph.name!r}",
                         hint=f"give an opset of at least {opset}, or leave the option out")
    if fold_constants:
        fold_graph_constants(graph)
    produced = {out for node in graph.nodes for out in node.outputs if out}
    g = original.graph
    nodes = [n for n in g.node if any(out in produced for out in n.output if out)]
    read = {t for n in nodes for t in (*n.input, *outer_names(n))} | {o.name for o in g.output}
    dense = {t.name: t for t in g.initializer}
    sparse = {t.values.name: t for t in g.sparse_initializer}
    initializers = [dense[name] if name in dense else numpy_helper.from_array(graph.initializers[name], name)
                    for name in graph.initializers if name in read and name not in sparse]
    kept = {t.name for t in initializers} | {name for name in sparse if name in read}
    inputs = [i for i in g.input if i.name not in dense and i.name not in sparse or i.name in kept]
    written = {out for n in nodes for out in n.output}
    clean = onnx.ModelProto()
    clean.CopyFrom(original)
    clean.graph.ClearField("node")
    clean.graph.node.extend(nodes)
    for field, items in (("initializer", initializers), ("input", inputs),
                         ("sparse_initializer", [t for name, t in sparse.items() if name in read]),
                         ("value_info", [vi for vi in g.value_info if vi.name in written])):
        clean.graph.ClearField(field)
        getattr(clean.graph, field).extend(items)
    if upgrade_opset is not None and upgrade_opset != opset:
        clean = _convert(clean, opset, upgrade_opset)
    return clean


def _convert(model: Any, opset: int, to: int) -> Any:
    from onnx import version_converter

    from polykit.compiler.graph.onnx_export import min_ir_version

    ir_version = model.ir_version
    try:
        converted = version_converter.convert_version(model, to)
    except Exception as exc:  # onnx raises RuntimeError/ValidationError/... for ops it has no adapter for
        raise UsageError(f"onnx's version converter cannot bring the model from opset {opset} to {to}: {exc}",
                         where=f"model {model.graph.name!r}", hint="leave --upgrade-opset out to keep the model's "
                                                                   "opset") from None
    converted.ir_version = max(ir_version, min_ir_version(to))
    return converted
