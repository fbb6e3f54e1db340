"""Explicit FP8 (float8_e4m3fn) Q/DQ models for the FP8 layer tests, written with onnx.helper, and
the tolerance an FP8 layer's float output is held to against onnxruntime's reading of them; and the checks the
FP8 plan tests share on a plan forced onto other tactics (test_fp8_gemm_plan.py, test_fp8_conv_plan.py)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
#: the largest finite e4m3 value: scales are amax / E4M3_MAX
E4M3_MAX = 448.0


def fp8_weight(rng: np.random.Generator, shape: tuple[int, ...], axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 weight, float32 scale): random float weights quantized per tensor (axis None) or per
    channel along `axis`, scale = amax / 448, as ModelOpt writes them."""
    w = rng.standard_normal(shape).astype(np.float32) * np.float32(0.4)
    if axis is None:
        scale = np.array(np.abs(w).max() / E4M3_MAX, np.float32)
        return (w / scale).astype(E4M3), scale
    others = tuple(i for i in range(len(shape)) if i != axis)
    scale = (np.abs(w).max(axis=others) / E4M3_MAX).astype(np.float32)
    shaped = scale.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return (w / shaped).astype(E4M3), scale


class Fp8Graph:
    """A graph being written: float x -> (Q/DQ'd layers) -> y."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, stem: str) -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def init(self, array: np.ndarray, stem: str) -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def qdq(self, x: str, scale: float) -> str:
        """x -> QuantizeLinear(e4m3, zero point 0) -> DequantizeLinear; `self.x_max` is the largest
        |value| the DQ can give."""
        self.x_max = E4M3_MAX * float(np.float32(scale))
        s, z = self.init(np.array(scale, np.float32), "s"), self.init(np.zeros((), E4M3), "z")
        q, d = self.name("q"), self.name("dq")
        self.nodes += [helper.make_node("QuantizeLinear", [x, s, z], [q], name=q),
                       helper.make_node("DequantizeLinear", [q, s, z], [d], name=d)]
        return d

    def weight(self, shape: tuple[int, ...], axis: int | None) -> str:
        """A constant e4m3 weight read through its DequantizeLinear; `self.w_max` is its largest |value|."""
        wq, scale = fp8_weight(self.rng, shape, axis)
        shaped = scale if axis is None else scale.reshape([-1 if i == axis else 1 for i in range(len(shape))])
        self.w_max = float(np.abs(wq.astype(np.float32) * shaped).max())
        w, s = self.init(wq, "w"), self.init(scale, "ws")
        z = self.init(np.zeros(scale.shape, E4M3), "wz")
        d = self.name("wdq")
        self.nodes.append(helper.make_node("DequantizeLinear", [w, s, z], [d], name=d,
                                           **({"axis": axis} if axis is not None else {})))
        return d

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def bias(self, n: int) -> str:
        return self.init(self.rng.standard_normal(n).astype(np.float32) * np.float32(0.2), "b")

    def model(self, x_shape: tuple[int, ...], out: str, path: Path, k: int) -> tuple[Path, float]:
        """Save the model; (its path, the absolute tolerance of its float output y, computed by the
        last layer: reduction length k, float_tolerance of the largest possible sum |x * w|)."""
        self.nodes.append(helper.make_node("Identity", [out], ["y"], name="out"))
        graph = helper.make_graph(self.nodes, "fp8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ())], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        model.ir_version = 10
        onnx.checker.check_model(model)
        onnx.save(model, str(path))
        return path, float_tolerance(k, k * self.x_max * self.w_max)


def conv_chain(path: Path, *, per_channel: bool = True) -> tuple[Path, float]:
    """x[2,5,13,11] -> Q/DQ -> Conv 3x3/2 (7 out, bias, pads 1) -> Relu -> Q -> DQ -> Conv 1x1 (9 out,
    per-tensor W) -> Add bias -> y: two FP8 convs, the first requantizing to e4m3 for the second."""
    g = Fp8Graph(seed=5)
    x = g.qdq("x", 3.0 / E4M3_MAX)
    c = g.op("Conv", [x, g.weight((7, 5, 3, 3), 0 if per_channel else None), g.bias(7)],
             pads=[1, 1, 1, 1], strides=[2, 2])
    r = g.qdq(g.op("Relu", [c]), 4.0 / E4M3_MAX)
    c2 = g.op("Conv", [r, g.weight((9, 7, 1, 1), None)])
    bias = g.init((g.rng.standard_normal((1, 9, 1, 1)) * 0.2).astype(np.float32), "cb")
    return g.model((2, 5, 13, 11), g.op("Add", [c2, bias]), path, k=7)


def matmul_batched(path: Path, *, per_channel: bool, k: int = 19) -> tuple[Path, float]:
    """x[2,3,5,k] -> Q/DQ -> MatMul W[k,11] (per channel along N or per tensor) -> y[2,3,5,11]."""
    g = Fp8Graph(seed=6)
    x = g.qdq("x", 2.5 / E4M3_MAX)
    return g.model((2, 3, 5, k), g.op("MatMul", [x, g.weight((k, 11), 1 if per_channel else None)]), path, k=k)


def gemm_mlp(path: Path, *, per_channel: bool) -> tuple[Path, float]:
    """x[6,23] -> Q/DQ -> Gemm (transB, bias, alpha 0.5) -> Relu -> Q -> DQ -> Gemm (bias) -> y[6,5]:
    the second reads the first's e4m3 output."""
    g = Fp8Graph(seed=7)
    x = g.qdq("x", 3.0 / E4M3_MAX)
    h = g.op("Gemm", [x, g.weight((13, 23), 0 if per_channel else None), g.bias(13)], transB=1, alpha=0.5)
    h = g.qdq(g.op("Relu", [h]), 2.0 / E4M3_MAX)
    return g.model((6, 23), g.op("Gemm", [h, g.weight((13, 5), 1 if per_channel else None), g.bias(5)]), path, k=13)


def float_tolerance(k: int, magnitude: float) -> float:
    """How far a float32 output of an FP8 layer may be from onnxruntime's: both sum the same k exact
    e4m3 products (onnxruntime of the dequantized values, each rounded once) in float32 in
    different orders, each sum within k * 2**-24 * sum |terms| of the exact one; `magnitude` bounds sum
    |x * w| (dequantized), bias and epilogue add a few roundings of values of that size."""
    return (2 * k + 8) * 2.0 ** -24 * magnitude


def assert_replayed(plan, forced, moved, name: str, kept) -> None:
    """`forced`, a tactic replay of `plan`: the layers `moved(plan)` lists, as many in `forced`, all on tactic
    `name`; every layer `kept(layer)` holds for on the tactic it has in `plan`."""
    assert [layer.tactic for layer in moved(forced)] == [name] * len(moved(plan))
    rest = [(layer.name, layer.tactic) for layer in plan.layers if kept(layer)]
    assert [(layer.name, layer.tactic) for layer in forced.layers if kept(layer)] == rest


def skip_unless_sm90() -> None:
    """Skip a GPU test on a device that is not an sm_90 (the FP8 tactics' wgmma need sm_90a)."""
    from polykit.runtime.cuda import driver

    if not driver.current_device().arch.startswith("sm_90"):
        pytest.skip("the FP8 tactics need sm_90a")


def assert_forced_plan_matches(plan, forced, cpu, feeds_of, cpu_cosine: float) -> None:
    """Run `plan`, `forced` (it on other tactics) and `cpu` (the cpu target's plan) on `feeds_of(seed)` for seeds
    10 and 11: `forced`'s output finite, at cosine >= 0.9999 from `plan`'s and >= `cpu_cosine` from `cpu`'s."""
    from polykit.runtime.engine import Engine

    from .test_int8_build import cosine

    for seed in (10, 11):
        feeds = feeds_of(seed)
        old, new, ref = (next(iter(Engine(p).create_execution_context().execute(feeds).values()))
                         for p in (plan, forced, cpu))
        assert np.all(np.isfinite(new))
        assert cosine(new, old) >= 0.9999 and cosine(new, ref) >= cpu_cosine
