"""ai.polykit GroupNormNHWC: GroupNormalization of a channels-last tensor (docs/FUSION.md, "Channels last").

GroupNormNHWC(X, scale, bias) -> Y, X [N, D1, ..., Dk, C] (rank >= 3: [N, L, C] for a 1-D conv's
output, [N, H, W, C] for a 2-D one), scale and bias [C] (per channel, opset 21's form), Y of X's
shape and dtype. Attributes `num_groups` G (C % G == 0) and `epsilon`. It computes ONNX
GroupNormalization on X with its last axis moved to axis 1: statistics per (n, group) over the
D1 * ... * Dk * C / G elements of the group's channels c in [g * C / G, (g + 1) * C / G), strided
by C in memory; InstanceNormalization is the case G == C. The layout passes make it
(nhwc_forms' region rule on rank 4, cancel_transposes' norm rule at any rank) so that a norm
between channels-last convolutions needs no Transpose.

Attribute `activation` (default "none"; NORM_ACTIVATIONS) applies a unary activation to the
normalized value before the store: "relu", "sigmoid", "tanh", "silu" (x * sigmoid(x)), "gelu" (the
erf form) and "gelu_tanh" (Gelu approximate="tanh"). fuse_bias_activation's norm step sets it when
the norm's output has that activation as its only reader (GroupNorm -> SiLU in every diffusion
ResBlock, wav2vec2's norm -> GELU), saving the activation's read + write of the tensor.
"""

from __future__ import annotations

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.registry import InferContext, shape_rule

GROUP_NORM_NHWC = "GroupNormNHWC"
#: the ONNX ops it stands for (channels first), their statistics per (n, group) of channels
CHANNEL_NORMS = ("GroupNormalization", "InstanceNormalization")
#: storage dtypes the layout passes convert (the cuda kernels' and the reference's)
FLOATS = ("float16", "float32", "bfloat16")
#: values of the `activation` attribute (the apply kernel's NG_ACT codes are their indices)
NORM_ACTIVATIONS = ("none", "relu", "sigmoid", "tanh", "silu", "gelu", "gelu_tanh")


def norm_activation(attrs) -> str:
    """The `activation` attribute of a GroupNormNHWC ("none" when absent; bytes decoded)."""
    act = attrs.get("activation", "none")
    return act.decode() if isinstance(act, bytes) else str(act)


def channels_last_perm(rank: int) -> list[int]:
    """The Transpose from channels last to channels first: [0, rank - 1, 1, ..., rank - 2]."""
    return [0, rank - 1, *range(1, rank - 1)]


def group_norm_nhwc(node: Node, x: str, out: str, channels: int) -> Node:
    """The GroupNormNHWC computing `node` (a GroupNormalization or InstanceNormalization of `channels`
    channels, channels first) on `x`, its channels-last input, writing `out`."""
    groups = int(node.attrs["num_groups"]) if node.op_type == "GroupNormalization" else channels
    attrs = {"num_groups": groups, "epsilon": float(node.attrs.get("epsilon", 1e-5))}
    return Node(GROUP_NORM_NHWC, [x, node.input(1), node.input(2)], [out], attrs, name=node.name,
                domain=POLYKIT_DOMAIN)


@shape_rule(GROUP_NORM_NHWC, domain=POLYKIT_DOMAIN)
def _group_norm_nhwc(ctx: InferContext):
    x = ctx.shape(0)
    groups = int(ctx.attr("num_groups", 0))
    if groups < 1:
        raise ctx.fail(f"num_groups must be at least 1, got {groups}", hint="to_channels_last's passes set it")
    act = norm_activation(ctx.node.attrs)
    if act not in NORM_ACTIVATIONS:
        raise ctx.fail(f"unknown activation {act!r}", hint=f"use one of {', '.join(NORM_ACTIVATIONS)}")
    if x is not None:
        if len(x) < 3:
            raise ctx.fail(f"GroupNormNHWC needs X of rank >= 3 ([N, ..., C]), got shape {x}")
        channels = x[-1]
        if isinstance(channels, int) and channels % groups:
            raise ctx.fail(f"{channels} channels do not split into num_groups={groups} groups")
        for i in (1, 2):
            s = ctx.shape(i)
            if s is not None and (len(s) != 1 or (isinstance(s[0], int) and isinstance(channels, int)
                                                    and s[0] != channels)):
                raise ctx.fail(f"input {i} ({ctx.node.inputs[i]!r}) must be [{channels}] (per channel), got {s}")
    return [(ctx.dtype(0), x)]
