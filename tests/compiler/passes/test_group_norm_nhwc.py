"""GroupNorm / InstanceNorm between channels-last convolutions (issue #29 item 3): recognize_groupnorm
turns torch's export chain into one norm, and the layout passes run it as ai.polykit GroupNormNHWC on
the NHWC (or NLC) tensor, so its elementwise readers stay channels last and no Transpose is left
around it. cpu plans (the reference kernels, channels last) against onnxruntime on random data; the
cuda fp16 level-0 plans built off the GPU: no Transpose layer next to the norm."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.passes import optimize, recognize_groupnorm
from polykit.compiler.plan.file import Plan
from polykit.runtime.engine import Runtime

from .passes_testkit import op_counts, run_and_compare

RNG = np.random.default_rng(29)
GN_NHWC = f"{POLYKIT_DOMAIN}:GroupNormNHWC"
CONV_NHWC = f"{POLYKIT_DOMAIN}:ConvNHWC"


class _Model:
    """An onnx.helper model under construction: nodes, float32 initializers, fresh names."""

    def __init__(self):
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def init(self, value, prefix: str = "w") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{out}", **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, rank: int) -> str:
        kernel = [k] * (rank - 2)
        w = (RNG.standard_normal((cout, cin, *kernel)) / np.sqrt(cin * k ** (rank - 2))).astype(np.float32)
        b = (RNG.standard_normal(cout) * 0.1).astype(np.float32)
        return self.op("Conv", [x, self.init(w), self.init(b, "b")], kernel_shape=kernel,
                       pads=[k // 2] * 2 * (rank - 2))

    def torch_group_norm(self, x: str, channels: int, groups: int, rank: int, affine: bool = True) -> str:
        """torch.nn.GroupNorm as the TorchScript exporter writes it: Reshape [0, G, -1] ->
        InstanceNormalization (ones, zeros) -> Reshape to Shape(x) -> Mul gamma -> Add beta."""
        r = self.op("Reshape", [x, self.init(np.array([0, groups, -1], np.int64), "shape")])
        n = self.op("InstanceNormalization", [r, self.init(np.ones(groups, np.float32), "ones"),
                                              self.init(np.zeros(groups, np.float32), "zeros")], epsilon=1e-5)
        y = self.op("Reshape", [n, self.op("Shape", [x])])
        if not affine:
            return y
        per_channel = (channels,) + (1,) * (rank - 2)
        gamma = RNG.uniform(0.5, 1.5, per_channel).astype(np.float32)
        beta = (RNG.standard_normal(per_channel) * 0.1).astype(np.float32)
        return self.op("Add", [self.op("Mul", [y, self.init(gamma, "gamma")]), self.init(beta, "beta")])

    def model(self, x_shape: tuple, y: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "gn",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                                  [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _live_counts(g) -> Counter:
    """op_counts without the Shape node of the export (dead once the chain is one node: DCE's job)."""
    return op_counts(g) - Counter({"Shape": 1})


def silu(m: _Model, x: str) -> str:
    return m.op("Mul", [x, m.op("Sigmoid", [x])])


#: the test's activations: ONNX op (GeluTanh: Gelu approximate="tanh"; SiLU: Mul(x, Sigmoid(x))) ->
#: the GroupNormNHWC `activation` that fuse_bias_activation gives the norm
ACTIVATION_OF = {"Gelu": "gelu", "SiLU": "silu", "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh",
                 "GeluTanh": "gelu_tanh"}
ONNX_ACT = {"GeluTanh": ("Gelu", {"approximate": "tanh"})}


def conv_norm_act_conv(x_shape: tuple, groups: int | None, act: str = "Gelu", channels: int = 16,
                       affine: bool = True) -> onnx.ModelProto:
    """Conv -> norm (torch's GroupNorm chain with `groups`; None: a plain InstanceNormalization with
    per-channel scale and bias) -> act (an ACTIVATION_OF key) -> Conv, 1-D or 2-D by the rank of `x_shape`."""
    m, rank = _Model(), len(x_shape)
    x = m.conv("x", x_shape[1], channels, 3, rank)
    if groups is None:
        x = m.op("InstanceNormalization", [x, m.init(RNG.uniform(0.5, 1.5, channels).astype(np.float32), "s"),
                                           m.init((RNG.standard_normal(channels) * 0.1).astype(np.float32), "b")])
    else:
        x = m.torch_group_norm(x, channels, groups, rank, affine)
    if act == "SiLU":
        x = silu(m, x)
    else:
        op, attrs = ONNX_ACT.get(act, (act, {}))
        x = m.op(op, [x], **attrs)
    return m.model(x_shape, m.conv(x, channels, 8, 3, rank))


def _run(plan: Plan, feeds: dict[str, np.ndarray]) -> np.ndarray:
    (out,) = Runtime().deserialize_engine(plan.serialize()).create_execution_context().execute(feeds).values()
    return out


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


# (input shape, groups, activation): 1-D and 2-D, wav2vec2's GroupNorm(C, C), a diffusion UNet's
# GroupNorm(32) + SiLU (odd pixel counts), one group, a plain InstanceNormalization. 1-D chains sink
# the Transpose through single-input activations (cancel_transposes), so SiLU's diamond is 2-D only
# (plan_layouts' regions)
CASES = [
    ((2, 3, 37), 16, "Gelu"),
    ((1, 5, 9, 7), 16, "Gelu"),
    ((2, 4, 11, 5), 32, "SiLU"),
    ((1, 3, 13), 4, "Gelu"),
    ((2, 3, 6, 5), 1, "Gelu"),
    ((2, 3, 21), None, "Gelu"),
    ((1, 3, 5, 9), None, "SiLU"),
]


def _channels(groups: int | None) -> int:
    return 64 if groups == 32 else 16


@pytest.mark.parametrize("shape,groups,act", CASES)
def test_cpu_channels_last_plan_runs_the_norm_nhwc_and_matches_onnxruntime(shape, groups, act):
    model = conv_norm_act_conv(shape, groups, act, channels=_channels(groups))
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    kinds = Counter(layer.kind for layer in plan.layers)
    assert kinds["GroupNormNHWC"] == 1 and kinds["ConvNHWC"] == 2
    assert not kinds["InstanceNormalization"] and not kinds["GroupNormalization"]
    # the activation runs inside the norm (fuse_bias_activation): no layer of its own
    assert _norm_activations(plan) == [ACTIVATION_OF[act]] and not kinds["Pointwise"] and not kinds[act]
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    np.testing.assert_allclose(_run(plan, feeds), _onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


def _norm_activations(plan: Plan) -> list[str]:
    return [layer.attrs.get("activation", "none") for layer in plan.layers if layer.kind == "GroupNormNHWC"]


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Tanh", "GeluTanh"])
@pytest.mark.parametrize("shape,groups", [((2, 3, 7, 5), 32), ((1, 3, 19), None)])
def test_cpu_plan_fuses_every_norm_activation_and_matches_onnxruntime(shape, groups, act):
    """The other activations a norm takes, 2-D GroupNorm(32) and 1-D InstanceNorm, odd shapes."""
    model = conv_norm_act_conv(shape, groups, act, channels=_channels(groups))
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    assert _norm_activations(plan) == [ACTIVATION_OF[act]]
    assert not {"Relu", "Sigmoid", "Tanh", "Gelu", "Pointwise"} & {layer.kind for layer in plan.layers}
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    np.testing.assert_allclose(_run(plan, feeds), _onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


def test_cpu_plan_of_the_wav2vec2_frontend_fuses_the_norm_gelu_and_matches_onnxruntime():
    """wav2vec2's feature extractor (tests/conv_models.py): Conv1d -> InstanceNorm (GroupNorm(C, C)) ->
    GELU -> Conv1d ...: the norm writes the GELU's output itself, odd length 203."""
    from tests.conv_models import wav2vec2_frontend

    model = wav2vec2_frontend()
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    assert _norm_activations(plan) == ["gelu"]
    feeds = {"audio": RNG.standard_normal((2, 203)).astype(np.float32)}
    np.testing.assert_allclose(_run(plan, feeds), _onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", ["swish", 3])
def test_a_plan_whose_norm_names_an_unknown_activation_fails_its_load_check(bad):
    """The activation is validated on load like the other attributes (the shape rule, re-run by the
    plan check): an edited plan is a PlanError naming the layer, not a kernel that computes nonsense."""
    from polykit.errors import PlanError

    plan = build_plan(conv_norm_act_conv((1, 3, 9, 7), 32, "SiLU", channels=64),
                      BuilderConfig(target="cpu", channels_last=True))
    norm = next(layer for layer in plan.layers if layer.kind == "GroupNormNHWC")
    norm.attrs["activation"] = bad
    with pytest.raises(PlanError, match=f"unknown activation '{bad}'"):
        Runtime().deserialize_engine(plan.serialize())


def test_a_norm_read_by_its_activation_and_a_residual_keeps_both_apart():
    """Conv -> GroupNorm(32) -> SiLU -> Add(the norm's output) -> Conv: the norm's output has two
    readers, so the norm stores it plain and SiLU stays a layer; the plan still matches onnxruntime."""
    m = _Model()
    x = m.conv("x", 3, 64, 3, 4)
    n = m.torch_group_norm(x, 64, 32, 4)
    y = m.conv(m.op("Add", [silu(m, n), n]), 64, 8, 3, 4)
    model = m.model((2, 3, 9, 7), y)
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    assert _norm_activations(plan) == ["none"]
    feeds = {"x": RNG.standard_normal((2, 3, 9, 7)).astype(np.float32)}
    np.testing.assert_allclose(_run(plan, feeds), _onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,groups,act", CASES)
def test_optimized_graph_has_one_transpose_in_and_one_out(shape, groups, act):
    """Only the input's and the output's reformats stay: the norm, its activation and both convs run
    channels last."""
    g = load_onnx(conv_norm_act_conv(shape, groups, act, channels=_channels(groups)))
    out = optimize(g, keep=g.outputs, channels_last=True)
    counts = op_counts(out)
    assert counts[GN_NHWC] == 1 and counts[CONV_NHWC] == 2, counts
    assert counts["Transpose"] + counts[f"{POLYKIT_DOMAIN}:Reformat"] == 2, counts
    norm = next(n for n in out.nodes if n.op_type == "GroupNormNHWC")
    assert norm.attrs["num_groups"] == (groups or _channels(groups))
    assert out.value(norm.inputs[0]).shape[-1] == _channels(groups)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,groups", [((2, 16, 5, 3), 4), ((1, 8, 11), 2), ((2, 6, 3, 2, 5), 3)])
def test_recognize_groupnorm_gives_one_node_with_the_same_outputs(shape, groups, affine):
    m = _Model()
    y = m.torch_group_norm("x", shape[1], groups, len(shape), affine)
    g = load_onnx(m.model(shape, y))
    out, changed = run_and_compare(g, recognize_groupnorm, rtol=1e-5, atol=1e-5)
    want = "InstanceNormalization" if groups == shape[1] else "GroupNormalization"
    assert changed and _live_counts(out) == Counter({want: 1})
    norm = next(n for n in out.nodes if n.op_type == want)
    assert norm.inputs[0] == "x" and out.initializers[norm.inputs[1]].shape == (shape[1],)


def test_instance_norm_takes_the_per_channel_affine_after_it():
    """GroupNorm(C, C): the cleanup removed the identity Reshapes first; InstanceNormalization (ones,
    zeros) -> Mul gamma -> Add beta is one InstanceNormalization with gamma and beta."""
    m = _Model()
    y = m.torch_group_norm("x", 8, 8, 3)
    g = load_onnx(m.model((2, 8, 13), y))
    g = optimize(g, keep=g.outputs, fuse=False)
    assert op_counts(g) == Counter({"InstanceNormalization": 1})


def test_recognize_groupnorm_leaves_a_chain_whose_intermediate_is_read_elsewhere():
    m = _Model()
    y = m.torch_group_norm("x", 8, 2, 4)
    extra = m.op("Relu", [m.nodes[1].output[0]])  # the InstanceNormalization's output read twice
    g = load_onnx(m.model((1, 8, 3, 3), y))
    g.outputs.append(extra)
    assert not recognize_groupnorm(g)


def test_recognize_groupnorm_leaves_an_affine_that_is_not_per_channel():
    m = _Model()
    y = m.torch_group_norm("x", 8, 2, 4, affine=False)
    y = m.op("Mul", [y, m.init(RNG.uniform(0.5, 1.5, (1, 8, 3, 1)).astype(np.float32), "gamma")])
    g = load_onnx(m.model((1, 8, 3, 3), y))
    out, changed = run_and_compare(g, recognize_groupnorm, atol=1e-5)
    assert changed and _live_counts(out) == Counter({"GroupNormalization": 1, "Mul": 1})


def diffusion_resblock(shape: tuple, channels: int = 64) -> onnx.ModelProto:
    """A diffusion UNet's residual block as torch exports it: conv_in -> [GroupNorm(32) -> SiLU -> conv]
    twice -> Add conv_in's output (the skip) -> GroupNorm(32) -> SiLU -> conv_out."""
    m = _Model()
    h = skip = m.conv("x", shape[1], channels, 3, 4)
    for _ in range(2):
        h = m.conv(silu(m, m.torch_group_norm(h, channels, 32, 4)), channels, channels, 3, 4)
    h = m.op("Add", [h, skip])
    return m.model(shape, m.conv(silu(m, m.torch_group_norm(h, channels, 32, 4)), channels, 4, 3, 4))


def test_diffusion_resblock_runs_channels_last_end_to_end():
    """Three GroupNorm(32) + SiLU and the skip Add between four convs: every norm channels last, the
    reformats only at the input and the output, and the cpu plan (channels last) matches onnxruntime."""
    model = diffusion_resblock((2, 3, 11, 9))
    g = load_onnx(model)
    counts = op_counts(optimize(g, keep=g.outputs, channels_last=True))
    assert counts[GN_NHWC] == 3 and counts[CONV_NHWC] == 4 and not counts["GroupNormalization"]
    assert counts["Transpose"] + counts[f"{POLYKIT_DOMAIN}:Reformat"] == 2, counts
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True))
    feeds = {"x": RNG.standard_normal((2, 3, 11, 9)).astype(np.float32)}
    np.testing.assert_allclose(_run(plan, feeds), _onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pin", ["InstanceNormalization", "GroupNormalization"])
def test_fp32_layers_by_op_type_pin_the_channels_last_norm(pin):
    """`fp32_layers` naming either norm op keeps its GroupNormNHWC form in float32 in an fp16 graph."""
    g = load_onnx(conv_norm_act_conv((1, 5, 9, 7), 16, "Gelu"))
    out = optimize(g, keep=g.outputs, channels_last=True, fp16=True, fp32_layers=(pin,))
    norm = next(n for n in out.nodes if n.op_type == "GroupNormNHWC")
    assert out.value(norm.inputs[0]).dtype == np.float32 and out.initializers[norm.inputs[1]].dtype == np.float32
    unpinned = optimize(g, keep=g.outputs, channels_last=True, fp16=True)
    norm = next(n for n in unpinned.nodes if n.op_type == "GroupNormNHWC")
    assert unpinned.value(norm.inputs[0]).dtype == np.float16


@pytest.mark.parametrize("act", ["SiLU", "Gelu"])
def test_a_float32_pinned_norm_keeps_its_fp16_activation_apart_and_stays_right(act):
    """fp32_layers pins the norm: a Cast reads it, so the fp16 activation after the Cast is not its to
    take (the norm writes float32); the cpu fp16 plan is within fp16 rounding of onnxruntime."""
    model = conv_norm_act_conv((1, 3, 9, 7), 32, act, channels=64)
    g = load_onnx(model)
    out = optimize(g, keep=g.outputs, channels_last=True, fp16=True, fp32_layers=("GroupNormalization",))
    norm = next(n for n in out.nodes if n.op_type == "GroupNormNHWC")
    assert out.value(norm.outputs[0]).dtype == np.float32 and "activation" not in norm.attrs
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True, fp16=True,
                                           fp32_layers=("GroupNormalization",)))
    feeds = {"x": RNG.standard_normal((1, 3, 9, 7)).astype(np.float32)}
    got, want = _run(plan, feeds), _onnxruntime(model, feeds)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def test_norm_between_nchw_ops_stays_channels_first():
    """No channels-last producer: the norm has nothing to gain and stays as it is."""
    m = _Model()
    y = m.op("Relu", [m.torch_group_norm("x", 16, 4, 4)])
    g = load_onnx(m.model((1, 16, 5, 5), y))
    counts = op_counts(optimize(g, keep=g.outputs, channels_last=True))
    assert counts["GroupNormalization"] == 1 and not counts[GN_NHWC] and not counts["Transpose"]


def _cuda_fp16(model: onnx.ModelProto) -> Plan:
    """The cuda fp16 plan at builder level 0 (first-priority tactics, nothing timed: no GPU needed)."""
    return build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0))


MOVEMENT = {"Transpose", "Reformat", "PermutedCopy"}


def _movement_bytes(plan: Plan) -> int:
    """Bytes the reformat layers read and write."""
    return sum(plan.tensors[n].nbytes for layer in plan.layers if layer.kind in MOVEMENT
               for n in (*layer.inputs, *layer.outputs) if n in plan.tensors)


@pytest.mark.parametrize("shape,groups,act", [((1, 3, 4001), 16, "Gelu"), ((1, 4, 33, 31), 32, "SiLU")])
def test_cuda_fp16_plan_has_no_transpose_around_the_norm(shape, groups, act):
    """wav2vec2's conv0 + GroupNorm(C, C) + GELU and a UNet block's GroupNorm(32) + SiLU: the norm layer
    reads the conv's channels-last output and its activation feeds the next conv, no Transpose layer
    between them (only the input's entry and the output's exit reformats)."""
    plan = _cuda_fp16(conv_norm_act_conv(shape, groups, act, channels=_channels(groups)))
    kinds = [layer.kind for layer in plan.layers]
    first, last = kinds.index("ConvNHWC"), len(kinds) - 1 - kinds[::-1].index("ConvNHWC")
    assert "GroupNormNHWC" in kinds[first:last]
    assert not MOVEMENT & set(kinds[first:last]), kinds
    norm = next(layer for layer in plan.layers if layer.kind == "GroupNormNHWC")
    assert norm.tactic == "cuda.norm_nhwc"
    # the reformats move the input and the output only: less than one round trip of the norm's tensor
    # (before: a Transpose of it to channels first and one back, 4x its bytes)
    assert _movement_bytes(plan) < 2 * plan.tensors[norm.inputs[0]].nbytes
    # ... and the activation runs in the norm's apply kernel: conv -> norm -> conv, three layers, the
    # norm's layer reads the tensor once and writes it once (the activation's own read + write gone);
    # a 1-D conv's [N, L, C] <-> [N, L, 1, C] Reshapes are views
    assert [k for k in kinds[first:last + 1] if k != "Reshape"] == ["ConvNHWC", "GroupNormNHWC", "ConvNHWC"], kinds
    assert norm.attrs["activation"] == ACTIVATION_OF[act] and not {"Pointwise", "Gelu", "Mul"} & set(kinds)
    assert _layer_bytes(plan, norm) == 2 * plan.tensors[norm.inputs[0]].nbytes + sum(
        plan.tensors[n].nbytes for n in norm.inputs[1:3])


def _layer_bytes(plan: Plan, layer) -> int:
    """Bytes a layer reads and writes (its inputs and outputs, each once; zoo_check's traffic)."""
    return sum(plan.tensors[n].nbytes for n in (*layer.inputs, *layer.outputs) if n in plan.tensors)


def test_cuda_fp16_diffusion_resblock_plan_has_reformats_only_at_its_ends():
    plan = _cuda_fp16(diffusion_resblock((1, 3, 32, 32)))
    kinds = [layer.kind for layer in plan.layers]
    first, last = kinds.index("ConvNHWC"), len(kinds) - 1 - kinds[::-1].index("ConvNHWC")
    assert kinds.count("GroupNormNHWC") == 3 and not MOVEMENT & set(kinds[first:last]), kinds
    # every GroupNorm(32) -> SiLU is one layer: the norms and the convs only, nine layers in all
    assert _norm_activations(plan) == ["silu"] * 3 and "Pointwise" not in kinds
    assert kinds[first:last + 1] == ["ConvNHWC", "GroupNormNHWC"] * 3 + ["ConvNHWC"], kinds


@pytest.mark.gpu
def test_cuda_fp16_diffusion_resblock_matches_the_cpu_plan():
    model = diffusion_resblock((2, 3, 32, 32))
    feeds = {"x": RNG.standard_normal((2, 3, 32, 32)).astype(np.float32)}
    got, want = _run(_cuda_fp16(model), feeds), _run(build_plan(model, BuilderConfig(target="cpu")), feeds)
    assert got.shape == want.shape and np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("shape,groups,act", [((1, 3, 4001), 16, "Gelu"), ((2, 4, 33, 31), 32, "SiLU"),
                                              ((1, 3, 9, 7), 1, "Gelu"), ((2, 3, 21), None, "Gelu"),
                                              ((2, 3, 9, 7), 32, "Relu"), ((1, 3, 21), None, "GeluTanh"),
                                              ((1, 3, 8, 8), 32, "Sigmoid"), ((1, 3, 17), 4, "Tanh")])
def test_cuda_fp16_plan_matches_the_cpu_plan(shape, groups, act):
    """The norm on cuda.norm_nhwc between the channels-last convs, its activation in the apply kernel,
    within fp16 rounding of the float32 cpu plan (NCHW, the reference kernels)."""
    model = conv_norm_act_conv(shape, groups, act, channels=_channels(groups))
    plan = _cuda_fp16(model)
    assert [layer.tactic for layer in plan.layers if layer.kind == "GroupNormNHWC"] == ["cuda.norm_nhwc"]
    assert _norm_activations(plan) == [ACTIVATION_OF[act]]
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    got, want = _run(plan, feeds), _run(build_plan(model, BuilderConfig(target="cpu")), feeds)
    assert got.shape == want.shape and np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


@pytest.mark.gpu
def test_cuda_fp16_wav2vec2_frontend_matches_the_cpu_plan():
    """wav2vec2's feature extractor: the first conv's InstanceNorm + GELU one cuda.norm_nhwc layer."""
    from tests.conv_models import wav2vec2_frontend

    model = wav2vec2_frontend(batch=1, length=4001)
    plan = _cuda_fp16(model)
    assert _norm_activations(plan) == ["gelu"]
    feeds = {"audio": RNG.standard_normal((1, 4001)).astype(np.float32)}
    got, want = _run(plan, feeds), _run(build_plan(model, BuilderConfig(target="cpu")), feeds)
    assert got.shape == want.shape and np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def _dynamic_length(model: onnx.ModelProto) -> onnx.ModelProto:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param, dims[2].dim_param = "n", "frames"
    return model


def test_profile_build_with_dynamic_length_runs_the_norm_nhwc_at_every_length():
    """Batch and length dynamic (a profile from 17 to 61 frames): the cpu plan's GroupNormNHWC matches
    onnxruntime at the profile's ends and an odd length between; the cuda fp16 plan takes cuda.norm_nhwc
    (its workspace sized at the profile's largest corner)."""
    from polykit.compiler.plan.profiles import Profile

    model = _dynamic_length(conv_norm_act_conv((1, 3, 40), 4, "Gelu"))
    profiles = [Profile({"x": ((1, 3, 17), (2, 3, 40), (3, 3, 61))})]
    plan = build_plan(model, BuilderConfig(target="cpu", channels_last=True, profiles=profiles))
    assert Counter(layer.kind for layer in plan.layers)["GroupNormNHWC"] == 1
    with Runtime().deserialize_engine(plan.serialize()) as engine, engine.create_execution_context() as ctx:
        for shape in ((1, 3, 17), (2, 3, 33), (3, 3, 61)):
            feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
            (got,) = ctx.execute(feeds).values()
            np.testing.assert_allclose(got, _onnxruntime(model, feeds), rtol=1e-4, atol=1e-4, err_msg=str(shape))
    cuda = build_plan(model, BuilderConfig(target="cuda", fp16=True, builder_optimization_level=0, profiles=profiles))
    assert [layer.tactic for layer in cuda.layers if layer.kind == "GroupNormNHWC"] == ["cuda.norm_nhwc"]
