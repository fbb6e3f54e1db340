"""ai.polykit Reformat on cuda (reformat_copy.cu): which layers the tactic takes, the launch it makes
(host side, no GPU), and results against the reference kernel (GPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.tensor.reformat_reference import reformat
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.base import DeviceTensor
from polykit.kernels.cuda.movement.reformat_copy import _supports, compile_variants, enqueue_reformat, kernel_name
from tests.kernels.cuda.recording_launcher import RecordingLauncher

rng = np.random.default_rng(29)


def _attrs(perm, to, pad):
    attrs = {"perm": list(perm), "to": dtypes.to_onnx(np.dtype(to))}
    if pad:
        attrs["pad"] = pad
    return attrs


def layer(x: np.ndarray, perm, to, pad: int = 0) -> LayerDesc:
    y = reformat(Node("Reformat", ["x"], ["y"], _attrs(perm, to, pad), domain=POLYKIT_DOMAIN), [x])[0]
    return LayerDesc("r", "Reformat", ("x",), ("y",), _attrs(perm, to, pad), domain=POLYKIT_DOMAIN,
                     in_dtypes=(x.dtype.name,), in_shapes=(x.shape,), out_dtypes=(y.dtype.name,),
                     out_shapes=(y.shape,))


def test_the_reference_casts_transposes_and_pads_with_zeros():
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    (y,) = reformat(Node("Reformat", ["x"], ["y"], _attrs((0, 2, 3, 1), np.float16, 5), domain=POLYKIT_DOMAIN), [x])
    assert y.dtype == np.float16 and y.shape == (2, 4, 5, 8)
    np.testing.assert_array_equal(y[..., :3], x.astype(np.float16).transpose(0, 2, 3, 1))
    assert not np.any(y[..., 3:])


def test_the_tactic_takes_float_rank4_layers_and_the_launch_carries_runtime_sizes():
    x = np.zeros((2, 3, 7, 9), np.float32)
    assert _supports(layer(x, (0, 2, 3, 1), np.float16, 5))
    assert not _supports(replace(layer(x, (0, 2, 3, 1), np.float16), in_dtypes=("int32",)))
    assert not _supports(replace(layer(x, (0, 2, 3, 1), np.float16), in_shapes=((2, 3, 63),)))
    rec = RecordingLauncher()
    tensors = {"x": DeviceTensor(0x1000, (2, 3, 7, 9), np.dtype(np.float32)),
               "y": DeviceTensor(0x9000, (2, 7, 9, 8), np.dtype(np.float16))}
    enqueue_reformat(layer(x, (0, 2, 3, 1), np.float16, 5), rec, tensors)
    (name, args), = rec.launches  # a padded fp16 pixel of 8 channels: one 16-byte chunk a thread
    assert name == "reformat_in_chunks_f32_f16" and [int(a) for a in args[2:]] == [2, 3, 63, 8, 16]
    rec = RecordingLauncher()
    tensors["y"] = DeviceTensor(0x9000, (2, 7, 9, 7), np.dtype(np.float16))  # 7 channels: no chunk divides
    enqueue_reformat(layer(x, (0, 2, 3, 1), np.float16, 4), rec, tensors)
    (name, args), = rec.launches
    assert name == "reformat_in_f32_f16" and [int(a) for a in args[2:]] == [2, 3, 63, 7]
    rec = RecordingLauncher()
    tensors = {"x": DeviceTensor(0x1000, (1, 5, 6, 21), np.dtype(np.float16)),
               "y": DeviceTensor(0x9000, (1, 21, 5, 6), np.dtype(np.float32))}
    enqueue_reformat(layer(np.zeros((1, 5, 6, 21), np.float16), (0, 3, 1, 2), np.float32), rec, tensors)
    (name, args), = rec.launches
    assert name == "reformat_out_f16_f32" and [int(a) for a in args[2:]] == [1, 21, 30]


def test_every_kernel_variant_is_declared_for_nvrtc():
    names = {k.name for k in compile_variants()}
    assert len(names) == 27 and kernel_name("in_chunks", np.float32, np.float16) in names


#: (input shape, perm, input dtype, output dtype, pad): odd pixel counts and channels, every direction
CASES = [((2, 3, 17, 19), (0, 2, 3, 1), np.float32, np.float16, 5), ((2, 3, 9, 5), (0, 2, 3, 1), np.float32, np.float32, 5),
         ((1, 3, 7, 3), (0, 2, 3, 1), np.float32, np.float16, 13), ((1, 5, 7, 7), (0, 2, 3, 1), np.float32, np.float16, 3),
         ((3, 3, 5, 6), (0, 2, 3, 1), np.float16, np.float16, 1), ((2, 3, 4, 4), (0, 2, 3, 1), np.float32, np.float32, 0),
         ((2, 9, 11, 21), (0, 3, 1, 2), np.float16, np.float32, 0), ((1, 4, 6, 3), (0, 3, 1, 2), np.float32, np.float16, 0)]


@pytest.mark.gpu
@pytest.mark.parametrize("misalign", [0, 2])
@pytest.mark.parametrize("shape,perm,src,dst,pad", CASES)
def test_reformat_matches_the_reference(shape, perm, src, dst, pad, misalign):
    from polykit.runtime.cuda.harness import run_layer

    x = (rng.standard_normal(shape) * 4).astype(src)
    lay = layer(x, perm, dst, pad)  # misaligned y: the element loop instead of the chunks
    out = run_layer(lay, {"x": x}, tactic="cuda.movement.reformat", misalign={"y": misalign * np.dtype(dst).itemsize})["y"]
    want = reformat(Node("Reformat", ["x"], ["y"], dict(lay.attrs), domain=POLYKIT_DOMAIN), [x])[0]
    np.testing.assert_array_equal(out, want)
