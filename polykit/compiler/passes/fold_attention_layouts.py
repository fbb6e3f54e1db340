"""fold_attention_layouts: let ai.polykit Attention read and write [B, S, H, D] directly, and
read Q, K and V as strided views of the tensor they were selected from.

First, K and V whose heads an exporter repeated for grouped-query attention (Unsqueeze -> Expand
or Tile -> Reshape) are read un-repeated with `kv_groups` (fold_kv_repeat.py).

A Transpose(perm [0, 2, 1, 3]) that feeds Q, K or V of an Attention (rank 4) is absorbed:
the Attention reads the Transpose's input and records that layout (`q_layout` / `k_layout` /
`v_layout` = "bshd"). An Attention output read by exactly one such Transpose (and by nothing
else; not a kept tensor) writes that Transpose's output instead (`out_layout` "bshd"); a Transpose
that only also moves size-1 dims (torchvision's MultiheadAttention: [1, H, S, D] -> [S, 1, H, D])
becomes a Reshape (a view) of the "bshd" output. In a
BERT-style block this removes the four head transposes per layer; the Reshapes that split
and merge the heads are views (no copy) already.

Then each input of an Attention that is (through Reshape / Flatten / Squeeze / Unsqueeze views)
a selection of another tensor -- a Transpose, a Gather of a constant scalar or of a constant
arithmetic run, a Slice with constant positive steps, an output of a Split, a PermutedCopy that
rolls nothing -- is read from that tensor directly through an element-stride view (`q_view` /
`k_view` / `v_view`: offset, logical shape, strides; the head axis contiguous), composed from the
chain's ops (a Reshape composes when it only splits or merges axes that are contiguous with each
other, numpy's no-copy rule). The packed QKV projection of ViT, DeiT, Swin and GPT-2
([.., S, 3, H, D], [S, B, 3E], unbind, split) so feeds Attention with no copy; the selections go
when nothing else reads them. Over a source of dynamic outer dims (a profile build's [B, S, 3E]
projection) the view's entries that depend on them are expressions of the source's dims (`#k`:
offset E, shape [#0, H, #1, D], strides [3E #1, D, 3E, 1]), composed with those dims as symbols
(`_symbolic_view`: a cut or a merge of a dynamic dim is refused) and evaluated at the bound shape by
whoever reads the view. Format: docs/FUSION.md.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ir.symbolic import SymInt, evaluate, expr_to_json, symbol, term_of
from polykit.compiler.ops.nn.fused import AXIS_SYMBOL, VIEW_ATTRS, OperandView, ViewError, decode_view, dense_strides
from polykit.compiler.ops.tensor.permuted_copy import PERMUTED_COPY, copy_spec
from polykit.compiler.passes.cancel_transposes import perm_of
from polykit.compiler.passes.fold_kv_repeat import fold_kv_repeat
from polykit.compiler.passes.fuse_movement import VIEW_OPS, selection
from polykit.compiler.passes.recognize_roll import slice_axes, static_shape
from polykit.compiler.passes.rewrite import const, protected

SWAP_SEQ_HEADS = [0, 2, 1, 3]
INPUT_LAYOUTS = ("q_layout", "k_layout", "v_layout")


def fold_attention_layouts(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Absorb head transposes into Attention layouts; True if the graph changed."""
    fixed = protected(graph, keep)
    producers, readers = graph.producers(), graph.consumers()
    changed = False
    for node in graph.nodes:
        if node.op_type != "Attention" or node.domain != POLYKIT_DOMAIN:
            continue
        changed |= fold_kv_repeat(graph, node, producers, readers, fixed)
        for i, attr in enumerate(INPUT_LAYOUTS):
            if node.attrs.get(attr, "bhsd") != "bhsd":
                continue
            src = producers.get(node.input(i))
            if src is not None and perm_of(graph, src) == SWAP_SEQ_HEADS:
                node.inputs[i] = src.inputs[0]
                node.attrs[attr] = "bshd"
                changed = True
        out = node.outputs[0]
        users = readers.get(out, [])
        if node.attrs.get("out_layout", "bhsd") != "bhsd" or out in fixed or len(users) != 1:
            continue
        transpose, shape = users[0], graph.value(out).shape
        perm = perm_of(graph, transpose)
        if perm == SWAP_SEQ_HEADS or (shape is not None and _swaps_heads(perm, len(shape))):
            graph.nodes.remove(transpose)
            node.outputs[0] = transpose.outputs[0]
            node.attrs["out_layout"] = "bshd"
            changed = True
        elif perm is not None and shape is not None and len(perm) == 4 and all(type(d) is int for d in shape) \
                and _moved(perm, shape) == _moved(SWAP_SEQ_HEADS, shape):
            # the same bytes as [B, S, H, D] (only size-1 dims placed elsewhere): write bshd, then a view
            bshd = graph.fresh_name(f"{out}_bshd")
            target = graph.fresh_name(f"{transpose.name}_shape")
            graph.initializers[target] = np.array([shape[p] for p in perm], np.int64)
            node.outputs[0] = bshd
            node.attrs["out_layout"] = "bshd"
            graph.nodes[graph.nodes.index(transpose)] = Node("Reshape", [bshd, target], list(transpose.outputs), {},
                                                             name=transpose.name)
            changed = True
        else:
            changed |= _fold_batch_merge(graph, node, transpose, readers, fixed)
    for node in graph.nodes:
        if node.op_type == "Attention" and node.domain == POLYKIT_DOMAIN:
            for i in range(3):
                changed |= _fold_view(graph, node, i, producers)
    return changed


def _swaps_heads(perm: list[int] | None, rank: int) -> bool:
    """perm swaps axes -3 and -2 (heads and sequence) of a rank `rank` tensor and keeps the rest."""
    return perm is not None and rank >= 4 and list(perm) == list(range(rank - 3)) + [rank - 2, rank - 3, rank - 1]


def _fold_batch_merge(graph: Graph, node: Node, view: Node, readers, fixed) -> bool:
    """An Attention output read only by a Reshape that merges or splits its batch dims (the last
    three kept), itself read only by a Transpose swapping heads and sequence -> the Attention writes
    "bshd" and the Reshape views that as the Transpose's output (the windowed attention's
    [B, W, H, S, D] output merged to [B*W, H, S, D] and transposed to [B*W, S, H, D]). True if folded."""
    out = node.outputs[0]
    shape, mid = static_shape(graph, out), static_shape(graph, view.outputs[0]) if view.outputs else None
    users = readers.get(view.outputs[0], []) if view.outputs else []
    if view.op_type not in VIEW_OPS or view.domain or shape is None or mid is None or len(shape) < 4 or len(mid) < 4 \
            or tuple(mid[-3:]) != tuple(shape[-3:]) or view.outputs[0] in fixed or len(users) != 1:
        return False
    transpose = users[0]
    if transpose.op_type != "Transpose" or not _swaps_heads(perm_of(graph, transpose), len(mid)):
        return False
    target = graph.fresh_name(f"{transpose.name}_shape")
    graph.initializers[target] = np.array(list(mid[:-3]) + [mid[-2], mid[-3], mid[-1]], np.int64)
    node.outputs[0] = graph.fresh_name(f"{out}_bshd")
    node.attrs["out_layout"] = "bshd"
    graph.nodes.remove(view)
    graph.nodes[graph.nodes.index(transpose)] = Node("Reshape", [node.outputs[0], target], list(transpose.outputs), {},
                                                     name=transpose.name)
    return True


# ---- strided views --------------------------------------------------------------------------
#: A step of a chain: ("reshape", shape) | ("transpose", perm) | ("slice", axis, first, count, step)
#: | ("select", axis, index)
Step = tuple
#: Movement ops whose output a view of their input can stand for
COPYING = frozenset({"Transpose", "Gather", "Slice", "Split", PERMUTED_COPY})
#: producers followed back from an Attention input at most
MAX_CHAIN = 16
#: largest source (elements) whose chain is traced element by element when the steps do not compose
MAX_TRACED = 1 << 22


def _apply(view: OperandView, step: Step) -> OperandView | None:
    """`view` after one step, None when the result is no single strided view (a reshape that
    merges axes that are not contiguous with each other)."""
    off, shape, st = view.offset, list(view.shape), list(view.strides)
    kind = step[0]
    if kind == "transpose":
        return OperandView(off, tuple(shape[p] for p in step[1]), tuple(st[p] for p in step[1]))
    if kind == "slice":
        _, a, first, count, stride = step
        shape[a], st[a] = count, st[a] * stride
        return OperandView(off + first * view.strides[a], tuple(shape), tuple(st))
    if kind == "select":
        _, a, k = step
        return OperandView(off + k * st[a], tuple(shape[:a] + shape[a + 1:]), tuple(st[:a] + st[a + 1:]))
    strides = _reshape_strides(shape, st, list(step[1]))
    return None if strides is None else OperandView(off, tuple(step[1]), strides)


def _reshape_strides(old: list[int], old_st: list[int], new: list[int]) -> tuple[int, ...] | None:
    """Strides of `new` over the elements a view (`old`, `old_st`) holds, in row-major order,
    or None when some new axis spans old axes that are not contiguous with each other."""
    if int(np.prod(old)) != int(np.prod(new)) or 0 in old:
        return None
    dims = [(d, s) for d, s in zip(old, old_st) if not _unit(d)]
    out = [0] * len(new)
    oi = 0
    ni = 0
    while ni < len(new):
        if _unit(new[ni]):
            ni += 1
            continue
        # the new axes ni..nj and old axes oi..oj that hold the same elements
        nj, oj = ni + 1, oi + 1
        n_el, o_el = new[ni], dims[oi][0]
        while n_el != o_el:
            if n_el < o_el:
                n_el *= new[nj]
                nj += 1
            else:
                o_el *= dims[oj][0]
                oj += 1
        if (isinstance(n_el, SymInt) or isinstance(o_el, SymInt)) and term_of(n_el) != term_of(o_el):
            return None  # equal at opt only
        if any(dims[k][1] != dims[k + 1][0] * dims[k + 1][1] for k in range(oi, oj - 1)):
            return None
        acc = dims[oj - 1][1]
        for k in range(nj - 1, ni - 1, -1):
            out[k] = 0 if _unit(new[k]) else acc
            acc *= new[k]
        ni, oi = nj, oj
    return tuple(out)


def _unit(d) -> bool:
    """A static dim of 1 (a dynamic dim is never taken for one, whatever its opt value)."""
    return not isinstance(d, SymInt) and d == 1


def view_of_transposed(view: OperandView, shape: tuple[int, ...], perm: list[int]) -> OperandView | None:
    """`view` reads a tensor of static `shape` that is `transpose(src, perm)`: the same elements as
    a view of `src`, or None when that is no single strided view (a view axis whose steps carry
    from one axis of `shape` into the next) or its head axis is not contiguous in `src`."""
    full = [int(np.prod(shape[a + 1:], dtype=np.int64)) for a in range(len(shape))]
    src_shape = [shape[a] for a in np.argsort(perm)]
    src_full = [int(np.prod(src_shape[p + 1:], dtype=np.int64)) for p in range(len(src_shape))]
    if view.last_element() >= int(np.prod(shape, dtype=np.int64)):
        return None
    reach = [(view.offset // full[a]) % shape[a] for a in range(len(shape))]  # the offset's index per axis
    offset = sum(i * src_full[perm[a]] for a, i in enumerate(reach))
    strides = []
    for d, s in zip(view.shape, view.strides):
        if d == 1 or s == 0:
            strides.append(0)
            continue
        # the outermost axis of more than one element whose steps make up s (then no step carries)
        a = next((a for a in range(len(shape)) if shape[a] > 1 and s % full[a] == 0), None)
        if a is None:
            return None
        reach[a] += (s // full[a]) * (d - 1)
        strides.append((s // full[a]) * src_full[perm[a]])
    if any(r >= n for r, n in zip(reach, shape)) or (view.shape[-1] != 1 and strides[-1] != 1):
        return None
    return OperandView(offset, view.shape, tuple(strides))


def _traced(shape: tuple[int, ...], steps: list[Step]) -> OperandView | None:
    """The view a chain amounts to, found by running it on the source's element numbers: a
    reshape that merges axes it later splits again (torchvision's [S, B, E] -> [S, B*H, D] ->
    [B*H, S, D] -> [B, H, S, D]) composes though its middle is no strided view. None when the
    result is not offset + sum(i * strides) with strides >= 0."""
    idx = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    for step in steps:
        if step[0] == "reshape":
            idx = idx.reshape(step[1])
        elif step[0] == "transpose":
            idx = idx.transpose(step[1])
        elif step[0] == "slice":
            _, a, first, count, stride = step
            idx = idx[(slice(None),) * a + (slice(first, first + (count - 1) * stride + 1, stride),)]
        else:
            idx = np.take(idx, step[2], axis=step[1])
    if idx.ndim == 0 or idx.size == 0:
        return None
    offset = int(idx.reshape(-1)[0])
    strides = tuple(int(idx[(0,) * a + (1,) + (0,) * (idx.ndim - a - 1)]) - offset if d > 1 else 0
                    for a, d in enumerate(idx.shape))
    if any(s < 0 for s in strides):
        return None
    fitted = np.full(idx.shape, offset, np.int64)
    for a, s in enumerate(strides):
        fitted += (np.arange(idx.shape[a], dtype=np.int64) * s).reshape((-1,) + (1,) * (idx.ndim - a - 1))
    return OperandView(offset, tuple(idx.shape), strides) if np.array_equal(fitted, idx) else None


def _steps(graph: Graph, node: Node, out: str, shape_of=static_shape) -> list[Step] | None:
    """The view steps that turn node's input into its output `out`, None when the node is no view
    of its input. `shape_of` gives the shapes: static_shape, or `_dims` (SymInts kept: a
    selection then must cut a static axis)."""
    shape = shape_of(graph, node.input(0)) if node.inputs and node.input(0) else None
    out_shape = shape_of(graph, out)
    if shape is None or out_shape is None:
        return None
    steps = _view_steps(graph, node, out, shape, out_shape)
    if steps is None or shape_of is static_shape:
        return steps
    if any(st[0] in ("slice", "select") and type(shape[st[1]]) is not int for st in steps):
        return None  # a cut of a dynamic axis: its count was found at opt
    kept = {d.expr for d in out_shape if isinstance(d, SymInt)}
    if node.op_type not in VIEW_OPS and node.op_type != "Transpose" \
            and any(isinstance(d, SymInt) and d.expr not in kept for d in shape):
        return None  # a selection that made a dynamic dim static (a Slice whose end met it at opt)
    return steps


def _view_steps(graph: Graph, node: Node, out: str, shape: tuple, out_shape: tuple) -> list[Step] | None:
    if node.domain == POLYKIT_DOMAIN and node.op_type == PERMUTED_COPY:
        try:
            spec = copy_spec(node.attrs, shape)
        except ValueError:
            return None
        if any(spec.out_shifts) or any(s + w > d for s, w, d in zip(spec.starts, spec.window, shape)):
            return None  # a roll
        cuts = [("slice", a, s, w, 1) for a, (s, w, d) in enumerate(zip(spec.starts, spec.window, shape)) if w != d]
        return cuts + [("reshape", spec.view), ("transpose", spec.perm), ("reshape", spec.shape)]
    if node.domain:
        return None
    if node.op_type in VIEW_OPS:
        return [("reshape", out_shape)]
    if node.op_type == "Transpose":
        perm = perm_of(graph, node)
        return None if perm is None else [("transpose", tuple(perm))]
    if node.op_type == "Gather" and len(node.inputs) == 2:
        index = const(graph, node.input(1))
        axis = int(node.attrs.get("axis", 0))
        axis = axis + len(shape) if axis < 0 else axis
        if index is not None and index.ndim == 1 and index.size >= 1 and index.dtype.kind in "iu" \
                and 0 <= axis < len(shape):
            ks = [int(k) + shape[axis] if k < 0 else int(k) for k in index]
            step = ks[1] - ks[0] if len(ks) > 1 else 1
            if step >= 1 and ks == list(range(ks[0], ks[0] + step * len(ks), step)) and 0 <= ks[0] and ks[-1] < shape[axis]:
                return [("slice", axis, ks[0], len(ks), step)]
            return None
    if node.op_type == "Split" and "split" in node.attrs and len(node.inputs) < 2:
        axis = int(node.attrs.get("axis", 0)) % len(shape)
        sizes = [int(v) for v in node.attrs["split"]]
        if sum(sizes) != shape[axis] or len(sizes) != len(node.outputs):
            return None
        k = node.outputs.index(out)
        return [("slice", axis, sum(sizes[:k]), sizes[k], 1)]
    if node.op_type == "Slice":
        cut = _slice_cut(graph, node, shape)
        if cut is not None:
            return cut
    sel = selection(graph, node, shape)
    if sel is None:
        return None
    axis, ranges = sel
    first, count = ranges[node.outputs.index(out)] if node.op_type == "Split" else ranges[0]
    if node.op_type == "Gather":
        return [("select", axis, first)]
    return [("slice", axis, first, count, 1)]


def _slice_cut(graph: Graph, node: Node, shape: tuple[int, ...]) -> list[Step] | None:
    """A constant Slice with positive steps as slice steps (None otherwise)."""
    cut = slice_axes(graph, node, shape)
    if cut is None:
        return None
    return [("slice", a, lo, count, st) for a, (lo, st, count) in enumerate(cut) if (lo, st, count) != (0, 1, shape[a])]


def _fold_view(graph: Graph, node: Node, i: int, producers: dict[str, Node]) -> bool:
    """Attention input i read through a view of the tensor it was selected from; True if folded."""
    if node.attrs.get(VIEW_ATTRS[i]) is not None:
        return False
    chain: list[tuple[str, list[Step], bool]] = []  # (the step's input, its steps, copies) from the Attention back
    name = node.input(i)
    dynamic = static_shape(graph, name) is None
    while len(chain) < MAX_CHAIN:
        src = producers.get(name)
        if src is None or not src.inputs or src.input(0) in ("",):
            break
        steps = _steps(graph, src, name, _dims if dynamic else static_shape)
        if steps is None:
            break
        chain.append((src.input(0), steps, src.op_type in COPYING))
        name = src.input(0)
    layout = node.attrs.get(INPUT_LAYOUTS[i], "bhsd")
    final: list[Step] = [("transpose", (0, 2, 1, 3))] if layout == "bshd" else []
    # the farthest source whose chain composes, as long as a copy lies on the way
    for depth in range(len(chain), 0, -1):
        if not any(copies for _, _, copies in chain[:depth]):
            break
        root = chain[depth - 1][0]
        shape = static_shape(graph, root)
        steps = [step for _, part, _ in reversed(chain[:depth]) for step in part] + final
        if dynamic:  # the chain's shapes hold SymInts: only a source of dynamic shape composes them
            dims = _dims(graph, root)
            raw = None if shape is not None or dims is None else _symbolic_view(dims, steps)
            if raw is not None:
                node.attrs[VIEW_ATTRS[i]] = raw
                node.attrs.pop(INPUT_LAYOUTS[i], None)
                node.inputs[i] = root
                return True
            continue
        if shape is None or 0 in shape:
            continue
        view: OperandView | None = OperandView(0, shape, dense_strides(shape))
        for step in steps:
            view = _apply(view, step) if view is not None else None
        if view is None and int(np.prod(shape)) <= MAX_TRACED:
            view = _traced(shape, steps)
        if view is None or len(view.shape) < 2 or (view.shape[-1] != 1 and view.strides[-1] != 1):
            continue
        strides = tuple(0 if d == 1 else s for d, s in zip(view.shape, view.strides))
        node.attrs[VIEW_ATTRS[i]] = OperandView(view.offset, view.shape, strides).encode()
        node.attrs.pop(INPUT_LAYOUTS[i], None)
        node.inputs[i] = root
        return True
    return False


def _dims(graph: Graph, name: str) -> tuple[int, ...] | None:
    """`name`'s shape, dynamic dims as their SymInts."""
    shape = graph.value(name).shape
    if shape is None or not all(isinstance(d, (int, np.integer)) for d in shape):
        return None
    return tuple(shape)


def _symbolic_view(shape: tuple[int, ...], steps: list[Step]) -> list | None:
    """The view attribute of `steps` over a source of dynamic `shape`: entries that depend on a
    dynamic dim are expressions of the source's dims `#k` (ops/nn/fused.decode_view), found by
    composing the steps with those dims as symbols, so the run's bound shape gives the view. None
    when a dynamic dim on the way is no source dim (a merge of two: a product a reshape may later
    split), two source dims share one expression, the steps do not compose, or the view does not
    hold at two small shapes (checked against the steps traced on element numbers there)."""
    names: dict = {}
    src: list = []
    for k, d in enumerate(shape):
        if isinstance(d, SymInt):
            if d.expr in names or int(d) < 2:
                return None
            names[d.expr] = SymInt(int(d), symbol(AXIS_SYMBOL.format(k)))
            src.append(names[d.expr])
        else:
            src.append(int(d))
    renamed = [_renamed(step, names) for step in steps]
    if any(step is None for step in renamed):
        return None
    view: OperandView | None = OperandView(0, tuple(src), dense_strides(src))
    for step in renamed:
        view = _apply(view, step) if view is not None else None
    if view is None or len(view.shape) < 2 or (view.shape[-1] != 1 and view.strides[-1] != 1):
        return None
    strides = tuple(0 if _unit(d) else s for d, s in zip(view.shape, view.strides))
    raw = [_entry(v) for v in (view.offset, *view.shape, *strides)]
    axes = {AXIS_SYMBOL.format(k) for k in range(len(shape))}
    if any(isinstance(v, SymInt) and not v.expr.symbols() <= axes for v in (view.offset, *view.shape, *strides)):
        return None
    for small in (2, 3):
        env = {AXIS_SYMBOL.format(k): small + k for k in range(len(shape))}
        at = [_at(d, env) for d in src]
        expect = _traced(tuple(at), [_at_step(step, env) for step in renamed])
        try:
            got = decode_view(raw, tuple(at))
        except ViewError:
            return None
        if expect is None or (got.offset, got.shape, got.strides) != (expect.offset, expect.shape, expect.strides):
            return None
    return raw


def _renamed(step: Step, names: dict) -> Step | None:
    """`step` with its dynamic dims as the source dims they are (None: one is not)."""
    if step[0] != "reshape":
        return step
    dims = [names.get(d.expr) if isinstance(d, SymInt) else int(d) for d in step[1]]
    return None if any(d is None for d in dims) else ("reshape", tuple(dims))


def _at(d, env: dict) -> int:
    return evaluate(d.expr, env) if isinstance(d, SymInt) else int(d)


def _at_step(step: Step, env: dict) -> Step:
    return ("reshape", tuple(_at(d, env) for d in step[1])) if step[0] == "reshape" else step


def _entry(v):
    """A view entry in the attribute form: an int, or the JSON form of its expression."""
    return expr_to_json(v.expr) if isinstance(v, SymInt) else int(v)


def _moved(perm: list[int], shape) -> list[int]:
    """The source axes of a transpose's output in order, size-1 dims left out (equal lists: equal bytes)."""
    return [p for p in perm if shape[p] != 1]
