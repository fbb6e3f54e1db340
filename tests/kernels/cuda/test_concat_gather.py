"""ai.polykit ConcatGather on cuda (gather.cu concat_gather): the launch it makes (host side, no GPU)
and results against the reference kernel (GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.movement.gather import compile_variants, concat_gather_args

rng = np.random.default_rng(31)


def _layer(n_sources: int, axis: int) -> LayerDesc:
    names = tuple(f"x{k}" for k in range(n_sources))
    return LayerDesc("cg", "ConcatGather", ("idx", *names), ("y",), {"axis": axis}, domain=POLYKIT_DOMAIN)


def test_the_launch_carries_every_source_and_extent_at_runtime_absent_ones_null():
    tensors = {"idx": DeviceTensor(0x100, (64,), np.dtype(np.int64)),
               "x0": DeviceTensor(0x1000, (1, 28, 28, 58), np.dtype(np.float16)),
               "x1": DeviceTensor(0x9000, (1, 28, 28, 58), np.dtype(np.float16)),
               "y": DeviceTensor(0x20000, (1, 28, 28, 64), np.dtype(np.float16))}
    name, n, args = concat_gather_args(_layer(2, 3), tensors)
    assert name == "concat_gather_2" and n == 28 * 28 * 64
    assert args[2:5] == [784, 64, 1] and args[5:7] == [tensors["x0"], tensors["x1"]] and args[7:9] == [0, 0]
    assert args[9:] == [58, 58, 0, 0]
    tensors = {"idx": DeviceTensor(0x100, (5,), np.dtype(np.int64)),
               **{f"x{k}": DeviceTensor(0x1000 * (k + 1), (2, k + 1, 3), np.dtype(np.float32)) for k in range(3)},
               "y": DeviceTensor(0x20000, (2, 5, 3), np.dtype(np.float32))}
    name, n, args = concat_gather_args(_layer(3, 1), tensors)
    assert name == "concat_gather_4" and args[2:5] == [2, 5, 3] and args[9:] == [1, 2, 3, 0]


def test_int32_indices_are_refused_with_a_hint():
    from polykit.errors import DeviceError

    tensors = {"idx": DeviceTensor(0x100, (4,), np.dtype(np.int32)), "x0": DeviceTensor(0x1000, (1, 2), np.dtype(np.float16)),
               "x1": DeviceTensor(0x2000, (1, 2), np.dtype(np.float16)), "y": DeviceTensor(0x3000, (1, 4), np.dtype(np.float16))}
    with pytest.raises(DeviceError):
        concat_gather_args(_layer(2, 1), tensors)


def test_the_concat_gather_kernels_are_declared_for_nvrtc():
    assert {k.name for k in compile_variants()} >= {f"concat_gather_{es}" for es in (1, 2, 4, 8)}


@pytest.mark.gpu
@pytest.mark.parametrize("extents,axis,dtype", [((58, 58), 3, np.float16), ((3, 5, 2, 7), 1, np.float32),
                                                ((116, 116), -1, np.float16), ((1, 4), 0, np.int64)])
def test_concat_gather_matches_the_reference(extents, axis, dtype):
    from polykit.runtime.cuda.harness import assert_matches_reference

    rank = 4
    a = axis % rank
    shapes = [tuple(e if d == a else (2, 3, 5, 7)[d] for d in range(rank)) for e in extents]
    total = sum(extents)
    idx = np.concatenate([rng.permutation(total), [-1, 0, total - 1]]).astype(np.int64)
    feeds = {"idx": idx, **{f"x{k}": (rng.standard_normal(s) * 10).astype(dtype) for k, s in enumerate(shapes)}}
    assert_matches_reference(_layer(len(extents), axis), feeds, rtol=0, atol=0)
