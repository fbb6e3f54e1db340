"""Training-mode Dropout and BatchNormalization on cuda (training.cu).

Without a GPU: a pure-python model of the kernel's MT19937 (its three-stage parallel twist
included) reproduces numpy's RandomState.uniform exactly, the kernel's dropout arithmetic
reproduces the reference bit for bit, tactic selection and argument packing. On the GPU:
the mask bit for bit and y against the reference (outputs poisoned)."""

from __future__ import annotations

import numpy as np
import pytest

from polykit.compiler.ir.graph import Node
from polykit.compiler.plan.records import LayerDesc
from polykit.kernels.cuda.models import training as tr
from polykit.kernels.cuda.base import DeviceTensor
from polykit.compiler.ops.references import find_reference
from polykit.kernels.tactics import candidates

rng = np.random.default_rng(71)
MT_N, MT_M = 624, 397


# ---- a model of training.cu's generator -------------------------------------------------------
def mt_init(seed: int) -> list[int]:
    mt, s = [0] * MT_N, seed & 0xFFFFFFFF
    for i in range(MT_N):
        mt[i] = s
        s = (1812433253 * (s ^ (s >> 30)) + i + 1) & 0xFFFFFFFF
    return mt


def mt_twist_in_stages(mt: list[int]) -> None:
    """The kernel's twist: stages [0,227), [227,454), [454,624), each read before written."""

    def word(i):
        y = (mt[i] & 0x80000000) | (mt[(i + 1) % MT_N] & 0x7FFFFFFF)
        return mt[(i + MT_M) % MT_N] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)

    for lo, hi in ((0, 227), (227, 454), (454, 624)):
        mt[lo:hi] = [word(i) for i in range(lo, hi)]


def mt_temper(y: int) -> int:
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    return y ^ (y >> 18)


def kernel_uniforms(seed: int, n: int) -> np.ndarray:
    mt, out = mt_init(seed), []
    while len(out) < n:
        mt_twist_in_stages(mt)
        for t in range(tr.MT_BLOCK_ELEMENTS):
            a, b = mt_temper(mt[2 * t]) >> 5, mt_temper(mt[2 * t + 1]) >> 6
            out.append((a * 67108864.0 + b) / 9007199254740992.0)
    return np.array(out[:n])


@pytest.mark.parametrize("seed", [0, 1, 42, 12345, 2**32 - 1])
@pytest.mark.parametrize("n", [1, 60, 312, 313, 1000])
def test_kernel_generator_model_reproduces_numpy_random_state(seed, n):
    assert np.array_equal(kernel_uniforms(seed, n), np.random.RandomState(seed).uniform(0.0, 1.0, n))


def kernel_dropout(x: np.ndarray, mask: np.ndarray, ratio: float) -> np.ndarray:
    """dropout_apply's arithmetic: factor rounded to T, (mask * x) then * factor, in T's compute type."""
    factor = np.asarray(1.0 / (1.0 - ratio)).astype(x.dtype)
    compute = np.float32 if x.dtype == np.float16 else x.dtype
    kept = mask.astype(compute) * x.astype(compute)
    return (kept * factor.astype(compute)).astype(x.dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("ratio", [0.75, 0.1, np.float32(0.3)])
def test_kernel_dropout_arithmetic_is_bit_exact_to_the_reference(dtype, ratio):
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    node = Node("Dropout", ["x", "r", "t"], ["y", "m"], {"seed": 3})
    ref_y, ref_mask = find_reference("", "Dropout")(node, [x, np.array(ratio, np.float32), np.array(True)])
    mask = kernel_uniforms(3, x.size).reshape(x.shape) >= float(np.float32(ratio))
    assert np.array_equal(mask, ref_mask)
    assert kernel_dropout(x, mask, float(np.float32(ratio))).tobytes() == ref_y.tobytes()


# ---- host side --------------------------------------------------------------------------------
class RecordingLauncher:
    def __init__(self):
        self.launches, self.workspaces = [], []

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launches.append((kernel.name, tuple(grid), tuple(block), list(args)))

    def workspace(self, nbytes):
        self.workspaces.append(nbytes)
        return 0xABC000


def dev(shape, dtype, ptr=4096):
    return DeviceTensor(ptr, tuple(shape), np.dtype(dtype))


def dropout(inputs=("x", "r", "t"), outputs=("y", "m"), **attrs):
    return LayerDesc("d", "Dropout", tuple(inputs), tuple(outputs), attrs)


def batchnorm(outputs=("Y", "RM", "RV"), **attrs):
    return LayerDesc("bn", "BatchNormalization", ("X", "S", "B", "M", "V"), tuple(outputs),
                     {"training_mode": 1, **attrs})


def test_dropout_with_a_training_input_picks_the_training_tactic():
    assert candidates("cuda", "Dropout", dropout())[0].name == "cuda.training.dropout"
    assert candidates("cuda", "Dropout", dropout(inputs=("x", "", "t")))[0].name == "cuda.training.dropout"


def test_dropout_without_a_training_input_is_not_the_training_tactic():
    assert "cuda.training.dropout" not in [t.name for t in candidates("cuda", "Dropout", dropout(inputs=("x", "r")))]


def test_batchnorm_training_mode_picks_the_training_tactic_and_inference_does_not():
    assert candidates("cuda", "BatchNormalization", batchnorm())[0].name == "cuda.training.batchnorm"
    inference = LayerDesc("bn", "BatchNormalization", ("X", "S", "B", "M", "V"), ("Y",), {})
    assert "cuda.training.batchnorm" not in [t.name for t in candidates("cuda", "BatchNormalization", inference)]


def test_tactics_decline_a_stamped_integer_input_dtype():
    from dataclasses import replace

    assert not tr.dropout_has_training_input(replace(dropout(), in_dtypes=("int32", "float32", "bool")))
    assert tr.dropout_has_training_input(replace(dropout(), in_dtypes=("bfloat16", "float32", "bool")))
    bn = replace(batchnorm(), in_dtypes=("int64",) * 5)
    assert "cuda.training.batchnorm" not in [t.name for t in candidates("cuda", "BatchNormalization", bn)]


def test_dropout_seed_is_taken_modulo_two_to_the_32():
    assert tr.dropout_seed(dropout(seed=5)) == 5 and tr.dropout_seed(dropout()) == 0
    assert tr.dropout_seed(dropout(seed=-1)) == np.uint32(0xFFFFFFFF)


def test_dropout_launches_the_generator_then_the_apply_kernel_with_device_scalars():
    rec = RecordingLauncher()
    t = {"x": dev((7, 50), np.float16, 1), "r": dev((), np.float64, 2), "t": dev((), np.bool_, 3),
         "y": dev((7, 50), np.float16, 4), "m": dev((7, 50), np.bool_, 5)}
    tr.enqueue_dropout_training(dropout(seed=9), rec, t)
    (gen, ggrid, gblock, gargs), (app, _, _, aargs) = rec.launches
    assert (gen, ggrid, gblock) == ("dropout_mask", (1, 1, 1), (tr.MT_THREADS, 1, 1))
    assert gargs[:5] == [t["r"], 3, t["t"], 9, 5] and gargs[5] == 350 and gargs[1].dtype == np.int32
    assert app == "dropout_apply_f16" and aargs == [t["x"], t["y"], 5, t["r"], 3, t["t"], 350]
    assert rec.workspaces == []


def test_dropout_without_mask_output_or_ratio_uses_a_workspace_mask_and_ratio_code_zero():
    rec = RecordingLauncher()
    t = {"x": dev((10,), np.float32), "t": dev((), np.bool_, 3), "y": dev((10,), np.float32)}
    tr.enqueue_dropout_training(dropout(inputs=("x", "", "t"), outputs=("y",)), rec, t)
    assert rec.workspaces == [10]
    assert rec.launches[0][3][:2] == [0, 0] and rec.launches[1][3][2] == 0xABC000


def test_dropout_of_an_integer_tensor_is_refused_with_a_device_error():
    from polykit.errors import DeviceError

    t = {"x": dev((4,), np.int32), "r": dev((), np.float32), "t": dev((), np.bool_), "y": dev((4,), np.int32)}
    with pytest.raises(DeviceError):
        tr.enqueue_dropout_training(dropout(outputs=("y",)), RecordingLauncher(), t)


def test_batchnorm_geometry_is_batch_channels_and_spatial_size():
    assert tr.batchnorm_geometry((2, 3, 4, 5)) == (2, 3, 20)
    assert tr.batchnorm_geometry((6, 7)) == (6, 7, 1)


def test_batchnorm_packs_dtype_codes_eps_momentum_and_one_block_per_channel():
    rec = RecordingLauncher()
    t = {"X": dev((2, 3, 4, 5), np.float32, 1), "S": dev((3,), np.float32, 2), "B": dev((3,), np.float32, 3),
         "M": dev((3,), np.float64, 4), "V": dev((3,), np.float64, 5), "Y": dev((2, 3, 4, 5), np.float32, 6),
         "RM": dev((3,), np.float64, 7), "RV": dev((3,), np.float64, 8)}
    tr.enqueue_batchnorm_training(batchnorm(epsilon=1e-2, momentum=0.8), rec, t)
    ((name, grid, block, args),) = rec.launches
    assert (name, grid, block) == ("batchnorm_train_f32", (3, 1, 1), (64, 1, 1))
    assert args[1:9] == [t["S"], 1, t["B"], 1, t["M"], 3, t["V"], 3]
    assert args[10:14] == [t["RM"], 3, t["RV"], 3] and args[14:17] == [2, 3, 20]
    assert args[17] == np.float64(1e-2) and args[18] == np.float64(0.8)


def test_every_training_kernel_is_a_compile_variant():
    names = {k.name for k in tr.compile_variants()}
    assert {"dropout_mask", *(f"dropout_apply_{c}" for c in tr.DTYPES)} <= names
    assert {k.file for k in tr.compile_variants()} == {"training.cu"}
    assert {f"batchnorm_train_{c}" for c in tr.DTYPES} <= {k.name for k in tr._batchnorm_kernels(None)}


# ---- on the GPU -------------------------------------------------------------------------------
def run_exact(layer, feeds):
    from polykit.runtime.cuda.harness import reference_layer, run_layer

    got, want = run_layer(layer, feeds), reference_layer(layer, feeds)
    for name, ref in want.items():
        assert got[name].dtype == ref.dtype, name
        assert got[name].tobytes() == ref.tobytes(), f"output {name!r} differs from the reference"
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 4, 5), (1,), (312,), (313,), (2, 700)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_training_dropout_mask_and_output_are_bit_exact(shape, dtype):
    feeds = {"x": rng.standard_normal(shape).astype(dtype), "r": np.array(0.75, np.float32), "t": np.array(True)}
    got = run_exact(dropout(seed=0), feeds)
    assert 0 < got["m"].sum() < got["m"].size or got["m"].size < 10


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [1, 77, 2**31 + 5])
@pytest.mark.parametrize("ratio_dtype", [np.float32, np.float64, np.float16])
def test_training_dropout_honours_seed_and_ratio_dtype(seed, ratio_dtype):
    feeds = {"x": rng.standard_normal((5, 67)).astype(np.float32), "r": np.array(0.3, ratio_dtype),
             "t": np.array(True)}
    run_exact(dropout(seed=seed), feeds)


@pytest.mark.gpu
def test_training_dropout_default_ratio_without_mask_output():
    feeds = {"x": rng.standard_normal((4, 33)).astype(np.float32), "t": np.array(True)}
    run_exact(dropout(inputs=("x", "", "t"), outputs=("y",), seed=4), feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("ratio,training", [(0.0, True), (0.5, False)])
def test_training_dropout_is_the_identity_for_ratio_zero_or_training_false(ratio, training):
    x = rng.standard_normal((3, 9)).astype(np.float32)
    got = run_exact(dropout(), {"x": x, "r": np.array(ratio, np.float32), "t": np.array(training)})
    assert np.array_equal(got["y"], x) and got["m"].all()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (5, 7), (1, 2, 1, 1), (3, 4, 300), (2, 1, 17, 19)])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (np.float64, 1e-12), (np.float16, 1e-3)])
def test_training_batchnorm_matches_reference_outputs_and_running_stats(shape, dtype, tol):
    from polykit.runtime.cuda.harness import assert_matches_reference

    c = shape[1]
    feeds = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(dtype), "S": rng.uniform(0.5, 1.5, c).astype(dtype),
             "B": rng.uniform(-1, 1, c).astype(dtype), "M": rng.uniform(-1, 1, c).astype(dtype),
             "V": rng.uniform(0.5, 2, c).astype(dtype)}
    assert_matches_reference(batchnorm(epsilon=1e-2, momentum=0.8), feeds, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_training_batchnorm_with_float64_running_stats_and_only_y():
    feeds = {"X": rng.standard_normal((4, 3, 6)).astype(np.float32), "S": rng.uniform(0.5, 1.5, 3).astype(np.float32),
             "B": rng.uniform(-1, 1, 3).astype(np.float32), "M": rng.uniform(-1, 1, 3),
             "V": rng.uniform(0.5, 2, 3)}
    from polykit.runtime.cuda.harness import assert_matches_reference

    assert_matches_reference(batchnorm(), feeds, rtol=1e-6, atol=1e-6)
    assert_matches_reference(batchnorm(outputs=("Y",)), feeds, rtol=1e-6, atol=1e-6)
