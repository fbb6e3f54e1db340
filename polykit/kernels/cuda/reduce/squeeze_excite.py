"""ai.polykit SqueezeExcite on cuda (squeeze_excite.cu): the whole gate in one launch.

  cuda.squeeze_excite   fp16 / fp32 / bf16 x with weights and biases of x's dtype, NHWC or NCHW, at most
                        MAX_EXTRAS one-element extra inputs, C + Cr small enough for the shared memory
                        (shared_bytes <= SHARED_LIMIT: C = 4096 with Cr = 1024 fits)

Block (k, n) of grid (splits, N) sums a chunk of sample n's pixels; split_of picks the split from
the shapes only (so a shape always gives the same sums): about SPLIT_BYTES of x a block, at most
MAX_BLOCKS blocks in all. With one split per sample nothing else runs; with more, the blocks leave
fp32 partials in the layer's workspace and the last block of each sample (a per-sample counter,
zeroed by a memset node before the launch: the workspace is scratch other layers share, never zero
between runs) joins them in split order and computes both FCs, so the result is deterministic and
each execution context and each CUDA-graph replay (the memset is captured before the kernel, on the
same stream, into the context's own workspace) starts from zero counters.
The act and gate bodies are generated per layer (pointwise_expr.emit_expression, as the conv
epilogues), each value rounded to x's type where the nodes the layer replaced stored it.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.nn.squeeze_excite import ARITY, SQUEEZE_EXCITE, LAYOUTS, channel_axis
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import CUDA_DIR, DeviceTensor, KernelSource, cuda_tactic
from polykit.kernels.cuda.storage_types import CTYPE

FILE = "squeeze_excite.cu"
BLOCK = 256
#: extra (one-element) inputs the bodies may read: the kernels' e0..e3
MAX_EXTRAS = 4
#: x bytes a block of a split sums (about); the split's upper bounds
SPLIT_BYTES = 32 * 1024
MAX_BLOCKS = 512
#: dynamic shared memory without the opt-in attribute
SHARED_LIMIT = 48 * 1024
DTYPES = ("float16", "float32", "bfloat16")


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def geometry(layout: str, n: int, hw: int, c: int, elem: int, vec: bool) -> tuple[int, int, int]:
    """(splits, chunk, tx): the pixels of a sample cut into `splits` chunks of `chunk`, and se_nhwc's
    threads along C (a power of two; BLOCK // tx rows of threads over the pixels)."""
    per_block = max(1, SPLIT_BYTES // max(1, c * elem))
    splits = max(1, min(-(-hw // per_block), max(1, MAX_BLOCKS // max(1, n)), hw))
    chunk = -(-hw // splits)
    splits = -(-hw // chunk)
    lanes = -(-c // (16 // elem)) if vec else c
    tx = min(BLOCK, _pow2_at_least(lanes)) if layout == "nhwc" else 32
    return splits, chunk, tx


def shared_bytes(layout: str, c: int, cr: int, tx: int) -> int:
    red = (BLOCK // tx) * c if layout == "nhwc" else 0
    return 4 * (c + cr + red)


def workspace_layout(n: int, splits: int, c: int) -> tuple[int, int]:
    """(bytes, offset of the partials): N counters (padded to 256 bytes), then [N, splits, C] fp32 partials;
    (0, 0) without a split."""
    if splits <= 1:
        return 0, 0
    head = -(-4 * n // 256) * 256
    return head + 4 * n * splits * c, head


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


def kernel_source(layer: Any, dtype: str) -> KernelSource:
    kernel = "se_nhwc" if layer.attrs.get("layout") == "nhwc" else "se_nchw"
    return KernelSource(kernel, code=prelude(layer, CTYPE[dtype]) + (CUDA_DIR / FILE).read_text())


def _supports(layer: Any) -> bool:
    shapes, dts = getattr(layer, "in_shapes", ()), getattr(layer, "in_dtypes", ())
    if layer.attrs.get("layout") not in LAYOUTS or not shapes or len(shapes[0]) != 4 or len(dts) < ARITY:
        return False
    if dts[0] not in DTYPES or any(d != dts[0] for d in dts) or len(layer.inputs) - ARITY > MAX_EXTRAS:
        return False
    if any(int(np.prod(s)) != 1 for s in shapes[ARITY:]):
        return False
    layout, n, hw, c, cr = _dims(layer, shapes[0])
    if min(n, hw, c, cr) < 1 or n * hw * c >= 2**31 or n > 65535:
        return False
    elem = np.dtype(dts[0]).itemsize
    # x aligned (16-byte loads where C allows) or not: the launch's shared memory either way
    if any(shared_bytes(layout, c, cr, geometry(layout, n, hw, c, elem, vec)[2]) > SHARED_LIMIT
           for vec in (False, c * elem % 16 == 0)):
        return False
    try:
        kernel_source(layer, dts[0])
    except Exception:  # a body op without a CUDA expression
        return False
    return True


def _kernels(layer: Any) -> list[KernelSource]:
    return [kernel_source(layer, layer.in_dtypes[0] if layer.in_dtypes else "float16")]


def _plan(layer: Any, x: DeviceTensor, w1_size: int):
    layout = layer.attrs.get("layout")
    axis = channel_axis(layout)
    n, c = int(x.shape[0]), int(x.shape[axis])
    hw = int(np.prod([d for k, d in enumerate(x.shape[1:], 1) if k != axis]))
    cr = w1_size // c if c else 0
    vec = layout == "nhwc" and (c * x.dtype.itemsize) % 16 == 0 and x.ptr % 16 == 0
    return layout, n, hw, c, cr, vec, *geometry(layout, n, hw, c, x.dtype.itemsize, vec)


def split_workspace(layer: Any, tensors: Mapping[str, Any], sm_count: int) -> int:
    try:
        x, w1 = tensors[layer.inputs[0]], tensors[layer.inputs[1]]
        # aligned or not, the split is the same (it reads the shapes only)
        _, n, _, c, _, _, splits, _, _ = _plan(layer, DeviceTensor(0, tuple(x.shape), np.dtype(x.dtype)),
                                               int(np.prod(w1.shape)))
    except (KeyError, IndexError, TypeError, ValueError):
        return 0
    return workspace_layout(n, splits, c)[0]


def launch_plan(layer: Any, tensors: Mapping[str, DeviceTensor], workspace: int = 0):
    """(kernel name, grid, block, shared bytes, args, (counters, bytes) to zero or None) of one launch."""
    x, w1 = tensors[layer.inputs[0]], tensors[layer.inputs[1]]
    layout, n, hw, c, cr, vec, splits, chunk, tx = _plan(layer, x, w1.size)
    if cr * c != w1.size or tensors[layer.inputs[3]].size != w1.size:
        raise DeviceError(f"SqueezeExcite weights of {w1.size} and {tensors[layer.inputs[3]].size} elements for "
                          f"{c} channels", where=f"layer {layer.name!r}", hint="rebuild the plan from the model")
    total, offset = workspace_layout(n, splits, c)
    counters, part = (workspace, workspace + offset) if total else (0, 0)
    extras = [tensors[name] for name in layer.inputs[ARITY:]]
    extras += [DeviceTensor(0, (1,), x.dtype)] * (MAX_EXTRAS - len(extras))
    args = [x, *(tensors[name] for name in layer.inputs[1:ARITY]), tensors[layer.outputs[0]], part, counters,
            np.int32(hw), np.int32(c), np.int32(cr), np.int32(chunk), np.int32(splits), np.int32(int(vec)),
            np.int32(tx), *extras]
    name = "se_nhwc" if layout == "nhwc" else "se_nchw"
    zero = (counters, 4 * n) if total else None
    return name, (splits, n, 1), (BLOCK, 1, 1), shared_bytes(layout, c, cr, tx), args, zero


def enqueue_squeeze_excite(layer: Any, launcher: Any, tensors: Mapping[str, DeviceTensor]) -> None:
    x, w1 = tensors[layer.inputs[0]], tensors[layer.inputs[1]]
    if not x.size:
        return
    _, n, _, c, _, _, splits, _, _ = _plan(layer, x, w1.size)
    total = workspace_layout(n, splits, c)[0]
    ws = launcher.workspace(total) if total else 0
    name, grid, block, shared, args, zero = launch_plan(layer, tensors, ws)
    if zero is not None:
        launcher.zero(*zero)
    launcher.launch(kernel_source(layer, x.dtype.name), grid, block, args, shared_mem=shared)


cuda_tactic(SQUEEZE_EXCITE, "cuda.squeeze_excite", domain=POLYKIT_DOMAIN, kernels=_kernels, supports=_supports,
            workspace=split_workspace)(enqueue_squeeze_excite)


def compile_variants() -> list[KernelSource]:
    """Both layouts in every dtype with a representative pair of bodies: SiLU reading nothing else, and
    a Clip act reading two extras with a HardSigmoid gate."""
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
            out += [kernel_source(layer, dt) for dt in DTYPES]
    return out
