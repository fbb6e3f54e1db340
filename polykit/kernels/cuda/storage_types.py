"""CUDA storage types of numpy dtypes (dtypes.cuh, lowp.cuh), their signature codes in kernel
names, and Cast's C expression (the conversion each target type needs)."""

from __future__ import annotations

from typing import Any, Mapping

from polykit.errors import NodeAttributeError
from polykit.compiler.ops.elementwise_table import literal

#: low-precision storage types (lowp.cuh; one byte per element, as ml_dtypes stores them):
#: numpy dtype name -> (C storage type, signature code)
LOWP = {
    "float8_e4m3fn": ("f8e4m3fn_t", "f8e4m3"), "float8_e4m3fnuz": ("f8e4m3fnuz_t", "f8e4m3uz"),
    "float8_e5m2": ("f8e5m2_t", "f8e5m2"), "float8_e5m2fnuz": ("f8e5m2fnuz_t", "f8e5m2uz"),
    "float8_e8m0fnu": ("f8e8m0_t", "f8e8m0"), "float4_e2m1fn": ("f4e2m1_t", "f4e2m1"),
    "int4": ("i4_t", "i4"), "uint4": ("u4_t", "u4"), "int2": ("i2_t", "i2"), "uint2": ("u2_t", "u2"),
}
LOWP_INTS = ("int4", "uint4", "int2", "uint2")
CTYPE = {
    "float32": "float", "float16": "half_t", "float64": "double", "int8": "i8", "uint8": "u8",
    "int16": "i16", "uint16": "u16", "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
    "bool": "bool", "bfloat16": "bf16_t",
    **{name: ctype for name, (ctype, _) in LOWP.items()},
}
CODE = {
    "float32": "f32", "float16": "f16", "float64": "f64", "int8": "i8", "uint8": "u8", "int16": "i16",
    "uint16": "u16", "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64", "bool": "b8", "bfloat16": "bf16",
    **{name: code for name, (_, code) in LOWP.items()},
}


def dtype_names(codes: tuple[str, ...]) -> tuple[str, ...]:
    """numpy dtype names whose CODE is one of `codes` (a family's storage types)."""
    return tuple(name for name, code in CODE.items() if code in codes)


#: ONNX TensorProto element type -> numpy dtype name (Cast "to")
ONNX_DTYPE = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
              9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
              17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
              21: "uint4", 22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2"}
#: Cast round_mode (float8e8m0 targets) -> the code e8m0_encode takes
ROUND_MODES = {"up": 0, "down": 1, "nearest": 2}
INT_DTYPES = ("int32", "int64", "int8", "uint8", "int16", "uint16", "uint32", "uint64")


def cast_expression(a: list[str], at: Mapping[str, Any]) -> str:
    """Cast's C expression: `a[0]` converted to the type attribute `to` names."""
    to = ONNX_DTYPE.get(int(at.get("to", 1)))
    if to is None:
        raise NodeAttributeError(f"Cast to ONNX type {at.get('to')} has no CUDA kernel", hint="use --target cpu")
    if to in ("float16", "bfloat16"):  # rounded to the narrow type, kept in the float compute type
        return f"pk_to_{'half' if to == 'float16' else 'bf16'}({a[0]})"
    sat = literal(bool(at.get("saturate", 1)))
    if to == "float8_e8m0fnu":
        mode = ROUND_MODES.get(str(at.get("round_mode", "up")))
        if mode is None:
            raise NodeAttributeError(f"Cast round_mode {at.get('round_mode')!r} is not one of {sorted(ROUND_MODES)}")
        return f"pk_to_e8m0({a[0]}, {sat}, {mode})"
    if to in LOWP_INTS:
        return f"pk_to_intn<{CTYPE[to]}>({a[0]})"
    if to in LOWP:  # float8 / float4: rounded (saturated as `saturate` says), kept in float
        return f"pk_to_lowp<{CTYPE[to]}>({a[0]}, {sat})"
    return f"cvt<{CTYPE[to]}>({a[0]})"
