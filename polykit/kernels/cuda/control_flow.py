"""If, Loop, Scan on the cuda target: host-driven layers that run their body plans on the device.

No kernels of their own: a body is a plan of cuda layers (polykit.compiler.bodies), run once
per iteration on the layer's stream through `launcher.bodies` (polykit.runtime.cuda.bodies),
on device buffers only. What the host reads back:

- If: the condition, once per run.
- Loop: the trip count M once; the condition after every iteration only when the body can
  change it (a body that passes its condition through runs M iterations back to back without
  a host round trip). Iteration numbers are uploaded once as a device array.
- Scan: nothing; every iteration is enqueued back to back.

Loop-carried values and Scan states live in the layer's output buffers: each iteration reads
and writes them in place (the body copies its inputs into its own arena before it runs and its
outputs out after). Scan slices are read and scan outputs written at byte offsets, so the
scan axes must be 0 (the reference and cpu run any axes). A Loop's scan outputs have the shape
the plan was built for; a run whose iteration count differs is a DeviceError.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DECLARED, CudaTactic, DeviceTensor

KINDS = ("If", "Loop", "Scan")


def compile_variants() -> list:
    return []  # no kernels: the bodies' layers bring their own


def _captured(layer: Any) -> int:
    return int(layer.attrs.get("polykit_captures", 0))


def _bind(plan: Any, inputs: Sequence[int], outputs: Sequence[int]) -> tuple[dict[str, int], list[tuple[int, int]]]:
    """Bindings of a body run (plan inputs and outputs, positional in the body's order) and the
    copies a body output listed twice needs after it: (destination, source) pointers."""
    bindings = dict(zip(plan.inputs, inputs))
    later: list[tuple[int, int]] = []
    first: dict[str, int] = {}
    for name, ptr in zip(plan.metadata["body_outputs"], outputs):
        if name in first:
            later.append((ptr, first[name]))
        else:
            first[name] = bindings[name] = ptr
    return bindings, later


def _run(bodies: Any, plan: Any, inputs: Sequence[int], outputs: Sequence[int], sizes: Sequence[int]) -> None:
    bindings, later = _bind(plan, inputs, outputs)
    bodies.run(plan, bindings)
    nbytes = dict(zip(outputs, sizes))
    for dst, src in later:
        bodies.copy(dst, src, nbytes[dst])


def _nbytes(t: DeviceTensor) -> int:
    return t.size * t.dtype.itemsize


def _enqueue_if(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    bodies = launcher.bodies
    cond = bool(bodies.read(tensors[layer.inputs[0]]).reshape(-1)[0])
    plan = layer.attrs["then_branch" if cond else "else_branch"]
    outs = [tensors[o] for o in layer.outputs]
    _run(bodies, plan, [tensors[i].ptr for i in layer.inputs[1:]], [t.ptr for t in outs], [_nbytes(t) for t in outs])


def _passes_condition(plan: Any) -> bool:
    """Whether the body's condition output is its condition input (it never stops the loop)."""
    return plan.metadata["body_outputs"][0] == plan.inputs[1]


def _enqueue_loop(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    bodies, plan = launcher.bodies, layer.attrs["body"]
    n = len(layer.inputs) - 2 - _captured(layer)
    m_name, c_name = layer.inputs[0], layer.inputs[1]
    trip = int(bodies.read(tensors[m_name]).reshape(-1)[0]) if m_name else None
    go = bool(bodies.read(tensors[c_name]).reshape(-1)[0]) if c_name else True
    state = [tensors[o] for o in layer.outputs[:n]]
    for t, src in zip(state, layer.inputs[2:2 + n]):
        bodies.copy(t.ptr, tensors[src].ptr, _nbytes(t))
    scans = [tensors[o] for o in layer.outputs[n:]]
    planned = scans[0].shape[0] if scans else None
    fixed = trip is not None and _passes_condition(plan)
    indices = launcher.workspace(8 * max(trip, 1) if fixed else 8)
    if fixed:
        bodies.write(indices, np.arange(trip, dtype=np.int64))
    cond_in, cond_out = launcher.workspace(1), launcher.workspace(1)
    bodies.write(cond_in, np.ones(1, np.bool_))
    captures = [tensors[i].ptr for i in layer.inputs[2 + n:]]
    flag = DeviceTensor(cond_out, (1,), np.dtype(np.bool_))
    i = 0
    while go and (trip is None or i < trip):
        if scans and i == planned:
            break  # one more iteration than the scan outputs hold: reported below
        if not fixed:
            bodies.write(indices, np.array([i], np.int64))
        outs = [cond_out] + [t.ptr for t in state] + [s.ptr + i * _nbytes(s) // planned for s in scans]
        sizes = [1] + [_nbytes(t) for t in state] + [_nbytes(s) // planned for s in scans]
        _run(bodies, plan, [indices + 8 * i if fixed else indices, cond_in, *outs[1:1 + n], *captures], outs, sizes)
        i += 1
        if not fixed:
            go = bool(bodies.read(flag).reshape(-1)[0])
    bodies.finish()
    if scans and (i != planned or go and (trip is None or i < trip)):
        ran = f"{i}" if i != planned else f"more than {i}"
        raise DeviceError(f"the loop ran {ran} iterations; the plan's scan outputs hold {planned}",
                          where=f"layer {layer.name!r} (Loop)",
                          hint="the trip count depends on data: rebuild the plan for these inputs' values "
                               "(BuilderConfig.input_values) or run it on --target cpu")


def _enqueue_scan(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    bodies, plan = launcher.bodies, layer.attrs["body"]
    m = int(layer.attrs["num_scan_inputs"])
    n = len(layer.inputs) - m - _captured(layer)
    state = [tensors[o] for o in layer.outputs[:n]]
    for t, src in zip(state, layer.inputs[:n]):
        bodies.copy(t.ptr, tensors[src].ptr, _nbytes(t))
    xs = [tensors[i] for i in layer.inputs[n:n + m]]
    scans = [tensors[o] for o in layer.outputs[n:]]
    length = xs[0].shape[0]
    in_dirs = list(layer.attrs.get("scan_input_directions") or [0] * m)
    out_dirs = list(layer.attrs.get("scan_output_directions") or [0] * len(scans))
    captures = [tensors[i].ptr for i in layer.inputs[n + m:]]
    for t in range(length):
        slices = [x.ptr + (length - 1 - t if d else t) * (_nbytes(x) // length) for x, d in zip(xs, in_dirs)]
        outs = [s.ptr + (length - 1 - t if d else t) * (_nbytes(s) // length) for s, d in zip(scans, out_dirs)]
        sizes = [_nbytes(x) for x in state] + [_nbytes(s) // length for s in scans]
        _run(bodies, plan, [*(x.ptr for x in state), *slices, *captures], [x.ptr for x in state] + outs, sizes)


def _axes_zero(layer: Any) -> bool:
    """Scan reads slices and writes outputs along axis 0 only (see the module docstring)."""
    if layer.kind != "Scan":
        return True
    m = int(layer.attrs.get("num_scan_inputs", 0))
    n = len(layer.inputs) - m - _captured(layer)
    ranks_in = [len(s) for s in layer.in_shapes[n:n + m]] if layer.in_shapes else [1] * m
    ranks_out = [len(s) for s in layer.out_shapes[n:]] if layer.out_shapes else []
    axes_in = list(layer.attrs.get("scan_input_axes") or [0] * m)
    axes_out = list(layer.attrs.get("scan_output_axes") or [0] * len(ranks_out))
    return all(a % max(r, 1) == 0 for a, r in zip(axes_in, ranks_in)) and \
        all(a % max(r, 1) == 0 for a, r in zip(axes_out, ranks_out))


_ENQUEUE = {"If": _enqueue_if, "Loop": _enqueue_loop, "Scan": _enqueue_scan}


def _bodies_built(layer: Any) -> bool:
    """The layer carries its bodies as plans (a build's lowering made them)."""
    return all(hasattr(v, "tensors") for k, v in layer.attrs.items() if k in ("then_branch", "else_branch", "body"))


for _kind in KINDS:
    DECLARED.append(CudaTactic("cuda", _kind, "cuda.control_flow", {},
                               lambda layer: _bodies_built(layer) and _axes_zero(layer), priority=0,
                               kernels_fn=lambda layer: [], enqueue_fn=_ENQUEUE[_kind], host_driven=True))
