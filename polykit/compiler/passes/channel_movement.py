"""channel_movement: fewer copies along one axis (ShuffleNet's shuffle, halves and channel pads).

1. `compose_gathers` (layout group, after fold_axis_permutations made channel shuffles Gathers):
   a Slice (constant bounds, any positive step, every other axis whole) or a Gather (constant 1-D
   indices) of the output of a Gather with constant 1-D indices on the same axis is one Gather of
   the first Gather's input with the composed indices. A Gather whose readers all compose so goes
   (the shuffle, then two channel halves: two Gathers of half the bytes each); one with another
   reader stays for it.
2. `pad_into_producers` (after the epilogues are fused): a zero-cost reader ("don't care" channels)
   lets the producer write the padded width. A Pad of constant mode, constant pads that only
   append `extra` entries at the end of the last axis and a finite value (or none), whose readers
   are all group-1 ConvNHWC layers reading it as X with zero weights on the appended channels
   (to_channels_last's CHANNEL_ALIGN pads), is dropped when its input's producer can write the
   wider tensor itself with finite values in the extra channels (they meet zero weights):
   - a group-1 ConvNHWC: zero weight rows and zero biases appended, so its extra channels compute
     the epilogue of 0; taken only when the epilogue maps 0 to a finite value (EPILOGUE_FINITE_AT_ZERO
     ops, one-element finite constants, no other extra input), else the Pad stays;
   - a depthwise ConvNHWC (group == channels, one output channel each): its input widened the same
     way first (recursively), then zero weights, zero biases and a larger group;
   - a Gather with constant 1-D indices on that axis: index 0 appended (a real, finite value);
   - a constant Slice on that axis: its window grows where its input has room, else it becomes a
     Gather of its channels and as many copies of its first.
   Each tensor on the way must have no other reader and not be kept; the output of a constant Gather
   or Slice that others read too is copied for the Pad alone (a selection reads what it writes).
3. `compose_reformats` (after the precision conversion): Cast -> Transpose (0, 2, 3, 1) -> zero Pad of
   the channels (a convnet's image entry) and Transpose (0, 3, 1, 2) -> Cast (its exit), each part
   optional but the Transpose and one more, with at most MAX_CHANNELS channels on the packed side:
   one ai.polykit Reformat (polykit.compiler.ops.tensor.reformat), one pass over the bytes. First, an
   upcast to float32 of a Resize's float16 / bfloat16 output (read only by the Cast) moves before the
   Resize, so a segmentation model's exit Transpose -> Resize -> Cast becomes Reformat -> Resize: the
   large upsampled tensor is written once, in float32, from unrounded values.
4. `compose_concat_gathers` (after rule 2): a Gather with constant 1-D indices of a Concat's output
   (2 to MAX_SOURCES distinct inputs) along the same axis -> one ai.polykit ConcatGather reading the
   Concat's inputs (polykit.compiler.ops.tensor.concat_gather); the Concat goes when nothing else
   reads it (ShuffleNet: Concat(x1, branch) -> shuffle -> halves is two ConcatGathers).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.tensor.concat_gather import CONCAT_GATHER, MAX_SOURCES
from polykit.compiler.ops.tensor.reformat import FLOATS, MAX_CHANNELS, REFORMAT, TO_NCHW, TO_NHWC
from polykit.compiler.passes.cancel_transposes import perm_of
from polykit.compiler.passes.eliminate_dead_code import eliminate_dead_code
from polykit.compiler.passes.merge_duplicates import merge_duplicates
from polykit.compiler.passes.recognize_roll import slice_axes, static_shape
from polykit.compiler.passes.rewrite import const, protected, replace_tensor

#: epilogue steps that map finite operands to a finite value (so an appended zero channel stays finite)
EPILOGUE_FINITE_AT_ZERO = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh",
                                     "Add", "Sub", "Mul", "Neg", "Abs", "Max", "Min", "Gelu", "Erf", "Identity",
                                     "Cast", "Elu", "Selu", "Celu", "Softplus", "Softsign", "Exp", "Sin", "Cos"})
#: how deep `pad_into_producers` follows producers (depthwise layers, then their producers)
MAX_DEPTH = 8


# ---- 1: gathers of gathers ------------------------------------------------------------------------
def constant_gather(graph: Graph, node: Node | None) -> tuple[int, np.ndarray] | None:
    """(axis, indices as int64 in [0, dim)) of a Gather with constant 1-D indices over a static
    axis, or None."""
    if node is None or node.domain or node.op_type != "Gather" or len(node.inputs) != 2:
        return None
    idx, shape = const(graph, node.input(1)), static_shape(graph, node.input(0))
    if idx is None or idx.ndim != 1 or idx.dtype.kind not in "iu" or shape is None:
        return None
    axis = int(node.attrs.get("axis", 0))
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape):
        return None
    dim = shape[axis]
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        return None
    return axis, np.where(idx < 0, idx + dim, idx)


def _picked(graph: Graph, node: Node, axis: int) -> np.ndarray | None:
    """The positions along `axis` of its input that a constant Slice or Gather `node` keeps, in
    order (None if it is neither or cuts another axis)."""
    shape = static_shape(graph, node.input(0)) if node.inputs else None
    if shape is None:
        return None
    if node.op_type == "Gather":
        own = constant_gather(graph, node)
        return own[1] if own is not None and own[0] == axis else None
    cut = slice_axes(graph, node, shape)
    if cut is None or any((lo, step, n) != (0, 1, d) for a, ((lo, step, n), d) in enumerate(zip(cut, shape))
                          if a != axis):
        return None
    lo, step, n = cut[axis]
    return np.arange(lo, lo + step * n, step, dtype=np.int64) if n > 0 else None


def compose_gathers(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Rule 1 above; True if the graph changed."""
    producers = graph.producers()
    changed = False
    for i, node in enumerate(graph.nodes):
        if node.domain or node.op_type not in ("Slice", "Gather") or not node.inputs:
            continue
        src = producers.get(node.input(0))
        table = constant_gather(graph, src)
        picked = None if table is None else _picked(graph, node, table[0])
        if picked is None:
            continue
        axis, idx = table
        indices = graph.add_initializer(idx[picked], f"{node.name}_indices")
        graph.nodes[i] = Node("Gather", [src.input(0), indices], list(node.outputs), {"axis": axis}, name=node.name)
        changed = True
    if changed:  # a Gather all of whose readers composed: nobody reads it now
        eliminate_dead_code(graph, keep=keep)
    return changed


# ---- 2: channel pads written by their producers -------------------------------------------------------
def _end_pad(graph: Graph, pad: Node) -> int | None:
    """How many entries a Pad appends at the end of the last axis of a rank-4 tensor, when
    that is all it does (constant mode, constant pads, a finite value or none); else None."""
    if pad.domain or pad.op_type != "Pad" or (pad.attrs.get("mode", "constant") or "constant") != "constant":
        return None
    shape, pads = graph.value(pad.input(0)).shape, const(graph, pad.input(1))
    if shape is None or len(shape) != 4 or pads is None or pads.size != 8 or pad.input(3):
        return None
    value = const(graph, pad.input(2)) if pad.input(2) else np.zeros(1)
    if value is None or value.size != 1 or not np.all(np.isfinite(value.astype(np.float64))):
        return None
    pads = [int(p) for p in pads.reshape(-1)]
    return pads[7] if pads[7] > 0 and not any(pads[:7]) else None


def _ignores_extra(graph: Graph, node: Node, name: str, width: int) -> bool:
    """A group-1 ConvNHWC reading `name` as X only, with zero weights past channel `width`."""
    if node.domain != POLYKIT_DOMAIN or node.op_type != "ConvNHWC" or node.input(0) != name \
            or name in node.inputs[1:] or int(node.attrs.get("group", 1)) != 1:
        return False
    w = const(graph, node.input(1))
    return w is not None and w.ndim == 4 and not np.any(w[..., width:])


def _finite_epilogue(graph: Graph, node: Node) -> bool:
    """A ConvNHWC's epilogue (if any) maps a zero raw result to a finite value: finite-preserving
    steps, extra inputs only one-element finite constants."""
    epilogue = node.attrs.get("epilogue")
    if not epilogue:
        return True
    for name in node.inputs[3:]:
        value = const(graph, name)
        if value is None or value.size != 1 or not np.all(np.isfinite(value.astype(np.float64))):
            return False
    return all(step.get("op") in EPILOGUE_FINITE_AT_ZERO and not step.get("domain") for step in epilogue["body"])


Edit = Callable[[], None]


class _Widener:
    def __init__(self, graph: Graph, fixed: set[str]):
        self.graph, self.fixed = graph, fixed
        self.producers, self.readers = graph.producers(), graph.consumers()

    def plan(self, name: str, extra: int, reader: Node, depth: int = 0) -> tuple[list[Edit], str] | None:
        """(the edits that give `reader` an `extra` channels wider `name`, finite values there; the
        name it then reads), or None. `name` must be a static rank-4 tensor that only `reader` reads,
        or the output of a constant Gather or Slice, which gets a copy of its own for `reader`."""
        shape = static_shape(self.graph, name)
        node = self.producers.get(name)
        if shape is None or len(shape) != 4 or node is None or name in self.fixed or depth > MAX_DEPTH \
                or len(node.outputs) != 1:
            return None
        shared = len(self.readers.get(name, [])) != 1
        if shared and (node.domain or node.op_type not in ("Gather", "Slice")):
            return None
        if shared:  # a copy of the selection for `reader` alone (it reads what it writes)
            node = Node(node.op_type, list(node.inputs), [self.graph.fresh_name(f"{name}_wide")], dict(node.attrs),
                        name=self.graph.fresh_name(f"{node.name}_wide"))
        wide = shape[:3] + (shape[3] + extra,)
        edits: list[Edit] | None = None
        if node.domain == POLYKIT_DOMAIN and node.op_type == "ConvNHWC":
            edits = self.conv(node, shape[3], extra, depth)
        elif node.domain == "" and node.op_type == "Gather":
            edits = self.gather(node, extra)
        elif node.domain == "" and node.op_type == "Slice":
            edits = self.slice(node, extra)
        if edits is None:
            return None
        out, value = node.outputs[0], self.graph.value(name)
        if shared:
            original = self.producers[name]
            edits.insert(0, lambda: self.graph.nodes.insert(self.graph.nodes.index(original) + 1, node))
        return edits + [lambda: self.graph.values.__setitem__(out, value.with_(name=out, shape=wide))], out

    def conv(self, node: Node, channels: int, extra: int, depth: int) -> list[Edit] | None:
        g = self.graph
        w, b = const(g, node.input(1)), const(g, node.input(2)) if node.input(2) else None
        group = int(node.attrs.get("group", 1))
        if w is None or w.ndim != 4 or w.shape[0] != channels or (node.input(2) and b is None) \
                or not _finite_epilogue(g, node):
            return None
        edits: list[Edit] = []
        source = node.input(0)
        if group != 1:  # depthwise, one output channel per input channel: its input widens too
            if group != channels or w.shape[3] != 1:
                return None
            inner = self.plan(node.input(0), extra, node, depth + 1)
            if inner is None:
                return None
            edits, source = inner
        weight = np.concatenate([w, np.zeros((extra,) + w.shape[1:], w.dtype)])
        bias = None if b is None else np.concatenate([b.reshape(-1), np.zeros(extra, b.dtype)])

        def apply() -> None:
            inputs = list(node.inputs)
            if group != 1:
                inputs[0] = source
            inputs[1] = g.add_initializer(weight, f"{node.input(1)}_wide")
            if bias is not None:
                inputs[2] = g.add_initializer(bias, f"{node.input(2)}_wide")
            node.inputs = inputs
            if group != 1:
                node.attrs = dict(node.attrs, group=group + extra)
        return edits + [apply]

    def gather(self, node: Node, extra: int) -> list[Edit] | None:
        table = constant_gather(self.graph, node)
        if table is None or table[0] != 3:
            return None
        idx = np.concatenate([table[1], np.zeros(extra, np.int64)])  # channel 0: any real value does

        def apply() -> None:
            node.inputs = [node.input(0), self.graph.add_initializer(idx, f"{node.name}_indices")]
        return [apply]

    def slice(self, node: Node, extra: int) -> list[Edit] | None:
        shape = static_shape(self.graph, node.input(0))
        picked = _picked(self.graph, node, 3) if shape is not None and len(shape) == 4 else None
        if picked is None:
            return None
        lo, hi = int(picked[0]), int(picked[-1]) + 1
        g = self.graph
        if hi - lo == picked.size and hi + extra <= shape[3]:  # room in its input: the window grows

            def grow() -> None:
                node.inputs = [node.input(0), g.add_initializer(np.array([lo], np.int64), f"{node.name}_starts"),
                               g.add_initializer(np.array([hi + extra], np.int64), f"{node.name}_ends"),
                               g.add_initializer(np.array([3], np.int64), f"{node.name}_axes")]
            return [grow]
        idx = np.concatenate([picked, np.full(extra, picked[0], np.int64)])  # else a Gather repeating one

        def gather() -> None:
            node.op_type, node.attrs = "Gather", {"axis": 3}
            node.inputs = [node.input(0), g.add_initializer(idx, f"{node.name}_indices")]
        return [gather]


def pad_into_producers(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Rule 2 above; True if any Pad went."""
    fixed = protected(graph, keep)
    changed = False
    for pad in list(graph.nodes):
        extra = _end_pad(graph, pad)
        if extra is None or pad.outputs[0] in fixed:
            continue
        widener = _Widener(graph, fixed)
        width = graph.value(pad.input(0)).shape[3]
        users = widener.readers.get(pad.outputs[0], [])
        if type(width) is not int or not users or not all(_ignores_extra(graph, u, pad.outputs[0], width) for u in users):
            continue
        planned = widener.plan(pad.input(0), extra, pad)
        if planned is None:
            continue
        edits, source = planned
        for edit in edits:
            edit()
        replace_tensor(graph, pad.outputs[0], source)
        graph.remove_nodes([pad])
        changed = True
    if changed:  # the copies made for a shared selection may read and pick alike (one widened, one copied)
        _merge_equal_gathers(graph, fixed)
        merge_duplicates(graph, keep=keep)
    return changed


def _merge_equal_gathers(graph: Graph, fixed: set[str]) -> None:
    """Gathers of one tensor along one axis with equal constant indices: the first one's output serves all."""
    first: dict[tuple, Node] = {}
    dead = []
    for node in graph.nodes:
        table = constant_gather(graph, node)
        if table is None or node.outputs[0] in fixed:
            continue
        key = (node.input(0), table[0], table[1].tobytes())
        if key in first:
            replace_tensor(graph, node.outputs[0], first[key].outputs[0])
            dead.append(node)
        else:
            first[key] = node
    graph.remove_nodes(dead)


# ---- 3: a channels-last chain's entry and exit ------------------------------------------------------
def _float_cast(graph: Graph, node: Node | None) -> bool:
    """A Cast between the float types Reformat converts."""
    if node is None or node.domain or node.op_type != "Cast" or "to" not in node.attrs:
        return False
    src, to = graph.value(node.input(0)).dtype, graph.value(node.outputs[0]).dtype
    return src is not None and to is not None and dtypes.dtype_name(src) in FLOATS \
        and dtypes.dtype_name(to) in FLOATS


def _zero_end_pad(graph: Graph, node: Node) -> int | None:
    extra = _end_pad(graph, node)
    value = const(graph, node.input(2)) if node.input(2) else None
    return extra if extra is not None and (value is None or not np.any(value)) else None


def _reformat_chain(graph: Graph, t: Node, producers: dict, readers: dict, fixed: set[str]) -> list[Node] | None:
    """[Cast ->] t [-> Cast] [-> Pad] (the Cast and the Pad in either order), each tensor between
    read only by the next node and not kept, the packed side at most MAX_CHANNELS: the nodes, when
    more than t."""
    perm = perm_of(graph, t) if not t.domain and t.op_type == "Transpose" else None
    shape = graph.value(t.input(0)).shape
    if perm is None or tuple(perm) not in (TO_NHWC, TO_NCHW) or shape is None or len(shape) != 4:
        return None
    channels = shape[1 if tuple(perm) == TO_NHWC else 3]
    dtype = graph.value(t.input(0)).dtype
    if type(channels) is not int or channels > MAX_CHANNELS or dtype is None \
            or dtypes.dtype_name(dtype) not in FLOATS:  # (a SymInt is an int subclass)
        return None
    chain = [t]
    before = producers.get(t.input(0))
    if _float_cast(graph, before) and t.input(0) not in fixed and len(readers.get(t.input(0), [])) == 1:
        chain.insert(0, before)
    out, cast_after, pad = t.outputs[0], False, False
    while out not in fixed and len(readers.get(out, [])) == 1:
        user = readers[out][0]
        if not cast_after and _float_cast(graph, user):
            cast_after = True
        elif not pad and tuple(perm) == TO_NHWC and _zero_end_pad(graph, user) is not None:
            pad = True
        else:
            break
        chain.append(user)
        out = user.outputs[0]
    return chain if len(chain) > 1 else None


def _sink_upcasts(graph: Graph, fixed: set[str]) -> bool:
    """Resize(x) -> Cast to float32 of a float16 / bfloat16 x, the Resize's output read only by the
    Cast -> Resize(Cast(x)) writing the Cast's output: the Cast converts the smaller tensor and the
    Resize, which computes in float32 anyway, keeps its values unrounded (a segmentation model's
    exit: its upsampled logits)."""
    producers, readers = graph.producers(), graph.consumers()
    changed = False
    for cast in list(graph.nodes):
        resize = producers.get(cast.input(0)) if _float_cast(graph, cast) else None
        if resize is None or resize.domain or resize.op_type != "Resize" or cast.input(0) in fixed \
                or len(readers.get(cast.input(0), [])) != 1 or graph.value(cast.outputs[0]).dtype != np.float32 \
                or graph.value(resize.input(0)).dtype.itemsize != 2:
            continue
        wide = graph.fresh_name(f"{resize.input(0)}_float32")
        up = Node("Cast", [resize.input(0)], [wide], dict(cast.attrs), name=cast.name)
        resized = Node("Resize", [wide, *resize.inputs[1:]], list(cast.outputs), dict(resize.attrs), name=resize.name)
        graph.values[wide] = graph.value(resize.input(0)).with_(name=wide, dtype=np.dtype(np.float32))
        graph.nodes[graph.nodes.index(resize)] = up
        graph.nodes[graph.nodes.index(cast)] = resized
        changed = True
    return changed


def compose_reformats(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Rule 3: a Transpose to or from NHWC of few channels with its Casts and zero channel Pad is one
    ai.polykit Reformat; True if any."""
    fixed = protected(graph, keep)
    changed = _sink_upcasts(graph, fixed)
    for _ in range(len(graph.nodes)):
        producers, readers = graph.producers(), graph.consumers()
        for t in graph.nodes:
            chain = _reformat_chain(graph, t, producers, readers, fixed)
            if chain is None:
                continue
            pads = [n for n in chain if n.op_type == "Pad"]
            attrs = {"perm": perm_of(graph, t), "to": dtypes.to_onnx(graph.value(chain[-1].outputs[0]).dtype)}
            if pads:
                attrs["pad"] = _zero_end_pad(graph, pads[0])
            node = Node(REFORMAT, [chain[0].input(0)], [chain[-1].outputs[0]], attrs, name=t.name,
                        domain=POLYKIT_DOMAIN)
            graph.nodes[graph.nodes.index(t)] = node
            graph.remove_nodes([n for n in chain if n is not t])
            changed = True
            break
        else:
            break
    return changed


# ---- 4: a Gather of a Concat reads the Concat's sources ---------------------------------------------
def compose_concat_gathers(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Rule 4: a Gather with constant 1-D indices of the output of a Concat (2 to MAX_SOURCES inputs)
    along the same axis -> one ai.polykit ConcatGather of the Concat's inputs; the Concat goes when
    nothing else reads it. True if any."""
    producers = graph.producers()
    changed = False
    for i, node in enumerate(graph.nodes):
        table = constant_gather(graph, node)
        cat = producers.get(node.input(0)) if table is not None else None
        if cat is None or cat.domain or cat.op_type != "Concat" or not 2 <= len(cat.inputs) <= MAX_SOURCES \
                or not all(cat.inputs) or len(set(cat.inputs)) != len(cat.inputs) \
                or len(static_shape(graph, node.input(0))) < 2:
            continue  # a 1-D Concat is shape arithmetic (dims, float dims too): only ONNX ops evaluate it symbolically
        rank = len(static_shape(graph, node.input(0)))
        axis = int(cat.attrs.get("axis", 0))
        if (axis + rank if axis < 0 else axis) != table[0]:
            continue
        indices = graph.add_initializer(table[1], f"{node.name}_indices")
        graph.nodes[i] = Node(CONCAT_GATHER, [indices, *cat.inputs], list(node.outputs), {"axis": table[0]},
                              name=node.name, domain=POLYKIT_DOMAIN)
        changed = True
    if changed:
        eliminate_dead_code(graph, keep=keep)
    return changed
