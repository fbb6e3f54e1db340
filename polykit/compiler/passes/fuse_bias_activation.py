"""fuse_bias_activation: give Conv / Gemm / MatMul their bias and activation epilogues.

1. Conv + Add(constant per-channel) -> the Conv's bias input (ai.polykit ConvNHWC likewise,
   its channels on the last axis).
2. MatMul(2-D A, constant 2-D W) + Add(constant [N]) -> Gemm(A, W, bias).
3. A view between a base op and its elementwise reader moves below the reader: `E(View(y), r)`
   -> `View(E(y, View'(r)))` where y is the base op's output read by nothing else, View a Reshape /
   Flatten / Squeeze / Unsqueeze (the element order stays), and each other operand r of E has
   E's output shape (View' gives it y's shape, a view too) or one element. So a residual Add
   behind a Reshape (torchvision's MultiheadAttention at batch 1: out-proj Gemm [S, E] ->
   [1, S, E] -> Add) joins the Gemm's epilogue in step 4.
4. Conv / Gemm / MatMul / ConvNHWC followed by elementwise ops (activations, bias, scale,
   residual Add, Clip...) whose intermediates are read only among them, converging to one
   output -> one ai.polykit node with an epilogue (docs/FUSION.md): a chain, or a diamond such
   as SiLU's `Mul(x, Sigmoid(x))`. Every step keeps the base op's output shape.
5. ai.polykit GroupNormNHWC followed by a unary activation that is the only reader of its output
   (Relu, Sigmoid, Tanh, Gelu of either `approximate`, SiLU as `Mul(x, Sigmoid(x))`), of the
   norm's output shape and dtype -> the norm with attribute `activation` (group_norm_nhwc.py),
   writing the activation's output: GroupNorm(32) -> SiLU of diffusion ResBlocks, wav2vec2's
   norm -> GELU. A norm pinned to float32 in an fp16 build is read by a Cast: it keeps its own.
"""

from __future__ import annotations

import heapq

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.nn.fused import EPILOGUE_ARITY, POLYKIT_BASES
from polykit.compiler.ops.nn.group_norm_nhwc import GROUP_NORM_NHWC, norm_activation
from polykit.compiler.passes.fuse_pointwise import body_step, is_fusable
from polykit.compiler.passes.rewrite import const, json_safe, protected, replace_nodes, sole_reader


def fuse_bias_activation(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Fold biases, then fuse epilogue groups; True if anything changed."""
    changed = _fold_biases(graph, protected(graph, keep))
    changed = _sink_views(graph, protected(graph, keep)) or changed
    changed = _fuse_epilogues(graph, protected(graph, keep)) or changed
    return _fuse_norm_activations(graph, protected(graph, keep)) or changed


def _takes_epilogue(node: Node) -> bool:
    """A plain base op (ONNX Conv/Gemm/MatMul, or ConvNHWC without an epilogue yet)."""
    if node.op_type in POLYKIT_BASES:
        return node.domain == POLYKIT_DOMAIN and not node.attrs.get("epilogue")
    return node.domain == "" and node.op_type in EPILOGUE_ARITY


def _other_const(graph: Graph, add: Node, name: str) -> np.ndarray | None:
    if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] == name else add.inputs[0]
    return None if other == name else const(graph, other)


def _fold_biases(graph: Graph, fixed: set[str]) -> bool:
    readers = graph.consumers()
    dead: list[Node] = []
    for base in list(graph.nodes):
        if not _takes_epilogue(base) or base.op_type == "Gemm" or len(base.outputs) != 1:
            continue
        out = base.outputs[0]
        add = sole_reader(graph, out, readers, fixed)
        c = None if add is None else _other_const(graph, add, out)
        if c is None or graph.value(add.outputs[0]).shape != graph.value(out).shape:
            continue
        folded = _matmul_to_gemm(graph, base, c) if base.op_type == "MatMul" else _bias_into_conv(graph, base, c)
        if folded:
            base.outputs = [add.outputs[0]]
            dead.append(add)
    graph.remove_nodes(dead)
    return bool(dead)


#: order-keeping views a base op's output may pass through on its way to an epilogue op
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def _sink_views(graph: Graph, fixed: set[str]) -> bool:
    """Rule 3 of the module docstring (through a chain of views, e.g. Reshape then a Transpose of
    size-1 dims made a Reshape); True if a view moved."""
    readers = graph.consumers()
    moved = False
    for base in list(graph.nodes):
        if not _takes_epilogue(base) or len(base.outputs) != 1:
            continue
        views, op = [], sole_reader(graph, base.outputs[0], readers, fixed)
        while op is not None and op.domain == "" and op.op_type in VIEW_OPS and op.outputs[0] not in fixed:
            views.append(op)
            op = sole_reader(graph, op.outputs[0], readers, fixed)
        if not views or op is None or not is_fusable(graph, op):  # op keeps its output's name
            continue
        last = views[-1].outputs[0]
        y, v, out = graph.value(base.outputs[0]), graph.value(last), graph.value(op.outputs[0])
        if (not y.is_static or not v.is_static or tuple(out.shape or ()) != tuple(v.shape)
                or out.dtype != v.dtype or op.inputs.count(last) != 1):
            continue
        others = [graph.value(n) for n in op.inputs if n and n != last]
        if any(not r.is_static or (tuple(r.shape) != tuple(v.shape) and int(np.prod(r.shape)) != 1) for r in others):
            continue
        _move_views_below(graph, base.outputs[0], views, op)
        readers = graph.consumers()
        moved = True
    return moved


def _move_views_below(graph: Graph, y: str, views: list[Node], op: Node) -> None:
    """`op(views(y), r...)` -> `Reshape(op(y, r viewed as y's shape...))`; op's output keeps its name."""
    last = views[-1].outputs[0]
    y_shape = tuple(int(d) for d in graph.value(y).shape)
    viewed_shape = tuple(int(d) for d in graph.value(last).shape)
    target = graph.add_initializer(np.array(y_shape, np.int64), f"{op.name}_shape")
    inputs, added = [], []
    for name in op.inputs:
        if name == last:
            inputs.append(y)
        elif name and tuple(graph.value(name).shape) == viewed_shape != y_shape:
            viewed = graph.fresh_name(f"{name}_as_{op.name}")
            added.append(Node("Reshape", [name, target], [viewed], {}, name=graph.fresh_name(f"{op.name}_view_in")))
            graph.set_value(graph.value(name).with_(name=viewed, shape=y_shape))
            inputs.append(viewed)
        else:
            inputs.append(name)  # one element (or y's shape already): broadcasts as before
    final = op.outputs[0]
    inner = graph.fresh_name(f"{final}_unviewed")
    graph.set_value(graph.value(final).with_(name=inner, shape=y_shape))
    op.inputs, op.outputs = inputs, [inner]
    back = graph.add_initializer(np.array(viewed_shape, np.int64), f"{op.name}_back")
    added.append(Node("Reshape", [inner, back], [final], {}, name=views[-1].name))
    graph.remove_nodes(views)
    graph.nodes.extend(added)
    graph.toposort()


def _bias_into_conv(graph: Graph, conv: Node, c: np.ndarray) -> bool:
    shape = graph.value(conv.outputs[0]).shape
    w = const(graph, conv.input(1))
    if shape is None or w is None or c.dtype != w.dtype or (conv.input(2) and const(graph, conv.input(2)) is None):
        return False
    channel_shape = (1, w.shape[0]) + (1,) * (len(shape) - 2)
    if conv.op_type == "ConvNHWC":
        channel_shape = (1,) * (len(shape) - 1) + (w.shape[0],)
    try:
        if np.broadcast_shapes(c.shape, channel_shape) != channel_shape:
            return False
    except ValueError:
        return False
    bias = np.broadcast_to(c, channel_shape).reshape(-1)
    if conv.input(2):
        bias = bias + const(graph, conv.input(2))
    conv.inputs = [conv.input(0), conv.input(1), graph.add_initializer(bias.astype(w.dtype), f"{conv.name}_B")]
    return True


def _matmul_to_gemm(graph: Graph, mm: Node, c: np.ndarray) -> bool:
    a = graph.value(mm.input(0)).shape
    w = const(graph, mm.input(1))
    if a is None or len(a) != 2 or w is None or w.ndim != 2 or c.dtype != w.dtype:
        return False
    if c.size not in (1, w.shape[1]) or (c.ndim == 2 and c.shape[0] != 1) or c.ndim > 2:
        return False
    bias = np.broadcast_to(c.reshape(-1), (w.shape[1],)).copy()
    mm.op_type = "Gemm"
    mm.inputs = [mm.input(0), mm.input(1), graph.add_initializer(bias, f"{mm.name}_C")]
    return True


def _fuse_epilogues(graph: Graph, fixed: set[str]) -> bool:
    readers = graph.consumers()
    replacements: dict[int, Node] = {}
    dead: list[Node] = []
    claimed: set[int] = set()  # chain nodes already given to a base (two convs feeding one residual Add)
    for base in graph.nodes:
        if not _takes_epilogue(base) or len(base.outputs) != 1:
            continue
        chain = epilogue_chain(graph, base, readers, fixed)
        if not chain or any(id(n) in claimed for n in chain):
            continue
        try:
            replacements[id(chain[-1])] = _epilogue_node(base, chain)
        except TypeError:  # an attribute that plans cannot store as JSON: leave the nodes apart
            continue
        claimed.update(id(n) for n in chain)
        dead.extend([base, *chain[:-1]])
    return replace_nodes(graph, replacements, dead)


#: The most elementwise nodes one epilogue takes (growth stops there; a bound on the search).
MAX_EPILOGUE_NODES = 32


def epilogue_chain(graph: Graph, base: Node, readers: dict[str, list[Node]], fixed: set[str]) -> list[Node]:
    """The elementwise nodes after `base` an epilogue can take, in graph order (the last one writes
    the epilogue's output); also the INT8 layers' epilogue (fold_qdq).

    Not only a chain: a group that reads base's output, or an intermediate, more than once (SiLU
    as `Mul(x, Sigmoid(x))`, HardSwish as `x * HardSigmoid(x)`, GELU's unrecognized forms) fuses
    too. Each node has base's output shape and dtype (so do its extra inputs); base's output and
    every intermediate are read only inside the group and are neither graph outputs nor kept; the
    group converges to one output, its last node's. The nodes are taken in graph order, each
    reading a value already inside, until a reader of an inside value cannot join (that value
    then leaves the group, so no later group is valid); the longest valid group wins."""
    out = base.outputs[0]
    shape = graph.value(out).shape
    if shape is None or any(d is None for d in shape) or out in fixed:
        return []
    dtype = graph.value(out).dtype
    order = {id(n): k for k, n in enumerate(graph.nodes)}
    # per inside value: how many of its readers are not in the group yet (0: read only inside)
    pending = {out: len(readers.get(out, []))}
    group: list[Node] = []
    best = 0
    heap = [(order[id(n)], n) for n in readers.get(out, [])]
    heapq.heapify(heap)
    seen = {id(n) for _, n in heap}
    while heap and len(group) < MAX_EPILOGUE_NODES:
        _, nxt = heapq.heappop(heap)
        # the epilogue writes the base op's output buffer: same shape and dtype (an fp16
        # build's closing Cast to float32 stays a Pointwise layer of its own)
        # ... and every extra input has that dtype too (kernels read them as their storage type:
        # a bool mask or an integer exponent keeps its op out of the epilogue)
        if (not is_fusable(graph, nxt) or graph.value(nxt.outputs[0]).shape != shape
                or graph.value(nxt.outputs[0]).dtype != dtype
                or any(graph.value(n).dtype != dtype for n in nxt.inputs if n and n not in pending)):
            break
        group.append(nxt)
        for name in dict.fromkeys(nxt.inputs):
            if name in pending:
                pending[name] -= 1
        result = nxt.outputs[0]
        pending[result] = len(readers.get(result, []))
        if all(count == 0 for name, count in pending.items() if name != result):
            best = len(group)  # converged: only the newest value is read outside
        if result in fixed:
            break  # a graph output or kept tensor can only be the group's output
        for n in readers.get(result, []):
            if id(n) not in seen:
                seen.add(id(n))
                heapq.heappush(heap, (order[id(n)], n))
    return group[:best]


def _epilogue_node(base: Node, chain: list[Node]) -> Node:
    arity = EPILOGUE_ARITY[base.op_type]
    inside = {base.outputs[0]} | {n.outputs[0] for n in chain}
    extras: list[str] = []
    for n in chain:
        extras.extend(name for name in n.inputs if name and name not in inside and name not in extras)
    inputs = list(base.inputs[:arity]) + [""] * (arity - len(base.inputs)) + extras
    attrs = json_safe(base.attrs)
    attrs["epilogue"] = {"input": base.outputs[0], "body": [body_step(n) for n in chain]}
    attrs["fused_from"] = list(base.attrs.get("fused_from") or [base.name]) + [n.name for n in chain]
    return Node(base.op_type, inputs, [chain[-1].outputs[0]], attrs, name=base.name, domain=POLYKIT_DOMAIN)


#: single-node activations a GroupNormNHWC absorbs: op type -> its `activation` value
_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}


def norm_activation_nodes(graph: Graph, out: str, readers: dict[str, list[Node]],
                          fixed: set[str]) -> tuple[str, list[Node]] | None:
    """(activation, its nodes: the last writes the result) when the readers of `out` (a norm's
    output) are exactly one activation of NORM_ACTIVATIONS; None otherwise."""
    if out in fixed:
        return None
    found = _single_activation(readers.get(out, []), out) or _silu(graph, readers.get(out, []), out, readers, fixed)
    if found is None:
        return None
    last = found[1][-1].outputs[0]
    y, z = graph.value(out), graph.value(last)
    if y.shape is None or z.shape != y.shape or z.dtype != y.dtype:
        return None
    return found


def _plain(node: Node, op: str) -> bool:
    return node.domain == "" and node.op_type == op and len(node.outputs) == 1


def _single_activation(rs: list[Node], out: str) -> tuple[str, list[Node]] | None:
    if len(rs) != 1 or rs[0].inputs != [out]:
        return None
    node = rs[0]
    if node.domain == "" and node.op_type in _UNARY and len(node.outputs) == 1:
        return _UNARY[node.op_type], [node]
    if _plain(node, "Gelu"):
        approximate = node.attrs.get("approximate", "none")
        approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
        act = {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
        return None if act is None else (act, [node])
    return None


def _silu(graph: Graph, rs: list[Node], out: str, readers: dict[str, list[Node]],
          fixed: set[str]) -> tuple[str, list[Node]] | None:
    """`Mul(out, Sigmoid(out))` (either operand order), the Sigmoid's output read only by the Mul."""
    if len(rs) != 2:
        return None
    sig = next((n for n in rs if _plain(n, "Sigmoid") and n.inputs == [out]), None)
    mul = next((n for n in rs if _plain(n, "Mul")), None)
    if sig is None or mul is None or sig.outputs[0] in fixed or [id(n) for n in readers.get(sig.outputs[0], [])] != [id(mul)]:
        return None
    if sorted(mul.inputs) != sorted([out, sig.outputs[0]]):
        return None
    return "silu", [sig, mul]


def _fuse_norm_activations(graph: Graph, fixed: set[str]) -> bool:
    """Step 5 of the module docstring; True if a norm took an activation."""
    readers = graph.consumers()
    dead: list[Node] = []
    for norm in graph.nodes:
        if (norm.op_type != GROUP_NORM_NHWC or norm.domain != POLYKIT_DOMAIN or len(norm.outputs) != 1
                or norm_activation(norm.attrs) != "none"):
            continue
        found = norm_activation_nodes(graph, norm.outputs[0], readers, fixed)
        if found is None:
            continue
        act, nodes = found
        norm.attrs = {**norm.attrs, "activation": act,
                      "fused_from": list(norm.attrs.get("fused_from") or [norm.name]) + [n.name for n in nodes]}
        norm.outputs = [nodes[-1].outputs[0]]
        dead.extend(nodes)
    graph.remove_nodes(dead)
    return bool(dead)
