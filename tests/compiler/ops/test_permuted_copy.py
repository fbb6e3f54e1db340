"""ai.polykit PermutedCopy: its shape rule and its reference kernel against numpy's roll / transpose."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.references import run_reference
from polykit.compiler.ops.tensor.permuted_copy import copy_spec
from tests.compiler.passes.passes_testkit import graph
from polykit.errors import PolykitError

rng = np.random.default_rng(3)


def run(x, **attrs):
    return run_reference(Node("PermutedCopy", ["x"], ["y"], attrs, "c", POLYKIT_DOMAIN), [x])[0]


def test_starts_roll_the_input_as_torch_roll_does_with_the_opposite_shift():
    x = rng.standard_normal((3, 7, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(x, starts=[0, 5, 1], shape=[3, 7, 4]), np.roll(x, (-5, -1), axis=(1, 2)))


def test_out_shifts_roll_the_output():
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = run(x, perm=[1, 0], shape=[6, 4], out_shifts=[2, -1])
    np.testing.assert_array_equal(y, np.roll(x.T, (2, -1), axis=(0, 1)))


def test_a_window_wraps_around_the_end_of_an_axis():
    x = np.arange(10, dtype=np.int64).reshape(5, 2)
    np.testing.assert_array_equal(run(x, starts=[3, 0], window=[4, 2], shape=[4, 2]), x[[3, 4, 0, 1]])


def test_window_partition_in_one_step():
    x = rng.standard_normal((1, 6, 4, 3)).astype(np.float32)
    y = run(x, starts=[0, 1, 1, 0], view=[1, 3, 2, 2, 2, 3], perm=[0, 1, 3, 2, 4, 5], shape=[6, 4, 3])
    expected = np.roll(x, (-1, -1), axis=(1, 2)).reshape(1, 3, 2, 2, 2, 3).transpose(0, 1, 3, 2, 4, 5).reshape(6, 4, 3)
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("attrs,what", [({"shape": [5]}, "same number of elements"),
                                        ({"perm": [0, 0], "shape": [2, 3]}, "not a permutation"),
                                        ({"starts": [2, 0], "shape": [2, 3]}, "starts"),
                                        ({"window": [1, 4], "shape": [1, 4]}, "window"),
                                        ({"shape": [6], "out_shifts": [1, 1]}, "out_shifts"),
                                        ({"shape": "6"}, "not a list of integers")])
def test_bad_attributes_are_named(attrs, what):
    with pytest.raises(ValueError, match=what):
        copy_spec(attrs, (2, 3))


def test_the_shape_rule_refuses_a_bad_node_with_a_hint():
    with pytest.raises(PolykitError, match="permutation") as info:
        graph([Node("PermutedCopy", ["x"], ["y"], {"perm": [1, 1], "shape": [3, 2]}, "c", POLYKIT_DOMAIN)],
              {"x": (2, 3)}, ["y"])
    assert "fuse_movement" in info.value.hint
