"""Concat by placement in a context's memory (cpu target): the producers of placed Concat inputs
write their rows into the root's slot of the scratch the caller gives, where the Concat's output
is read from; the slot holds exactly the concatenation."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.runtime.engine import Engine
from tests.compiler.test_concat_placement import _image, branches


def _scratch(nbytes: int) -> np.ndarray:
    raw = np.full(nbytes + 256, 0xFF, np.uint8)  # NaN in every float slot
    start = -raw.ctypes.data % 256
    return raw[start:start + nbytes]


def test_placed_rows_land_in_the_root_slot_of_the_callers_scratch():
    model, _ = branches((3, 5, 24))
    plan = build_plan(model, BuilderConfig(target="cpu"))
    (cat,) = [layer for layer in plan.layers if layer.kind == "Concat"]
    root = plan.tensors[cat.outputs[0]]
    assert sorted(plan.memory.placements) == sorted(cat.inputs)
    model.graph.output.append(helper.make_tensor_value_info(cat.outputs[0], TensorProto.FLOAT, None))
    reference = build_plan(model, BuilderConfig(target="cpu"))  # the Concat's output kept: nothing placed
    assert reference.memory.placements == {}
    image = _image()
    with Engine(reference) as engine, engine.create_execution_context() as ctx:
        want = ctx.execute({"image": image})
    with Engine(plan) as engine, engine.create_execution_context(device_memory=None) as ctx:
        scratch = _scratch(engine.device_memory_size)
        ctx.set_device_memory(scratch.ctypes.data, scratch.nbytes)
        got = ctx.execute({"image": image})
        y = plan.outputs[0]
        np.testing.assert_array_equal(got[y], want[y])
        held = scratch[root.offset:root.offset + root.nbytes].view(np.float32).reshape(root.shape)
        np.testing.assert_array_equal(held, want[cat.outputs[0]])
