"""move_row_transposes: carry Transposes through row-wise ops and views until they meet a partner.

A Transpose that keeps the last axis in place permutes whole rows, and ops that work row by row
commute with it: MatMul / Gemm with a constant 2-D right operand, LayerNormalization and Softmax
over the last axis. Elementwise ops commute with any Transpose, and so does a Reshape (Flatten,
Squeeze, Unsqueeze) that splits or merges only axes the permutation keeps together, in order
(`commute_reshape`). Such a chain of ops is rewritten to compute on the untransposed tensor, so the
Transpose moves to the chain's other end:

1. *Sink*: a Transpose whose readers lead, through such chains (branching allowed), only to
   partners: another Transpose (the two compose into one) or a Q/K/V input of an ai.polykit
   Attention that the chain reaches with perm [0, 2, 1, 3] (fold_attention_layouts, which runs
   next in the layout group, absorbs that as a "bshd" layout), or one it reads through a strided
   view (`q_view` / `k_view` / `v_view`, set by fold_attention_layouts: the pipeline runs this pass
   again after it) that stays one view of the untransposed tensor -- any permutation (torchvision's
   MultiheadAttention: LayerNorm -> Transpose [1, 0, 2] -> packed in-projection read as q, k, v views).
2. *Hoist*: a Transpose reading the end of such a chain (one path, every tensor read once) whose
   source is another Transpose (they compose) or an Attention output that the Transpose, moved up,
   reads with perm [0, 2, 1, 3] (absorbed as out_layout "bshd").

A Gemm (transA=0, constant B and bias) whose output is read by a Reshape that splits only its rows
runs as MatMul + Add over the split rows, so a Transpose of those rows passes it (torchvision's
MultiheadAttention: `Reshape -> Gemm -> Reshape -> Transpose`). A rewrite applies only when it
removes at least one copying Transpose on balance (a Transpose that moves only size-1 dims is a
view and counts zero), so no plan moves more bytes. Static shapes only; kept tensors and graph
outputs keep their names (they are never an intermediate of a chain); a moved Transpose's input
keeps its other readers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node, Value
from polykit.compiler.ops.nn.fused import VIEW_ATTRS, OperandView, ViewError, decode_view, dynamic_view
from polykit.compiler.ops.nn.softmax import SOFTMAX_OPS
from polykit.compiler.passes.cancel_transposes import (cancel_transposes, elementwise, keeps_data_order, perm_of,
                                                       relayout_constant)
from polykit.compiler.passes.fold_attention_layouts import view_of_transposed
from polykit.compiler.passes.rewrite import const, protected, replace_tensor

VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
SWAP_SEQ_HEADS = [0, 2, 1, 3]
ATTENTION_LAYOUTS = ("q_layout", "k_layout", "v_layout")
#: rewrites per call before giving up (each removes at least one Transpose)
MAX_REWRITES = 4096
#: ops one sink or hoist may pass (a bound on the search)
MAX_CHAIN = 64

Shape = tuple[int, ...]
Perm = list[int]


def move_row_transposes(graph: Graph, *, keep: frozenset[str] = frozenset(), attention: bool = True) -> bool:
    """Sink and hoist Transposes to their partners (rules above); True if the graph changed.
    `attention=False` leaves Attention inputs and outputs alone (no fold_attention_layouts after)."""
    fixed = protected(graph, keep)
    changed = False
    for _ in range(MAX_REWRITES):
        if not _one_rewrite(graph, fixed, attention):
            break
        changed = True
    if changed:  # identity results on kept names, pairs the moves made adjacent
        cancel_transposes(graph, keep=keep)
    return changed


def _one_rewrite(graph: Graph, fixed: set[str], attention: bool) -> bool:
    producers, readers = graph.producers(), graph.consumers()
    for t in list(graph.nodes):
        perm = perm_of(graph, t)
        if perm is None or _static(graph, t.inputs[0]) is None or len(perm) != len(_static(graph, t.inputs[0])):
            continue
        ctx = _Ctx(graph, fixed, producers, readers, attention)
        plan = _plan_sink(ctx, t, perm)
        if plan is not None:
            _apply_sink(ctx, t, plan)
            return True
        plan = _plan_hoist(ctx, t, perm)
        if plan is not None:
            _apply_hoist(ctx, t, plan)
            return True
    return False


# ---- reshapes through permutations ------------------------------------------------------------
def commute_reshape(old_in: Shape, old_out: Shape, perm: Perm) -> tuple[Shape, Perm] | None:
    """For `old_in == transpose(new_in, perm)`: (new_out, perm_out) with
    `reshape(old_in, old_out) == transpose(reshape(new_in, new_out), perm_out)`, or None when the
    reshape merges axes the permutation separates or reorders. Size-1 axes may go anywhere."""
    groups = _reshape_groups(old_in, old_out)
    if groups is None:
        return None
    blocks: list[tuple[tuple[int, int], list[int]]] = []
    last = (-1, 0)
    for k, (ins, outs) in enumerate(groups):
        if any(perm[b] != perm[a] + 1 for a, b in zip(ins, ins[1:])):
            return None  # merged axes are not neighbours in this order before the transpose
        last = (perm[ins[0]], 0) if ins else (last[0], k + 1)
        blocks.append((last, outs))
    order = [j for _, outs in sorted(blocks, key=lambda b: b[0]) for j in outs]
    new_out = tuple(old_out[j] for j in order)
    return new_out, [order.index(j) for j in range(len(old_out))]


def _reshape_groups(old_in: Shape, old_out: Shape) -> list[tuple[list[int], list[int]]] | None:
    """Aligned groups (input axes, output axes) of equal size; a size-1 input axis is a group of
    its own, a size-1 output axis opens a group of its own when it starts one."""
    if 0 in old_in or 0 in old_out or int(np.prod(old_in)) != int(np.prod(old_out)):
        return None
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    n, m = len(old_in), len(old_out)
    while i < n or j < m:
        if i < n and old_in[i] == 1:
            groups.append(([i], []))
            i += 1
        elif j < m and old_out[j] == 1:
            groups.append(([], [j]))
            j += 1
        else:
            ins, outs, a, b = [i], [j], old_in[i], old_out[j]
            i, j = i + 1, j + 1
            while a != b:
                if a < b:
                    if old_in[i] == 1:
                        groups.append(([i], []))
                    else:
                        ins.append(i)
                        a *= old_in[i]
                    i += 1
                else:
                    outs.append(j)
                    b *= old_out[j]
                    j += 1
            groups.append((ins, outs))
    return groups


def _inverse(perm: Perm) -> Perm:
    return [int(a) for a in np.argsort(perm)]


def _new_shape(old: Shape, perm: Perm) -> Shape:
    """The shape of `new` where `old == transpose(new, perm)`."""
    return tuple(old[a] for a in _inverse(perm))


# ---- chains -----------------------------------------------------------------------------------
@dataclass
class _Ctx:
    graph: Graph
    fixed: set[str]
    producers: dict[str, Node]
    readers: dict[str, list[Node]]
    attention: bool


@dataclass
class _Step:
    """One link of a chain over old shapes: a view ("view"), an elementwise op ("elementwise"), a
    row-wise op ("rows"), or a Gemm that runs as MatMul + Add over split rows ("gemm_nd")."""
    kind: str
    node: Node | None
    inp: str  # the old tensor the op reads the chain from ("" for a view)
    old_in: Shape
    old_out: Shape


def _static(graph: Graph, name: str) -> Shape | None:
    if not name or name not in graph.values:
        return None
    v = graph.value(name)
    return tuple(v.shape) if v.is_static and v.is_tensor and all(d > 0 for d in v.shape) else None


def _chain_input(ctx: _Ctx, node: Node) -> str | None:
    """The one tensor input `node` carries a transpose through, or None."""
    if node.domain or len(node.outputs) < 1 or _static(ctx.graph, node.outputs[0]) is None:
        return None
    g = ctx.graph
    if node.op_type in VIEW_OPS or node.op_type in ("MatMul", "Gemm", "LayerNormalization") \
            or node.op_type in SOFTMAX_OPS:
        name = node.input(0)
    else:
        live = [n for n in dict.fromkeys(node.inputs) if n and n not in g.initializers]
        name = live[0] if len(live) == 1 else None
    return name if name and _static(g, name) is not None and _kind(ctx, node, name) else None


def _kind(ctx: _Ctx, node: Node, name: str) -> str | None:
    g = ctx.graph
    shape, out = _static(g, name), _static(g, node.outputs[0])
    rank = len(shape)
    if node.op_type in VIEW_OPS:
        return "view" if name not in node.inputs[1:] else None
    if node.op_type in ("MatMul", "Gemm"):
        w = const(g, node.input(1))
        if w is None or w.ndim != 2 or rank < 2:
            return None
        if node.op_type == "MatMul":
            return "rows"
        c = const(g, node.input(2)) if node.input(2) else np.zeros(1, w.dtype)
        n = w.shape[0] if node.attrs.get("transB", 0) else w.shape[1]
        ok = not node.attrs.get("transA", 0) and c is not None and c.size in (1, n) and c.ndim <= 2 \
            and (c.ndim < 2 or c.shape[0] == 1)
        return "rows" if ok else None
    if node.op_type == "LayerNormalization" or node.op_type in SOFTMAX_OPS:
        if int(node.attrs.get("axis", -1)) % rank != rank - 1:
            return None
        extra = [o for o in node.outputs[1:] if o and (ctx.readers.get(o) or o in ctx.fixed)]
        return None if extra or name in node.inputs[1:] else "rows"
    if elementwise(g, node) and len(node.outputs) == 1 and out == shape \
            and all(const(g, n).ndim <= rank for n in node.inputs if n and n in g.initializers):
        return "elementwise"
    return None


def _steps(ctx: _Ctx, start: str, run: list[Node]) -> list[_Step]:
    """The links of `run` (nodes in graph order, the first reading `start`), normalized: a Gemm
    followed by a view that splits its rows runs over the split rows (the view moves before it),
    consecutive views merge, identity views go."""
    g = ctx.graph
    steps: list[_Step] = []
    cur = start
    for node in run:
        old_in, old_out = _static(g, cur), _static(g, node.outputs[0])
        kind = _kind(ctx, node, cur)
        prev = steps[-1] if steps else None
        if kind == "view" and prev is not None and prev.kind == "view":
            prev.old_out = old_out
        elif kind == "view" and prev is not None and prev.node is not None and prev.node.op_type == "Gemm" \
                and prev.kind == "rows" and (rows := _split_rows(old_out, old_in[-1])) is not None:
            k = prev.old_in[-1]
            if len(steps) >= 2 and steps[-2].kind == "view":
                steps[-2].old_out = rows + (k,)
            else:
                steps.insert(-1, _Step("view", None, "", prev.old_in, rows + (k,)))
            prev.kind, prev.old_in, prev.old_out = "gemm_nd", rows + (k,), rows + (old_in[-1],)
            if prev.old_out != old_out:
                steps.append(_Step("view", None, "", prev.old_out, old_out))
        else:
            steps.append(_Step(kind, node, cur, old_in, old_out))
        cur = node.outputs[0]
    return [s for s in steps if s.kind != "view" or s.old_in != s.old_out]


def _split_rows(shape: Shape, n: int) -> Shape | None:
    """The leading dims of `shape` when its trailing dims hold `n` elements (None if none do)."""
    for k in range(len(shape) - 1, 0, -1):
        size = int(np.prod(shape[k:]))
        if size == n:
            return shape[:k]
        if size > n:
            return None
    return None


def _through(step: _Step, perm: Perm, forward: bool) -> Perm | None:
    """The perm on the other side of `step` (after it when `forward`, else before it)."""
    if step.kind == "view":
        got = commute_reshape(step.old_in, step.old_out, perm) if forward else \
            commute_reshape(step.old_out, step.old_in, perm)
        return None if got is None else got[1]
    if step.kind != "elementwise" and perm[-1] != len(perm) - 1:
        return None  # a row-wise op: the transpose must keep the rows whole
    return perm


def _real(perm: Perm, shape: Shape) -> int:
    """1 if a Transpose of `shape` by `perm` copies (moves dims of size > 1), else 0."""
    return 0 if keeps_data_order(perm, shape) else 1


def _movable(ctx: _Ctx, name: str) -> bool:
    """Whether `name`, an intermediate of a chain, may disappear."""
    return name not in ctx.fixed


# ---- sink ------------------------------------------------------------------------------------
@dataclass
class _Branch:
    """A chain run from a tensor (old name) to its end tensor, and what reads that end."""
    steps: list[_Step]
    nodes: list[Node]
    perms: list[Perm]
    end: str
    partners: list[tuple[str, Node, Perm]] = field(default_factory=list)  # (kind, node, composed)
    branches: list["_Branch"] = field(default_factory=list)


def _plan_sink(ctx: _Ctx, t: Node, perm: Perm) -> _Branch | None:
    if t.outputs[0] in ctx.fixed:
        return None
    root = _Branch([], [], [perm], t.outputs[0])
    budget = [MAX_CHAIN]
    if not _grow(ctx, root, budget):
        return None
    gain = _real(perm, _static(ctx.graph, t.inputs[0])) + _partner_gain(ctx, root)
    if gain < 1 or not root.branches:
        return None  # no copy saved, or nothing passed (rule 1 of cancel_transposes, fold_attention_layouts)
    return root


def _grow(ctx: _Ctx, branch: _Branch, budget: list[int]) -> bool:
    """Fill `branch`'s partners and sub-branches from the readers of its end; False if a reader
    is neither."""
    g, end, perm = ctx.graph, branch.end, branch.perms[-1]
    users = ctx.readers.get(end, [])
    if not users or end in ctx.fixed:
        return False
    for user in {id(u): u for u in users}.values():
        z = perm_of(g, user)
        if z is not None:
            if len(z) != len(perm) or _feeds_selection(ctx, user.outputs[0]):
                return False
            branch.partners.append(("transpose", user, [perm[i] for i in z]))
            continue
        if user.domain == POLYKIT_DOMAIN and user.op_type == "Attention":
            if _attention_reads(ctx, user, end, perm):
                branch.partners.append(("attention", user, perm))
            elif _view_reads(ctx, user, end, perm) is not None:
                branch.partners.append(("view", user, perm))
            else:
                return False
            continue
        sub = _run_down(ctx, end, user, perm, budget)
        if sub is None or not _grow(ctx, sub, budget):
            return False
        branch.branches.append(sub)
    return True


def _feeds_selection(ctx: _Ctx, name: str) -> bool:
    """Whether `name` is read, through views, by a window selection (Gather, Slice, Split):
    fuse_movement folds the Transpose making `name` into those selections, and composes the
    transposes after them too while the selections permute nothing; a permutation composed
    into that Transpose would cost the copies of those later transposes."""
    todo, seen = [name], set()
    while todo:
        cur = todo.pop()
        for user in ctx.readers.get(cur, []):
            if not user.domain and user.op_type in ("Gather", "Slice", "Split"):
                return True
            if not user.domain and user.op_type in VIEW_OPS and user.outputs[0] not in seen:
                seen.add(user.outputs[0])
                todo.append(user.outputs[0])
    return False


def _attention_reads(ctx: _Ctx, att: Node, name: str, perm: Perm) -> bool:
    slots = [i for i, n in enumerate(att.inputs) if n == name]
    return ctx.attention and perm == SWAP_SEQ_HEADS and all(i < 3 for i in slots) \
        and all(att.attrs.get(ATTENTION_LAYOUTS[i], "bhsd") == "bhsd" and att.attrs.get(VIEW_ATTRS[i]) is None
                for i in slots)


def _view_reads(ctx: _Ctx, att: Node, name: str, perm: Perm) -> list[tuple[int, OperandView]] | None:
    """(slot, its view of the untransposed tensor) of every read of `name` (`transpose(new, perm)`)
    by Attention `att`, when each is a Q/K/V read through a static view attribute that stays one
    view (fold_attention_layouts.view_of_transposed); else None."""
    slots = [i for i, n in enumerate(att.inputs) if n == name]
    raws = [att.attrs.get(VIEW_ATTRS[i]) if i < 3 else None for i in slots]
    shape = _static(ctx.graph, name)
    if not ctx.attention or shape is None or any(raw is None or dynamic_view(raw) for raw in raws):
        return None
    out = []
    for i, raw in zip(slots, raws):
        try:
            moved = view_of_transposed(decode_view(raw, shape), shape, perm)
        except ViewError:
            return None
        if moved is None:
            return None
        out.append((i, moved))
    return out


def _run_down(ctx: _Ctx, start: str, first: Node, perm: Perm, budget: list[int]) -> _Branch | None:
    """The run of chain ops from `first` on while each output has one reader that continues it."""
    if _chain_input(ctx, first) != start:
        return None
    run = [first]
    while True:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        out = run[-1].outputs[0]
        users = ctx.readers.get(out, [])
        if len(users) != 1 or not _movable(ctx, out) or _chain_input(ctx, users[0]) != out:
            break
        run.append(users[0])
    steps = _steps(ctx, start, run)
    perms = [perm]
    for step in steps:
        nxt = _through(step, perms[-1], forward=True)
        if nxt is None:
            return None
        perms.append(nxt)
    return _Branch(steps, run, perms, run[-1].outputs[0])


def _partner_gain(ctx: _Ctx, branch: _Branch) -> int:
    gain = 0
    old = _static(ctx.graph, branch.end)
    for kind, node, composed in branch.partners:
        if kind == "transpose":
            gain += _real(perm_of(ctx.graph, node), old) - _real(composed, _new_shape(old, branch.perms[-1]))
    return gain + sum(_partner_gain(ctx, b) for b in branch.branches)


def _apply_sink(ctx: _Ctx, t: Node, root: _Branch) -> None:
    dead: list[Node] = [t]
    _emit(ctx, root, t.inputs[0], dead)
    ctx.graph.remove_nodes(dead)


def _emit(ctx: _Ctx, branch: _Branch, new_in: str, dead: list[Node]) -> None:
    g = ctx.graph
    new_end = _rewrite(ctx, branch.steps, branch.perms, new_in, None)
    dead.extend(branch.nodes)
    for kind, node, composed in branch.partners:
        if kind == "attention":
            heads = g.fresh_name(f"{branch.end}_bshd")
            g.set_value(Value(heads, g.value(branch.end).dtype, g.value(branch.end).shape))
            g.nodes.append(Node("Transpose", [new_end], [heads], {"perm": list(SWAP_SEQ_HEADS)},
                                name=g.fresh_name(f"{node.name}_heads")))
            node.inputs = [heads if n == branch.end else n for n in node.inputs]
        elif kind == "view":
            for i, view in _view_reads(ctx, node, branch.end, composed) or ():
                node.inputs[i] = new_end
                node.attrs[VIEW_ATTRS[i]] = view.encode()
        elif composed == list(range(len(composed))) and node.outputs[0] not in ctx.fixed:
            replace_tensor(g, node.outputs[0], new_end)
            dead.append(node)
        else:
            node.inputs = [new_end]
            node.attrs = {**node.attrs, "perm": composed}
    for sub in branch.branches:
        _emit(ctx, sub, new_end, dead)


# ---- hoist -----------------------------------------------------------------------------------
@dataclass
class _Hoist:
    source: Node
    steps: list[_Step]
    nodes: list[Node]
    perms: list[Perm]


def _plan_hoist(ctx: _Ctx, t: Node, perm: Perm) -> _Hoist | None:
    g = ctx.graph
    cur, run = t.inputs[0], []
    while True:
        if not _movable(ctx, cur) or len(ctx.readers.get(cur, [])) != 1 or len(run) > MAX_CHAIN:
            return None
        node = ctx.producers.get(cur)
        if node is None:
            return None
        if perm_of(g, node) is not None or (node.domain == POLYKIT_DOMAIN and node.op_type == "Attention"
                                           and node.outputs[0] == cur):
            break
        name = _chain_input(ctx, node)
        if name is None:
            return None
        run.insert(0, node)
        cur = name
    if not run:
        return None
    steps = _steps(ctx, cur, run)
    perms = [_inverse(perm)]  # the chain's end is transpose(new end, perm^-1)
    for step in reversed(steps):
        nxt = _through(step, perms[0], forward=False)
        if nxt is None:
            return None
        perms.insert(0, nxt)
    top = _inverse(perms[0])  # new top = transpose(old top, top)
    gain = _real(perm, _static(g, t.inputs[0]))
    if perm_of(g, node) is not None:
        s = perm_of(g, node)
        shape = _static(g, node.inputs[0])
        if shape is None or len(s) != len(top):
            return None
        gain += _real(s, shape) - _real([s[i] for i in top], shape)
    elif not (ctx.attention and top == SWAP_SEQ_HEADS and node.attrs.get("out_layout", "bhsd") == "bhsd"):
        return None
    return _Hoist(node, steps, run, perms) if gain >= 1 else None


def _apply_hoist(ctx: _Ctx, t: Node, plan: _Hoist) -> None:
    g, source = ctx.graph, plan.source
    top = _inverse(plan.perms[0])
    s = perm_of(g, source)
    dead = [t, *plan.nodes]
    if s is None:  # an Attention output: fold_attention_layouts takes the [0, 2, 1, 3]
        new_top = _transpose(g, source.outputs[0], top, f"{source.name}_heads")
    elif (composed := [s[i] for i in top]) == list(range(len(composed))):
        new_top = source.inputs[0]
        dead.append(source)
    else:
        new_top = _transpose(g, source.inputs[0], composed, source.name)
        dead.append(source)
    g.remove_nodes(dead)
    _rewrite(ctx, plan.steps, plan.perms, new_top, t.outputs[0])


def _transpose(g: Graph, name: str, perm: Perm, base: str) -> str:
    out = g.fresh_name(f"{name}_t")
    old = _static(g, name)
    g.set_value(Value(out, g.value(name).dtype, tuple(old[p] for p in perm)))
    g.nodes.append(Node("Transpose", [name], [out], {"perm": list(perm)}, name=g.fresh_name(base)))
    return out


# ---- rewriting a chain -----------------------------------------------------------------------
def _rewrite(ctx: _Ctx, steps: list[_Step], perms: list[Perm], new_in: str, final: str | None) -> str:
    """Emit `steps` over the new layout from `new_in` (`perms[i]`: old == transpose(new, perms[i])
    before step i); the last output is named `final` if given. Returns the new end tensor."""
    g = ctx.graph
    cur = new_in
    dtype = g.value(new_in).dtype
    for i, step in enumerate(steps):
        shape = _new_shape(step.old_out, perms[i + 1])
        out = final if final is not None and i == len(steps) - 1 else g.fresh_name(f"{cur}_r")
        base = step.node.name if step.node is not None else cur
        if step.node is not None and step.kind != "view":
            dtype = g.value(step.node.outputs[0]).dtype
        if step.kind == "view":
            target = g.add_initializer(np.array(shape, np.int64), f"{base}_shape")
            g.nodes.append(Node("Reshape", [cur, target], [out], {}, name=g.fresh_name(f"{base}_view")))
        elif step.kind == "gemm_nd":
            _matmul_bias(g, step.node, cur, out, shape, dtype)
        else:
            node = step.node
            inverse = _inverse(perms[i])
            inputs = [cur if n == step.inp else relayout_constant(g, n, inverse)
                      if step.kind == "elementwise" and n in g.initializers else n for n in node.inputs]
            g.nodes.append(Node(node.op_type, inputs, [out], dict(node.attrs), name=g.fresh_name(node.name),
                                domain=node.domain))
        g.set_value(Value(out, dtype, shape))
        cur = out
    return cur


def _matmul_bias(g: Graph, gemm: Node, name: str, out: str, shape: Shape, dtype) -> None:
    """Gemm(name, B, C) over rows of any rank: MatMul(name, alpha * op(B)) + beta * C."""
    w = const(g, gemm.input(1))
    alpha, beta = float(gemm.attrs.get("alpha", 1.0)), float(gemm.attrs.get("beta", 1.0))
    weight = w.T if gemm.attrs.get("transB", 0) else w
    if alpha != 1.0:
        weight = weight * np.asarray(alpha, w.dtype)
    b = gemm.input(1) if weight is w else g.add_initializer(np.ascontiguousarray(weight).astype(w.dtype),
                                                             f"{gemm.input(1)}_rows")
    if not gemm.input(2):
        g.nodes.append(Node("MatMul", [name, b], [out], {}, name=g.fresh_name(gemm.name)))
        return
    product = g.fresh_name(f"{out}_matmul")
    g.set_value(Value(product, dtype, shape))
    c = const(g, gemm.input(2)).reshape(-1)
    bias = np.broadcast_to(c * np.asarray(beta, c.dtype) if beta != 1.0 else c, (shape[-1],))
    g.nodes.append(Node("MatMul", [name, b], [product], {}, name=g.fresh_name(gemm.name)))
    g.nodes.append(Node("Add", [product, g.add_initializer(np.ascontiguousarray(bias), f"{gemm.input(2)}_rows")],
                        [out], {}, name=g.fresh_name(f"{gemm.name}_bias")))
