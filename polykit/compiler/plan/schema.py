"""The field tables of a plan's JSON metadata, and the small validators they are made of.

Each record of the document (a tensor, a layer, a weight, the memory plan, a kernel row) is
one tuple of `Field`s: the key, whether it is required, and the check of its value (type,
enum, bounds). Adding a field to the plan format is one row here; a field this reader does
not list is ignored, so a writer of the same format version may add optional fields.

A check is `check(value, path)`; it raises `Invalid(path, what)`, which plan_check turns
into a PlanError naming the field (`tensors['x'].offset`).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from polykit.compiler.ir.dtypes import EXTENDED_NAMES, ONNX_TO_NUMPY
from polykit.compiler.plan.records import PRECISIONS, TARGETS, TENSOR_KINDS

#: Bounds of sizes and offsets: far beyond any device, far below int64 overflow.
MAX_BYTES = 1 << 48
MAX_RANK = 32
#: attrs/metadata nesting deeper than this is not something polykit writes
MAX_DEPTH = 32

#: numpy dtype name -> dtype, for every element type a plan may hold
DTYPES: dict[str, np.dtype] = {dt.name: dt for dt in ONNX_TO_NUMPY.values() if dt != np.dtype(object)}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a kernel source file a plan may name: the bare name of a .cu file (no folder part, no "..");
#: that it is one of this polykit's sources is the runtime's check (polykit.runtime.tactic_check)
KERNEL_FILE = re.compile(r"[A-Za-z0-9_]+\.cu")

Check = Callable[[Any, str], None]


class Invalid(Exception):
    """One violation: the field's path in the document and what is wrong with it."""

    def __init__(self, path: str, what: str):
        super().__init__(f"{path}: {what}")
        self.path = path
        self.what = what


@dataclass(frozen=True)
class Field:
    key: str
    check: Check
    required: bool = True


def show(value: Any) -> str:
    """A value as a message quotes it (short)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def integer(lo: int, hi: int) -> Check:
    def check(value: Any, path: str) -> None:
        if type(value) is not int:
            raise Invalid(path, f"must be an integer, not {_type_name(value)} ({show(value)})")
        if not lo <= value <= hi:
            raise Invalid(path, f"{value} is out of range [{lo}, {hi}]")
    return check


def text(pattern: "re.Pattern[str] | None" = None, empty: bool = False) -> Check:
    def check(value: Any, path: str) -> None:
        if type(value) is not str:
            raise Invalid(path, f"must be a string, not {_type_name(value)} ({show(value)})")
        if not value and not empty:
            raise Invalid(path, "must not be empty")
        if value and pattern is not None and not pattern.fullmatch(value):
            raise Invalid(path, f"{show(value)} is not of the form {pattern.pattern}")
    return check


def one_of(choices: Iterable[str]) -> Check:
    def check(value: Any, path: str) -> None:
        known = sorted(choices)
        if not isinstance(value, str) or value not in known:
            raise Invalid(path, f"{show(value)} is not one of {', '.join(map(repr, known))}")
    return check


def nullable(inner: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if value is not None:
            inner(value, path)
    return check


def list_of(item: Check, max_len: int | None = None, named: bool = False) -> Check:
    """A list whose items pass `item`; `named` paths items by their "name" (layers['fc1'])."""
    def check(value: Any, path: str) -> None:
        if type(value) is not list:
            raise Invalid(path, f"must be a list, not {_type_name(value)}")
        if max_len is not None and len(value) > max_len:
            raise Invalid(path, f"has {len(value)} items, at most {max_len} are allowed")
        for i, v in enumerate(value):
            name = v.get("name") if named and isinstance(v, dict) else None
            item(v, f"{path}[{name!r}]" if isinstance(name, str) else f"{path}[{i}]")
    return check


def map_of(item: Check) -> Check:
    """A JSON object whose values pass `item` (keys are strings by JSON's rules)."""
    def check(value: Any, path: str) -> None:
        if type(value) is not dict:
            raise Invalid(path, f"must be an object, not {_type_name(value)}")
        for k, v in value.items():
            item(v, f"{path}[{k!r}]")
    return check


def record(fields: Sequence[Field]) -> Check:
    def check(value: Any, path: str) -> None:
        if type(value) is not dict:
            raise Invalid(path, f"must be an object, not {_type_name(value)}")
        for f in fields:
            where = f"{path}.{f.key}" if path else f.key
            if f.key in value:
                f.check(value[f.key], where)
            elif f.required:
                raise Invalid(where, "is missing")
    return check


def all_of(*checks: Check) -> Check:
    def check(value: Any, path: str) -> None:
        for c in checks:
            c(value, path)
    return check


def pair_of(item: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if type(value) is not list or len(value) != 2:
            raise Invalid(path, f"must be a list of two items, not {show(value)}")
        item(value[0], f"{path}[0]")
        item(value[1], f"{path}[1]")
    return check


def dtype_name(value: Any, path: str) -> None:
    if not isinstance(value, str) or value not in DTYPES:
        if value in EXTENDED_NAMES.values():
            raise Invalid(path, f"{show(value)} needs the ml_dtypes package, which is not installed here "
                                "(pip install ml_dtypes)")
        raise Invalid(path, f"{show(value)} is not an element type polykit runs")


def dtype_or_empty(value: Any, path: str) -> None:
    if value != "":
        dtype_name(value, path)


SHAPE = list_of(integer(0, MAX_BYTES), max_len=MAX_RANK)
BYTES = integer(0, MAX_BYTES)


def json_value(value: Any, path: str, depth: int = 0) -> None:
    """Any JSON value; arrays tagged {"__ndarray__": {dtype, shape, data}} must decode."""
    if depth > MAX_DEPTH:
        raise Invalid(path, f"is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        if "__ndarray__" in value:
            if len(value) != 1:
                raise Invalid(path, "an array tag must be the object's only key")
            ndarray_tag(value["__ndarray__"], f"{path}.__ndarray__")
            return
        if "__plan__" in value:  # a control-flow body: checked as a whole plan when it is decoded
            if len(value) != 1 or type(value["__plan__"]) is not dict:
                raise Invalid(path, "a plan tag must be the object's only key and hold a plan document")
            return
        for k, v in value.items():
            json_value(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            json_value(v, f"{path}[{i}]", depth + 1)


_NDARRAY_FIELDS = (Field("dtype", dtype_name), Field("shape", SHAPE), Field("data", text(empty=True)))


def ndarray_tag(value: Any, path: str) -> None:
    record(_NDARRAY_FIELDS)(value, path)
    expected = nbytes_of(value["dtype"], value["shape"])
    try:
        size = len(base64.b64decode(value["data"], validate=True))
    except (binascii.Error, ValueError):
        raise Invalid(f"{path}.data", "is not base64") from None
    if size != expected:
        raise Invalid(f"{path}.data", f"holds {size} bytes, dtype and shape need {expected}")


def nbytes_of(dtype: str, shape: Sequence[int]) -> int:
    """prod(shape) * itemsize in Python integers (no overflow)."""
    n = DTYPES[dtype].itemsize
    for d in shape:
        n *= d
    return n


def _no_source(value: Any, path: str) -> None:
    """A field of format-1 kernel tables (source text, a file and defines to splice): a plan of
    this format carries no code; the runtime regenerates every kernel from the layer's tactic."""
    raise Invalid(path, "a plan carries no kernel source (its kernels are regenerated from the layers' tactics "
                        "at load); a plan that holds source was edited or written by another tool")


def _any(value: Any, path: str) -> None:
    """Any JSON value (lists of numbers are checked by the rule that reads them)."""


# ---- the records ------------------------------------------------------------------------------
TENSOR_FIELDS = (
    Field("name", text()),
    Field("dtype", dtype_name),
    Field("shape", SHAPE),
    Field("kind", one_of(TENSOR_KINDS)),
    Field("offset", integer(-1, MAX_BYTES)),
    Field("nbytes", BYTES),
    Field("dims", _any, required=False),  # expressions, checked by plan_dims.check_dims
    Field("value", _any, required=False),  # expressions, checked by plan_dims.check_dims
)

LAYER_FIELDS = (
    Field("name", text()),
    Field("kind", text()),
    Field("domain", text(empty=True)),
    Field("inputs", list_of(text(empty=True))),
    Field("outputs", list_of(text(empty=True))),
    Field("attrs", map_of(json_value)),
    Field("tactic", text()),
    Field("tactic_params", map_of(json_value)),
    Field("precision", one_of(PRECISIONS)),
    Field("fused_nodes", list_of(text(empty=True))),
    Field("in_dtypes", list_of(dtype_or_empty), required=False),
    Field("out_dtypes", list_of(dtype_or_empty), required=False),
    Field("in_shapes", list_of(SHAPE), required=False),
    Field("out_shapes", list_of(SHAPE), required=False),
    Field("profile_tactics", list_of(text(), max_len=1 << 10), required=False),  # plan_check: one per profile
)

WEIGHT_FIELDS = (
    Field("dtype", dtype_name),
    Field("shape", SHAPE),
    Field("offset", BYTES),
    Field("nbytes", BYTES),
)

#: a Concat input placed in its Concat's output (polykit.compiler.plan.memory.Placement), in elements
PLACEMENT_FIELDS = (
    Field("root", text()),
    Field("offset", BYTES),
    Field("row", integer(1, MAX_BYTES)),
    Field("stride", integer(1, MAX_BYTES)),
)

MEMORY_FIELDS = (
    Field("arena_bytes", BYTES),
    Field("peak_bytes", BYTES),
    Field("no_reuse_bytes", BYTES),
    Field("offsets", map_of(BYTES)),
    Field("lifetimes", map_of(pair_of(integer(-1, 1 << 31)))),
    Field("alignment", integer(1, 1 << 20), required=False),
    Field("strategy", one_of(("best-fit", "first-fit", "none")), required=False),
    Field("aliases", map_of(text()), required=False),
    Field("placements", map_of(record(PLACEMENT_FIELDS)), required=False),
)

#: a kernel of a layer: its entry point and the key of its source text (polykit.kernels.cuda.base.
#: kernel_rows); `key` is required from format 2 on (plan_check), a format-1 plan's rows keep the name
KERNEL_ROW_FIELDS = (
    Field("name", text(_IDENTIFIER)),
    Field("key", text(re.compile(r"[0-9a-f]{24}")), required=False),
    Field("arch", text(re.compile(r"sm_[0-9]+a?"), empty=True), required=False),
    *(Field(key, _no_source, required=False) for key in ("file", "code", "code_ref", "defines")),
)

#: the installed plugin a tactic of the plan comes from (polykit.kernels.tactics.PluginOrigin)
PLUGIN_FIELDS = (
    Field("plugin", text(re.compile(r"[A-Za-z0-9_.\-]+"))),
    Field("version", text(re.compile(r"[A-Za-z0-9_.+!\-]+"), empty=True)),
)

KERNEL_TABLE_FIELDS = (
    Field("layers", map_of(list_of(record(KERNEL_ROW_FIELDS)))),
    Field("plugins", map_of(record(PLUGIN_FIELDS)), required=False),
    Field("code", _no_source, required=False),
)

INPUT_VALUE_FIELDS = (
    Field("dtype", dtype_name),
    Field("shape", SHAPE),
    Field("values", list_of(_any)),
)

#: one initializer a refit may replace: where its current value is (polykit.compiler.builder.refit)
REFIT_WEIGHT_FIELDS = (
    Field("dtype", dtype_name),
    Field("shape", SHAPE),
    Field("source", one_of(("plan", "model", "caller"))),
)

#: a refittable plan's record: the model it was built from (ONNX bytes) and its refittable initializers
REFIT_FIELDS = (
    Field("format", integer(1, 1)),
    Field("model", json_value),  # an array tag of the ONNX bytes (uint8), checked when a refit reads it
    Field("weights", map_of(record(REFIT_WEIGHT_FIELDS))),
)

#: a --weight-streaming plan's record: the weights each layer reads, in run order (polykit.runtime.weight_streaming)
WEIGHT_STREAMING_FIELDS = (
    Field("format", integer(1, 1)),
    Field("layers", list_of(list_of(text()))),
)

#: metadata keys the runtime reads; every other key is free-form JSON
METADATA_FIELDS = (
    Field("kernels", record(KERNEL_TABLE_FIELDS), required=False),
    Field("input_values", map_of(record(INPUT_VALUE_FIELDS)), required=False),
    Field("builder_config", map_of(json_value), required=False),
    Field("tactics", map_of(text(empty=True)), required=False),
    Field("body_outputs", list_of(text()), required=False),
    Field("rank", integer(0, 1 << 20), required=False),
    Field("ranks", integer(1, 1 << 20), required=False),
    Field("refit", record(REFIT_FIELDS), required=False),
    Field("weight_streaming", record(WEIGHT_STREAMING_FIELDS), required=False),
)

DOCUMENT_FIELDS = (
    Field("format", integer(0, 1 << 31)),
    Field("target", one_of(TARGETS)),
    Field("gpu_arch", text(empty=True), required=False),
    Field("inputs", list_of(text())),
    Field("outputs", list_of(text())),
    Field("tensors", map_of(record(TENSOR_FIELDS))),
    Field("layers", list_of(record(LAYER_FIELDS), named=True)),
    Field("weights", map_of(record(WEIGHT_FIELDS))),
    Field("memory", record(MEMORY_FIELDS)),
    Field("metadata", all_of(json_value, record(METADATA_FIELDS))),
    Field("profiles", lambda value, path: _profiles(value, path), required=False),
    Field("compatibility", lambda value, path: _compatibility(value, path), required=False),
)


def _compatibility(value: Any, path: str) -> None:
    from polykit.compiler.plan.compatibility import COMPATIBILITY_FIELDS

    record(COMPATIBILITY_FIELDS)(value, path)


def _profiles(value: Any, path: str) -> None:
    from polykit.compiler.plan.dims import PROFILE_FIELDS

    record(PROFILE_FIELDS)(value, path)
