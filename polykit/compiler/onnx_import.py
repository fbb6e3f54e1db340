"""ONNX -> Graph: read the protobuf (external data included), check structure, canonicalize
every node to one opset form through the importer table, then infer shapes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from polykit.compiler import dtypes
from polykit.compiler.ir import Graph, Node, Value
from polykit.compiler.registry import CANONICAL_OPSET, ImportContext, find_importer, is_supported, load_ops
from polykit.errors import ModelLoadError, NodeAttributeError, PolykitError, UnsupportedModelError


def read_model(source: "str | os.PathLike | Any") -> Any:
    """Read an onnx.ModelProto from a path (external data resolved) or pass one through."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, onnx.ModelProto):
        return source
    path = Path(source)
    if not path.is_file():
        raise ModelLoadError(f"model file {str(path)!r} does not exist", hint="check the path")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"cannot parse the ONNX protobuf: {exc}",
            where=str(path),
            hint="the file is not an ONNX model or is corrupt; re-export it",
        ) from exc
    _load_external_data(model, path.parent)
    return model


def _load_external_data(model: Any, base_dir: Path) -> None:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        file = base_dir / location
        if not location or not file.is_file():
            raise ModelLoadError(
                f"external data file {location!r} for tensor {tensor.name!r} is missing",
                where=str(file),
                hint="keep the .data file next to the .onnx file it was saved with",
            )
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
        with open(file, "rb") as fh:
            fh.seek(offset)
            raw = fh.read() if length is None else fh.read(length)
        if length is not None and len(raw) != length:
            raise ModelLoadError(
                f"external data for tensor {tensor.name!r} is truncated ({len(raw)} of {length} bytes)",
                where=str(file),
                hint="re-save the model with its external data",
            )
        tensor.raw_data = raw
        del tensor.external_data[:]
        tensor.data_location = 0  # DEFAULT


def _attr_value(attr: Any, where: str) -> Any:
    import onnx
    from onnx import numpy_helper

    t = attr.type
    A = onnx.AttributeProto
    if t == A.FLOAT:
        return float(attr.f)
    if t == A.INT:
        return int(attr.i)
    if t == A.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if t == A.TENSOR:
        return _tensor_to_array(attr.t, where)
    if t == A.FLOATS:
        return [float(x) for x in attr.floats]
    if t == A.INTS:
        return [int(x) for x in attr.ints]
    if t == A.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attr.strings]
    if t == A.GRAPH:
        return attr.g  # subgraph kept as protobuf; exported unchanged
    if t == A.TENSORS:
        return [numpy_helper.to_array(x) for x in attr.tensors]
    if t == A.SPARSE_TENSOR:
        from onnx import numpy_helper as nh

        dense = nh.to_array(attr.sparse_tensor.values)
        shape = tuple(attr.sparse_tensor.dims)
        out = np.zeros(shape, dtype=dense.dtype)
        idx = nh.to_array(attr.sparse_tensor.indices)
        if idx.ndim == 1:
            out.reshape(-1)[idx] = dense
        else:
            out[tuple(idx.T)] = dense
        return out
    raise NodeAttributeError(f"attribute {attr.name!r} has an unsupported type {t}", where=where)


def _tensor_to_array(tensor: Any, where: str) -> np.ndarray:
    from onnx import numpy_helper

    dtypes.to_numpy(tensor.data_type, where=f"{where}: tensor {tensor.name!r}")
    try:
        arr = numpy_helper.to_array(tensor)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot decode tensor {tensor.name!r}: {exc}", where=where, hint="the tensor's data does not match its dims/type"
        ) from exc
    return np.array(arr)  # own, writable copy


def _value_from_proto(vi: Any) -> Value:
    tt = vi.type.tensor_type
    dt = dtypes.ONNX_TO_NUMPY.get(tt.elem_type) if tt.elem_type else None
    shape = None
    if tt.HasField("shape"):
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return Value(vi.name, dt, shape)


def _check_attr_types(node_proto: Any, opset: int, where: str) -> None:
    """Attributes whose type differs from the op schema's -> NodeAttributeError."""
    import onnx

    try:
        schema = onnx.defs.get_schema(node_proto.op_type, opset, node_proto.domain)
    except Exception:
        return
    for attr in node_proto.attribute:
        spec = schema.attributes.get(attr.name)
        if spec is None:
            continue
        if attr.type != spec.type and attr.type != onnx.AttributeProto.UNDEFINED:
            raise NodeAttributeError(
                f"attribute {attr.name!r} has type {onnx.AttributeProto.AttributeType.Name(attr.type)}, "
                f"the op schema wants {onnx.AttributeProto.AttributeType.Name(spec.type)}",
                where=where,
                hint="fix the attribute's type in the model",
            )


def load_onnx(source: "str | os.PathLike | Any", *, check_supported: bool = True) -> Graph:
    """Import an ONNX model (path or ModelProto) into a canonical, shape-inferred Graph.

    Raises ModelLoadError for unreadable files, GraphError for structural problems, and
    UnsupportedModelError listing every node whose op polykit does not implement.
    """
    load_ops()
    model = read_model(source)
    where = str(source) if not hasattr(source, "graph") else f"model {model.graph.name!r}"
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    if not opsets:
        opsets[""] = 1
    original = opsets.get("", CANONICAL_OPSET)
    g = model.graph

    initializers: dict[str, np.ndarray] = {}
    for t in g.initializer:
        initializers[t.name] = _tensor_to_array(t, where)
    for st in g.sparse_initializer:
        from onnx import numpy_helper

        vals = numpy_helper.to_array(st.values)
        idx = numpy_helper.to_array(st.indices)
        dense = np.zeros(tuple(st.dims), dtype=vals.dtype)
        if idx.ndim == 1:
            dense.reshape(-1)[idx] = vals
        else:
            dense[tuple(idx.T)] = vals
        initializers[st.values.name] = dense

    values: dict[str, Value] = {}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type"):
            values[vi.name] = _value_from_proto(vi)
    inputs = [vi.name for vi in g.input if vi.name not in initializers]

    nodes: list[Node] = []
    used_names: set[str] = set()
    for idx, np_ in enumerate(g.node):
        name = np_.name or f"{np_.op_type}_{idx}"
        while name in used_names:
            name = f"{name}_{idx}"
        used_names.add(name)
        node_where = f"{where}: node {name!r} ({np_.op_type})"
        _check_attr_types(np_, opsets.get(np_.domain if np_.domain != "ai.onnx" else "", original), node_where)
        attrs = {a.name: _attr_value(a, node_where) for a in np_.attribute}
        nodes.append(
            Node(np_.op_type, list(np_.input), list(np_.output), attrs, name, "" if np_.domain == "ai.onnx" else np_.domain)
        )

    metadata = {
        "ir_version": int(model.ir_version),
        "producer_name": model.producer_name,
        "producer_version": model.producer_version,
        "domain": model.domain,
        "model_version": int(model.model_version),
        "doc_string": model.doc_string,
        "metadata_props": {p.key: p.value for p in model.metadata_props},
        "original_opset": original,
    }
    graph = Graph(nodes, inputs, [o.name for o in g.output], initializers, values, opsets, g.name or "graph", metadata)
    for name in inputs:
        if name not in graph.values:
            graph.values[name] = Value(name)
    graph.validate()
    graph.toposort()

    canonicalize(graph, original)
    if check_supported:
        unsupported = [
            (n.name, n.op_type, n.domain, opsets.get(n.domain, original))
            for n in graph.nodes
            if not is_supported(n.domain, n.op_type)
        ]
        if unsupported:
            raise UnsupportedModelError(unsupported, where=where)
    from polykit.compiler.infer import infer_shapes

    infer_shapes(graph, strict=check_supported)
    return graph


def canonicalize(graph: Graph, original_opset: int) -> None:
    """Run each node's importer so the graph follows one opset form (>= CANONICAL_OPSET)."""
    ctx = ImportContext(graph, original_opset)
    out: list[Node] = []
    for node in graph.nodes:
        fn = find_importer(node.domain, node.op_type, original_opset if node.domain == "" else graph.opsets.get(node.domain, 1))
        if fn is None:
            out.append(node)
            continue
        try:
            replaced = fn(node, ctx)
        except PolykitError:
            raise
        except Exception as exc:
            raise NodeAttributeError(
                f"cannot import the node: {type(exc).__name__}: {exc}",
                where=node.describe(),
                hint="check the node's attributes and inputs against the ONNX spec for its opset",
            ) from exc
        out.extend([node] if replaced is None else replaced)
    graph.nodes = out
    graph.opsets[""] = max(original_opset, CANONICAL_OPSET)
