"""Tactics of the newest LLM ops (llm.cu): RotaryEmbedding, SwiGLU, TensorScatter,
CausalConvWithState, LinearAttention; one plain kernel each (correctness first: these are not
the hot layers of the models polykit tunes for)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from polykit.compiler.ops.models.llm import text_attr
from polykit.errors import DeviceError
from polykit.kernels.cuda.movement import movement
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic

FILE = "llm.cu"
CODES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}
HALF_AND_FLOAT = ("f32", "f16", "bf16")
WIDTHS = (1, 2, 4, 8)
BLOCK = 256
MAX_GRID = 1 << 16


def _grid(n: int) -> tuple[int, int, int]:
    return (max(1, min(-(-n // BLOCK), MAX_GRID)), 1, 1)


def _opt(layer, tensors, i) -> DeviceTensor | int:
    """Optional input i as a DeviceTensor, or 0 (a null pointer) when omitted."""
    return tensors[layer.inputs[i]] if len(layer.inputs) > i and layer.inputs[i] else 0


def _code(layer, x: DeviceTensor, allowed) -> str:
    code = CODES.get(x.dtype.name)
    if code not in allowed:
        raise DeviceError(f"{layer.kind} has no CUDA kernel for {x.dtype}", where=f"layer {layer.name!r}",
                          hint="use --target cpu")
    return code


def _kernels(layer) -> list[KernelSource]:
    names = [f"rotary_{c}" for c in HALF_AND_FLOAT] + [f"swiglu_{c}" for c in CODES.values()] + \
        [f"tensor_scatter_b{w}" for w in WIDTHS] + [f"causal_conv_{c}" for c in HALF_AND_FLOAT] + \
        [f"linear_attention_{c}" for c in HALF_AND_FLOAT]
    return [KernelSource(n, FILE) for n in names] + movement.copy_kernels(None)


def enqueue_rotary(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    code = _code(layer, x, HALF_AND_FLOAT)
    if len(x.shape) == 4:
        b, h, s, d = x.shape
        strides = (h * s * d, s * d, d)
    else:
        b, s, hidden = x.shape
        h = int(layer.attrs["num_heads"])
        d = hidden // h
        strides = (s * hidden, d, hidden)
    rot = int(layer.attrs.get("rotary_embedding_dim", 0)) or d
    if y.size:
        launcher.launch(KernelSource(f"rotary_{code}", FILE), _grid(y.size), (BLOCK, 1, 1),
                        [x, tensors[layer.inputs[1]], tensors[layer.inputs[2]], _opt(layer, tensors, 3), y, b, s, h, d,
                         *strides, rot, int(layer.attrs.get("interleaved", 0))])


def enqueue_swiglu(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    a, b, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    code = _code(layer, a, tuple(CODES.values()))
    alpha = float(layer.attrs.get("alpha", 1.0))
    if y.size:
        launcher.launch(KernelSource(f"swiglu_{code}", FILE), _grid(y.size), (BLOCK, 1, 1),
                        [a, b, y, y.size, np.float64(alpha) if code == "f64" else np.float32(alpha)])


def enqueue_tensor_scatter(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    cache, update, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    where = f"layer {layer.name!r}"
    if cache.dtype.itemsize not in WIDTHS:
        raise DeviceError(f"TensorScatter has no CUDA kernel for {cache.dtype}", where=where, hint="use --target cpu")
    strides = movement.contiguous_strides(cache.shape)
    movement.launch_copy(launcher, cache, y, cache.shape, strides, strides, where=where)
    axis = int(layer.attrs.get("axis", -2)) % len(cache.shape)
    prefix = int(np.prod(cache.shape[:axis], dtype=np.int64))
    inner = int(np.prod(cache.shape[axis + 1:], dtype=np.int64))
    n = update.shape[axis]
    if prefix * n * inner:
        launcher.launch(KernelSource(f"tensor_scatter_b{cache.dtype.itemsize}", FILE), _grid(prefix * n * inner),
                        (BLOCK, 1, 1), [update, _opt(layer, tensors, 2), y, prefix, prefix // cache.shape[0], n, inner,
                                        cache.shape[axis], int(text_attr(layer, "mode", "linear") == "circular")])


def enqueue_causal_conv(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    x, w, y = tensors[layer.inputs[0]], tensors[layer.inputs[1]], tensors[layer.outputs[0]]
    code = _code(layer, x, HALF_AND_FLOAT)
    present = tensors[layer.outputs[1]] if len(layer.outputs) > 1 and layer.outputs[1] else 0
    b, c, length = x.shape
    k = w.shape[2]
    total = b * c * (length + k - 1)
    if total:
        launcher.launch(KernelSource(f"causal_conv_{code}", FILE), _grid(total), (BLOCK, 1, 1),
                        [x, w, _opt(layer, tensors, 2), _opt(layer, tensors, 3), y, present, b * c, c, length, k,
                         int(text_attr(layer, "activation", "none") != "none")])


def _linear_state_bytes(layer, tensors, sm_count: int) -> int:
    q, k, v = (tensors[n] for n in layer.inputs[:3])
    hkv = int(layer.attrs["kv_num_heads"])
    return 4 * q.shape[0] * hkv * (k.shape[2] // hkv) * (v.shape[2] // hkv)


def enqueue_linear_attention(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    q, k, v = (tensors[n] for n in layer.inputs[:3])
    y = tensors[layer.outputs[0]]
    code = _code(layer, q, HALF_AND_FLOAT)
    past, decay, beta = (_opt(layer, tensors, i) for i in (3, 4, 5))
    present = tensors[layer.outputs[1]] if len(layer.outputs) > 1 and layer.outputs[1] else 0
    if any(isinstance(t, DeviceTensor) and t.dtype != q.dtype for t in (k, v, past, decay, beta, present)):
        raise DeviceError("LinearAttention on cuda needs every tensor in Q's dtype", where=f"layer {layer.name!r}",
                          hint="use --target cpu")
    hq, hkv = int(layer.attrs["q_num_heads"]), int(layer.attrs["kv_num_heads"])
    b, t, _ = q.shape
    dk, dv = k.shape[2] // hkv, v.shape[2] // hkv
    scale = float(layer.attrs.get("scale", 0.0)) or 1.0 / np.sqrt(dk)
    if b * hkv == 0 or dv == 0:
        return
    state = launcher.workspace(_linear_state_bytes(layer, tensors, 0))
    launcher.launch(KernelSource(f"linear_attention_{code}", FILE), (b * hkv, 1, 1), (min(BLOCK, -(-dv // 32) * 32), 1, 1),
                    [q, k, v, past, decay, beta, y, present, state, t, hkv, hq // hkv, dk, dv,
                     1 if isinstance(decay, int) or decay.shape[2] == hkv else dk,
                     beta.shape[2] if isinstance(beta, DeviceTensor) else 1, np.float32(scale)])


cuda_tactic("RotaryEmbedding", "cuda.llm.rotary", kernels=_kernels)(enqueue_rotary)
cuda_tactic("SwiGLU", "cuda.llm.swiglu", kernels=_kernels)(enqueue_swiglu)
cuda_tactic("TensorScatter", "cuda.llm.tensor_scatter", kernels=_kernels)(enqueue_tensor_scatter)
cuda_tactic("CausalConvWithState", "cuda.llm.causal_conv", kernels=_kernels)(enqueue_causal_conv)
cuda_tactic("LinearAttention", "cuda.llm.linear_attention", kernels=_kernels,
            workspace=_linear_state_bytes)(enqueue_linear_attention)


def compile_variants() -> list[KernelSource]:
    """The one llm.cu module (every op and dtype is an entry point in it)."""
    return _kernels(None)
