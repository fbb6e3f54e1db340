"""Grouped-query attention's repeated K and V heads read un-repeated (ai.polykit Attention's
`kv_groups`), for fold_attention_layouts.

Exporters of grouped-query and multi-query attention (Llama, Mistral, Qwen, Gemma, Falcon) copy
each key/value head g = Hq / Hkv times before the attention:

    K [.., Hkv, S, D] -> Unsqueeze(axis -3) -> Expand | Tile (that new unit axis to g)
      -> Reshape [.., Hkv * g, S, D] -> Attention

HF's `repeat_kv` (`x[:, :, None].expand(..).reshape(..)`) exports the Expand, torch's
`repeat_interleave` the Tile. Both place the g copies of head j at heads j g .. j g + g - 1, so
query head h reads key/value head h // g: the Attention reads K and V as they were and records g.
g comes from the inferred shapes (the one unit axis the Unsqueeze inserts right after the heads,
the one axis the Expand / Tile grows, the Reshape merging exactly those two), never from names;
the heads and g must be static, batch and sequence dims may be dynamic (a dynamic dim matches only
the same expression). K and V must repeat by the same g. The repeat's nodes go when nothing else
reads it.
"""

from __future__ import annotations

from polykit.compiler.ir.graph import Graph, Node
from polykit.compiler.ir.symbolic import SymInt, same_dims
from polykit.compiler.ops.nn.fused import KV_GROUPS, LAYOUT_ATTRS, VIEW_ATTRS
from polykit.compiler.passes.rewrite import const

REPEATS = ("Expand", "Tile")


def _unsqueeze_axis(graph: Graph, node: Node, rank: int) -> int | None:
    """The one axis an Unsqueeze inserts into a rank-`rank` input (normalized), else None."""
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1:
        value = const(graph, node.input(1))
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    if axes is None or len(axes) != 1:
        return None
    axis = int(axes[0])
    return axis + rank + 1 if axis < 0 else axis


def _shape(graph: Graph, name: str) -> tuple | None:
    """`name`'s inferred shape when every dim is known (an int, or a dynamic dim's SymInt)."""
    shape = graph.value(name).shape
    return None if shape is None or any(not isinstance(d, int) for d in shape) else tuple(shape)


def _static(d) -> bool:
    return isinstance(d, int) and not isinstance(d, SymInt)


def repeated_heads(graph: Graph, name: str, producers: dict[str, Node]) -> tuple[str, int, list[Node]] | None:
    """(the un-repeated tensor, g, the repeat's nodes from the Attention back) when `name` is a
    repeat of its heads (axis -3) as the module docstring shows, else None."""
    reshape = producers.get(name)
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain:
        return None
    repeat = producers.get(reshape.input(0))
    if repeat is None or repeat.op_type not in REPEATS or repeat.domain:
        return None
    unsqueeze = producers.get(repeat.input(0))
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or unsqueeze.domain:
        return None
    src = unsqueeze.input(0)
    shapes = [_shape(graph, t) for t in (src, unsqueeze.outputs[0], repeat.outputs[0], name)]
    if any(s is None for s in shapes):
        return None
    kv, unit, grown, merged = shapes
    n = len(kv)
    a = _unsqueeze_axis(graph, unsqueeze, n)
    if n < 3 or a != n - 2 or not _static(kv[a - 1]) or not same_dims(unit, kv[:a] + (1,) + kv[a:]):
        return None  # the new axis must follow the (static) heads: axis -3 of K
    g = grown[a]
    if not _static(g) or g < 2 or not same_dims(grown, unit[:a] + (g,) + unit[a + 1:]):
        return None
    if not same_dims(merged, kv[:a - 1] + (kv[a - 1] * g,) + kv[a:]):
        return None
    return src, g, [reshape, repeat, unsqueeze]


def fold_kv_repeat(graph: Graph, node: Node, producers: dict[str, Node], readers: dict[str, list[Node]],
                   fixed: set[str]) -> bool:
    """Attention `node` reads K and V un-repeated with kv_groups g; True if it changed."""
    attrs = node.attrs
    if int(attrs.get(KV_GROUPS, 1)) != 1 or any(attrs.get(a) is not None for a in VIEW_ATTRS[1:]) \
            or any(attrs.get(a, "bhsd") != "bhsd" for a in LAYOUT_ATTRS[1:3]):
        return False
    found = [repeated_heads(graph, node.input(i), producers) for i in (1, 2)]
    if any(f is None for f in found) or found[0][1] != found[1][1]:
        return False
    for i, (src, _, _) in zip((1, 2), found):
        node.inputs[i] = src
    attrs[KV_GROUPS] = found[0][1]
    for _, _, chain in found:
        _drop_unread(graph, chain, readers, fixed, node)
    return True


def _drop_unread(graph: Graph, chain: list[Node], readers: dict[str, list[Node]], fixed: set[str],
                 attention: Node) -> None:
    """Remove the chain's nodes (from the Attention back) whose output nothing reads any more."""
    gone = {id(attention)}
    for link in chain:
        out = link.outputs[0]
        if out in fixed or any(id(r) not in gone for r in readers.get(out, [])) \
                or not any(n is link for n in graph.nodes):
            return
        graph.remove_nodes([link])
        gone.add(id(link))
