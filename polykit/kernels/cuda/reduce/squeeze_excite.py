"""ai.polykit SqueezeExcite on cuda (squeeze_excite.cu): the whole gate in two launches, no memset.

  cuda.squeeze_excite   fp16 / fp32 / bf16 x with weights and biases of x's dtype, NHWC or NCHW, at most
                        MAX_EXTRAS one-element extra inputs, Cr up to what the shared memory holds

se_pool_<layout>, grid (P, Q, N): block (p, q, n) sums a chunk of sample n's pixels over a slice of
CS channels and multiplies its sums' mean (rounded to x's type when P == 1, as the ReduceMean stored
it) by that slice's columns of W1: FC1 partials, fp32, in the layer's workspace. se_fc2, grid (Q2, N):
each block joins its sample's partials in one fixed order, adds b1, applies the act body, and computes
CS2 output channels of FC2 with the gate body. geometry() picks P and Q from the shapes only (about
SPLIT_BYTES of x a block, at most MAX_BLOCKS pool blocks), so a shape always gives the same sums:
deterministic. Why two launches and not one with a last-block join (the design first tried): the
block that joins last would read both FCs' weights alone (MobileNetV3-L's last SE blocks: 0.9 MB, tens
of microseconds on one SM, more than the five launches it replaces), and its counters need a memset
node before every run, as the workspace is scratch other layers share; here the weights are spread over
the blocks of both grids, and nothing in the workspace must be zero: every partial is written before
it is read, in each execution context and each CUDA-graph replay.
The act and gate bodies are generated per layer (pointwise_expr.emit_expression, as the conv
epilogues), each value rounded to x's type where the nodes the layer replaced stored it.

A layer with `scale` (fuse_squeeze_excite absorbed the Mul y = x * s) runs se_fc2_scale_<layout> as
its second launch, grid (Q2, P3, N): every block joins its sample's partials and computes the gates of
its CS2 channels as se_fc2 does (the same bits in every block), then scales its chunk of the sample's
pixels of those channels (scale_geometry: about SPLIT_BYTES of x a block, so the hidden units and the
CS2 x Cr slice of W2 each block reads again, from L2, stay small against the pixels it moves; 16-byte
loads and stores where the shapes and pointers allow). Still two launches, and the gate never
reaches memory: the Mul layer (a third launch re-reading x) is gone.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.squeeze_excite import ARITY, LAYOUTS, MAX_EXTRAS, SQUEEZE_EXCITE, channel_axis
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import CUDA_DIR, DeviceTensor, KernelSource, cuda_tactic
from polykit.kernels.cuda.storage_types import CTYPE

FILE = "squeeze_excite.cu"
BLOCK = 256
#: channels a pool block sums (and W1 columns it reads), output channels an se_fc2 block computes
CS, CS2 = 64, 64
#: x bytes a pool block sums (about); the pool grid's bound
SPLIT_BYTES = 32 * 1024
MAX_BLOCKS = 1024
#: se_fc2_scale's pixel chunks are multiples of this (16 bytes of the narrowest dtype)
VEC_PIXELS = 8
#: dynamic shared memory without the opt-in attribute
SHARED_LIMIT = 48 * 1024
DTYPES = ("float16", "float32", "bfloat16")


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def geometry(layout: str, n: int, hw: int, c: int, elem: int, vec: bool) -> tuple[int, int, int, int, int]:
    """(P, chunk, Q, cs, tx) of the pool: a sample's pixels cut into P chunks of `chunk`, its channels
    into Q slices of `cs`, and se_pool_nhwc's threads along a slice (a power of two; BLOCK // tx rows
    of threads over the pixels)."""
    cs = min(c, CS)
    q = -(-c // cs)
    per_block = max(1, SPLIT_BYTES // max(1, cs * elem))
    p = max(1, min(-(-hw // per_block), max(1, MAX_BLOCKS // max(1, n * q)), hw))
    chunk = -(-hw // p)
    p = -(-hw // chunk)
    lanes = -(-cs // (16 // elem)) if vec else cs
    tx = min(BLOCK, _pow2_at_least(lanes)) if layout == "nhwc" else 32
    return p, chunk, q, cs, tx


def scale_geometry(hw: int, c: int, elem: int) -> tuple[int, int]:
    """(P3, chunk) of se_fc2_scale: a sample's pixels cut into P3 chunks of `chunk` pixels (a multiple of
    VEC_PIXELS, so NCHW runs of 16 bytes stay inside a chunk; P3 within a grid's y extent)."""
    per_block = max(1, SPLIT_BYTES // max(1, min(c, CS2) * elem))
    chunk = max(per_block, -(-hw // 65535))
    chunk = -(-chunk // VEC_PIXELS) * VEC_PIXELS
    return -(-hw // chunk), chunk


def pool_shared_bytes(layout: str, cs: int, tx: int) -> int:
    return 4 * (cs + ((BLOCK // tx) * cs if layout == "nhwc" else 0))


def workspace_bytes(n: int, p: int, q: int, cr: int) -> int:
    """The FC1 partials: [N, P, Q, Cr] fp32."""
    return 4 * n * p * q * cr


def _dims(layer: Any, x_shape) -> tuple[str, int, int, int, int]:
    """(layout, N, HW, C, Cr) from x's shape and W1's size."""
    layout = layer.attrs.get("layout")
    axis = channel_axis(layout)
    n, c = int(x_shape[0]), int(x_shape[axis])
    hw = int(np.prod([d for k, d in enumerate(x_shape[1:], 1) if k != axis]))
    w1 = layer.in_shapes[1] if getattr(layer, "in_shapes", ()) else None
    cr = int(np.prod(w1)) // c if w1 is not None and c else 0
    return layout, n, hw, c, cr


def body_function(name: str, holder: Mapping[str, Any], extras: list[str]) -> str:
    """`__device__ float name(float v, e0..e3)`: the holder's body on v (rounded to ELEM first)."""
    from polykit.kernels.cuda.pointwise.pointwise_expr import emit_expression

    values = {holder["input"]: "round_as<ELEM>(v)"}
    types = {holder["input"]: "ELEM"}
    for j, extra in enumerate(extras):
        values[extra], types[extra] = f"ld(e{j}, 0)", "ELEM"
    code, env = emit_expression(holder["body"], values, types, prefix="t")
    params = ", ".join(f"const ELEM* e{j}" for j in range(MAX_EXTRAS))
    return (f"__device__ __forceinline__ float {name}(float v, {params}) {{\n{code}\n"
            f"  return (float)({env[holder['output']]});\n}}\n")


def prelude(layer: Any, elem: str) -> str:
    extras = list(layer.inputs[ARITY:])
    return (f"#define ELEM {elem}\n" + ("#define PK_GELU16 1\n" if elem != "float" else "") +
            '#include "pointwise.cuh"\n' + body_function("se_act", layer.attrs["act"], extras)
            + body_function("se_gate", layer.attrs["gate"], extras))


def kernel_source(layer: Any, dtype: str, kernel: str) -> KernelSource:
    return KernelSource(kernel, code=prelude(layer, CTYPE[dtype]) + (CUDA_DIR / FILE).read_text())


def scaled(layer: Any) -> bool:
    """Whether the layer's output is x * s (attribute `scale`), not the gate s."""
    return layer.attrs.get("scale", 0) == 1


def kernel_names(layer: Any) -> tuple[str, str]:
    layout = "nhwc" if layer.attrs.get("layout") == "nhwc" else "nchw"
    return f"se_pool_{layout}", f"se_fc2_scale_{layout}" if scaled(layer) else "se_fc2"


def fc2_shared_bytes(layer: Any, cr: int) -> int:
    """se_fc2's hidden units, and se_fc2_scale's CS2 gates after them."""
    return 4 * (cr + (CS2 if scaled(layer) else 0))


def _supports(layer: Any) -> bool:
    shapes, dts = getattr(layer, "in_shapes", ()), getattr(layer, "in_dtypes", ())
    if layer.attrs.get("layout") not in LAYOUTS or not shapes or len(shapes[0]) != 4 or len(dts) < ARITY:
        return False
    if dts[0] not in DTYPES or any(d != dts[0] for d in dts) or len(layer.inputs) - ARITY > MAX_EXTRAS:
        return False
    if any(int(np.prod(s)) != 1 for s in shapes[ARITY:]):
        return False
    layout, n, hw, c, cr = _dims(layer, shapes[0])
    if min(n, hw, c, cr) < 1 or n * hw * c >= 2**31 or n > 65535 or fc2_shared_bytes(layer, cr) > SHARED_LIMIT:
        return False
    if layer.attrs.get("scale", 0) not in (0, 1):
        return False
    try:
        _kernels(layer)
    except Exception:  # a body op without a CUDA expression
        return False
    return True


def _kernels(layer: Any) -> list[KernelSource]:
    dtype = layer.in_dtypes[0] if layer.in_dtypes else "float16"
    return [kernel_source(layer, dtype, k) for k in kernel_names(layer)]


def _plan(layer: Any, x: DeviceTensor, w1_size: int):
    layout = layer.attrs.get("layout")
    axis = channel_axis(layout)
    n, c = int(x.shape[0]), int(x.shape[axis])
    hw = int(np.prod([d for k, d in enumerate(x.shape[1:], 1) if k != axis]))
    cr = w1_size // c if c else 0
    vec = layout == "nhwc" and (min(c, CS) * x.dtype.itemsize) % 16 == 0 and (c * x.dtype.itemsize) % 16 == 0 \
        and x.ptr % 16 == 0
    return layout, n, hw, c, cr, vec, *geometry(layout, n, hw, c, x.dtype.itemsize, vec)


def fc1_workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
    try:
        x, w1 = tensors[layer.inputs[0]], tensors[layer.inputs[1]]
        # aligned or not, the grid is the same (it reads the shapes only)
        _, n, _, _, cr, _, p, _, q, _, _ = _plan(layer, DeviceTensor(0, tuple(x.shape), np.dtype(x.dtype)),
                                                 int(np.prod(w1.shape)))
    except (KeyError, IndexError, TypeError, ValueError):
        return 0
    return workspace_bytes(n, p, q, cr)


def launch_plan(layer: Any, tensors: Mapping[str, DeviceTensor], workspace: int = 0) -> list[tuple]:
    """The two launches: (kernel name, grid, block, shared bytes, args) each."""
    x, w1 = tensors[layer.inputs[0]], tensors[layer.inputs[1]]
    layout, n, hw, c, cr, vec, p, chunk, q, cs, tx = _plan(layer, x, w1.size)
    if cr * c != w1.size or tensors[layer.inputs[3]].size != w1.size:
        raise DeviceError(f"SqueezeExcite weights of {w1.size} and {tensors[layer.inputs[3]].size} elements for "
                          f"{c} channels", where=f"layer {layer.name!r}", hint="rebuild the plan from the model")
    extras = [tensors[name] for name in layer.inputs[ARITY:]]
    extras += [DeviceTensor(0, (1,), x.dtype)] * (MAX_EXTRAS - len(extras))
    pool, fc2 = kernel_names(layer)
    b1, w2, b2 = (tensors[name] for name in layer.inputs[2:ARITY])
    out = tensors[layer.outputs[0]]
    first = (pool, (p, q, n), (BLOCK, 1, 1), pool_shared_bytes(layout, cs, tx),
             [x, w1, workspace, np.int32(hw), np.int32(c), np.int32(cr), np.int32(chunk), np.int32(cs),
              np.int32(int(vec)), np.int32(tx)])
    head = [workspace, b1, w2, b2]
    tail = [np.int32(c), np.int32(cr), np.int32(p * q), np.int32(CS2)]
    if not scaled(layer):
        return [first, (fc2, (-(-c // CS2), n, 1), (BLOCK, 1, 1), fc2_shared_bytes(layer, cr),
                        [*head, out, *tail, *extras])]
    if out.size != x.size:
        raise DeviceError(f"SqueezeExcite scales x of {x.size} elements into an output of {out.size}",
                          where=f"layer {layer.name!r}", hint="rebuild the plan from the model")
    p3, chunk3 = scale_geometry(hw, c, x.dtype.itemsize)
    per = 16 // x.dtype.itemsize
    along = c if layout == "nhwc" else hw  # the contiguous extent a 16-byte run must divide
    vec3 = along % per == 0 and chunk3 % per == 0 and x.ptr % 16 == 0 and out.ptr % 16 == 0
    return [first, (fc2, (-(-c // CS2), p3, n), (BLOCK, 1, 1), fc2_shared_bytes(layer, cr),
                    [*head, x, out, *tail, np.int32(hw), np.int32(chunk3), np.int32(int(vec3)), *extras])]


def enqueue_squeeze_excite(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    x, w1 = tensors[layer.inputs[0]], tensors[layer.inputs[1]]
    if not x.size:
        return
    _, n, _, _, cr, _, p, _, q, _, _ = _plan(layer, x, w1.size)
    ws = launcher.workspace(workspace_bytes(n, p, q, cr))
    for name, grid, block, shared, args in launch_plan(layer, tensors, ws):
        launcher.launch(kernel_source(layer, x.dtype.name, name), grid, block, args, shared_mem=shared)


cuda_tactic(SQUEEZE_EXCITE, "cuda.squeeze_excite", domain=POLYKIT_DOMAIN, kernels=_kernels, supports=_supports,
            workspace=fc1_workspace)(enqueue_squeeze_excite)


def compile_variants() -> list[KernelSource]:
    """Both layouts in every dtype with a representative pair of bodies: SiLU reading nothing else, and
    a Clip act reading two extras with a HardSigmoid gate; the scaling layers' second kernels too."""
    from polykit.compiler.plan.records import LayerDesc

    silu = {"input": "a", "body": [{"op": "Sigmoid", "inputs": ["a"], "outputs": ["b"], "attrs": {}},
                                   {"op": "Mul", "inputs": ["a", "b"], "outputs": ["h"], "attrs": {}}], "output": "h"}
    clip = {"input": "a", "body": [{"op": "Clip", "inputs": ["a", "lo", "hi"], "outputs": ["h"], "attrs": {}}],
            "output": "h"}
    sigmoid = {"input": "z", "body": [{"op": "Sigmoid", "inputs": ["z"], "outputs": ["s"], "attrs": {}}], "output": "s"}
    hard = {"input": "z", "body": [{"op": "HardSigmoid", "inputs": ["z"], "outputs": ["s"],
                                    "attrs": {"alpha": 1 / 6, "beta": 0.5}}], "output": "s"}
    out = []
    for layout in LAYOUTS:
        for act, gate, extras in ((silu, sigmoid, ()), (clip, hard, ("lo", "hi"))):
            layer = LayerDesc("se", SQUEEZE_EXCITE, ("x", "w1", "b1", "w2", "b2", *extras), ("s",),
                              {"layout": layout, "act": act, "gate": gate}, domain=POLYKIT_DOMAIN)
            out += [kernel_source(layer, dt, k) for dt in DTYPES for k in kernel_names(layer)]
            scaling = LayerDesc("se", SQUEEZE_EXCITE, layer.inputs, ("y",), {**layer.attrs, "scale": 1},
                                domain=POLYKIT_DOMAIN)
            out += [kernel_source(scaling, dt, kernel_names(scaling)[1]) for dt in DTYPES]
    return out
