"""RNN / GRU / LSTM tactic (recurrent.cu, with gemm.cu's gemm_simt for the input projection).

One layer runs as: one GEMM XW = X W^T over every time step and both directions at once (grid z
= direction), an init launch that loads the states, then per time step one launch (two for GRU
without linear_before_reset) that takes both directions together: each warp computes the
recurrent dot products of one hidden unit for RNN_NB batch items (R's rows read once for all of
them), applies the cell and writes the new state, Y, Y_h and Y_c. T launches per layer is cheap
next to the math for the sequence lengths these models run, and the whole layer replays as one
CUDA graph. float32 only (the ONNX tests and the models polykit targets use it).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from polykit.compiler.ops.models.recurrent import ACTIVATIONS, CELLS, RecurrentAttrs, recurrent_attrs
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, Launcher, cuda_tactic, defines, stored_as
from polykit.kernels.cuda.gemm.gemm import TILES, gemm_args, launch_tiled, split_k

FILE = "recurrent.cu"
CELL_CODES = {"RNN": 0, "GRU": 1, "LSTM": 2}
ACT_CODES = {name: i for i, name in enumerate(ACTIVATIONS)}
NB = 4  # batch items a warp serves (RNN_NB)
GEMM = KernelSource("gemm_simt", "gemm.cu", defines=defines(ELEM="float"))
GEMM_REDUCE = KernelSource("gemm_splitk_reduce", "gemm.cu", defines=defines(ELEM="float"))


def _align(n: int) -> int:
    return (n + 255) // 256 * 256  # the launcher's workspace regions are 256-byte aligned


def _sources(op: str) -> tuple[KernelSource, KernelSource]:
    cell = op.lower()
    d = dict(CELL=CELL_CODES[op], RNN_NB=NB, RNN_INIT_KERNEL=f"rnn_init_{cell}", RNN_STEP_KERNEL=f"rnn_step_{cell}")
    return (KernelSource(f"rnn_init_{cell}", FILE, defines=defines(**d)),
            KernelSource(f"rnn_step_{cell}", FILE, defines=defines(**d)))


def _kernels(layer) -> list[KernelSource]:
    ops = CELLS if layer is None else (layer.kind,)
    return [s for op in ops for s in _sources(op)] + [GEMM, GEMM_REDUCE]


def _dims(a: RecurrentAttrs, x_shape, r_shape) -> tuple[int, int, int, int]:
    """(T, N, input size, hidden size) of a launch."""
    T, N = (x_shape[0], x_shape[1]) if a.layout == 0 else (x_shape[1], x_shape[0])
    return int(T), int(N), int(x_shape[2]), int(r_shape[2])


def _regions(a: RecurrentAttrs, T: int, N: int, H: int) -> list[int]:
    """Bytes of XW, the h ping-pong, the c ping-pong (LSTM) and the GRU gate buffer."""
    state = 2 * a.directions * N * H * 4
    return [a.directions * T * N * a.gates * H * 4, state, state if a.op == "LSTM" else 0,
            state if a.op == "GRU" and not a.linear_before_reset else 0]


def _workspace(layer, tensors: Mapping[str, Any], sm_count: int) -> int:
    try:
        a = recurrent_attrs(layer.kind, layer.attrs, layer.name)
        T, N, I, H = _dims(a, tensors[layer.inputs[0]].shape, tensors[layer.inputs[2]].shape)
    except Exception:
        return 0  # the layer fails at enqueue with its own error
    bm, bn, bk = TILES[GEMM.name]
    M, NN = T * N, a.gates * H
    splits = split_k(-(-NN // bn) * -(-M // bm) * a.directions, I, bk, sm_count, a.directions)
    partial = 4 * splits * a.directions * M * NN if splits > 1 else 0
    return sum(_align(n) for n in _regions(a, T, N, H) + [partial] if n)


def _optional(layer, tensors: Mapping[str, DeviceTensor], names, i: int) -> DeviceTensor | None:
    return tensors.get(names[i]) if i < len(names) and names[i] else None


def _check(layer, a: RecurrentAttrs, ins: list[DeviceTensor | None]) -> None:
    where = f"layer {layer.name!r}"
    for i, t in enumerate(ins):
        want = np.int32 if i == 4 else np.float32
        if t is not None and np.dtype(t.dtype) != want:
            raise DeviceError(f"{layer.kind} input {i} is {t.dtype}; the cuda kernels take {np.dtype(want)}",
                              where=where, hint="run this layer on --target cpu")
    X, W, R = ins[:3]
    if len(X.shape) != 3 or W.shape[0] != a.directions or R.shape[1] != a.gates * R.shape[2]:
        raise DeviceError(f"X {X.shape}, W {W.shape}, R {R.shape} do not fit {a.op}", where=where)


def _act_args(a: RecurrentAttrs) -> list[Any]:
    acts = [list(a.activations[d]) + [a.activations[d][-1]] * (3 - len(a.activations[d])) for d in range(2)
            if d < a.directions]
    acts += acts[:1] * (2 - len(acts))
    codes = [ACT_CODES[act.name] for per in acts for act in per]
    alphas = [np.float32(act.alpha) for per in acts for act in per]
    betas = [np.float32(act.beta) for per in acts for act in per]
    return codes + alphas + betas


def enqueue_recurrent(layer, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
    a = recurrent_attrs(layer.kind, layer.attrs, f"layer {layer.name!r}")
    ins = [_optional(layer, tensors, layer.inputs, i) for i in range(8)]
    _check(layer, a, ins)
    X, W, R, B, lens, h0, c0, P = ins
    Y, Yh, Yc = (_optional(layer, tensors, layer.outputs, i) for i in range(3))
    T, N, I, H = _dims(a, X.shape, R.shape)
    D, G = a.directions, a.gates
    if N * H == 0:
        return
    xw, h, c, gates = (launcher.workspace(n) if n else 0 for n in _regions(a, T, N, H))
    if T * N and I:
        f32 = np.dtype(np.float32)
        count, args = gemm_args(X, W, None, DeviceTensor(xw, (D, T * N, G * H), f32), M=T * N, N=G * H, K=I,
                                sam=I, sak=1, sbk=1, sbn=I, batch=[D], a_bs=[0], b_bs=[G * H * I],
                                where=f"layer {layer.name!r}")
        launch_tiled(launcher, GEMM, GEMM_REDUCE.name, T * N, G * H, I, count, args, [])
    init, step = _sources(a.op)
    half = D * N * H * 4
    launcher.launch(init, (-(-D * N * H // 256),), (256,),
                    [h0 or 0, c0 or 0, h, c or 0, Yh or 0, Yc or 0, D, N, H, a.layout])
    phases = (1, 2) if a.op == "GRU" and not a.linear_before_reset else (0,)
    grid = (-(-H * -(-N // NB) // 8), D)
    tail = [a.layout, int(a.reverse_only)]
    acts = _act_args(a)
    for s in range(T):
        cur, nxt = (0, half) if s % 2 == 0 else (half, 0)
        for phase in phases:
            launcher.launch(step, grid, (256,), [
                xw, R, B or 0, P or 0, lens or 0, h + cur, h + nxt, c + cur if c else 0, c + nxt if c else 0,
                gates, Y or 0, Yh or 0, Yc or 0, T, N, H, s, *tail, phase, int(a.input_forget),
                np.float32(a.clip or 0.0), *acts])


for _op in CELLS:
    cuda_tactic(_op, f"cuda.recurrent.{_op.lower()}", kernels=_kernels, supports=stored_as("float32"),
                params={"batch_per_warp": NB}, workspace=_workspace)(enqueue_recurrent)


def compile_variants() -> list[KernelSource]:
    return _kernels(None)
