"""to_channels_last: run 1-D / 2-D / 3-D convolutions and 2-D pools channels-last (docs/FUSION.md, "Channels last").

- A 1-D Conv (x [N, C, L], constant W, of a class in `conv_classes`) runs as the 2-D ConvNHWC (kernel
  [1, k]) of its input viewed [N, 1, L, C] between 3-D Transposes (_Rewriter.conv1d), a dense one's
  channels padded to CHANNEL_ALIGN as a dense 2-D conv's are, so the NHWC tensor-core tactics serve it.
- A 3-D Conv (x [N, C, D, H, W], constant W) runs as the 2-D ConvNHWC of its depth taps stacked into
  channels (_Rewriter.conv3d: a strided Slice of D per tap, one Concat, [N * OD, H, W, C * kd]), so the same
  tactics and epilogues serve it; a (1, kh, kw) conv is a 2-D conv over N * D images with no copy.

- Conv (2-D, float16/float32, constant W) of a class in `conv_classes` -> Transpose(X, 0231)
  [-> Pad of the channel axis with zeros up to a multiple of CHANNEL_ALIGN: dense convs only] ->
  ai.polykit ConvNHWC(X', W repacked as KRSC [with as many zero channels], B, its group kept) ->
  Transpose(0312) writing the Conv's output name. Classes (conv_class): "dense" (group 1),
  "depthwise" (group == C: one input channel a group, any channel multiplier), "grouped" (the
  rest). The default converts dense and depthwise convs; a build converts the classes its
  target's NHWC tactics serve well (polykit.compiler.builder.builder.nhwc_conv_classes).
- ConvTranspose (2-D, constant W [C, M, kH, kW], one group) whose strides equal its kernel, with no
  dilation, pads or output padding (each output pixel takes one input pixel: UNet's 2x2/2
  up-convolution), when dense convs are converted: a 1x1 ConvNHWC giving kH * kW * M channels (W
  repacked, the bias tiled) -> Reshape [N, H, W, kH, kW, M] -> Transpose (0, 1, 3, 2, 4, 5) -> Reshape
  [N, H * kH, W * kW, M] (the pixel shuffle, one copy, until fold_depth_to_space makes the conv store
  it) -> Transpose(0312). Others stay NCHW.
- MaxPool (its Indices unused; float16/float32, or int8/uint8 / e4m3 between INT8 / FP8 layers) / AveragePool
  (2-D, float16/float32) and GlobalAveragePool (rank 4)
  whose input an NHWC op computes, directly or through elementwise ops: the same wrapping, as
  MaxPoolNHWC / AveragePoolNHWC / ReduceMean(axes=[1, 2], keepdims=1). A pool elsewhere stays NCHW
  (two reformats to save none).
Pads are resolved (auto_pad folded in), so the new nodes carry explicit pads; a node whose pads
depend on unknown dims stays. The NHWC node keeps the original node's name. cancel_transposes
then cancels the Transposes between neighbours, leaving reformats at the chain's entry and exit.
- ai.polykit QConv (INT8, 2-D, group 1, constant W and zero points) -> QConvNHWC the same way, its
  channels padded to a multiple of INT8_CHANNEL_ALIGN with X's zero point (a real zero of the
  centered product), W repacked KRSC (padded with W's zero points), the epilogue's extra inputs
  transposed to NHWC (constants here, rank-4 tensors through Transposes); "symmetric" 1 when X and W
  are int8 with zero points 0.
- ai.polykit QMatMul on FP8 operands, or on int8 X and W with zero points of 0 (symmetric INT8: X
  [..., M, K] of static shape, W a constant [K, N] with K % INT8_CHANNEL_ALIGN == 0) ->
  Reshape(X, [1, 1, rows, K]) -> a 1x1 QConvNHWC over the rows (W packed KRSC [N, 1, 1, K] here,
  once: K-major, as the sm90 FP8 and INT8 wgmma kernels read it; "symmetric" 1 for INT8) ->
  Reshape to [..., M, N]; epilogue inputs that broadcast along N alone stay, those of the output's
  shape are reshaped like it (others leave the node as it is). The cuda FP8 tactics run convolutions
  only (kernels/cuda/int8/fp8_sm90.py), and the sm90 INT8 tiles too (s8 wgmma for INT8 GEMMs:
  issue 35); an asymmetric (uint8) QMatMul stays on cuda.int8.mma_matmul.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.nn.channels_last import CHANNEL_ALIGN, TO_NCHW, TO_NHWC
from polykit.compiler.ops.nn.conv import AUTO_PADS, window_geometry
from polykit.compiler.ops.quant.int8 import (FP8, INT8_DTYPES, NHWC_KIND, QUANT_ARITY, QUANT_DTYPES, SYMMETRIC,
                                             Y_SCALE, Y_SYMMETRIC, Y_ZERO_POINT, W, W_ZERO_POINT, X, X_ZERO_POINT)
from polykit.compiler.passes.fuse_pointwise import is_fusable
from polykit.compiler.passes.rewrite import protected

FLOATS = (np.dtype(np.float16), np.dtype(np.float32))
#: every conv class (conv_class); DEFAULT_CONV_CLASSES: those to_channels_last converts unless told
CONV_CLASSES = ("dense", "depthwise", "grouped")
DEFAULT_CONV_CLASSES = frozenset({"dense", "depthwise"})


def conv_class(group: int, channels: int) -> str:
    """A conv's class for to_channels_last: "dense" (group 1), "depthwise" (group == its input
    channels `channels`, so one channel a group), else "grouped"."""
    return "dense" if group == 1 else "depthwise" if group == channels else "grouped"


def aligned(channels: int, align: int) -> int:
    """`channels` rounded up to a multiple of `align` (what a dense conv's input is padded to)."""
    return -(-channels // align) * align


def explicit_pads(graph: Graph, node: Node, kernel: list[int]) -> list[int] | None:
    """A conv's or pool's pads with auto_pad resolved, or None when they depend on unknown dims."""
    auto = node.attrs.get("auto_pad", "NOTSET") or "NOTSET"
    spatial = graph.value(node.input(0)).shape[2:]
    if auto not in AUTO_PADS or (auto.startswith("SAME") and not all(isinstance(d, int) for d in spatial)):
        return None
    geo = window_geometry(node.attrs, spatial, kernel, ceil_mode=bool(node.attrs.get("ceil_mode", 0)),
                          where=node.describe())
    return list(geo.pads_begin + geo.pads_end)


def nhwc_pool(graph: Graph, node: Node, fixed: set[str]) -> tuple[str, dict] | None:
    """The NHWC form (op type, attributes) of a 2-D MaxPool (its Indices unread; float16/float32, or
    int8/uint8 / float8_e4m3fn), AveragePool (float16/float32) or GlobalAveragePool (rank 4: ReduceMean over axes
    [1, 2] given as an input), or None."""
    x = graph.value(node.input(0))
    eight_bit = (*(np.dtype(d) for d in INT8_DTYPES), *((FP8,) if FP8 is not None else ())) \
        if node.op_type == "MaxPool" else ()
    if x.dtype not in FLOATS + eight_bit or x.shape is None or len(x.shape) != 4:
        return None
    if node.op_type == "GlobalAveragePool":
        return "ReduceMean", {"keepdims": 1}
    indices = node.outputs[1] if len(node.outputs) > 1 else ""
    kernel = [int(k) for k in node.attrs.get("kernel_shape") or []]
    if len(kernel) != 2 or (indices and (indices in fixed or graph.consumers().get(indices))):
        return None
    pads = explicit_pads(graph, node, kernel)
    if pads is None:
        return None
    attrs = {k: v for k, v in node.attrs.items() if k not in ("auto_pad", "storage_order")}
    attrs["pads"] = pads
    return f"{node.op_type}NHWC", attrs


#: QConvNHWC's channel multiple: the cuda INT8 kernel loads 16 channels (bytes) at a time
INT8_CHANNEL_ALIGN = 16


class _Rewriter:
    """One pass over the nodes in order: what is NHWC so far, weights repacked so far."""

    def __init__(self, graph: Graph, fixed: set[str], conv_classes: frozenset[str] = DEFAULT_CONV_CLASSES):
        self.graph = graph
        self.fixed = fixed
        self.conv_classes = conv_classes
        self.nhwc: set[str] = set()  # NCHW names of tensors an NHWC op computes
        self.repacked: dict[tuple[str, int], str] = {}

    def floats_4d(self, name: str, also: tuple[np.dtype, ...] = ()) -> bool:
        v = self.graph.value(name)
        return v.dtype in FLOATS + also and v.shape is not None and len(v.shape) == 4

    def to_nhwc(self, name: str, node: Node, prefix: list[Node]) -> str:
        out = self.graph.fresh_name(f"{name}_nhwc")
        prefix.append(Node("Transpose", [name], [out], {"perm": list(TO_NHWC)},
                           name=self.graph.fresh_name(f"{node.name}_to_nhwc")))
        return out

    def wrapped(self, node: Node, op: str, inputs: list[str], attrs: dict, prefix: list[Node]) -> list[Node]:
        """prefix + the NHWC node + the Transpose that writes `node`'s output (NCHW) name."""
        out = node.outputs[0]
        raw = self.graph.fresh_name(f"{out}_nhwc")
        domain = "" if op == "ReduceMean" else POLYKIT_DOMAIN
        back = Node("Transpose", [raw], [out], {"perm": list(TO_NCHW)}, name=self.graph.fresh_name(f"{node.name}_to_nchw"))
        return prefix + [Node(op, inputs, [raw], attrs, name=node.name, domain=domain), back]

    def padded_channels(self, x: str, extra: int, node: Node, prefix: list[Node], value: str = "") -> str:
        """x padded with `extra` channels of `value` (a scalar tensor; "" pads zeros)."""
        pads = self.graph.add_initializer(np.array([0, 0, 0, 0, 0, 0, 0, extra], dtype=np.int64), f"{node.name}_cpad")
        out = self.graph.fresh_name(f"{x}_cpad")
        prefix.append(Node("Pad", [x, pads] + ([value] if value else []), [out], {},
                           name=self.graph.fresh_name(f"{node.name}_pad_channels")))
        return out

    def dense_aligned(self, xt: str, channels: int, group: int, node: Node, prefix: list[Node]) -> tuple[str, int]:
        """(xt, channels) with a dense conv's channels padded with zeros to a multiple of CHANNEL_ALIGN, for its
        kernels' 16-byte loads; a grouped conv's as they are (padding them would move channels between groups)."""
        if group != 1 or channels % CHANNEL_ALIGN == 0:
            return xt, channels
        padded = aligned(channels, CHANNEL_ALIGN)
        return self.padded_channels(xt, padded - channels, node, prefix), padded

    def krsc(self, w: str, channels: int, fill: np.ndarray | None = None) -> str:
        """W [M, C, kH, kW] as [M, kH, kW, channels], one initializer per use; the channels past C
        hold `fill` (per output channel, or a scalar; zeros without it)."""
        key = (w, channels)
        if key not in self.repacked:
            arr = np.transpose(self.graph.initializers[w], TO_NHWC)
            packed = np.zeros(arr.shape[:3] + (channels,), arr.dtype)
            if fill is not None:
                packed[...] = np.asarray(fill, arr.dtype).reshape(-1, 1, 1, 1)
            packed[..., :arr.shape[3]] = arr
            self.repacked[key] = self.graph.add_initializer(packed, f"{w}_krsc")
        return self.repacked[key]

    # ---- one rewrite per op: the replacement nodes, or None to leave the node ----------------
    def conv(self, node: Node) -> list[Node] | None:
        x, w = node.input(0), node.input(1)
        weight = self.graph.initializers.get(w)
        if weight is not None and weight.ndim == 3:
            return self.conv1d(node)
        if weight is not None and weight.ndim == 5:
            return self.conv3d(node)
        if weight is None or weight.ndim != 4 or not self.floats_4d(x) or weight.dtype != self.graph.value(x).dtype:
            return None
        group = int(node.attrs.get("group", 1))
        if conv_class(group, int(weight.shape[1]) * group) not in self.conv_classes:
            return None
        attrs = self.nhwc_attrs(node, weight)
        if attrs is None:
            return None
        prefix: list[Node] = []
        # a dense conv's channels are padded for the 16-byte loads of its kernels; padding a grouped
        # conv's would move channels between groups (its kernels take any count)
        align = CHANNEL_ALIGN if group == 1 else 1
        xt, channels = self.nhwc_input(x, int(weight.shape[1]) * group, align, node, prefix)
        inputs = [xt, self.krsc(w, channels // group)] + ([node.input(2)] if node.input(2) else [])
        return self.wrapped(node, "ConvNHWC", inputs, attrs, prefix)

    def conv1d(self, node: Node) -> list[Node] | None:
        """A 1-D Conv (x [N, C, L], constant W [M, C / group, k]) as the 2-D ConvNHWC of x viewed
        [N, 1, L, C]: Transpose (0, 2, 1) -> Reshape [N, 1, L, C] [-> Pad of a dense conv's channels
        to a multiple of CHANNEL_ALIGN, zeros as the 2-D path's] -> ConvNHWC (kernel [1, k]) ->
        Reshape [N, L', M] -> Transpose (0, 2, 1), the Transposes 3-D so that they cancel against a
        sequence model's own [N, L, C] <-> [N, C, L] transposes (Whisper's and wav2vec2's front-ends)."""
        x, w = node.input(0), node.input(1)
        weight, xv = self.graph.initializers.get(w), self.graph.value(x)
        if (weight is None or weight.ndim != 3 or xv.dtype not in FLOATS or xv.shape is None or len(xv.shape) != 3
                or weight.dtype != xv.dtype or not isinstance(xv.shape[1], int)):
            return None
        group, (m, cg, k) = int(node.attrs.get("group", 1)), weight.shape
        if conv_class(group, cg * group) not in self.conv_classes:
            return None
        pads = explicit_pads(self.graph, node, [int(k)])
        if pads is None:
            return None
        a = node.attrs
        attrs = {"kernel_shape": [1, int(k)], "strides": [1, int(list(a.get("strides", [1]))[0])],
                 "dilations": [1, int(list(a.get("dilations", [1]))[0])], "pads": [0, pads[0], 0, pads[1]],
                 "group": group}
        step = lambda what: self.graph.fresh_name(f"{node.name}_{what}")  # noqa: E731
        shape = lambda dims: self.graph.add_initializer(np.array(dims, dtype=np.int64), f"{node.name}_shape")  # noqa: E731
        t = [self.graph.fresh_name(f"{node.outputs[0]}_{what}") for what in ("nlc", "nhwc", "conv", "nlm")]
        prefix = [Node("Transpose", [x], [t[0]], {"perm": [0, 2, 1]}, name=step("to_nlc")),
                  Node("Reshape", [t[0], shape([0, 1, -1, int(xv.shape[1])])], [t[1]], {}, name=step("as_2d"))]
        xt, channels = self.dense_aligned(t[1], cg, group, node, prefix)
        w2d = self.graph.add_initializer(np.ascontiguousarray(weight[:, :, None, :]), f"{w}_2d")
        inputs = [xt, self.krsc(w2d, channels)] + ([node.input(2)] if node.input(2) else [])
        return prefix + [Node("ConvNHWC", inputs, [t[2]], attrs, name=node.name, domain=POLYKIT_DOMAIN),
                         Node("Reshape", [t[2], shape([0, -1, int(m)])], [t[3]], {}, name=step("as_1d")),
                         Node("Transpose", [t[3]], [node.outputs[0]], {"perm": [0, 2, 1]}, name=step("to_ncl"))]

    def conv3d(self, node: Node) -> list[Node] | None:
        """A 3-D Conv (x [N, C, D, H, W], constant W [M, C / group, kd, kh, kw]) as the 2-D ConvNHWC of its depth
        taps stacked into channels: Transpose (0, 2, 3, 4, 1) [-> Pad of D] -> for each tap dz the Slice of the OD
        depths it reads (from dz * dilation, the depth stride apart), viewed [N, OD, H, W, C, 1] -> Concat on that
        last axis -> Reshape [N * OD, H, W, C * kd], channel c * kd + dz, so each group's channels stay together
        [-> Pad of a dense conv's channels to CHANNEL_ALIGN] -> ConvNHWC (kernel [kh, kw], W [M, C / group, kd,
        kh, kw] read as [M, C / group * kd, kh, kw]) -> Reshape [N, OD, OH, OW, M] -> Transpose (0, 4, 1, 2, 3).
        The stack is a partial im2col: kd x the input's bytes, copied once. Two forms stack nothing: a (1, kh, kw)
        conv of depth stride 1 without depth pads is a 2-D conv over N * D images, and a (kd, 1, 1) conv of
        spatial stride 1 without spatial pads the 2-D conv of kernel [kd, 1] over the view [N, D, H * W, C].
        Its class (conv_classes) is the 2-D conv's: a stacked depthwise 3-D conv runs as a grouped one of kd
        channels a group."""
        x, w = node.input(0), node.input(1)
        weight, xv = self.graph.initializers.get(w), self.graph.value(x)
        yv = self.graph.value(node.outputs[0])
        if (weight is None or weight.ndim != 5 or xv.dtype not in FLOATS or xv.shape is None or len(xv.shape) != 5
                or weight.dtype != xv.dtype or not all(isinstance(v, int) for v in xv.shape[1:])
                or yv.shape is None or len(yv.shape) != 5 or not all(isinstance(v, int) for v in yv.shape[1:])):
            return None
        group, (m, cg, kd, kh, kw) = int(node.attrs.get("group", 1)), (int(v) for v in weight.shape)
        (c, d, h, wd), (od, oh, ow) = xv.shape[1:], yv.shape[2:]
        pads = explicit_pads(self.graph, node, [kd, kh, kw])
        if pads is None:
            return None
        a = node.attrs
        strides = [int(v) for v in a.get("strides", [1, 1, 1])]
        dilations = [int(v) for v in a.get("dilations", [1, 1, 1])]
        temporal = kh == kw == 1 and strides[1:] == [1, 1] and not any(pads[i] for i in (1, 2, 4, 5))
        if conv_class(group, cg * (1 if temporal else kd) * group) not in self.conv_classes:
            return None
        if (d + pads[0] + pads[3] - dilations[0] * (kd - 1) - 1) // strides[0] + 1 != od:
            return None
        step = lambda what: self.graph.fresh_name(f"{node.name}_{what}")  # noqa: E731
        tensor = lambda what: self.graph.fresh_name(f"{node.outputs[0]}_{what}")  # noqa: E731
        ints = lambda values: self.graph.add_initializer(np.array(values, dtype=np.int64), f"{node.name}_ints")  # noqa: E731
        ndhwc = tensor("ndhwc")
        prefix = [Node("Transpose", [x], [ndhwc], {"perm": [0, 2, 3, 4, 1]}, name=step("to_ndhwc"))]
        if temporal:  # a (kd, 1, 1) conv (a (2+1)-D block's temporal half): the 2-D conv of kernel [kd, 1] over
            # the view [N, D, H * W, C], its depth as the rows: nothing stacked
            viewed = tensor("nhwc")
            prefix.append(Node("Reshape", [ndhwc, ints([-1, d, h * wd, c])], [viewed], {}, name=step("as_2d")))
            xt, channels = self.dense_aligned(viewed, c, group, node, prefix)
            w2d = self.graph.add_initializer(np.ascontiguousarray(weight.reshape(m, cg, kd, 1)), f"{w}_2d")
            attrs = {"kernel_shape": [kd, 1], "strides": [strides[0], 1], "dilations": [dilations[0], 1],
                     "pads": [pads[0], 0, pads[3], 0], "group": group}
            return self._conv3d_tail(node, prefix, xt, w2d, channels, attrs, (od, oh, ow, m), tensor, step, ints)
        source = ndhwc
        if pads[0] or pads[3]:
            source = tensor("dpad")
            prefix.append(Node("Pad", [ndhwc, ints([0, pads[0], 0, 0, 0, 0, pads[3], 0, 0, 0])], [source], {},
                               name=step("pad_depth")))
        if kd == 1 and strides[0] == 1 and not (pads[0] or pads[3]):
            taps = source
        else:
            parts = []
            for dz in range(kd):
                start = dz * dilations[0]
                part, tap = tensor(f"tap{dz}"), tensor(f"tap{dz}_1")
                prefix += [Node("Slice", [source, ints([start]), ints([start + (od - 1) * strides[0] + 1]), ints([1]),
                                          ints([strides[0]])], [part], {}, name=step(f"tap{dz}")),
                           Node("Reshape", [part, ints([-1, od, h, wd, c, 1])], [tap], {}, name=step(f"tap{dz}_axis"))]
                parts.append(tap)
            taps = parts[0]
            if kd > 1:
                taps = tensor("taps")
                prefix.append(Node("Concat", parts, [taps], {"axis": 5}, name=step("stack_taps")))
        stacked = tensor("nhwc")
        prefix.append(Node("Reshape", [taps, ints([-1, h, wd, c * kd])], [stacked], {}, name=step("as_2d")))
        xt, channels = self.dense_aligned(stacked, c * kd, group, node, prefix)
        w2d = self.graph.add_initializer(np.ascontiguousarray(weight.reshape(m, cg * kd, kh, kw)), f"{w}_2d")
        attrs = {"kernel_shape": [kh, kw], "strides": strides[1:], "dilations": dilations[1:],
                 "pads": [pads[1], pads[2], pads[4], pads[5]], "group": group}
        return self._conv3d_tail(node, prefix, xt, w2d, channels, attrs, (od, oh, ow, m), tensor, step, ints)

    def _conv3d_tail(self, node: Node, prefix: list[Node], xt: str, w2d: str, channels: int, attrs: dict,
                     out: tuple[int, int, int, int], tensor, step, ints) -> list[Node]:
        """conv3d's ConvNHWC on `xt` (W `w2d` packed KRSC for `channels`), its output viewed [N, OD, OH, OW, M]
        and transposed to the Conv's NCDHW output."""
        inputs = [xt, self.krsc(w2d, channels // attrs["group"])] + ([node.input(2)] if node.input(2) else [])
        conv, ndhwc_out = tensor("conv"), tensor("ndhwc_out")
        return prefix + [Node("ConvNHWC", inputs, [conv], attrs, name=node.name, domain=POLYKIT_DOMAIN),
                         Node("Reshape", [conv, ints([-1, *out])], [ndhwc_out], {}, name=step("as_3d")),
                         Node("Transpose", [ndhwc_out], [node.outputs[0]], {"perm": [0, 4, 1, 2, 3]},
                              name=step("to_ncdhw"))]

    def conv_transpose(self, node: Node) -> list[Node] | None:
        """A ConvTranspose whose kernel equals its strides (one group, no dilation, no padding:
        each output pixel takes one input pixel, as UNet's 2x2/2 up-convolution) as a 1x1 ConvNHWC
        giving kH * kW * M channels, then the pixel shuffle Reshape [N, H, W, kH, kW, M] ->
        Transpose (0, 1, 3, 2, 4, 5) -> Reshape [N, H * kH, W * kW, M]."""
        x, w, b = node.input(0), node.input(1), node.input(2)
        weight, xv = self.graph.initializers.get(w), self.graph.value(x)
        if ("dense" not in self.conv_classes or weight is None or weight.ndim != 4 or not self.floats_4d(x)
                or weight.dtype != xv.dtype or (b and b not in self.graph.initializers)
                or not all(isinstance(d, int) for d in xv.shape)):
            return None
        (n, c, h, wd), (m, kh, kw) = xv.shape, weight.shape[1:]
        a = node.attrs
        if (int(a.get("group", 1)) != 1 or [int(v) for v in a.get("strides", [1, 1])] != [kh, kw]
                or any(int(v) != 1 for v in a.get("dilations", [1, 1]))
                or any(int(v) for v in list(a.get("pads", [])) + list(a.get("output_padding", [])))
                or self.graph.value(node.outputs[0]).shape != (n, m, h * kh, wd * kw)):
            return None
        as_1x1 = np.ascontiguousarray(np.transpose(weight, (2, 3, 1, 0)).reshape(kh * kw * m, c, 1, 1))
        prefix: list[Node] = []
        xt, channels = self.nhwc_input(x, c, CHANNEL_ALIGN, node, prefix)
        inputs = [xt, self.krsc(self.graph.add_initializer(as_1x1, f"{w}_1x1"), channels)]
        if b:
            inputs.append(self.graph.add_initializer(np.tile(self.graph.initializers[b], kh * kw), f"{b}_tiled"))
        attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
        t = [self.graph.fresh_name(f"{node.outputs[0]}_{what}") for what in ("taps", "blocks", "shuffled", "nhwc")]
        shapes = [self.graph.add_initializer(np.array(s, dtype=np.int64), f"{node.name}_shape")
                  for s in ((n, h, wd, kh, kw, m), (n, h * kh, wd * kw, m))]
        step = lambda what: self.graph.fresh_name(f"{node.name}_{what}")  # noqa: E731
        return prefix + [
            Node("ConvNHWC", inputs, [t[0]], attrs, name=node.name, domain=POLYKIT_DOMAIN),
            Node("Reshape", [t[0], shapes[0]], [t[1]], {}, name=step("taps")),
            Node("Transpose", [t[1]], [t[2]], {"perm": [0, 1, 3, 2, 4, 5]}, name=step("shuffle")),
            Node("Reshape", [t[2], shapes[1]], [t[3]], {}, name=step("pixels")),
            Node("Transpose", [t[3]], [node.outputs[0]], {"perm": list(TO_NCHW)}, name=step("to_nchw"))]

    def nhwc_attrs(self, node: Node, weight: np.ndarray) -> dict | None:
        """A 2-D conv's attributes in the NHWC form (explicit pads, kernel shape, its group), or
        None when its pads depend on unknown dims."""
        kernel = [int(k) for k in weight.shape[2:]]
        pads = explicit_pads(self.graph, node, kernel)
        if pads is None:
            return None
        attrs = {k: v for k, v in node.attrs.items() if k != "auto_pad"}
        attrs.update(pads=pads, kernel_shape=kernel, group=int(node.attrs.get("group", 1)))
        return attrs

    def nhwc_input(self, x: str, c: int, align: int, node: Node, prefix: list[Node],
                   value: str = "") -> tuple[str, int]:
        """(x in NHWC with its c channels padded to a multiple of `align` with `value`, that channel count)."""
        channels = aligned(c, align)
        xt = self.to_nhwc(x, node, prefix)
        if channels != c:
            xt = self.padded_channels(xt, channels - c, node, prefix, value)
        return xt, channels

    def qconv(self, node: Node) -> list[Node] | None:
        """An INT8 or FP8 QConv (2-D, group 1, constant W and zero points) as QConvNHWC: channels padded to
        INT8_CHANNEL_ALIGN with the activation's zero point (a real zero), W repacked KRSC, the
        epilogue's extra inputs transposed to NHWC."""
        x, w = node.input(X), node.input(W)
        init = self.graph.initializers
        weight, w_zero = init.get(w), init.get(node.input(W_ZERO_POINT))
        xv = self.graph.value(x)
        if (weight is None or weight.ndim != 4 or w_zero is None or node.input(X_ZERO_POINT) not in init
                or xv.dtype not in QUANT_DTYPES or xv.shape is None or len(xv.shape) != 4
                or int(node.attrs.get("group", 1)) != 1):
            return None
        attrs = self.nhwc_attrs(node, weight)
        if attrs is None:
            return None
        prefix: list[Node] = []
        extras = {}
        for name in dict.fromkeys(node.inputs[QUANT_ARITY:]):
            extras[name] = self.nhwc_operand(name, node, prefix)
            if extras[name] is None:
                return None
        xt, channels = self.nhwc_input(x, int(weight.shape[1]), INT8_CHANNEL_ALIGN, node, prefix,
                                       value=node.input(X_ZERO_POINT))
        if "epilogue" in attrs:
            body = [dict(step, inputs=[extras.get(n, n) for n in step["inputs"]]) for step in attrs["epilogue"]["body"]]
            attrs["epilogue"] = dict(attrs["epilogue"], body=body)
        x_zero = init[node.input(X_ZERO_POINT)]
        if x_zero.dtype == weight.dtype == np.int8 and not np.any(x_zero) and not np.any(w_zero):
            attrs[SYMMETRIC] = 1  # the kernels that skip the zero-point terms (int8_sm90.py) may take it
        if self.zero_y(node):
            attrs[Y_SYMMETRIC] = 1
        inputs = [xt, node.input(X_ZERO_POINT), self.krsc(w, channels, w_zero)] + list(node.inputs[W_ZERO_POINT:QUANT_ARITY])
        inputs += [extras[n] for n in node.inputs[QUANT_ARITY:]]
        return self.wrapped(node, NHWC_KIND, inputs, attrs, prefix)

    def rows_qmatmul(self, node: Node) -> list[Node] | None:
        """An FP8 or symmetric INT8 QMatMul with a constant [K, N] weight as a 1x1 QConvNHWC over its
        rows (module docstring)."""
        weight, xv = self.graph.initializers.get(node.input(W)), self.graph.value(node.input(X))
        if (weight is None or weight.ndim != 2 or not (self.fp8_operands(weight, xv) or self.symmetric_int8(node, weight, xv))
                or xv.shape is None or len(xv.shape) < 2 or not all(isinstance(d, int) for d in xv.shape)
                or weight.shape[0] % INT8_CHANNEL_ALIGN or weight.shape[0] != xv.shape[-1]):
            return None
        (k, n), out_shape = weight.shape, (*xv.shape[:-1], weight.shape[1])
        rows = int(np.prod(xv.shape[:-1]))
        prefix: list[Node] = []

        def reshaped(name: str, shape: tuple[int, ...]) -> str:
            out = self.graph.fresh_name(f"{name}_rows")
            target = self.graph.add_initializer(np.array(shape, np.int64), f"{node.name}_shape")
            prefix.append(Node("Reshape", [name, target], [out], name=self.graph.fresh_name(f"{node.name}_reshape")))
            return out

        extras = {}
        for name in dict.fromkeys(node.inputs[QUANT_ARITY:]):
            shape = self.graph.value(name).shape
            if shape is not None and tuple(shape) == out_shape:
                extras[name] = reshaped(name, (1, 1, rows, n))
            elif shape is not None and int(np.prod(shape)) in (1, n) and (len(shape) == 0 or shape[-1] in (1, n)):
                extras[name] = name  # a scalar or a vector along N broadcasts against [1, 1, rows, N] too
            else:
                return None
        attrs = {key: value for key, value in node.attrs.items() if key != "epilogue"}
        attrs.update(kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
        if weight.dtype == np.int8:
            attrs[SYMMETRIC] = 1  # the sm90 INT8 tiles (int8_sm90.py) take it, the mma.sync conv too
        if self.zero_y(node):
            attrs[Y_SYMMETRIC] = 1
        if "epilogue" in node.attrs:
            epilogue = node.attrs["epilogue"]
            body = [dict(step, inputs=[extras.get(i, i) for i in step["inputs"]]) for step in epilogue["body"]]
            attrs["epilogue"] = dict(epilogue, body=body)
        krsc = self.graph.add_initializer(np.ascontiguousarray(weight.T).reshape(n, 1, 1, k), f"{node.input(W)}_krsc")
        inputs = [reshaped(node.input(X), (1, 1, rows, k)), node.input(X_ZERO_POINT), krsc,
                  *node.inputs[W_ZERO_POINT:QUANT_ARITY], *(extras[i] for i in node.inputs[QUANT_ARITY:])]
        raw = self.graph.fresh_name(f"{node.outputs[0]}_rows")
        target = self.graph.add_initializer(np.array(out_shape, np.int64), f"{node.name}_out_shape")
        return prefix + [Node(NHWC_KIND, inputs, [raw], attrs, name=node.name, domain=POLYKIT_DOMAIN),
                         Node("Reshape", [raw, target], [node.outputs[0]],
                              name=self.graph.fresh_name(f"{node.name}_unrows"))]

    @staticmethod
    def fp8_operands(weight: np.ndarray, xv) -> bool:
        return FP8 is not None and weight.dtype == FP8 and xv.dtype == FP8

    def zero_y(self, node: Node) -> bool:
        """Whether the INT8 node requantizes its output with a zero point that is a constant 0 (an absent one is 0,
        ONNX's default): the sm90 kernels then round and saturate by one conversion (int8_out.cuh's Y_ZERO)."""
        if not node.input(Y_SCALE):
            return False
        name = node.input(Y_ZERO_POINT)
        zero = self.graph.initializers.get(name) if name else np.zeros((), np.uint8)
        return zero is not None and zero.dtype in INT8_DTYPES and zero.size == 1 and not np.any(zero)

    def symmetric_int8(self, node: Node, weight: np.ndarray, xv) -> bool:
        """int8 X and W whose zero points are constants of 0 (`--int8` builds; explicit Q/DQ models
        with symmetric quantization): the sm90 INT8 tiles, which skip the zero-point terms, serve them."""
        init = self.graph.initializers
        zeros = [init.get(node.input(X_ZERO_POINT)), init.get(node.input(W_ZERO_POINT))]
        return (weight.dtype == np.int8 and xv.dtype == np.int8
                and all(z is not None and z.dtype == np.int8 and not np.any(z) for z in zeros))

    def nhwc_operand(self, name: str, node: Node, prefix: list[Node]) -> str | None:
        """An epilogue input of an NCHW output in NHWC: a constant transposed here (broadcast shapes
        ranked up to 4 first), a rank-4 tensor through a Transpose; None for anything else."""
        value = self.graph.initializers.get(name)
        if value is not None and value.ndim <= 4:
            arr = np.transpose(value.reshape((1,) * (4 - value.ndim) + value.shape), TO_NHWC)
            return self.graph.add_initializer(np.ascontiguousarray(arr), f"{name}_nhwc")
        v = self.graph.value(name)
        if value is None and v.shape is not None and len(v.shape) == 4:
            return self.to_nhwc(name, node, prefix)
        return None

    def pool(self, node: Node) -> list[Node] | None:
        x = node.input(0)
        form = nhwc_pool(self.graph, node, self.fixed)
        if x not in self.nhwc or form is None:
            return None
        op, attrs = form
        prefix: list[Node] = []
        inputs = [self.to_nhwc(x, node, prefix)]
        if op == "ReduceMean":
            inputs.append(self.graph.add_initializer(np.array([1, 2], dtype=np.int64), f"{node.name}_axes"))
        return self.wrapped(node, op, inputs, attrs, prefix)

    def follows_nhwc(self, node: Node) -> bool:
        """An elementwise op all of whose tensor inputs an NHWC op computes."""
        tensors = [n for n in node.inputs if n and n not in self.graph.initializers]
        return bool(tensors) and all(n in self.nhwc for n in tensors) and is_fusable(self.graph, node)


REWRITES: dict[str, Callable[[_Rewriter, Node], "list[Node] | None"]] = {
    "Conv": _Rewriter.conv, "ConvTranspose": _Rewriter.conv_transpose, "MaxPool": _Rewriter.pool, "AveragePool": _Rewriter.pool,
    "GlobalAveragePool": _Rewriter.pool,
}


#: rewrites of ai.polykit nodes
POLYKIT_REWRITES: dict[str, Callable[[_Rewriter, Node], "list[Node] | None"]] = {
    "QConv": _Rewriter.qconv, "QMatMul": _Rewriter.rows_qmatmul}


def to_channels_last(graph: Graph, *, keep: frozenset[str] = frozenset(),
                     conv_classes: Iterable[str] = DEFAULT_CONV_CLASSES) -> bool:
    """Wrap every eligible conv (of a class in `conv_classes`: "dense", "depthwise", "grouped") and
    pool as an NHWC op between Transposes; True if any."""
    classes = frozenset(conv_classes)
    if not classes <= set(CONV_CLASSES):
        raise ValueError(f"conv classes {sorted(classes - set(CONV_CLASSES))} are not among {CONV_CLASSES}")
    r = _Rewriter(graph, protected(graph, keep), classes)
    nodes: list[Node] = []
    for node in graph.nodes:
        table = REWRITES if node.domain == "" else POLYKIT_REWRITES if node.domain == POLYKIT_DOMAIN else {}
        rewrite = table.get(node.op_type)
        new = rewrite(r, node) if rewrite is not None else None
        if new is not None:
            nodes.extend(new)
            r.nhwc.add(node.outputs[0])
        else:
            nodes.append(node)
            if r.follows_nhwc(node):
                r.nhwc.add(node.outputs[0])
    changed = len(nodes) != len(graph.nodes)
    graph.nodes = nodes
    return changed
