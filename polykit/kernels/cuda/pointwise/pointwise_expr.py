"""A fused body (ONNX elementwise ops in topological order, docs/FUSION.md) as C statements
over pointwise.cuh, and the dtype of each of its values. The expression of each op comes
from its row of the elementwise op table (polykit.compiler.ops.elementwise_table), or from
CUDA_EMITTERS for a row that needs the CUDA storage types (Cast); used by the pointwise
generator and by the GEMM/conv epilogues."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from polykit.errors import NodeAttributeError
from polykit.kernels.cuda.storage_types import CTYPE, ONNX_DTYPE, cast_expression
from polykit.compiler.ops.elementwise_table import CudaEmitter, ElementwiseOp, elementwise_op

#: C expressions of the rows that leave `cuda` None because they need the CUDA storage types
#: (the table's own expressions otherwise; the generator reads these over the table)
CUDA_EMITTERS: dict[str, CudaEmitter] = {"Cast": cast_expression}


def cuda_emitter(row: ElementwiseOp | None) -> CudaEmitter | None:
    """The C expression builder of an elementwise row; None when it has none (no row, or a
    plugin's row without `cuda`)."""
    if row is None:
        return None
    return row.cuda if row.cuda is not None else CUDA_EMITTERS.get(row.name)


def emit_expression(body: Sequence[Mapping[str, Any]], values: Mapping[str, str],
                    types: Mapping[str, str] | None = None, *, prefix: str = "v") -> tuple[str, dict[str, str]]:
    """C statements that evaluate `body` (ONNX elementwise ops in topological order).

    `values` maps each external name the body reads to a C expression in its compute type
    (float for fp16/bf16/fp32 storage). `types`, given, maps it to its C storage type
    ("half_t", or a template parameter "T0"): each arithmetic op's result is then rounded to
    its ONNX type (`round_as`, dtypes.cuh: a float16/bfloat16 value rounds, any other is
    unchanged), as the reference evaluates a body op by op, each output of type T; without
    it nothing is rounded before the store. Returns (code, env): `code` declares one `auto`
    local per body output (named `<prefix><k>`), `env` maps every name (external and body) to
    its C expression, so a caller stores env[output] with `st(ptr, index, env[output])`.
    """
    env, ctypes = dict(values), dict(types or {})
    lines = []
    for k, op in enumerate(body):
        row = elementwise_op(op["op"])
        emit = cuda_emitter(row)
        if emit is None:
            raise NodeAttributeError(f"op {op['op']} cannot run inside a CUDA pointwise kernel",
                                     hint="use --target cpu, or keep the op out of the fused body")
        args = []
        for name in op["inputs"]:
            if name and name not in env:
                raise NodeAttributeError(f"pointwise body reads {name!r} before it is defined")
            args.append(env[name] if name else "")
        var = f"{prefix}{k}"
        expr = emit(args, op.get("attrs", {}))
        ctype = _result_ctype(row.result, op, ctypes) if types is not None else None
        rounds = ctype is not None and row.result in ("first", "second")  # bool is exact, Cast rounds itself
        lines.append(f"    auto {var} = {f'round_as<{ctype}>({expr})' if rounds else expr};")
        for out in op["outputs"]:
            env[out] = var
            if ctype is not None:
                ctypes[out] = ctype
    return "\n".join(lines), env


def _result_ctype(result: str, op: Mapping[str, Any], ctypes: Mapping[str, str]) -> str:
    """The C storage type of an op's result (ONNX typing: `result` of its elementwise row)."""
    if result == "bool":
        return "bool"
    if result == "cast":
        return CTYPE[ONNX_DTYPE.get(int(op.get("attrs", {}).get("to", 1)), "float32")]
    return ctypes[op["inputs"][1 if result == "second" else 0]]


def body_dtypes(body: Sequence[Mapping[str, Any]], dtypes: Mapping[str, str]) -> dict[str, str]:
    """numpy dtype names of every body value, given the external inputs' (ONNX typing rules)."""
    env = dict(dtypes)
    for op in body:
        ins = [env.get(n) for n in op["inputs"]]
        row = elementwise_op(op["op"])
        result = row.result if row is not None else "first"
        if result == "bool":
            dt = "bool"
        elif result == "cast":
            dt = ONNX_DTYPE.get(int(op.get("attrs", {}).get("to", 1)), "float32")
        elif result == "second":
            dt = ins[1]
        else:
            dt = ins[0]
        for out in op["outputs"]:
            env[out] = dt
    return env
