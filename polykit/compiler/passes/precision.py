"""convert_precision: run a float32 graph in half precision (BuilderConfig fp16 / bf16).

As TensorRT does with fp16 (or bf16) enabled: float32 activations and weights become
float16 (bfloat16: ml_dtypes' type; weights converted once, here, at build time; values
beyond fp16's range clamp to +-65504 so masks built from float32's lowest value stay
finite, bfloat16 has float32's range), while the engine's inputs and outputs stay float32:
a Cast follows each float input and precedes each float output (graph outputs and `keep`
tensors keep their names and their float32 type). I/O given a half dtype by
polykit.compiler.passes.io_formats loses those Casts (cancel_round_trip_casts). Those Casts are ordinary elementwise
nodes, so fuse_pointwise folds them into their neighbours.

Some inputs keep their type whatever the layer runs in (FP32_INPUTS: Resize's roi and
scales); some ops always run in float32 (FP32_OPS: Range, NMS, quantization, control flow,
ops of unknown domains); layers named in `keep_fp32` (node names, op types, or a fused
node's original names) stay float32 with Casts around them. Every other node follows its
inputs; attributes that name a float32 result (Cast `to`, EyeLike/Random* `dtype`,
ConstantOfShape / Constant values) switch to the half type, inside Pointwise bodies and
epilogues too. A node whose shape rule refuses the half type stays float32. Tensors that
were not float32 (indices, shapes, masks, float64) are untouched, and so are the float32 values a
profile build computes from the input dims (`shape_values`: a detector's resize scale), which the
host evaluates in float32 as the model does.

Data-movement ops (MOVE_OPS: Identity, Reshape, Transpose, Slice, Gather, Concat, ...) compute
nothing; a chain of them that only carries float32 activations (no weights, nothing available
in half yet) to float32 readers (graph outputs, kept tensors, float32 layers) stays float32, so
a pure copy between float32 I/O is exact, as TensorRT keeps it. Every other movement runs in
half like the rest (a Transpose feeding a half conv moves half the bytes).
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

import numpy as np

from polykit.compiler.graph.infer import infer_shapes
from polykit.compiler.graph.shape_values import is_symbolic
from polykit.compiler.ir.dtypes import EXTENDED_TYPES
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.ops.nn.channels_last import NCHW_OPS
from polykit.compiler.ops.nn.fused import EPILOGUE_ARITY, rename_fused_tensor
from polykit.compiler.ops.nn.group_norm_nhwc import CHANNEL_NORMS, GROUP_NORM_NHWC
from polykit.compiler.passes.rewrite import protected
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import PolykitError

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
#: bfloat16 (ml_dtypes; None where it is not installed: the lean runtime builds nothing)
BF16 = EXTENDED_TYPES.get(16)
#: ONNX TensorProto codes
FLOAT, FLOAT16, BFLOAT16 = 1, 10, 16
FP16_MAX = float(np.finfo(np.float16).max)
#: half dtype -> its ONNX code
HALF_CODES = {F16: FLOAT16, **({BF16: BFLOAT16} if BF16 is not None else {})}

#: default-domain ops that always run in float32 (their float inputs are cast back)
FP32_OPS = frozenset({"Range", "NonMaxSuppression", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                      "If", "Loop", "Scan"})
#: op -> input slots that keep float32 even when the layer runs in float16
FP32_INPUTS = {"Resize": (1, 2), "Upsample": (1,)}
#: op -> input slots read in whatever type they come (no Cast inserted for them)
ANY_TYPE_INPUTS = {"Cast": (0,), "CastLike": (0,), "Shape": (0,), "Size": (0,)}
#: op -> input slots read as float16 when they come so (float16 builds): QuantizeLinear's X, whose float16 value
#: divided by the float32 scale in float32 (the scale's type: quantize_reference, quantize.cu's QK_F16) is
#: exactly the float32 Cast of it quantized, so a quantized layer's input Q reads a half producer's tensor itself
#: (bfloat16 still goes through its Cast: quantize.cu reads no bfloat16)
FLOAT16_INPUTS = {"QuantizeLinear": (0,)}
#: default-domain ops that only move or copy values (their data inputs come in the type they have)
MOVE_OPS = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Gather",
                      "GatherElements", "GatherND", "Expand", "Tile", "Split", "Concat", "DepthToSpace",
                      "SpaceToDepth"})
#: ops whose `dtype` attribute names their float result
DTYPE_ATTR_OPS = frozenset({"EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                            "Bernoulli"})


def to_half(arr: np.ndarray, half: np.dtype = F16) -> np.ndarray:
    """float32 -> float16 with finite values clamped to fp16's range (inf and NaN kept);
    -> bfloat16 (float32's range) rounded to nearest even."""
    arr = np.asarray(arr)
    if half != F16:
        return arr.astype(half)
    finite = np.isfinite(arr)
    return np.where(finite, np.clip(arr, -FP16_MAX, FP16_MAX), arr).astype(F16)


def is_pinned(node: Node, keep_fp32: Iterable[str] = ()) -> bool:
    """Whether `node` stays in float32: by op, by domain, or named in `keep_fp32`."""
    names = set(keep_fp32)
    if node.domain not in ("", POLYKIT_DOMAIN):
        return True
    if node.domain == "" and node.op_type in FP32_OPS:
        return True
    if node.name in names or node.op_type in names:
        return True
    if node.domain == POLYKIT_DOMAIN:
        body = node.attrs.get("body") or (node.attrs.get("epilogue") or {}).get("body") or []
        if names & set(node.attrs.get("fused_from") or ()) or names & {step["op"] for step in body}:
            return True
        if NCHW_OPS.get(node.op_type) in names:  # "Conv" pins the convs to_channels_last made ConvNHWC
            return True
        if node.op_type == GROUP_NORM_NHWC and names & set(CHANNEL_NORMS):  # and the norms' channels-last form
            return True
    return False


def _half_attrs(op: str, attrs: dict[str, Any], upcast: bool = False, half: np.dtype = F16) -> bool:
    """Switch a plain op's float32-naming attributes to `half` in place; True if any.

    `upcast`: the op is a Cast from the half type (an explicit upcast, e.g. an output Cast), which stays."""
    code = HALF_CODES[half]
    if op == "Cast" and int(attrs.get("to", 0)) == FLOAT and not upcast:
        attrs["to"] = code
        return True
    if op in DTYPE_ATTR_OPS and int(attrs.get("dtype", 0)) == FLOAT:
        attrs["dtype"] = code
        return True
    if op == "ConstantOfShape":
        value = attrs.get("value")
        if value is None:
            attrs["value"] = np.zeros(1, half)
            return True
        if isinstance(value, np.ndarray) and value.dtype == F32:
            attrs["value"] = to_half(value, half)
            return True
    if op == "Constant" and isinstance(attrs.get("value"), np.ndarray) and attrs["value"].dtype == F32:
        attrs["value"] = to_half(attrs["value"], half)
        return True
    return False


def half_node_attrs(node: Node, upcast: bool = False, half: np.dtype = F16) -> bool:
    """`_half_attrs` for a node and every step of its Pointwise body or epilogue."""
    changed = node.domain == "" and _half_attrs(node.op_type, node.attrs, upcast, half)
    if node.domain == POLYKIT_DOMAIN:
        body = node.attrs.get("body") if node.op_type == "Pointwise" else None
        if node.op_type in EPILOGUE_ARITY and node.attrs.get("epilogue"):
            body = node.attrs["epilogue"]["body"]
        for step in body or ():
            step["attrs"] = dict(step.get("attrs") or {})
            changed |= _half_attrs(step["op"], step["attrs"], half=half)
    return changed


def convert_precision(graph: Graph, half: Any = F16, *, keep_fp32: Iterable[str] = frozenset(),
                      keep: Iterable[str] = frozenset()) -> bool:
    """Rewrite `graph` (in place, shape-inferred) to compute in `half` (float16 or bfloat16);
    True if it changed."""
    half = np.dtype(half)
    if half not in HALF_CODES:
        raise PolykitError(f"cannot convert a graph to {half.name}", hint="use float16 or bfloat16")
    return _Converter(graph, half, frozenset(keep_fp32), protected(graph, keep)).run()


def convert_to_fp16(graph: Graph, *, keep_fp32: Iterable[str] = frozenset(),
                    keep: Iterable[str] = frozenset()) -> bool:
    """convert_precision to float16."""
    return convert_precision(graph, F16, keep_fp32=keep_fp32, keep=keep)


def shape_values(graph: Graph) -> frozenset[str]:
    """The float32 tensors whose values a profile build computes from the input dims (symbolic values:
    polykit.compiler.graph.shape_values; e.g. a detector's resize scale, min_size / min(h, w), as float
    dims): the host evaluates them in float32, as onnxruntime does, so they stay float32. In half they
    would leave the float dims that follow them unknown, and round other sizes than the model's."""
    known = infer_shapes(graph, strict=False)
    return frozenset(n for n, v in known.items() if is_symbolic(v) and graph.value(n).dtype == F32)


class _Converter:
    def __init__(self, graph: Graph, half: np.dtype, keep_fp32: frozenset[str], fixed: set[str]):
        self.g, self.half, self.keep_fp32, self.fixed = graph, half, keep_fp32, fixed
        self.orig: dict[str, np.dtype | None] = {}
        self.shape_values: frozenset[str] = frozenset()
        #: tensor -> {dtype: name holding it in that dtype}
        self.avail: dict[str, dict[np.dtype, str]] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.out: list[Node] = []
        self.copies: set[int] = set()
        self.changed = False

    def run(self) -> bool:
        g = self.g
        names = set(g.inputs) | set(g.initializers) | {o for n in g.nodes for o in n.outputs if o}
        self.orig = {name: g.value(name).dtype for name in names}
        self.shape_values = shape_values(g)
        for name in g.inputs:
            self.avail[name] = {self.orig[name]: name}
        self.copies = self._find_copies()
        self._convert_weights()
        for node in list(g.nodes):
            self._visit(node)
        g.nodes = self.out
        for name, dt in self.dtypes.items():
            shape = g.value(name).shape
            g.set_value(Value(name, dt, shape))
        return self.changed

    def _pinned(self, node: Node) -> bool:
        """Whether `node` stays float32: is_pinned, or it computes a shape value (`shape_values`)."""
        return is_pinned(node, self.keep_fp32) or any(o in self.shape_values for o in node.outputs if o)

    # ---- weights -------------------------------------------------------------------
    def _wants(self, node: Node, pinned: bool) -> list[np.dtype | None]:
        """Per input slot: the dtype a float32 tensor must arrive in (None: not float32)."""
        fixed_slots = FP32_INPUTS.get(node.op_type, ()) if node.domain == "" else ()
        any_slots = ANY_TYPE_INPUTS.get(node.op_type, ()) if node.domain == "" else ()
        if node.domain == "" and self.half == F16:
            any_slots = any_slots + FLOAT16_INPUTS.get(node.op_type, ())
        free = F32 if pinned or self._float32_copy(node) else self.half
        return [None if not t or self.orig.get(t) != F32 or i in any_slots else F32 if pinned or i in fixed_slots
                else free for i, t in enumerate(node.inputs)]

    def _float32_copy(self, node: Node) -> bool:
        """Whether `node` is a float32 copy: in `copies` and no float input is available in half."""
        return id(node) in self.copies and not any(self.half in self.avail.get(t, {}) for t in node.inputs if t)

    def _find_copies(self) -> set[int]:
        """ids of MOVE_OPS nodes that read no float32 weight and whose outputs only float32
        readers read: graph outputs / kept tensors, pinned nodes, or other such copies."""
        g = self.g
        readers: dict[str, list[Node]] = {}
        for node in g.nodes:
            for t in node.inputs:
                readers.setdefault(t, []).append(node)
        copies: set[int] = set()
        for node in reversed(g.nodes):
            if node.domain != "" or node.op_type not in MOVE_OPS or self._pinned(node):
                continue
            if any(t in g.initializers and self.orig.get(t) == F32 for t in node.inputs):
                continue
            outs = [o for o in node.outputs if o and self.orig.get(o) == F32]
            if outs and all(all(id(r) in copies or self._pinned(r) for r in readers.get(o, ()))
                            and (o in self.fixed or readers.get(o)) for o in outs):
                copies.add(id(node))
        return copies

    def _convert_weights(self) -> None:
        g = self.g
        wants: dict[str, set] = {}
        for node in g.nodes:
            for t, want in zip(node.inputs, self._wants(node, self._pinned(node))):
                if want is not None and t in g.initializers:
                    wants.setdefault(t, set()).add(want)
        for name, arr in g.initializers.items():
            self.avail[name] = {arr.dtype: name}
            if arr.dtype == F32 and wants.get(name) == {self.half} and name not in self.fixed:
                g.initializers[name] = to_half(arr, self.half)
                self.avail[name] = {self.half: name}
                self.dtypes[name] = self.half
                self.changed = True

    # ---- nodes ---------------------------------------------------------------------
    def _visit(self, node: Node) -> None:
        pinned = self._pinned(node)
        upcast = node.op_type == "Cast" and node.domain == "" and self.orig.get(node.input(0)) == self.half
        trial = None
        if not pinned:
            trial = copy.deepcopy(node)
            half_node_attrs(trial, upcast, self.half)
            out_dtypes = self._infer(trial, self._wants(node, False))
            if out_dtypes is None:
                pinned, trial = True, None
        if pinned:
            out_dtypes = self._infer(node, self._wants(node, True))
        wants = self._wants(node, pinned)
        if trial is not None:
            self.changed |= half_node_attrs(node, upcast, self.half)
        self._feed(node, wants)
        self.out.append(node)
        for k, out in enumerate(node.outputs):
            dt = out_dtypes[k] if out_dtypes and k < len(out_dtypes) else self.orig.get(out)
            if not out or dt is None:
                continue
            self.avail[out] = {dt: out}
            if dt != self.orig.get(out):
                self.dtypes[out] = dt
            if out in self.fixed and self.orig.get(out) == F32 and dt != F32:
                self._restore_output(node, out, dt)

    def _infer(self, node: Node, wants: list[np.dtype | None]) -> list[np.dtype | None] | None:
        """Output dtypes of `node` when its inputs arrive as `wants` says; None if its rule refuses."""
        rule = find_shape_rule(node.domain, node.op_type)
        if rule is None:
            return None
        g = self.g
        dtypes = [want or self._current(t) for t, want in zip(node.inputs, wants)]
        shapes = [g.value(t).shape if t else None for t in node.inputs]
        consts = [g.initializers.get(t) if t else None for t in node.inputs]
        try:
            return [dt for dt, _ in rule(InferContext(node, dtypes, shapes, consts))]
        except PolykitError:
            return None

    def _current(self, name: str) -> np.dtype | None:
        if not name:
            return None
        have = self.avail.get(name)
        return next(iter(have)) if have else self.orig.get(name)

    def _feed(self, node: Node, wants: list[np.dtype | None]) -> None:
        """Make each float32-origin input arrive in the dtype the node wants."""
        fused = node.domain == POLYKIT_DOMAIN and node.op_type != "Attention"
        for i, (t, want) in enumerate(zip(list(node.inputs), wants)):
            if want is None:
                continue
            name = self._get(t, want)
            if name == t:
                continue
            if fused:
                rename_fused_tensor(node, t, name)
            else:
                node.inputs[i] = name

    def _get(self, t: str, want: np.dtype) -> str:
        have = self.avail.setdefault(t, {self.orig[t]: t})
        if want in have:
            return have[want]
        g = self.g
        src_dtype, src = next(iter(have.items()))
        if src in g.initializers:
            name = g.add_initializer(to_half(g.initializers[src], want) if want == self.half
                                     else g.initializers[src].astype(want), f"{t}_{want.name}")
        else:
            name = g.fresh_name(f"{t}_{want.name}")
            to = HALF_CODES[want] if want == self.half else FLOAT
            self.out.append(Node("Cast", [src], [name], {"to": to}, name=g.fresh_name(f"cast_{t}_{want.name}")))
            g.set_value(Value(name, want, g.value(t).shape))
        self.dtypes[name] = want
        have[want] = name
        self.changed = True
        return name

    def _restore_output(self, node: Node, out: str, dt: np.dtype) -> None:
        """A kept/graph output computed in half: the node writes a fresh name, a Cast writes `out`."""
        g = self.g
        inner = g.fresh_name(f"{out}_{dt.name}")
        if node.domain == POLYKIT_DOMAIN:
            rename_fused_tensor(node, out, inner)
        node.outputs = [inner if o == out else o for o in node.outputs]
        g.set_value(Value(inner, dt, g.value(out).shape))
        self.out.append(Node("Cast", [inner], [out], {"to": FLOAT}, name=g.fresh_name(f"cast_{out}_float32")))
        self.avail[out] = {dt: inner, F32: out}
        self.dtypes[inner] = dt
        self.dtypes.pop(out, None)
        self.changed = True
