"""An If on a run-time condition whose branches give sequences/optionals (resolve_sequences' walk).

It stays an If layer over their elements' tensors when the branches give each output one
structure (the same lengths, the same optionals present), and, for an optional output that one
branch gives and the other leaves empty, when the rest agrees: that output becomes a presence
flag and its elements (layout `{"present": flag, "item": ...}`, sequence_walk.PRESENT). The branch
that leaves it empty gives `false` and placeholders of the other branch's element dtypes and
shapes (zeros; of the element's rank with no elements where that shape is not static, which the
If's sized outputs then serve); the engine packs the elements when the flag is set, else None
(polykit.runtime.sequences).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ir.graph import OPTIONAL, Graph, Node, Value
from polykit.compiler.passes.control.sequence_walk import PRESENT, RUN_LENGTH, Layout, Walk, layout_names

KEYS = ("then_branch", "else_branch")


def if_at_run_time(walk: Walk, node: Node) -> bool:
    """Emit `node` as an If over element tensors (module docstring); False (nothing emitted) when
    the branches' structures differ otherwise or a branch reads an outer sequence."""
    from polykit.compiler.passes.control.resolve_sequences import resolve_sequences

    if any(walk.graph.value(n).wrap for n in node.inputs[1:] if n):
        return False
    branches = {k: node.attrs[k].copy() for k in KEYS}
    originals = {k: list(b.outputs) for k, b in branches.items()}
    layouts = {k: resolve_sequences(b, {})["outputs"] for k, b in branches.items()}
    if any(_run_length(layout) for layout in layouts.values()):
        return False  # (a branch's sequence whose length the run decides)
    if not any(node.attrs[KEYS[0]].value(o).wrap for o in originals[KEYS[0]]):
        return False
    outputs: list[str] = []
    given: dict[str, list[str]] = {k: [] for k in KEYS}
    structs: dict[str, Layout] = {}
    for j, out in enumerate(node.outputs):
        per = {k: layouts[k].get(originals[k][j], originals[k][j]) for k in KEYS}
        skeletons = [_skeleton(per[k]) if originals[k][j] in layouts[k] else None for k in KEYS]
        wrapped = walk.graph.value(out).wrap
        if skeletons[0] == skeletons[1]:
            for k in KEYS:
                given[k] += layout_names(per[k]) if wrapped else [per[k]]
            if not wrapped:
                outputs.append(out)
                continue
            structs[out] = _fresh(walk, out, skeletons[0])
            outputs += layout_names(structs[out])
        elif wrapped and wrapped[0] == OPTIONAL and None in skeletons:
            present = KEYS[skeletons.index(None) ^ 1]
            for k in KEYS:
                flag = _constant(branches[k], f"{out}/present", np.array(k == present))
                given[k] += [flag] + (layout_names(per[k]) if k == present else
                                      _placeholders(branches[k], branches[present], per[present]))
            structs[out] = {PRESENT: walk.graph.fresh_name(f"{out}/present"),
                            "item": _fresh(walk, out, skeletons[KEYS.index(present)])}
            walk.graph.set_value(Value(structs[out][PRESENT], np.dtype(np.bool_), ()))
            outputs += layout_names(structs[out])
        else:
            return False
    for k, b in branches.items():
        b.outputs = given[k]
    walk.structs.update(structs)
    walk.emit(Node("If", list(node.inputs), outputs, {**node.attrs, **branches}, node.name))
    return True


def _constant(branch: Graph, stem: str, value: np.ndarray) -> str:
    """A new output of `branch` that gives `value` (an Identity of an initializer)."""
    init, out = branch.fresh_name(f"{stem}_value"), branch.fresh_name(stem)
    branch.initializers[init] = value
    branch.set_value(Value(init, value.dtype, value.shape))
    branch.nodes.append(Node("Identity", [init], [out], name=f"{out}__const"))
    branch.set_value(Value(out, value.dtype, value.shape))
    return out


def _placeholders(branch: Graph, other: Graph, layout: Layout) -> list[str]:
    """Outputs of `branch` standing for the elements `layout` of `other` gives: zeros of their dtype
    and static shape (of their rank, empty, where the shape is not static)."""
    names = []
    for name in layout_names(layout):
        v = other.value(name)
        static = v.shape is not None and all(type(d) is int for d in v.shape)
        shape = tuple(v.shape) if static else (0,) * len(v.shape or ())
        names.append(_constant(branch, f"{name}_placeholder", np.zeros(shape, v.dtype)))
    return names


def _run_length(layout: Any) -> bool:
    """Whether a layout (or a {name: layout} map) holds a sequence whose length the run decides."""
    if isinstance(layout, dict):
        return RUN_LENGTH in layout or any(_run_length(v) for v in layout.values())
    return isinstance(layout, list) and any(_run_length(item) for item in layout)


def _skeleton(layout: Layout) -> Any:
    """A layout's structure without its names (None for a plain tensor output or an empty optional)."""
    if isinstance(layout, list):
        return [_skeleton(item) if isinstance(item, list) or item is None else "" for item in layout]
    return layout if layout is None else ""


def _fresh(walk: Walk, name: str, skeleton: Any) -> Layout:
    """A layout of `skeleton`'s structure with new tensor names for its elements."""
    if skeleton is None or skeleton == "":
        return None if skeleton is None else walk.graph.fresh_name(f"{name}/item")
    return [_fresh(walk, f"{name}/{i}", item) for i, item in enumerate(skeleton)]
