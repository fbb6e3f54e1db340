"""The cuda CheckRange and SelectByIndex tactics (polykit.kernels.cuda.movement.selection), their host side on
emulated device memory (HostBodies, as the control-flow tests), outputs poisoned first: the
selection copies the chosen element into room of its shape, or into the planned tensor when the
candidates share a shape; the check writes the wrapped position or raises. The gpu-marked tests of
tests/backends/test_run_time_positions.py run the same plans on a device."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import RuntimeInputError
from polykit.kernels.tactics import find_tactic
from tests.backends.test_run_time_positions import _feeds, _positional_model
from tests.kernels.cuda.test_control_flow_sized import HostBuffers, LoopBodies, _read, layer_tensors
from tests.kernels.cuda.test_control_flow_scan import HostLauncher

SHAPES = {"a": (2, 3), "b": (1, 3), "c": (4, 3), "t": (3, 3), "pos": ()}


def _plan(op: str, shapes=SHAPES):
    model = _positional_model(op, op != "SequenceAt")
    shapes = {k: v for k, v in shapes.items() if k != "t" or op == "SequenceInsert"}
    return build_plan(model, BuilderConfig(target="cuda", fuse=False, input_shapes=shapes))


def _run(plan, kind: str, values: dict[str, np.ndarray]):
    """The plan's `kind` layer run once by its cuda.selection tactic on emulated memory: the layer,
    its tensors, the LayerOutputs and the host."""
    (layer,) = [lay for lay in plan.layers if lay.kind == kind]
    host = LoopBodies()
    launcher = HostLauncher(host)
    launcher.outputs = HostBuffers(host).outputs(plan)
    tensors = layer_tensors(plan, layer, host, values)
    find_tactic("cuda", kind, "cuda.selection").enqueue(layer, launcher, tensors)
    return layer, tensors, launcher.outputs, host


@pytest.mark.parametrize("pos", [-3, -1, 0, 2, 3])
def test_select_copies_each_chosen_element_into_room_of_its_shape(pos):
    plan = _plan("SequenceInsert")
    feeds = _feeds("SequenceInsert", pos)
    want = [feeds[n] for n in "abc"]
    p = pos + 3 if pos < 0 else pos
    want.insert(p, feeds["t"])
    index = [0 if k == p else k + 1 if k < p else k for k in range(4)]  # candidates: t, a, b, c
    (select,) = [lay for lay in plan.layers if lay.kind == "SelectByIndex"]
    values = {select.inputs[0]: np.array(index, np.int64), **{n: feeds[n] for n in "abct"}}
    layer, _, outputs, host = _run(plan, "SelectByIndex", values)
    for k, name in enumerate(layer.outputs):
        np.testing.assert_array_equal(_read(plan, layer, outputs, host, name), want[k], err_msg=f"element {k}")


def test_select_writes_an_output_whose_candidates_share_a_shape_into_its_planned_tensor():
    plan = _plan("SequenceErase", {"a": (2, 3), "b": (2, 3), "c": (4, 3), "pos": ()})
    feeds = _feeds("SequenceErase", 0)
    b = feeds["a"][::-1].copy()
    (select,) = [lay for lay in plan.layers if lay.kind == "SelectByIndex"]
    values = {select.inputs[0]: np.array([1, 2], np.int64), "a": feeds["a"], "b": b, "c": feeds["c"]}
    layer, tensors, outputs, host = _run(plan, "SelectByIndex", values)  # erase at 0: b, c
    first, second = layer.outputs
    assert not outputs.sizes(first) and outputs.sizes(second)
    planned = tensors[first]
    np.testing.assert_array_equal(host.get(planned.ptr, planned.shape, planned.dtype), b)
    np.testing.assert_array_equal(_read(plan, layer, outputs, host, second), feeds["c"])


@pytest.mark.parametrize("pos", [-3, -1, 0, 2])
def test_check_range_writes_the_position_counted_from_the_end(pos):
    layer, tensors, _, host = _run(_plan("SequenceAt"), "CheckRange", {"pos": np.array(pos, np.int64)})
    out = tensors[layer.outputs[0]]
    assert host.get(out.ptr, out.shape, out.dtype).item() == pos % 3


@pytest.mark.parametrize("pos", [3, -4, -(1 << 40)])
def test_check_range_out_of_range_raises_naming_input_value_and_range(pos):
    with pytest.raises(RuntimeInputError, match=rf"input 'pos'.* is {pos}, outside its range \[-3, 2\]"):
        _run(_plan("SequenceAt"), "CheckRange", {"pos": np.array(pos, np.int64)})
