"""ONNX-level model edits Polygraphy offers on `surgeon sanitize`, `inspect model` and `convert`:

    override_input_shapes(model, {"x": ("batch", 1, 2, 2)})     # --override-input-shapes
    unbounded_dds(model)                                         # --list-unbounded-dds
    set_upper_bounds(model, {"": 1000})                          # --set-unbounded-dds-upper-bound
    to_fp16(model)                                               # convert --fp-to-fp16

Unbounded data-dependent shapes follow Polygraphy's rule (polygraphy/backend/onnx/util.py,
get_unbounded_dds_tensors): a Range limit, Pad pads, Resize sizes, Tile repeats or Expand
shape that is computed at run time (not a weight, not a Min's result) makes the node's
output size unbounded when onnx's shape inference cannot give the output's dims from the
model's input dims. An upper bound is a Min node between that tensor and its readers.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from polykit.errors import UsageError

#: op -> the input slot whose run-time value sizes the output (Polygraphy's dispatcher table)
SIZE_INPUTS = {"Range": 1, "Pad": 1, "Resize": 3, "Tile": 1, "Expand": 1}


def override_input_shapes(model: Any, shapes: Mapping[str, Sequence[Any]]) -> Any:
    """Set the named graph inputs' dims (int or a str dim_param) in place; the value infos and
    graph output shapes (which followed the old input shapes) are inferred again by onnx (an
    output shape it cannot infer is left unknown); returns `model`."""
    import onnx

    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    for name, dims in shapes.items():
        if name not in inputs:
            raise UsageError(f"--override-input-shapes names {name!r}, which is not a graph input",
                             where=f"model {graph.name!r}", hint=f"graph inputs are: {', '.join(inputs)}")
        shape = inputs[name].type.tensor_type.shape
        shape.ClearField("dim")
        for d in dims:
            dim = shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = int(d)
    graph.ClearField("value_info")
    for out in graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        inferred = {o.name: o for o in onnx.shape_inference.infer_shapes(model, strict_mode=False).graph.output}
    except Exception:  # onnx's inference errors: the outputs stay of unknown shape
        inferred = {}
    for out in graph.output:
        if out.name in inferred and inferred[out.name].type.tensor_type.HasField("shape"):
            out.type.tensor_type.shape.CopyFrom(inferred[out.name].type.tensor_type.shape)
    return model


def unbounded_dds(model: Any) -> list[dict[str, str]]:
    """[{"tensor", "node", "op"}]: the run-time tensors that size an output without a bound, in
    graph order (the tensors --set-unbounded-dds-upper-bound bounds)."""
    import onnx

    graph = model.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # onnx's inference errors: then no output's dims are known, as in Polygraphy
        inferred = graph
    dims = {vi.name: vi for vi in (*inferred.value_info, *inferred.output, *inferred.input)}
    input_symbols = {d.dim_param for i in graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producers = {o: n for n in graph.node for o in n.output if o}
    found: list[dict[str, str]] = []
    for node in graph.node:
        slot = SIZE_INPUTS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if slot is None or slot >= len(node.input) or not node.input[slot]:
            continue
        tensor = node.input[slot]
        producer = producers.get(tensor)
        if tensor in constants or producer is None or producer.op_type == "Min":
            continue
        if all(_bounded(dims.get(out), input_symbols) for out in node.output if out):
            continue
        if tensor not in {f["tensor"] for f in found}:
            found.append({"tensor": tensor, "node": node.name, "op": node.op_type})
    return found


def _bounded(value_info: Any, input_symbols: set[str]) -> bool:
    """Whether every dim of an inferred tensor is a number or a symbol of the graph inputs."""
    if value_info is None or not value_info.type.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") or d.dim_param in input_symbols for d in value_info.type.tensor_type.shape.dim)


def parse_upper_bounds(values: Sequence[str]) -> dict[str, int]:
    """['1000', 'cast_out_6:500'] -> {'': 1000, 'cast_out_6': 500}."""
    bounds: dict[str, int] = {}
    for value in values:
        name, _, number = value.rpartition(":")
        try:
            bound = int(number)
        except ValueError:
            raise UsageError(f"--set-unbounded-dds-upper-bound {value!r} is not [NAME:]INTEGER",
                             hint="e.g. --set-unbounded-dds-upper-bound 1000 or cast_out_6:1000") from None
        bounds[name] = bound
    return bounds


def set_upper_bounds(model: Any, bounds: Mapping[str, int]) -> dict[str, int]:
    """Insert `Min(tensor, bound)` after each unbounded tensor (`bounds[""]` for those not
    named) and after every tensor named in `bounds`; returns {tensor: bound} applied."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output if o}
    targets = [f["tensor"] for f in unbounded_dds(model)]
    for name in bounds:
        if name and name not in producers:
            raise UsageError(f"--set-unbounded-dds-upper-bound names {name!r}, which no node produces",
                             where=f"model {graph.name!r}", hint="list them with `polykit inspect model MODEL "
                                                                 "--list-unbounded-dds`")
        if name and name not in targets:
            targets.append(name)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
        types = {vi.name: vi.type.tensor_type for vi in (*inferred.value_info, *inferred.output)}
    except Exception:  # as unbounded_dds: unknown types are int64, the type these inputs take
        types = {}
    applied: dict[str, int] = {}
    for tensor in targets:
        bound = bounds.get(tensor, bounds.get(""))
        if bound is None:
            continue
        t = types.get(tensor)
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type) if t is not None and t.elem_type else np.int64
        rank = len(t.shape.dim) if t is not None and t.HasField("shape") else 0
        producer = producers[tensor]
        copy = f"{tensor}_copy"
        producer.output[list(producer.output).index(tensor)] = copy
        const = numpy_helper.from_array(np.full((rank,) if rank else (), bound, dtype), f"{tensor}_upper_bound")
        graph.initializer.append(const)
        graph.node.append(helper.make_node("Min", [copy, const.name], [tensor], name=f"{tensor}_min"))
        applied[tensor] = bound
    _toposort(graph)
    return applied


def toposorted(graph: Any) -> list[Any]:
    """graph.node in an order where each node follows the producers of what it reads (a node
    reading a name nothing makes comes where it stood)."""
    made = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    order, pending = [], list(graph.node)
    while pending:
        ready = [n for n in pending if all(x in made for x in n.input)] or pending[:1]
        for n in ready:
            order.append(n)
            made.update(n.output)
        pending = [n for n in pending if all(n is not r for r in ready)]
    return order


def _toposort(graph: Any) -> None:
    order = toposorted(graph)
    graph.ClearField("node")
    graph.node.extend(order)


def to_fp16(model: Any) -> Any:
    """An ONNX model computing in float16 (Polygraphy's --fp-to-fp16, which keeps I/O types):
    polykit's precision pass (float32 weights and activations -> float16, the inputs and outputs
    float32 with Casts) on the imported graph, exported back to ONNX."""
    from polykit.backends.loaders import GraphFromOnnx
    from polykit.compiler.graph.onnx_export import to_onnx
    from polykit.compiler.passes import convert_to_fp16, run_passes

    graph = GraphFromOnnx(model, check_supported=False)().copy()
    run_passes(graph, [lambda g: convert_to_fp16(g)])
    return to_onnx(graph)
