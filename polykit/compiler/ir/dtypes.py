"""ONNX element types <-> numpy dtypes, without importing onnx (plans load without it)."""

from __future__ import annotations

import numpy as np

from polykit.errors import PolykitError

# TensorProto.DataType enum values (onnx.proto), kept here so the runtime needs no onnx import.
ONNX_TO_NUMPY: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    8: np.dtype(object),  # STRING
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
}
#: ONNX code -> the ml_dtypes type polykit runs it as
EXTENDED_NAMES: dict[int, str] = {
    16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
    21: "uint4", 22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2",
}
try:  # bfloat16, float8, 4- and 2-bit types as numpy dtypes (ml_dtypes comes with onnx, the toolkit's)
    import ml_dtypes

    #: ONNX types polykit runs through ml_dtypes: stored and cast exactly, computed in float32 by kernels that need it
    EXTENDED_TYPES: dict[int, np.dtype] = {
        code: np.dtype(getattr(ml_dtypes, name)) for code, name in EXTENDED_NAMES.items() if hasattr(ml_dtypes, name)
    }
except ImportError:  # the lean runtime without ml_dtypes: plans of the other types run
    EXTENDED_TYPES = {}
ONNX_TO_NUMPY.update(EXTENDED_TYPES)
NUMPY_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in ONNX_TO_NUMPY.items()}

ONNX_TYPE_NAMES = {
    0: "UNDEFINED", 1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32",
    7: "INT64", 8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64",
    14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ",
    19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1",
    24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2",
}

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


#: ml_dtypes floating types: numpy's np.floating does not cover them (their dtype kind is "V")
_ML_FLOATS = ("bfloat16", "float8_", "float4_")


def is_float(dtype: np.dtype | type) -> bool:
    """True for numpy floats and ml_dtypes' bfloat16 / float8 / float4 (which numpy's
    `issubdtype(dt, np.floating)` calls non-floating, so an accumulator chosen by it would be
    an integer one and silently truncate)."""
    dt = np.dtype(dtype)
    return bool(np.issubdtype(dt, np.floating)) or dt.name.startswith(_ML_FLOATS)


def to_numpy(onnx_type: int, where: str | None = None) -> np.dtype:
    """numpy dtype of an ONNX element type; PolykitError for types polykit does not run."""
    try:
        return ONNX_TO_NUMPY[onnx_type]
    except KeyError:
        raise PolykitError(
            f"element type {ONNX_TYPE_NAMES.get(onnx_type, onnx_type)} is not supported",
            where=where,
            hint="polykit runs float16/32/64, (u)int8-64 and bool tensors; cast the tensor in the model",
        ) from None


def to_onnx(dtype: np.dtype | type) -> int:
    """ONNX element type of a numpy dtype."""
    dt = np.dtype(dtype)
    try:
        return NUMPY_TO_ONNX[dt]
    except KeyError:
        raise PolykitError(f"numpy dtype {dt} has no ONNX element type in polykit") from None


def dtype_name(dtype: np.dtype | None) -> str:
    return "?" if dtype is None else np.dtype(dtype).name
