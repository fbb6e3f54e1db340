"""Run one plan layer on the GPU with a chosen cuda tactic: the kernel tests' workhorse.

`run_layer` compiles the tactic's kernels (through the kernel cache), uploads every input
(weights included: pass them in `inputs` by name), poisons the outputs with 0xFF bytes (NaN
for floats) so an element the kernel never writes fails the comparison, launches, syncs,
checks for errors and downloads the outputs. Output shapes and dtypes come from the op's
shape rule unless `output_specs` gives them.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import Node
from polykit.compiler.ops.registry import InferContext, find_shape_rule
from polykit.errors import BuildError, DeviceError
from polykit.kernels.cuda.base import CudaTactic, DeviceTensor
from polykit.kernels.tactics import candidates, find_tactic
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules
from polykit.runtime.cuda.memory import DeviceBuffer, download, fill_bytes, upload
from polykit.runtime.cuda.stream import Stream

OutputSpecs = Mapping[str, tuple[tuple[int, ...], Any]]


def resolve_tactic(layer: Any, tactic: str | None = None, arch: str | None = None) -> CudaTactic:
    """The named tactic, else the layer's own, else the first cuda candidate for the layer
    (that runs on `arch` when given)."""
    name = tactic or getattr(layer, "tactic", "") or None
    if name:
        t = find_tactic("cuda", layer.kind, name)
        if t is None:
            raise BuildError(f"no cuda tactic named {name!r} for layer kind {layer.kind!r}", where=f"layer {layer.name!r}")
        return t  # type: ignore[return-value]
    found = candidates("cuda", layer.kind, layer, arch=arch)
    if not found:
        raise BuildError(f"no cuda tactic supports layer kind {layer.kind!r} with these attributes",
                         where=f"layer {layer.name!r}", hint="run it on --target cpu, or add a tactic")
    return found[0]  # type: ignore[return-value]


def infer_output_specs(layer: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Output (shape, dtype) of `layer` from its op's shape rule, all inputs known as constants."""
    rule = find_shape_rule(layer.domain, layer.kind)
    if rule is None:
        raise BuildError(f"no shape rule for {layer.kind!r}", where=f"layer {layer.name!r}",
                         hint="pass output_specs={name: (shape, dtype)} to run_layer")
    node = Node(layer.kind, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, layer.domain)
    arrays = [inputs.get(n) if n else None for n in layer.inputs]
    ctx = InferContext(node, [a.dtype if a is not None else None for a in arrays],
                       [tuple(a.shape) if a is not None else None for a in arrays], arrays)
    results = rule(ctx)
    specs = {}
    for name, (dtype, shape) in zip(layer.outputs, results):
        if not name:
            continue
        if shape is None or not all(isinstance(d, int) for d in shape) or dtype is None:
            raise BuildError(f"output {name!r} has no static shape/dtype", where=f"layer {layer.name!r}",
                             hint="pass output_specs to run_layer")
        specs[name] = (tuple(shape), np.dtype(dtype))
    return specs


def run_layer(layer: Any, inputs: Mapping[str, np.ndarray], tactic: str | None = None, poison: bool = True,
              output_specs: OutputSpecs | None = None, cache: bool = True,
              misalign: Mapping[str, int] | None = None,
              placed: Mapping[str, tuple[int, int]] | None = None) -> dict[str, np.ndarray]:
    """Run `layer` (a LayerDesc) once on the GPU and return its outputs as host arrays.
    `misalign` places the named tensors that many bytes past their allocation's (256-byte
    aligned) start: kernels' alignment guards and fallbacks get tested on real pointers.
    `placed` puts the named outputs in a slice of a wider channels-last tensor, as Concat by
    placement does (DeviceTensor.row_stride): name -> (before, after), the channels of other
    inputs before and after each pixel row; such an output comes back as its whole (poisoned)
    rows, shape[:-1] + (before + C + after,), so a test sees what was written outside the slice."""
    shift, placed = dict(misalign or {}), dict(placed or {})
    info = driver.current_device()
    chosen = resolve_tactic(layer, tactic, arch=info.arch)
    specs = dict(output_specs) if output_specs is not None else infer_output_specs(layer, inputs)
    missing = [n for n in layer.inputs if n and n not in inputs]
    if missing:
        raise DeviceError(f"run_layer got no array for input(s) {missing}", where=f"layer {layer.name!r}")
    stray = sorted(n for n in placed if n not in specs or not specs[n][0])
    if stray:
        raise DeviceError(f"run_layer cannot place {stray}: not outputs of rank 1 or more",
                          where=f"layer {layer.name!r}", hint="name the layer's outputs in `placed`")
    modules = KernelModules(info.arch)
    buffers: list[DeviceBuffer] = []
    stream = None
    try:
        modules.load(chosen.kernels(layer), cache=cache)
        stream = Stream()
        tensors: dict[str, DeviceTensor] = {}
        for name in dict.fromkeys(n for n in layer.inputs if n):
            arr, off = np.ascontiguousarray(inputs[name]), shift.get(name, 0)
            buf = DeviceBuffer(arr.nbytes + off, what=f"input {name!r}")
            buffers.append(buf)
            upload(buf.ptr + off, arr)
            tensors[name] = DeviceTensor(buf.ptr + off, tuple(arr.shape), arr.dtype)
        held: dict[str, tuple[int, tuple[int, ...], np.dtype]] = {}  # output -> (pointer, shape, dtype) returned
        for name, (shape, dtype) in specs.items():
            dt, off = np.dtype(dtype), shift.get(name, 0)
            before, after = placed.get(name, (0, 0))
            rows = (*shape[:-1], before + shape[-1] + after) if name in placed else tuple(shape)
            nbytes = int(np.prod(rows, dtype=np.int64)) * dt.itemsize
            buf = DeviceBuffer(nbytes + off, what=f"output {name!r}")
            buffers.append(buf)
            fill_bytes(buf.ptr + off, nbytes, 0xFF if poison else 0)
            held[name] = (buf.ptr + off, rows, dt)
            tensors[name] = DeviceTensor(buf.ptr + off + before * dt.itemsize, tuple(shape), dt,
                                         rows[-1] if name in placed else 0)

        def workspace(nbytes: int) -> int:
            buf = DeviceBuffer(nbytes, what=f"workspace of layer {layer.name!r}")
            buffers.append(buf)
            return buf.ptr

        launcher = CudaLauncher(modules, stream.handle, workspace, layer.name)
        driver.synchronize()
        chosen.enqueue(layer, launcher, tensors)
        driver.call("cuStreamSynchronize", stream.handle, what=f"run of tactic {chosen.name!r}",
                    where=f"layer {layer.name!r}")
        return {name: download(ptr, shape, dt) for name, (ptr, shape, dt) in held.items()}
    finally:
        if stream is not None:
            stream.close()
        for buf in buffers:
            buf.free()
        modules.close()


def reference_layer(layer: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The layer's outputs from its op's numpy reference kernel (the oracle of kernel tests)."""
    from polykit.compiler.ops.references import run_reference

    node = Node(layer.kind, list(layer.inputs), list(layer.outputs), dict(layer.attrs), layer.name, layer.domain)
    outs = run_reference(node, [inputs[n] if n else None for n in layer.inputs])
    return {name: out for name, out in zip(layer.outputs, outs) if name}


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64; inf when `out` holds a NaN the reference does not."""
    o, r = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if o.shape != r.shape:
        raise AssertionError(f"shape {o.shape} differs from the reference's {r.shape}")
    if np.any(np.isnan(o) & ~np.isnan(r)):
        return float("inf")
    ok = np.isfinite(r)
    denom = np.linalg.norm(r[ok]) or 1.0
    return float(np.linalg.norm((o - r)[ok]) / denom)


def assert_matches_reference(layer: Any, inputs: Mapping[str, np.ndarray], *, tactic: str | None = None,
                             rtol: float = 1e-5, atol: float = 1e-5, rel: float | None = None) -> dict[str, np.ndarray]:
    """Run `layer` on the GPU (poisoned outputs) and assert every output matches the reference:
    elementwise within atol + rtol*|ref| (NaN never passes unless the reference has it), and,
    when `rel` is given, also ||out - ref|| / ||ref|| <= rel. Returns the GPU outputs."""
    got = run_layer(layer, inputs, tactic=tactic)
    want = reference_layer(layer, inputs)
    for name, ref in want.items():
        out = got[name]
        assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype} != reference {ref.dtype}"
        err = relative_error(out, ref)
        assert err != float("inf"), f"{name}: unwritten (NaN) elements"
        if rel is not None:
            assert err <= rel, f"{name}: relative error {err:.3g} > {rel:.3g}"
        else:
            np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(ref, np.float64), rtol=rtol, atol=atol,
                                       err_msg=f"layer {layer.name!r} output {name!r}")
    return got
