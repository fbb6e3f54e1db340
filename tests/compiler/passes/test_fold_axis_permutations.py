"""fold_axis_permutations: a Reshape -> Transpose -> Reshape that reorders one axis becomes a Gather."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.passes import fold_axis_permutations

from .passes_testkit import graph, node, op_counts, run_and_compare


def _shuffle(shape, split, perm, axis=1):
    """x -> Reshape(shape with axis `axis` split into `split`) -> Transpose(perm) -> Reshape(shape) -> Relu."""
    inner = shape[:axis] + split + shape[axis + 1:]
    return graph([node("Reshape", ["x", "inner"], "r"), node("Transpose", ["r"], "t", perm=perm),
                  node("Reshape", ["t", "outer"], "s"), node("Relu", ["s"], "y")], {"x": shape}, ["y"],
                 {"inner": np.array(inner, np.int64), "outer": np.array(shape, np.int64)})


@pytest.mark.parametrize("shape,split,perm,axis", [
    ((2, 6, 5, 3), (2, 3), [0, 2, 1, 3, 4], 1),          # ShuffleNet's channel shuffle, 2 groups
    ((1, 15, 4, 7), (3, 5), [0, 2, 1, 3, 4], 1),         # odd groups
    ((2, 3, 4, 12), (2, 3, 2), [0, 1, 2, 5, 3, 4], 3),   # a three-way split of the last axis
])
def test_a_reshape_transpose_reshape_reordering_one_axis_becomes_one_gather(shape, split, perm, axis):
    out, changed = run_and_compare(_shuffle(shape, split, perm, axis), fold_axis_permutations)
    assert changed and op_counts(out) == {"Gather": 1, "Relu": 1}
    (gather,) = [n for n in out.nodes if n.op_type == "Gather"]
    assert gather.inputs[0] == "x" and gather.attrs["axis"] == axis
    assert sorted(out.initializers[gather.inputs[1]].tolist()) == list(range(shape[axis]))


@pytest.mark.parametrize("shape,inner,perm", [
    ((2, 6, 5, 3), (2, 6, 15), [0, 2, 1]),               # merges axes instead of splitting one
    ((2, 6, 5, 3), (2, 2, 3, 5, 3), [0, 3, 2, 1, 4]),    # moves a factor past another axis
])
def test_chains_that_move_data_across_axes_stay(shape, inner, perm):
    g = graph([node("Reshape", ["x", "inner"], "r"), node("Transpose", ["r"], "t", perm=perm),
               node("Reshape", ["t", "outer"], "y")], {"x": shape}, ["y"],
              {"inner": np.array(inner, np.int64), "outer": np.array(shape, np.int64)})
    assert not fold_axis_permutations(g)


def test_an_intermediate_read_elsewhere_keeps_the_chain():
    g = _shuffle((2, 6, 5, 3), (2, 3), [0, 2, 1, 3, 4])
    g.nodes.append(node("Neg", ["t"], "z"))
    g.outputs.append("z")
    g.toposort()
    assert not fold_axis_permutations(g)
