"""ai.polykit SqueezeExcite: a squeeze-excitation gate in one node (docs/FUSION.md, "SqueezeExcite").

SqueezeExcite(x, W1, b1, W2, b2, extras...) -> s, x of rank 4 and a float dtype:

    p = mean of x over its spatial axes                      [N, C]  (rounded to x's dtype)
    h = act(p . W1^T + b1)                                   [N, Cr] (W1 [Cr, C], b1 [Cr])
    s = gate(h . W2^T + b2)                                  [N, C]  (W2 [C, Cr], b2 [C])

stored as [N, 1, 1, C] (`layout` "nhwc": x is [N, H, W, C]) or [N, C, 1, 1] (`layout` "nchw": x is
[N, C, H, W]); the dtype of x. W1 and W2 are the 1x1 convolutions' weights as they were (any shape
whose flat order is [Cr, C] / [C, Cr]: KCRS [Cr, C, 1, 1] or KRSC [Cr, 1, 1, C]), b1 and b2 their
biases. `act` and `gate` are epilogue holders `{"input", "body", "output"}`: a body (fused.py's format)
evaluated on the value `input` (the matrix product plus bias, in the shape of the node's output with
Cr or C channels), whose value `output` (== `input` for an empty body) is the result. The bodies may
read the node's inputs past the fifth (`extras`: one-element constants such as Clip's bounds).
With attribute `scale` 1 the node also applies its gate: the output is y = x * s (x's shape and dtype,
each product rounded to it, as the Mul it absorbed stored it) and s is internal (the gate holder's
`output` names no graph tensor then).
polykit.compiler.passes.fuse_squeeze_excite makes the node from ReduceMean -> 1x1 conv -> 1x1 conv
(-> Mul with x).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.nn.fused import decode_json_attrs, infer_body
from polykit.compiler.ops.registry import InferContext, importer, shape_rule

SQUEEZE_EXCITE = "SqueezeExcite"
LAYOUTS = ("nhwc", "nchw")
#: the epilogue holders of the node, in evaluation order
HOLDERS = ("act", "gate")
#: inputs before the bodies' extras: x, W1, b1, W2, b2
ARITY = 5
#: the most extra inputs (one-element constants) the bodies read together: the cuda kernels' e0..e3
MAX_EXTRAS = 4
#: the most hidden units (the cuda kernels keep them, and 64 gates, in 48 KiB of shared memory), samples (a grid
#: axis) and elements of x (32-bit offsets) fuse_squeeze_excite makes a node for
MAX_HIDDEN, MAX_BATCH, MAX_ELEMENTS = 12288 - 64, 65535, 2**31 - 1
FLOATS = ("float16", "float32", "bfloat16")
_HINT = "fuse_squeeze_excite makes this node; rebuild the plan (or fix the edited attributes)"

importer(SQUEEZE_EXCITE, since=1, domain=POLYKIT_DOMAIN)(decode_json_attrs)


def channel_axis(layout: str) -> int:
    return 3 if layout == "nhwc" else 1


def gate_shape(n: Any, channels: Any, layout: str) -> tuple:
    """[N, 1, 1, C] (nhwc) or [N, C, 1, 1] (nchw)."""
    return (n, 1, 1, channels) if layout == "nhwc" else (n, channels, 1, 1)


def scales(node: Node) -> bool:
    """Whether the node's output is x * s (attribute `scale` 1) rather than the gate s (ValueError for
    another value)."""
    value = node.attrs.get("scale", 0)
    if value not in (0, 1) or isinstance(value, bool):
        raise ValueError(f"attribute 'scale' is {value!r}, not 0 or 1")
    return value == 1


def holder(node: Node, key: str) -> dict[str, Any]:
    """The `act` / `gate` holder of a SqueezeExcite node (ValueError naming what is wrong)."""
    h = node.attrs.get(key)
    if not isinstance(h, dict) or not isinstance(h.get("input"), str) or not isinstance(h.get("body"), list) \
            or not isinstance(h.get("output"), str):
        raise ValueError(f"attribute {key!r} is not an epilogue holder {{'input', 'body', 'output'}}")
    if not h["body"] and h["output"] != h["input"]:
        raise ValueError(f"attribute {key!r} has an empty body but output {h['output']!r} != input {h['input']!r}")
    return h


def se_dims(node: Node, x_shape, w1_size: int | None, w2_size: int | None) -> tuple[str, int | None, int | None]:
    """(layout, C, Cr) of a SqueezeExcite with input shape `x_shape` and weights of these sizes
    (ValueError naming what is wrong); C or Cr None where unknown."""
    layout = node.attrs.get("layout")
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    c = None if x_shape is None else x_shape[channel_axis(layout)]
    c = c if isinstance(c, int) else None
    cr = None
    if c is not None and w1_size is not None:
        if c < 1 or w1_size % c:
            raise ValueError(f"W1 has {w1_size} elements, not a multiple of the {c} channels")
        cr = w1_size // c
        if cr < 1 or (w2_size is not None and w2_size != c * cr):
            raise ValueError(f"W2 has {w2_size} elements; [C, Cr] = [{c}, {cr}] needs {c * cr}")
    return layout, c, cr


def _size(ctx: InferContext, i: int) -> int | None:
    shape = ctx.shape(i)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64))


@shape_rule(SQUEEZE_EXCITE, domain=POLYKIT_DOMAIN)
def _squeeze_excite(ctx: InferContext):
    node = ctx.node
    if ctx.n_inputs < ARITY or not all(ctx.has(i) for i in range(ARITY)) or ctx.n_outputs != 1:
        raise ctx.fail("SqueezeExcite takes x, W1, b1, W2, b2 (then the bodies' extras) and gives one tensor",
                       hint=_HINT)
    if ctx.rank(0) not in (None, 4):
        raise ctx.fail(f"SqueezeExcite reads a rank-4 tensor, not rank {ctx.rank(0)}", hint=_HINT)
    dt = ctx.dtype(0)
    if dt is not None and np.dtype(dt).name not in FLOATS:
        raise ctx.fail(f"x has dtype {np.dtype(dt).name}, not one of {', '.join(FLOATS)}", hint=_HINT)
    try:
        layout, c, cr = se_dims(node, ctx.shape(0), _size(ctx, 1), _size(ctx, 3))
        act, gate = (holder(node, k) for k in HOLDERS)
        scaled = scales(node)
    except ValueError as exc:
        raise ctx.fail(str(exc), hint=_HINT) from None
    for i, want in ((2, cr), (4, c)):
        got = _size(ctx, i)
        if want is not None and got is not None and got != want:
            raise ctx.fail(f"bias input {i} has {got} elements, not {want}", hint=_HINT)
    n = ctx.shape(0)[0] if ctx.shape(0) is not None else None
    env = {node.inputs[i]: (ctx.dtype(i), ctx.shape(i), ctx.const(i)) for i in range(ARITY, ctx.n_inputs)}
    env[act["input"]] = (dt, None if cr is None else gate_shape(n, cr, layout), None)
    env = infer_body(ctx, act["body"], env)
    hidden = env.get(act["output"])
    if hidden is None:
        raise ctx.fail(f"act's output {act['output']!r} is not written by its body", hint=_HINT)
    if hidden[0] is not None and dt is not None and hidden[0] != dt:
        raise ctx.fail(f"act gives dtype {hidden[0]}, x's is {dt}", hint=_HINT)
    env[gate["input"]] = (dt, None if c is None else gate_shape(n, c, layout), None)
    env = infer_body(ctx, gate["body"], env)
    out = env.get(gate["output"])
    if out is None:
        raise ctx.fail(f"gate's output {gate['output']!r} is not written by its body", hint=_HINT)
    want = None if c is None else gate_shape(n, c, layout)
    if out[1] is not None and want is not None and tuple(out[1]) != want:
        raise ctx.fail(f"gate gives shape {out[1]}, the gate is {want}", hint=_HINT)
    if scaled:
        if out[0] is not None and dt is not None and out[0] != dt:
            raise ctx.fail(f"gate gives dtype {out[0]}, x's is {dt}: a scaling node multiplies them", hint=_HINT)
        return [(dt, ctx.shape(0))]
    return [(out[0], want)]
