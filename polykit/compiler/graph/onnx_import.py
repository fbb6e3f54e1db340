"""ONNX -> Graph: read the protobuf (external data included), check structure, canonicalize
every node to one opset form through the importer table, then infer shapes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import Graph, Node, Value, has_subgraphs
from polykit.compiler.ops.registry import (CANONICAL_OPSET, GraphImporter, ImportContext, find_importer, is_supported,
                                          load_ops)
from polykit import limits
from polykit.errors import GraphError, ModelLoadError, NodeAttributeError, PolykitError, UnsupportedModelError
from polykit.files import require_file


def read_model(source: "str | os.PathLike | Any") -> Any:
    """Read an onnx.ModelProto from a path (external data resolved) or pass one through."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, onnx.ModelProto):
        check_model(source, f"model {source.graph.name!r}")
        return source
    path = require_file(source, "model file", ModelLoadError)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"cannot parse the ONNX protobuf: {exc}",
            where=str(path),
            hint="the file is not an ONNX model or is corrupt; re-export it",
        ) from exc
    check_model(model, str(path))
    _load_external_data(model, path.parent, str(path))
    return model


def check_model(model: Any, where: str) -> None:
    """ModelLoadError with onnx.checker's message when it rejects the model's frame (IR version,
    opset imports, the graph itself), or when the graph has no outputs.

    The graph's contents are the importer's to check: it names the node for dangling or
    duplicate names, bad attributes and tensor data, and it accepts what onnx.checker
    refuses but polykit handles (nodes out of topological order, untyped value infos)."""
    import onnx

    frame = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import)
    frame.graph.name = model.graph.name
    try:
        onnx.checker.check_model(frame)
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(f"the model is not valid ONNX: {str(exc).strip()}", where=where,
                             hint="onnx.checker rejects it; fix the model or re-export it") from None
    if not model.graph.output:
        raise ModelLoadError("the model's graph has no outputs", where=where,
                             hint="an engine of it would compute nothing; mark the tensors you need as graph outputs")
    bad = next(_undecodable_text(model, "model"), None)
    if bad is not None:
        raise ModelLoadError(f"{bad} is not valid UTF-8 text", where=where, hint="the file is corrupt; re-export it")
    _check_opsets(model, where)
    _check_body_depth(model.graph, where)
    for t in model.graph.initializer:
        _check_dims(t.dims, f"initializer {t.name!r}", where)


def _check_opsets(model: Any, where: str) -> None:
    """ModelLoadError for a default-domain opset newer than the ONNX specification polykit reads
    models against (onnx.defs): its ops' semantics are unknown, so no answer could be trusted."""
    import onnx

    latest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > latest:
            raise ModelLoadError(f"the model imports ONNX opset {o.version}; polykit implements opsets up to {latest}",
                                 where=where, hint=f"export the model with opset {latest} or lower")


def _check_body_depth(graph: Any, where: str) -> None:
    """ModelLoadError when control-flow bodies (If/Loop/Scan graphs) nest deeper than the
    body_depth limit: importing, inferring and building them recurses once per level."""
    import onnx

    limit = limits.current().body_depth
    stack = [(graph, 0)]
    while stack:
        g, depth = stack.pop()
        if depth > limit:
            raise ModelLoadError(f"control-flow bodies nest more than {limit} deep (graph {g.name!r})", where=where,
                                 hint=limits.raise_hint("body_depth"))
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append((attr.g, depth + 1))
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend((b, depth + 1) for b in attr.graphs)


def _undecodable_text(message: Any, path: str) -> Any:
    """Paths of string fields protobuf left as bytes (ONNX's proto2 strings with invalid UTF-8)."""
    for field, value in message.ListFields():
        if field.type == field.TYPE_STRING:
            items = value if field.is_repeated else [value]
            if any(isinstance(v, bytes) for v in items):
                yield f"{path}.{field.name}"
        elif field.type == field.TYPE_MESSAGE and field.is_repeated:
            for i, child in enumerate(value):
                yield from _undecodable_text(child, f"{path}.{field.name}[{i}]")
        elif field.type == field.TYPE_MESSAGE:
            yield from _undecodable_text(value, f"{path}.{field.name}")


def _load_external_data(model: Any, base_dir: Path, where: str) -> None:
    """Read each tensor's external data after checking its location (inside the model's folder,
    no NUL), offset and length (ASCII digits, inside the file) and the total against the
    host_memory limit, before reading a byte."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    total = 0
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if "\0" in location:
            raise ModelLoadError(f"external data location {location!r} of tensor {tensor.name!r} holds a NUL byte",
                                 where=where, hint="the file is corrupt or crafted; re-export the model")
        file = base_dir / location
        try:
            inside = file.resolve().is_relative_to(base_dir.resolve())
            size = file.stat().st_size if inside and location and file.is_file() else None
        except OSError as exc:  # a name too long for the file system, a loop of links
            raise ModelLoadError(f"external data location {location[:80]!r} of tensor {tensor.name!r} cannot be "
                                 f"opened: {exc.strerror or exc}", where=where,
                                 hint="keep the .data file next to the .onnx file it was saved with") from None
        if location and not inside:
            raise ModelLoadError(f"external data location {location!r} of tensor {tensor.name!r} lies outside the "
                                 "model's folder", where=str(base_dir),
                                 hint="external data files must sit in the model's folder (or below it)")
        if not location or size is None:
            raise ModelLoadError(
                f"external data file {location!r} for tensor {tensor.name!r} is missing",
                where=str(file),
                hint="keep the .data file next to the .onnx file it was saved with",
            )
        offset = _external_int(info, "offset", 0, tensor.name, file)
        length = _external_int(info, "length", None, tensor.name, file)
        if offset > size or (length is not None and offset + length > size):
            end = "the end" if length is None else f"{offset + length}"
            raise ModelLoadError(f"external data of tensor {tensor.name!r} (bytes {offset}..{end}) lies outside the "
                                 f"{size}-byte file", where=str(file), hint="re-save the model with its external data")
        length = size - offset if length is None else length
        total += length
        limits.check("host_memory", total, "the model's external data", ModelLoadError, where)
        with open(file, "rb") as fh:
            fh.seek(offset)
            raw = fh.read(length)
        if len(raw) != length:
            raise ModelLoadError(
                f"external data for tensor {tensor.name!r} is truncated ({len(raw)} of {length} bytes)",
                where=str(file),
                hint="re-save the model with its external data",
            )
        tensor.raw_data = raw
        del tensor.external_data[:]
        tensor.data_location = 0  # DEFAULT


def _external_int(info: dict[str, str], key: str, default: int | None, tensor: str, file: Path) -> int | None:
    if key not in info:
        return default
    text = info[key]
    if not (text.isascii() and text.isdigit()) or len(text) > 4000:  # (an int of more digits is a ValueError)
        raise ModelLoadError(f"external data {key} {text[:40]!r} of tensor {tensor!r} is not a non-negative integer "
                             "(ASCII digits)", where=str(file), hint="re-save the model with its external data")
    return int(text)


def _attr_value(attr: Any, where: str) -> Any:
    import onnx

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
        return attr.g  # subgraph kept as protobuf (If/Loop/Scan importers turn it into a Graph)
    if t == A.TYPE_PROTO:
        return attr.tp  # a type (Optional's); kept as protobuf, exported unchanged
    if t == A.TENSORS:
        return [_tensor_to_array(x, where) for x in attr.tensors]
    if t == A.SPARSE_TENSOR:
        return _sparse_to_dense(attr.sparse_tensor, where)
    raise NodeAttributeError(f"attribute {attr.name!r} has an unsupported type {t}", where=where)


def _tensor_to_array(tensor: Any, where: str) -> np.ndarray:
    from onnx import numpy_helper

    dtypes.to_numpy(tensor.data_type, where=f"{where}: tensor {tensor.name!r}")
    _check_dims(tensor.dims, f"tensor {tensor.name!r}", where)
    try:
        arr = numpy_helper.to_array(tensor)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot decode tensor {tensor.name!r}: {exc}", where=where, hint="the tensor's data does not match its dims/type"
        ) from exc
    return np.array(arr)  # own, writable copy


def _sparse_to_dense(sparse: Any, where: str) -> np.ndarray:
    """The dense array of a SparseTensorProto; ModelLoadError when its parts do not fit together."""
    values = _tensor_to_array(sparse.values, where)
    indices = _tensor_to_array(sparse.indices, where)
    _check_dims(sparse.dims, f"sparse tensor {sparse.values.name!r}", where)
    limits.check("host_memory", int(np.prod(list(sparse.dims), dtype=object)) * values.dtype.itemsize,
                 f"the dense form of sparse tensor {sparse.values.name!r}", ModelLoadError, where)
    try:
        dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
        if indices.ndim == 1:
            dense.reshape(-1)[indices] = values
        else:
            dense[tuple(indices.T)] = values
    except (ValueError, IndexError, TypeError, MemoryError) as exc:
        raise ModelLoadError(f"sparse tensor {sparse.values.name!r} does not decode: {exc}", where=where,
                             hint="its dims, indices and values must agree") from None
    return dense


def _check_dims(dims: Sequence[int], what: str, where: str) -> None:
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{what} has dims {list(dims)}: a dim is negative", where=where,
                             hint="the model is corrupt; re-export it")


def _value_from_proto(vi: Any) -> Value:
    """A ValueInfoProto's metadata: a tensor, or a sequence/optional of one (Value.wrap)."""
    from polykit.compiler.ir.sequences import value_of_type

    return value_of_type(vi.name, vi.type)


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
    model = _inline_local_functions(model, where)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    if not opsets:
        opsets[""] = 1
    original = opsets.get("", CANONICAL_OPSET)
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
    graph = graph_from_proto(model.graph, opsets, original, where)
    graph.metadata = metadata
    canonicalize(graph, original)
    if any(has_subgraphs(n) for n in graph.nodes):  # bodies' outer reads became node inputs
        graph.validate()
        graph.toposort()
    if check_supported:
        unsupported = [
            (n.name, n.op_type, n.domain, opsets.get(n.domain, original))
            for n in graph.nodes
            if not is_supported(n.domain, n.op_type)
        ]
        if unsupported:
            raise UnsupportedModelError(unsupported, where=where)
    from polykit.compiler.graph.infer import infer_shapes

    infer_shapes(graph, strict=check_supported)
    return graph


def _inline_local_functions(model: Any, where: str) -> Any:
    """The model with its local functions (ModelProto.functions, what exporters emit for
    modules kept whole) expanded in place by onnx's inliner, so each call runs as the ops of its
    body; the model itself when it defines none."""
    if not model.functions:
        return model
    from onnx import inliner

    try:
        return inliner.inline_local_functions(model)
    except Exception as exc:  # a malformed or recursive function body: onnx's inliner refuses it
        raise GraphError(f"cannot expand the model's local functions: {exc}".splitlines()[0][:300], where=where,
                         hint="check the functions with onnx.checker.check_model(model, full_check=True)") from None


def graph_from_proto(g: Any, opsets: dict[str, int], original: int, where: str, captures: Sequence[str] = ()) -> Graph:
    """The Graph of a GraphProto (a model's graph, or an If/Loop/Scan body whose reads of the
    enclosing scope, `captures`, become extra inputs after its own), checked and sorted but
    not canonicalized."""
    initializers: dict[str, np.ndarray] = {}
    for t in g.initializer:
        initializers[t.name] = _tensor_to_array(t, where)
    for st in g.sparse_initializer:
        initializers[st.values.name] = _sparse_to_dense(st, where)

    values: dict[str, Value] = {}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.WhichOneof("value") is not None and vi.name not in initializers:  # an initializer's array is its truth
            values[vi.name] = _value_from_proto(vi)
    inputs = [vi.name for vi in g.input if vi.name not in initializers] + list(captures)
    for names, what in ((inputs, "input"), ([o.name for o in g.output], "output")):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise GraphError(f"graph {what} {twice[0]!r} is listed more than once", where=where,
                             hint=f"give every graph {what} once")

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
    graph = Graph(nodes, inputs, [o.name for o in g.output], initializers, values, opsets, g.name or "graph")
    for name in inputs:
        if name not in graph.values:
            graph.values[name] = Value(name)
    shadowed = sorted({o for n in nodes for o in n.outputs if o in initializers})
    if shadowed:  # folding would read the initializer, shape inference the node's output
        raise GraphError(f"tensor {shadowed[0]!r} is both an initializer and the output of a node", where=where,
                         hint="rename one of them: an ONNX graph defines every name once")
    graph.validate()
    graph.toposort()
    return graph


def canonicalize(graph: Graph, original_opset: int) -> None:
    """Run each node's importer so the graph follows one opset form (>= CANONICAL_OPSET)."""
    ctx = ImportContext(graph, original_opset, _subgraph_importer(graph.opsets, original_opset))
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


def _subgraph_importer(opsets: dict[str, int], original_opset: int) -> GraphImporter:
    """ImportContext.import_graph of a graph of `opsets` imported from `original_opset`."""
    def import_graph(proto: Any, where: str, captures: Sequence[str] = ()) -> Graph:
        body = graph_from_proto(proto, opsets, original_opset, where, captures=captures)
        canonicalize(body, original_opset)
        return body

    return import_graph
