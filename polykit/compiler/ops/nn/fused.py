"""polykit's fused ops (domain ai.polykit): Pointwise, Conv/Gemm/MatMul/ConvNHWC with an epilogue, Attention.

The passes in polykit.compiler.passes create these nodes; docs/FUSION.md is their contract
(the builder, the cpu target and the cuda target rely on it). A *body* is a list of plain
ONNX elementwise steps `{"op", "inputs", "outputs", "attrs"}` in topological order; its
names are the fused node's inputs, the node's outputs, or names local to the body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.concat_operands import concat_operands
from polykit.compiler.ops.nn.view_operands import view_operands, view_shape
from polykit.compiler.ops.registry import ImportContext, InferContext, broadcast_shapes, find_shape_rule, importer, shape_rule
from polykit.errors import NodeAttributeError

#: Base ops that take an epilogue, with the arity their inputs are padded to.
EPILOGUE_ARITY = {"Conv": 3, "Gemm": 3, "MatMul": 2, "ConvNHWC": 3}
#: Epilogue bases that are ai.polykit ops of their own (valid without an epilogue too,
#: with their own shape rule and reference kernel: ops/channels_last.py)
POLYKIT_BASES = frozenset({"ConvNHWC"})


def body_names(body: list[dict[str, Any]]) -> set[str]:
    """Every tensor name a body reads or writes ("" excluded)."""
    names: set[str] = set()
    for step in body:
        names.update(n for n in step["inputs"] if n)
        names.update(n for n in step["outputs"] if n)
    return names


def _rename_in_body(body: list[dict[str, Any]], old: str, new: str) -> None:
    for step in body:
        step["inputs"] = [new if n == old else n for n in step["inputs"]]
        step["outputs"] = [new if n == old else n for n in step["outputs"]]


def rename_fused_tensor(node: Node, old: str, new: str) -> None:
    """Rename tensor `old` to `new` in a fused node's inputs, outputs and bodies.

    Passes that rename a tensor read or written by a fused node must call this (plain
    `Node.inputs` edits would leave a body pointing at the old name). A body-local name
    that equals `new` is first moved aside so the body stays unambiguous.
    """
    external = set(node.inputs) | set(node.outputs)
    for body, holder in _bodies_of(node):
        local = body_names(body) - external
        if holder is not None:
            local.update(holder[k] for k in ("input", "output") if k in holder)
        if new in local:
            taken = body_names(body) | external | {new}
            k = 0
            while f"{new}__local{k}" in taken:
                k += 1
            moved = f"{new}__local{k}"
            _rename_in_body(body, new, moved)
            for entry in [*(node.attrs.get("concat") or ()), *(node.attrs.get("view") or ())]:  # operands: body-local names
                if entry.get("name") == new:
                    entry["name"] = moved
            if holder is not None:
                for key in ("input", "output"):
                    if holder.get(key) == new:
                        holder[key] = moved
        _rename_in_body(body, old, new)
        if holder is not None:  # a holder whose body reads or writes the node's tensor itself (SqueezeExcite's gate)
            for key in ("input", "output"):
                if holder.get(key) == old:
                    holder[key] = new
    node.inputs = [new if n == old else n for n in node.inputs]
    node.outputs = [new if n == old else n for n in node.outputs]


#: fused ops of ai.polykit whose bodies sit in holders {"input", "body"(, "output")} under these attributes
#: (SqueezeExcite: ops/nn/squeeze_excite.py)
HOLDER_ATTRS = {"SqueezeExcite": ("act", "gate")}


def _bodies_of(node: Node) -> list[tuple[list[dict[str, Any]], dict[str, Any] | None]]:
    """The (body, holder) pairs of a fused node: a Pointwise body (no holder), an epilogue, or the
    holders HOLDER_ATTRS names."""
    if node.domain != POLYKIT_DOMAIN:
        return []
    if node.op_type == "Pointwise":
        body = node.attrs.get("body")
        return [] if body is None else [(body, None)]
    holders = [node.attrs.get(key) for key in HOLDER_ATTRS.get(node.op_type, ())]
    epi = node.attrs.get("epilogue")
    if epi:  # the float kinds of EPILOGUE_ARITY and the INT8 layers (ops/int8.py)
        holders.append(epi)
    return [(h["body"], h) for h in holders if isinstance(h, dict) and isinstance(h.get("body"), list)]


def step_node(step: dict[str, Any], index: int = 0) -> Node:
    """A body step as a plain ONNX Node (for shape rules and reference kernels)."""
    return Node(step["op"], list(step["inputs"]), list(step["outputs"]), dict(step.get("attrs") or {}),
                name=f"body[{index}]:{step['op']}")


def infer_body(ctx: InferContext, body: list[dict[str, Any]], env: dict[str, tuple]) -> dict[str, tuple]:
    """Run each step's shape rule; `env` maps names to (dtype, shape, const-or-None)."""
    for k, step in enumerate(body):
        sub = step_node(step, k)
        rule = find_shape_rule("", sub.op_type)
        if rule is None:
            raise ctx.fail(f"body step {k} uses {sub.op_type!r}, which has no shape rule",
                           hint="fused bodies may only hold registered ONNX elementwise ops")
        missing = [n for n in sub.inputs if n and n not in env]
        if missing:
            raise ctx.fail(f"body step {k} ({sub.op_type}) reads {missing}, defined neither by the node's "
                           "inputs nor by an earlier step")
        meta = [env.get(n, (None, None, None)) if n else (None, None, None) for n in sub.inputs]
        sub_ctx = InferContext(sub, [m[0] for m in meta], [m[1] for m in meta], [m[2] for m in meta])
        for out, (dt, shape) in zip(sub.outputs, rule(sub_ctx)):
            if out:
                env[out] = (dt, shape, None)
    return env


def _external_env(ctx: InferContext, start: int = 0) -> dict[str, tuple]:
    env: dict[str, tuple] = {}
    for i in range(start, ctx.n_inputs):
        if ctx.has(i):
            env[ctx.node.inputs[i]] = (ctx.dtype(i), ctx.shape(i), ctx.const(i))
    return env


def _outputs_from(ctx: InferContext, env: dict[str, tuple]) -> list[tuple]:
    results = []
    for out in ctx.node.outputs:
        if out not in env:
            raise ctx.fail(f"output {out!r} is not written by the body")
        results.append(env[out][:2])
    return results


def decode_json_attrs(node: Node, ctx: ImportContext) -> None:
    """ONNX export stores dict/list-of-dict attributes as JSON strings; bring them back."""
    for key in ("body", "epilogue", "concat", "view", "row_map", *HOLDER_ATTRS["SqueezeExcite"]):
        if isinstance(node.attrs.get(key), str):
            try:
                node.attrs[key] = json.loads(node.attrs[key])
            except json.JSONDecodeError as exc:
                raise NodeAttributeError(f"attribute {key!r} is not JSON ({exc.msg} at character {exc.pos})",
                                         where=node.describe(),
                                         hint="polykit writes these attributes as JSON; rebuild the model with "
                                              "polykit or fix the edited attribute") from None


for _op in ("Pointwise", "Attention", *EPILOGUE_ARITY):
    importer(_op, since=1, domain=POLYKIT_DOMAIN)(decode_json_attrs)


@shape_rule("Pointwise", domain=POLYKIT_DOMAIN)
def _pointwise(ctx: InferContext):
    env = _external_env(ctx)
    if ctx.node.attrs.get("concat"):
        env.update(_concat_env(ctx))
    if ctx.node.attrs.get("view"):
        env.update(_view_env(ctx))
    env = infer_body(ctx, ctx.attr("body"), env)
    return _outputs_from(ctx, env)


def _concat_env(ctx: InferContext) -> dict[str, tuple]:
    """(dtype, shape, None) of each concatenated operand (ops/nn/concat_operands.py), by the
    Concat shape rule over its sources; their recorded extents must match known dims."""
    inputs = ctx.node.inputs
    env: dict[str, tuple] = {}
    for e in concat_operands(ctx.node.attrs, len(inputs), ctx.node.describe()):
        idx = range(e["first"], e["first"] + e["count"])
        if e["name"] in inputs:
            raise ctx.fail(f"concatenated operand {e['name']!r} is also an input of the node")
        sub = Node("Concat", [inputs[i] for i in idx], [e["name"]], {"axis": e["axis"]}, name=f"concat:{e['name']}")
        sub_ctx = InferContext(sub, [ctx.dtype(i) for i in idx], [ctx.shape(i) for i in idx], [None] * e["count"])
        ((dtype, shape),) = find_shape_rule("", "Concat")(sub_ctx)
        for i, want in zip(idx, e["extents"]):
            got = ctx.shape(i)
            if want is not None and got is not None and e["axis"] < len(got) and isinstance(got[e["axis"]], int) \
                    and got[e["axis"]] != want:
                raise ctx.fail(f"concat source {inputs[i]!r} has size {got[e['axis']]} along axis {e['axis']}, "
                               f"its record says {want}", hint="rebuild the plan from the model")
        env[e["name"]] = (dtype, shape, None)
    return env


def _view_env(ctx: InferContext) -> dict[str, tuple]:
    """(dtype, shape, None) of each view operand (ops/nn/view_operands.py): its source's dtype, its
    own logical shape; every element it addresses must lie inside a source of known size."""
    inputs = ctx.node.inputs
    sizes = [None if ctx.shape(i) is None or not all(isinstance(d, int) for d in ctx.shape(i))
             else int(np.prod(ctx.shape(i), dtype=np.int64)) for i in range(len(inputs))]
    env: dict[str, tuple] = {}
    for e in view_operands(ctx.node.attrs, len(inputs), ctx.node.describe(), sizes):
        if e["name"] in inputs:
            raise ctx.fail(f"view operand {e['name']!r} is also an input of the node")
        env[e["name"]] = (ctx.dtype(e["input"]), view_shape(e), None)
    return env


def base_node(node: Node) -> Node:
    """The op under an epilogue node: its inputs (padding dropped) and own attrs; a plain ONNX
    op, or for POLYKIT_BASES the same ai.polykit op without its epilogue."""
    arity = EPILOGUE_ARITY[node.op_type]
    inputs = list(node.inputs[:arity])
    while inputs and not inputs[-1]:
        inputs.pop()
    attrs = {k: v for k, v in node.attrs.items() if k not in ("epilogue", "fused_from")}
    domain = POLYKIT_DOMAIN if node.op_type in POLYKIT_BASES else ""
    return Node(node.op_type, inputs, [node.attrs["epilogue"]["input"]], attrs, name=node.name, domain=domain)


@shape_rule(*(op for op in EPILOGUE_ARITY if op not in POLYKIT_BASES), domain=POLYKIT_DOMAIN)
def infer_epilogue(ctx: InferContext):
    """Shape rule of an epilogue node: the base op's rule, then the body's."""
    node = ctx.node
    if "epilogue" not in node.attrs:
        raise ctx.fail(f"an ai.polykit {node.op_type} needs an 'epilogue' attribute")
    base = base_node(node)
    rule = find_shape_rule(base.domain, base.op_type)
    if rule is None:
        raise ctx.fail(f"the base op {base.op_type} has no shape rule")
    n = len(base.inputs)
    base_ctx = InferContext(base, [ctx.dtype(i) for i in range(n)], [ctx.shape(i) for i in range(n)],
                            [ctx.const(i) for i in range(n)])
    (dt, shape), *_ = rule(base_ctx)
    env = _external_env(ctx, EPILOGUE_ARITY[node.op_type])
    env[node.attrs["epilogue"]["input"]] = (dt, shape, None)
    env = infer_body(ctx, node.attrs["epilogue"]["body"], env)
    return _outputs_from(ctx, env)


#: Attention tensor layouts: "bhsd" ([..., S, D], the default) or "bshd" (rank >= 4 [..., S, H, D]:
#: the heads and sequence axes, -3 and -2, swapped)
ATTENTION_LAYOUTS = ("bhsd", "bshd")
LAYOUT_ATTRS = ("q_layout", "k_layout", "v_layout", "out_layout")
#: Q, K, V read through an explicit element-stride view of their stored tensor (docs/FUSION.md)
VIEW_ATTRS = ("q_view", "k_view", "v_view")
#: grouped-query heads: K and V hold H / g heads, query head h reads key/value head h // g (axis -3)
KV_GROUPS = "kv_groups"
#: a hint, never a change of value: every key k > q + c of the mask is -inf / false (an int c; set by
#: passes/mark_causal_masks.py), so a kernel may skip those keys; the reference and other kernels ignore it
MASK_CAUSAL = "mask_causal"


class ViewError(ValueError):
    """An Attention view attribute that does not fit its tensor."""


@dataclass(frozen=True)
class OperandView:
    """How Attention reads one operand: logical element `i` (a multi-index over `shape`, rank >= 2,
    last axis D) is element `offset + sum(i * strides)` of the stored tensor, row-major flat."""

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def encode(self) -> list[int]:
        """The attribute form: [offset, *shape, *strides]."""
        return [self.offset, *self.shape, *self.strides]

    def last_element(self) -> int:
        return self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.strides))


def dense_strides(shape) -> tuple[int, ...]:
    """Row-major element strides of `shape`, 0 on size-1 dims (their stride never matters)."""
    st, acc = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        st[k] = acc if shape[k] != 1 else 0
        acc *= shape[k]
    return tuple(st)


#: how a view entry names dim k of its stored tensor (a dynamic dim: `#0`, `#1`, ...)
AXIS_SYMBOL = "#{}"


def decode_view(value, stored_shape=None) -> OperandView:
    """An attribute [offset, *shape, *strides] as an OperandView (ViewError naming what is wrong).
    An entry may be an expression (symbolic.expr_to_json form, + and * only) of the stored
    tensor's dims `#k` (a profile build's dynamic dims: `["*", 2304, "#1"]`, the batch stride of a
    [B, S, 2304] packed projection); `stored_shape` gives them (ints, or SymInts in a build)."""
    if not isinstance(value, (list, tuple)):
        raise ViewError(f"{value!r} is not a list of integers")
    try:
        value = [_view_entry(v, stored_shape) for v in value]
    except ViewError as exc:
        raise ViewError(f"{value!r} is not a list of integers (or '#k' expressions): {exc}") from None
    if len(value) < 5 or len(value) % 2 == 0:
        raise ViewError(f"{len(value)} integers; a view is [offset, *shape, *strides] of rank >= 2")
    rank = (len(value) - 1) // 2
    offset, shape, strides = value[0], tuple(value[1:1 + rank]), tuple(value[1 + rank:])
    if offset < 0 or any(d < 1 for d in shape) or any(s < 0 for s in strides):
        raise ViewError(f"offset {offset}, shape {shape}, strides {strides}: need offset >= 0, dims >= 1, strides >= 0")
    if strides[-1] != 1 and shape[-1] != 1:
        raise ViewError(f"strides {strides}: the last (head) axis must be contiguous (stride 1)")
    return OperandView(offset, shape, strides)


def _view_entry(v, stored_shape, depth: int = 0):
    """One view entry's value: an int, or `#k` / ["+" | "*", entries...] over the stored dims."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    if depth > 8:
        raise ViewError("a view entry is nested deeper than 8 levels")
    if isinstance(v, str):
        k = v[1:]
        if v[:1] != "#" or not k.isdigit():
            raise ViewError(f"entry {v!r} is no int and no stored dim '#k'")
        if stored_shape is None or int(k) >= len(stored_shape):
            raise ViewError(f"entry {v!r} names a dim its tensor of shape {stored_shape} does not have")
        return stored_shape[int(k)]
    if isinstance(v, (list, tuple)) and len(v) >= 3 and v[0] in ("+", "*"):
        args = [_view_entry(a, stored_shape, depth + 1) for a in v[1:]]
        out = args[0]
        for a in args[1:]:
            out = out + a if v[0] == "+" else out * a
        return out
    raise ViewError(f"entry {v!r} is not an integer, '#k' or ['+' | '*', ...] of them")


def dynamic_view(raw) -> bool:
    """Whether a view attribute names its tensor's dims (a profile build's view)."""
    return isinstance(raw, (list, tuple)) and any(not isinstance(v, (int, np.integer)) for v in raw)


def operand_view(attrs, i: int, stored_shape) -> OperandView | None:
    """Attention input i (0 Q, 1 K, 2 V) or, for i = 3, its output, as an OperandView of the stored
    tensor of shape `stored_shape`: from its `*_view` attribute (checked: every element it
    addresses lies inside the tensor), else from its layout ("bhsd" contiguous, "bshd" the
    (0, 2, 1, 3) transpose); None when the shape is not static and there is no view. A view
    naming the tensor's dims (`#k`) takes them from `stored_shape`: the bound shape at run time,
    SymInts in a build (the view's dims and strides then are SymInts too)."""
    raw = attrs.get(VIEW_ATTRS[i]) if i < 3 else None
    layout = str(attrs.get(LAYOUT_ATTRS[i], "bhsd"))
    if layout not in ATTENTION_LAYOUTS:
        raise ViewError(f"unknown layout {layout!r} (use one of {ATTENTION_LAYOUTS})")
    static = stored_shape is not None and all(type(d) is int for d in stored_shape)
    if not static and (raw is None or stored_shape is None or not dynamic_view(raw)
                       or not all(isinstance(d, (int, np.integer)) for d in stored_shape)):
        if raw is not None:
            raise ViewError(f"a view needs the static shape of its tensor, got {stored_shape}")
        return None
    stored = tuple(stored_shape)
    if raw is not None:
        if layout != "bhsd":
            raise ViewError(f"both a view and layout {layout!r} given")
        view = decode_view(raw, stored)
        total = int(np.prod([int(d) for d in stored], dtype=np.int64))
        if total == 0 or view.last_element() >= total:
            raise ViewError(f"view {[int(v) for v in view.encode()]} addresses element {int(view.last_element())}, "
                            f"past the {total} elements of its tensor {tuple(int(d) for d in stored)}")
        return view
    if layout == "bshd":
        if len(stored) < 4:
            raise ViewError(f"layout 'bshd' needs a tensor of rank >= 4, got rank {len(stored)}")
        st = dense_strides(stored)
        return OperandView(0, _swap_heads(stored), _swap_heads(st))
    return OperandView(0, stored, dense_strides(stored))


def kv_groups(attrs) -> int:
    """An Attention's `kv_groups` g (1: K and V have Q's heads); ViewError when it is no integer >= 1."""
    g = attrs.get(KV_GROUPS, 1)
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
        raise ViewError(f"{KV_GROUPS} {g!r} is no integer >= 1")
    return int(g)


def grouped_heads(q, k, v, g: int):
    """K's and V's logical shapes with their heads (axis -3) repeated g times, as Q reads them;
    ViewError when Q's heads are not g times theirs (static dims) or a rank is below 3."""
    if g == 1:
        return k, v
    if min(len(q), len(k), len(v)) < 3:
        raise ViewError(f"{KV_GROUPS} {g} needs Q, K and V of rank >= 3 (heads on axis -3), got ranks "
                        f"{len(q)}, {len(k)}, {len(v)}")
    hq = q[-3]
    for name, x in (("K", k), ("V", v)):
        if isinstance(hq, int) and isinstance(x[-3], int) and hq != g * x[-3]:
            raise ViewError(f"Q has {hq} heads, {name} {x[-3]}: with {KV_GROUPS} {g} Q needs {g} x {name}'s heads")
    return tuple(k[:-3]) + (hq,) + tuple(k[-2:]), tuple(v[:-3]) + (hq,) + tuple(v[-2:])


def _swap_heads(dims) -> tuple:
    """`dims` ([..., H, S, D] or [..., S, H, D]) with axes -3 and -2 swapped."""
    return tuple(dims[:-3]) + (dims[-2], dims[-3], dims[-1])


def attention_view(shape, layout: str, ctx: InferContext | None = None):
    """The [..., S, D] shape Attention computes on, for a tensor stored in `layout`."""
    if layout not in ATTENTION_LAYOUTS:
        raise ctx.fail(f"unknown attention layout {layout!r}", hint=f"use one of {ATTENTION_LAYOUTS}")
    if layout == "bhsd" or shape is None:
        return shape
    if len(shape) < 4:
        raise ctx.fail(f"layout 'bshd' needs a tensor of rank >= 4, got rank {len(shape)}")
    return _swap_heads(shape)


def _logical(ctx: InferContext, i: int, layout: str):
    """Input i's logical [..., S, D] shape: its view's shape (validated against the stored
    tensor), else the layout's view of its shape."""
    raw = ctx.node.attrs.get(VIEW_ATTRS[i])
    if raw is None:
        return attention_view(ctx.shape(i), layout, ctx)
    try:
        view = operand_view(ctx.node.attrs, i, ctx.shape(i))
    except ViewError as exc:
        raise ctx.fail(f"{VIEW_ATTRS[i]} of input {i}: {exc}",
                       hint="fold_attention_layouts makes views; rebuild the plan (or fix the edited attribute)") from None
    return view.shape


@shape_rule("Attention", domain=POLYKIT_DOMAIN)
def _attention(ctx: InferContext):
    layouts = [str(ctx.node.attrs.get(a, "bhsd")) for a in LAYOUT_ATTRS]
    q, k, v = (_logical(ctx, i, layouts[i]) for i in range(3))
    attention_view(None, layouts[3], ctx)
    if q is None or k is None or v is None:
        return [(ctx.dtype(0), None)]
    if min(len(q), len(k), len(v)) < 2:
        raise ctx.fail(f"Q, K, V must be at least 2-D, got ranks {len(q)}, {len(k)}, {len(v)}")
    try:
        k, v = grouped_heads(q, k, v, kv_groups(ctx.node.attrs))
    except ViewError as exc:
        raise ctx.fail(str(exc), hint="fold_attention_layouts sets kv_groups from the heads it un-repeats; "
                                      "rebuild the plan (or fix the edited attribute)") from None
    dq, dk = q[-1], k[-1]
    if isinstance(dq, int) and isinstance(dk, int) and dq != dk:
        raise ctx.fail(f"Q and K head sizes differ ({dq} vs {dk})", hint="K is [..., Skv, D], not transposed")
    skv_k, skv_v = k[-2], v[-2]
    if isinstance(skv_k, int) and isinstance(skv_v, int) and skv_k != skv_v:
        raise ctx.fail(f"K and V sequence lengths differ ({skv_k} vs {skv_v})")
    batch = broadcast_shapes(ctx, q[:-2], k[:-2], v[:-2])
    out = tuple(batch) + (q[-2], v[-1])
    if ctx.has(3) and ctx.shape(3) is not None:
        broadcast_shapes(ctx, ctx.shape(3), tuple(batch) + (q[-2], k[-2]))
    if ctx.dtype(3) is not None and ctx.dtype(3) != np.dtype(np.bool_) and ctx.dtype(3) != ctx.dtype(0):
        raise ctx.fail(f"mask dtype {ctx.dtype(3)} is neither bool nor Q's dtype {ctx.dtype(0)}")
    if layouts[3] == "bshd":
        if len(out) < 4:
            raise ctx.fail(f"out_layout 'bshd' needs an output of rank >= 4, got rank {len(out)}")
        out = _swap_heads(out)
    return [(ctx.dtype(0), out)]
