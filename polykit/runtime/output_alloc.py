"""Data-dependent output sizes at run time (TensorRT's IOutputAllocator, polykit's way).

A layer whose output size depends on input values (NonZero, Compress, Unique,
NonMaxSuppression) has a dim that is a data symbol `data(tensor)[axis]` in the plan
(polykit.compiler.ops.data_dims); its arena slot holds the symbol's bound. The engine runs the
layers in segments that end at such a layer: after it, the target reports the sizes
(`TargetContext.data_sizes`: cpu reads the array's shape; cuda reads back the count the
kernel wrote to a device word, one synchronization), the ShapeBinder evaluates the shapes that
waited for them, and the target rebinds its tensors (`bind_shapes`) before the consumers
launch. Such a plan is never captured as a CUDA graph: its launches depend on a read-back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from polykit.compiler.ir.symbolic import Expr
from polykit.errors import PlanError
from polykit.runtime.shapes import ShapeBinder, ShapeSet


@dataclass(frozen=True)
class DataOutput:
    """Data symbol `symbol` is dim `axis` of tensor `tensor`, which layer `layer` writes."""

    symbol: str
    tensor: str
    axis: int
    layer: int


def data_outputs(plan: Any) -> tuple[DataOutput, ...]:
    """The data symbols of `plan`, each with the first output that has it as a dim of a layer
    that reads no tensor with it (the layer that decides it); PlanError
    when a symbol that a tensor needs has no producing layer."""
    data = plan.profiles.data if plan.profiles is not None else {}
    found: dict[str, DataOutput] = {}
    for index, layer in enumerate(plan.layers):
        read = {s for n in layer.inputs if n for e in plan.tensors[n].dims if isinstance(e, Expr) for s in e.symbols()}
        for name in layer.outputs:
            for axis, d in enumerate(plan.tensors[name].dims if name else ()):
                sym = d.args[0] if isinstance(d, Expr) and d.op == "sym" else None
                if sym in data and sym not in found and sym not in read:  # the layer that decides it
                    found[sym] = DataOutput(sym, name, axis, index)
    needed = {s for t in plan.tensors.values() for e in t.dims + t.value if isinstance(e, Expr)
              for s in e.symbols() if s in data}
    lost = sorted(needed - set(found))
    if lost:
        raise PlanError(f"no layer writes a tensor whose dim is the data symbol {lost[0]!r}",
                        hint="the plan is inconsistent; rebuild it with this polykit version")
    return tuple(sorted(found.values(), key=lambda o: (o.layer, o.symbol)))


class OutputSizes:
    """Runs a plan's layers with its data-dependent sizes bound as the layers report them."""

    def __init__(self, plan: Any):
        self.outputs = data_outputs(plan)
        self.count = len(plan.layers)

    def __bool__(self) -> bool:
        return bool(self.outputs)

    def run(self, ctx: Any, binder: ShapeBinder, shapes: ShapeSet, stream: Any,
            segment: Callable[[Sequence[int]], None]) -> ShapeSet:
        """Launch every layer through `segment(indices)`, binding each data symbol after its
        layer; the ShapeSet with every size of this run."""
        start = 0
        for index in sorted({o.layer for o in self.outputs}):
            segment(range(start, index + 1))
            decided = [o for o in self.outputs if o.layer == index]
            sizes = ctx.data_sizes(decided, stream)
            bound = binder.bind_data(shapes, sizes)
            ctx.bind_shapes(bound)
            for name, value in bound.values.items():
                if name not in shapes.values:  # shape tensors computed from the new sizes
                    ctx.copy_in(name, value, stream)
            shapes, start = bound, index + 1
        segment(range(start, self.count))
        return shapes
