"""Graph -> ONNX: the inverse of onnx_import, for surgeon tools and round-trip checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import Graph, Node, Value, subgraphs
from polykit.compiler.ir.subgraphs import CAPTURES, captured, onnx_inputs
from polykit.errors import PolykitError


def _make_attr(key: str, value: Any) -> Any:
    import onnx
    from onnx import helper, numpy_helper

    if isinstance(value, onnx.GraphProto):
        return helper.make_attribute(key, value)
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if isinstance(value, (list, tuple)) and len(value) == 0:
        return helper.make_attribute(key, [], attr_type=onnx.AttributeProto.INTS)
    if isinstance(value, (list, tuple)) and isinstance(value[0], np.ndarray):
        return helper.make_attribute(key, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, (dict, list)) and not _is_plain_list(value):
        import json

        return helper.make_attribute(key, json.dumps(value, sort_keys=True))
    return helper.make_attribute(key, value)


def _is_plain_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, (int, float, str, bool)) for v in value)


def value_info(v: Value) -> Any:
    from onnx import helper

    if v.wrap:
        from polykit.compiler.ir.sequences import type_of_value

        return helper.make_value_info(v.name, type_of_value(v))
    elem = dtypes.to_onnx(v.dtype) if v.dtype is not None else 0
    shape = None if v.shape is None else [d if d is not None else None for d in v.shape]
    return helper.make_tensor_value_info(v.name, elem, shape)


def exported_node(n: Node) -> Any:
    """The NodeProto of `n` (bodies of control-flow nodes as GraphProtos: `export_attrs`)."""
    from onnx import helper

    from polykit.compiler.ops.models.collective import is_collective, onnx_form

    n = onnx_form(n) if is_collective(n) else n
    proto = helper.make_node(n.op_type, onnx_inputs(n), n.outputs, name=n.name or None, domain=n.domain or None)
    proto.attribute.extend(_make_attr(k, v) for k, v in sorted(export_attrs(n).items()))
    return proto


def export_attrs(node: Node) -> dict[str, Any]:
    """`node.attrs` as ONNX has them: bodies as GraphProtos reading outer names again, without
    the captures count (the caller drops the captured inputs: `onnx_inputs`)."""
    out = {k: v for k, v in node.attrs.items() if k != CAPTURES}
    for key, body in subgraphs(node):
        out[key] = body_to_proto(body, node)
    return out


def body_to_proto(body: Graph, node: Node) -> Any:
    """A body as a GraphProto: its captured inputs dropped (polykit.compiler.ir.subgraphs), reads
    of them renamed to the outer tensors the node binds them to."""
    from onnx import helper, numpy_helper

    c = captured(node)
    formal = body.inputs[: len(body.inputs) - c] if c else list(body.inputs)
    outer = dict(zip(body.inputs[len(formal):], node.inputs[len(node.inputs) - c:])) if c else {}

    def name(n: str) -> str:
        return outer.get(n, n)

    nodes = []
    for n in body.nodes:
        copy = Node(n.op_type, [name(i) for i in n.inputs], list(n.outputs), n.attrs, n.name, n.domain)
        nodes.append(exported_node(copy))
    inits = [numpy_helper.from_array(np.asarray(arr), k) for k, arr in body.initializers.items()]
    inputs = [value_info(body.value(n)) for n in formal]
    outputs = [value_info(body.value(n).with_(name=name(n))) for n in body.outputs]
    return helper.make_graph(nodes, body.name, inputs, [o for o in outputs], inits)


def to_onnx(graph: Graph, *, keep_value_info: bool = True) -> Any:
    """Build an onnx.ModelProto from `graph` (opset = the graph's canonical opsets)."""
    from onnx import helper, numpy_helper

    nodes = [exported_node(n) for n in graph.nodes]
    inits = [numpy_helper.from_array(np.asarray(arr), name) for name, arr in graph.initializers.items()]
    inputs = [value_info(graph.value(n)) for n in graph.inputs]
    outputs = [value_info(graph.value(n)) for n in graph.outputs]
    io = set(graph.inputs) | set(graph.outputs) | set(graph.initializers)
    infos = []
    if keep_value_info:
        for name, v in graph.values.items():
            if name not in io and v.dtype is not None and v.dtype != np.dtype(object):
                infos.append(value_info(v))
    g = helper.make_graph(nodes, graph.name, inputs, outputs, inits, value_info=infos)
    opsets = dict(graph.opsets)
    for domain in {exported.domain for exported in nodes} - {"", "ai.onnx"}:
        opsets.setdefault(domain, 1)
    opset_imports = [helper.make_opsetid(d, v) for d, v in sorted(opsets.items())]
    md = graph.metadata
    model = helper.make_model(
        g,
        opset_imports=opset_imports,
        producer_name=md.get("producer_name") or "polykit",
        producer_version=md.get("producer_version") or "",
    )
    model.ir_version = max(int(md.get("ir_version", 0)), min_ir_version(opsets.get("", 21)))
    if md.get("doc_string"):
        model.doc_string = md["doc_string"]
    if md.get("model_version"):
        model.model_version = md["model_version"]
    if md.get("domain"):
        model.domain = md["domain"]
    for k, v in (md.get("metadata_props") or {}).items():
        model.metadata_props.add(key=k, value=v)
    return model


def min_ir_version(opset: int) -> int:
    """The oldest IR version that supports default-domain opset `opset`."""
    from onnx import helper

    for row in helper.VERSION_TABLE:
        # rows: (release, ir_version, ai.onnx opset, ai.onnx.ml, ai.onnx.training?)
        if row[2] >= opset:
            return row[1]
    return helper.VERSION_TABLE[-1][1]


def save_onnx(graph: Graph, path: "str | os.PathLike", *, external_data: bool | None = None,
              size_threshold: int = 1024) -> Path:
    """Write `graph` as an ONNX file (see save_model)."""
    return save_model(to_onnx(graph), path, external_data=external_data, size_threshold=size_threshold)


def save_model(model: Any, path: "str | os.PathLike", *, external_data: bool | None = None,
               size_threshold: int = 1024) -> Path:
    """Write an onnx.ModelProto; with `external_data` True, tensors of `size_threshold` bytes
    or more go to `<name>.data` beside it, and that file is written even when none is that large
    (default: external data when the model would exceed protobuf's 2 GiB limit)."""
    import onnx

    path = Path(path)
    data = path.with_name(path.name + ".data")
    if external_data is None:
        external_data = sum(len(t.raw_data) for t in model.graph.initializer) > 1_800_000_000
    try:
        if external_data:
            data.unlink(missing_ok=True)  # onnx appends to an existing data file
            onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data.name, size_threshold=size_threshold)
            data.touch()
        else:
            onnx.save_model(model, str(path))
    except (OSError, ValueError) as exc:
        raise PolykitError(f"cannot write the model: {exc}", where=str(path),
                           hint="check the directory exists and is writable") from exc
    return path
