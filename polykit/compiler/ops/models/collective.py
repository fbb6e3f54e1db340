"""DistCollective: one collective operation between ranks (docs/DISTRIBUTED.md).

An ai.polykit DistCollective node has one input and one output and these attributes:
`op` (COLLECTIVE_OPS), `reduce` (REDUCTIONS; for the ops that reduce), `ranks` (the group's
size), `group` (the global ranks of its members, in order), `root` (an index into the group:
broadcast, reduce, gather, scatter) and `axis` (non-negative: the dim all_gather / gather
concatenate, reduce_scatter / scatter / all_to_all split into `ranks` equal chunks).

onnxruntime's com.microsoft AllReduce / AllGather / AllToAll import to it (one node per input of
their variadic forms) and export back where the attributes say the same thing.
"""

from __future__ import annotations

from typing import Any, Mapping

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.registry import ImportContext, InferContext, importer, shape_rule

KIND = "DistCollective"
#: onnxruntime's contrib domain of its collective ops
MS_DOMAIN = "com.microsoft"
#: op -> how the output's dim[axis] follows the input's ("same", "times" ranks, "divide" by ranks)
COLLECTIVE_OPS = {
    "all_reduce": "same", "broadcast": "same", "reduce": "same", "all_to_all": "same",
    "all_gather": "times", "gather": "times", "reduce_scatter": "divide", "scatter": "divide",
}
#: ops whose `reduce` attribute matters
REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter"})
#: ops whose `root` attribute matters
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})
REDUCTIONS = ("sum", "prod", "max", "min", "avg")


def is_collective(layer_or_node: Any) -> bool:
    """A DistCollective layer or node (one that exchanges data with other ranks)."""
    return layer_or_node.domain == POLYKIT_DOMAIN and getattr(layer_or_node, "kind",
                                                               getattr(layer_or_node, "op_type", "")) == KIND


def group_of(attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The global ranks of the collective's members, in order (default 0 .. ranks-1)."""
    group = attrs.get("group")
    return tuple(int(g) for g in group) if group else tuple(range(int(attrs.get("ranks", 1))))


def collective_node(op: str, x: str, y: str, ranks: int, name: str, *, reduce: str = "sum", axis: int = 0,
                    root: int = 0, group: tuple[int, ...] | None = None) -> Node:
    """A DistCollective node reading `x` and writing `y`."""
    attrs: dict[str, Any] = {"op": op, "ranks": int(ranks), "group": list(group or range(ranks))}
    if op in REDUCING:
        attrs["reduce"] = reduce
    if op in ROOTED:
        attrs["root"] = int(root)
    if COLLECTIVE_OPS.get(op) != "same" or op == "all_to_all":
        attrs["axis"] = int(axis)
    return Node(KIND, [x], [y], attrs, name, POLYKIT_DOMAIN)


def attr_problem(attrs: Mapping[str, Any], rank: int | None, *, world_ok: bool = False) -> str | None:
    """What is wrong with a DistCollective's attributes (for an input of rank `rank`), else None.
    `world_ok`: an all_reduce may have ranks 0, "every rank of the build" (an imported AllReduce,
    which has no group size; the builder sets it from BuilderConfig.ranks)."""
    op, ranks = attrs.get("op"), attrs.get("ranks")
    if op not in COLLECTIVE_OPS:
        return f"op {op!r} is not one of {', '.join(COLLECTIVE_OPS)}"
    least = 0 if world_ok and op == "all_reduce" else 1
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < least:
        return f"ranks {ranks!r} is not an integer >= 1"
    group = attrs.get("group")
    if group is not None and (not isinstance(group, (list, tuple)) or len(group) != ranks
                              or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in group)
                              or len(set(group)) != len(group)):
        return f"group {group!r} is not {ranks} distinct non-negative ranks"
    if op in REDUCING and attrs.get("reduce", "sum") not in REDUCTIONS:
        return f"reduce {attrs.get('reduce')!r} is not one of {', '.join(REDUCTIONS)}"
    root = attrs.get("root", 0)
    if (op in ROOTED or "root" in attrs) and (isinstance(root, bool) or not isinstance(root, int)
                                              or not 0 <= root < ranks):
        return f"root {root!r} is not a member index in 0..{ranks - 1}"
    axis = attrs.get("axis", 0)
    if isinstance(axis, bool) or not isinstance(axis, int) or (rank is not None and not 0 <= axis < max(rank, 1)):
        return f"axis {axis!r} is not a dim of the rank-{rank} input"
    return None


@shape_rule(KIND, domain=POLYKIT_DOMAIN)
def _collective(ctx: InferContext):
    shape = ctx.shape(0)
    attrs = ctx.node.attrs
    problem = attr_problem(attrs, None if shape is None else len(shape), world_ok=True)
    if problem:
        raise ctx.fail(f"DistCollective {problem}", hint="see docs/DISTRIBUTED.md for the attributes")
    if shape is None:
        return [(ctx.dtype(0), None)]
    axis, ranks, change = int(attrs.get("axis", 0)), int(attrs["ranks"]), COLLECTIVE_OPS[attrs["op"]]
    out, dim = list(shape), shape[axis] if shape else None
    if change != "same" and isinstance(dim, int):
        if change == "divide" and dim % ranks:
            raise ctx.fail(f"{attrs['op']} splits dim {axis} ({dim}) into {ranks} chunks, which does not divide",
                           hint="split a dim that the rank count divides")
        out[axis] = dim * ranks if change == "times" else dim // ranks
    elif change != "same":
        out[axis] = None
    if attrs["op"] == "all_to_all" and isinstance(dim, int) and dim % ranks:
        raise ctx.fail(f"all_to_all splits dim {axis} ({dim}) into {ranks} chunks, which does not divide")
    return [(ctx.dtype(0), tuple(out))]


# ---- onnxruntime's com.microsoft collectives ------------------------------------------------------
def _ms_group_size(node: Node) -> int:
    """The ranks of an onnxruntime collective: group_size (AllReduce has none: 0, the build's --ranks)."""
    return int(node.attrs.get("group_size", 0))


def _per_input(node: Node, op: str, **attrs: Any) -> list[Node]:
    if len(node.inputs) != len(node.outputs):
        from polykit.errors import NodeAttributeError

        raise NodeAttributeError(f"{node.op_type} has {len(node.inputs)} inputs and {len(node.outputs)} outputs",
                                 where=node.describe(), hint="give one output per input")
    ranks = _ms_group_size(node)
    out = []
    for i, (x, y) in enumerate(zip(node.inputs, node.outputs)):
        made = collective_node(op, x, y, max(ranks, 1), node.name if len(node.inputs) == 1 else f"{node.name}_{i}",
                               **attrs)
        if ranks == 0:
            made.attrs.update(ranks=0, group=[])  # the world: BuilderConfig.ranks fills it in (resolve_world)
        out.append(made)
    return out


@importer("AllReduce", since=1, domain=MS_DOMAIN)
def _all_reduce(node: Node, ctx: ImportContext) -> list[Node]:
    return _per_input(node, "all_reduce", reduce="sum")


@importer("AllGather", since=1, domain=MS_DOMAIN)
def _all_gather(node: Node, ctx: ImportContext) -> list[Node]:
    axis = int(node.attrs.get("axis", 0))
    if axis < 0:
        rank = ctx.graph.value(node.inputs[0]).shape
        axis += len(rank) if rank is not None else 0
    return _per_input(node, "all_gather", axis=axis)


@importer("AllToAll", since=1, domain=MS_DOMAIN)
def _all_to_all(node: Node, ctx: ImportContext) -> list[Node]:
    return _per_input(node, "all_to_all", axis=0)


def onnx_form(node: Node) -> Node:
    """The com.microsoft node onnxruntime knows for a DistCollective that means the same thing
    (a whole-world group in order: AllReduce sum, AllGather, AllToAll on axis 0); else `node`."""
    attrs = node.attrs
    ranks = int(attrs.get("ranks", 1))
    if group_of(attrs) != tuple(range(ranks)):
        return node
    op = attrs.get("op")
    if op == "all_reduce" and attrs.get("reduce", "sum") == "sum":
        return Node("AllReduce", list(node.inputs), list(node.outputs), {}, node.name, MS_DOMAIN)
    if op == "all_gather":
        return Node("AllGather", list(node.inputs), list(node.outputs),
                    {"group_size": ranks, "axis": int(attrs.get("axis", 0))}, node.name, MS_DOMAIN)
    if op == "all_to_all" and int(attrs.get("axis", 0)) == 0:
        return Node("AllToAll", list(node.inputs), list(node.outputs), {"group_size": ranks}, node.name, MS_DOMAIN)
    return node
