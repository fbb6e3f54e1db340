"""What the cuda target lends control-flow tactics (polykit.kernels.cuda.models.control_flow).

An If/Loop/Scan layer holds its bodies as plans (polykit.compiler.builder.bodies). A CudaContext
keeps one execution context per body plan (`BodyContexts`: made on the layer's first run,
closed with the context), and the layer's tactic drives them from the host through a
`BodyDriver`: it runs a body on device buffers (ExecutionContext.enqueue on the layer's
stream: inputs copied into the body's own arena, outputs copied out; a body replays as a CUDA
graph after its first run), copies between device buffers (strided ones too: a Scan's slices
along an axis other than 0), writes small host arrays (loop indices) and reads scalars back
(an If's condition, a Loop's trip count and, once per iteration, its condition when the body
can change it). A Loop body built for a profile (its shapes change across iterations) is bound to
each iteration's input shapes and iteration number first, an If branch built for one to its inputs'
shapes (`bind`: the host evaluates its shapes, polykit.runtime.shapes), and runs uncaptured; a body
output whose size a layer of the body decides from values reads as the size its run gave it (`shapes`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.memory import copy_device, download, upload


class BodyContexts:
    """Execution contexts of the body plans one CudaContext runs, by plan identity."""

    def __init__(self, allocator: Any = None, pdl: bool = False) -> None:
        self._open: dict[int, tuple[Any, Any, Any]] = {}
        self._allocator = allocator  # the outer engine's: body engines allocate through it too
        self._pdl = pdl  # the outer engine's launch mode (a body plan records no builder config)

    def context(self, plan: Any) -> Any:
        held = self._open.get(id(plan))
        if held is None:
            from polykit.runtime.engine import Engine

            engine = Engine(plan, allocator=self._allocator, pdl=self._pdl)  # a body of run-time shapes binds new shapes every iteration: not captured
            held = (plan, engine, engine.create_execution_context(cuda_graph=plan.profiles is None))
            self._open[id(plan)] = held
        return held[2]

    def close(self) -> None:
        for _, engine, ctx in self._open.values():
            ctx.close()
            engine.close()
        self._open = {}


class BodyDriver:
    """Host-side operations of a control-flow layer on one stream (module docstring)."""

    def __init__(self, bodies: BodyContexts, stream: Any):
        self._bodies = bodies
        self.stream = stream
        self._held: list[np.ndarray] = []  # host arrays of async uploads, alive until the next read

    def run(self, plan: Any, bindings: Mapping[str, int]) -> None:
        """Run body `plan` once on device pointers (one per plan input and output)."""
        self._bodies.context(plan).enqueue(dict(bindings), self.stream)

    def bind(self, plan: Any, shapes: Mapping[str, tuple[int, ...]],
             values: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        """Give body `plan` (one built for a profile) the input `shapes` and shape-tensor input `values`
        of its next run; {output: its shape} then (a RuntimeInputError past the profile)."""
        ctx = self._bodies.context(plan)
        for name, shape in shapes.items():
            ctx.set_input_shape(name, shape)
        for name, value in values.items():
            ctx.set_input_values(name, value)
        return self.shapes(plan)

    def shapes(self, plan: Any) -> dict[str, tuple[int, ...]]:
        """{output: its shape} of body `plan` for the shapes it is bound to; an output whose size a
        layer of the body decides from values has the size its last run gave it."""
        ctx = self._bodies.context(plan)
        return {name: ctx.get_tensor_shape(name) for name in plan.outputs}

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        copy_device(dst, src, nbytes, self.stream)

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None:
        """Copy `rows` blocks of `width` bytes, `src_pitch` bytes apart at src, to `dst_pitch`
        bytes apart at dst (cuMemcpy2DAsync, device to device, on the stream)."""
        if width == 0 or rows == 0:
            return
        d = driver.drv()
        params = d.CUDA_MEMCPY2D()
        params.srcMemoryType = params.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
        params.srcDevice, params.srcPitch = src, src_pitch
        params.dstDevice, params.dstPitch = dst, dst_pitch
        params.WidthInBytes, params.Height = width, rows
        driver.call("cuMemcpy2DAsync", params, self.stream, what="strided device-to-device copy")

    def write(self, ptr: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        self._held.append(array)
        upload(ptr, array, self.stream)

    def read(self, tensor: DeviceTensor) -> np.ndarray:
        """The tensor's value on the host, once the stream's work before it is done."""
        value = download(tensor.ptr, tensor.shape, tensor.dtype, self.stream)
        self._held = []
        return value

    def finish(self) -> None:
        """Wait for the stream (the uploads' host arrays may then go)."""
        driver.call("cuStreamSynchronize", self.stream, what="stream synchronize")
        self._held = []
