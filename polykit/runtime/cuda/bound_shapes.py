"""The shapes a cuda context's DeviceTensors carry: rebound once per shape set, not per run.

A plan built for optimization profiles evaluates its tensors' shapes per input shape set
(polykit.runtime.shapes.ShapeBinder, cached by `ShapeSet.key`); the cuda target hands them to
its kernels through the DeviceTensors they read at launch. Rebuilding a DeviceTensor for every
dynamic tensor on every enqueue cost the host ~240 us a run for BERT-base (197 tensors, 2-core
EPYC) where a static plan spends nothing, and with an idle GPU that host time is the run's
(benchmarks/dynamic_vs_static.py, docs/DYNAMIC_SHAPES.md "Dynamic against static"). So the
context remembers which shape set its tensors carry: binding the same key again does nothing,
and a new key rebuilds only the tensors whose shape changed. Pointers are kept as they are
(arena offsets, caller addresses bound in place: those moves keep the shape).
"""

from __future__ import annotations

from typing import Any, MutableMapping

from polykit.kernels.cuda.base import DeviceTensor


class BoundShapes:
    """Keeps `tensors` (name -> DeviceTensor, the context's own dict) at the shapes of the last
    ShapeSet bound; every other writer of `tensors` keeps each tensor's shape."""

    def __init__(self, tensors: MutableMapping[str, DeviceTensor]):
        self.tensors = tensors
        self.key: tuple | None = None

    def bind(self, shapes: Any) -> int:
        """Give the tensors `shapes.shapes` (a ShapeSet); the number of tensors rebuilt (0 when
        `shapes.key` is the set they already carry)."""
        if self.key is not None and shapes.key == self.key:
            return 0
        tensors, rebuilt = self.tensors, 0
        for name, shape in shapes.shapes.items():
            t = tensors[name]
            if t.shape != shape:
                tensors[name] = DeviceTensor(t.ptr, tuple(shape), t.dtype)
                rebuilt += 1
        self.key = shapes.key
        return rebuilt

    @staticmethod
    def emulated(plan: Any) -> dict[str, DeviceTensor]:
        """DeviceTensors of `plan`'s non-weight tensors at their recorded shapes (null pointers):
        what a context holds before its first bind, for timing the rebinding without a GPU."""
        return {name: DeviceTensor(0, tuple(desc.shape), desc.np_dtype) for name, desc in plan.tensors.items()
                if desc.kind != "weight"}
