"""`polykit inspect model MODEL --format text`: an ONNX model as Polygraphy's `inspect model` prints
it (polygraphy/backend/onnx/util.py, str_from_onnx_graph), so scripts that grep its lines
(`[Op: Mul]`, `---- 3 Node(s) ----`) keep working:

    ==== ONNX Model ====
        Name: test_identity | ONNX Opset: 8

        ---- 1 Graph Input(s) ----
        {x [dtype=float32, shape=(1, 1, 2, 2)]}
        ...
        ---- 1 Node(s) ----
        Node 0    |  [Op: Identity]
            {x [dtype=float32, shape=(1, 1, 2, 2)]}
             -> {y [dtype=float32, shape=(1, 1, 2, 2)]}

It renders inspect's description (describe_onnx), shapes from polykit's shape inference.
"""

from __future__ import annotations

from typing import Any, Iterable

INDENT = "    "
#: ONNX type names inspect's I/O rows use -> numpy's, which Polygraphy prints
_NUMPY_NAMES = {"float": "float32", "double": "float64", "float16": "float16", "bfloat16": "bfloat16"}


def _shape(shape: Any) -> str:
    if shape is None:
        return "None"
    dims = [repr(d) if isinstance(d, str) else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _meta(tensors: Iterable[dict[str, Any] | None]) -> str:
    """Polygraphy's TensorMetadata text: {name [dtype=..., shape=(...)], ...}."""
    items = [f"{t['name']} [dtype={_NUMPY_NAMES.get(t.get('dtype'), t.get('dtype')) or None}, "
             f"shape={_shape(t.get('shape'))}]" for t in tensors if t]
    return "{" + ", ".join(items) + "}"


def _node_tensor(t: dict[str, Any] | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {**t, "name": f"Initializer | {t['name']}" if t.get("kind") == "weight" else t["name"]}


def render_text(info: dict[str, Any]) -> str:
    """The text of `info` (describe_onnx's dict; with "layers" in it, every node)."""
    opset = info["opsets"].get("ai.onnx", next(iter(info["opsets"].values()), "?"))
    lines = ["==== ONNX Model ====", f"{INDENT}Name: {info['name']} | ONNX Opset: {opset}", ""]
    body = [f"---- {len(info['inputs'])} Graph Input(s) ----", _meta(info["inputs"]), "",
            f"---- {len(info['outputs'])} Graph Output(s) ----", _meta(info["outputs"]), "",
            f"---- {info['initializers']} Initializer(s) ----"]
    layers = info.get("layers")
    if info.get("weights") is not None:
        body += [_meta(info["weights"]), ""]
    elif layers is not None:
        body += ["{}" if not info["initializers"] else _meta(
            {t["name"]: t for layer in layers for t in layer["inputs"] if t and t.get("kind") == "weight"}.values()), ""]
    else:
        body.append("")
    body.append(f"---- {info['nodes']} Node(s) ----")
    if layers is None and info.get("ops"):  # polykit's default `ops` section, one line (Polygraphy has none)
        body += ["Ops: " + ", ".join(f"{op} x{count}" for op, count in info["ops"].items()), ""]
    for index, layer in enumerate(layers or ()):
        body.append(f"Node {index:<4} | {layer['name']} [Op: {layer['op']}]")
        body.append(INDENT + _meta(_node_tensor(t) for t in layer["inputs"]))
        body.append(INDENT + " -> " + _meta(_node_tensor(t) for t in layer["outputs"]))
        if layer.get("attrs"):
            body.append(INDENT + "---- Attributes ----")
            body += [f"{INDENT}{name} = {value}" for name, value in layer["attrs"].items()]
        body.append("")
    return "\n".join(lines[:2] + [""] + [INDENT + line if line else "" for line in body]).rstrip() + "\n"
