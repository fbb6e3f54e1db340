"""Structure-aware mutators for the fuzzer (polykit.testing.fuzz): each takes a valid value
and a numpy Generator and returns a changed copy plus a one-line description of the change.

- `mutate_json`: a JSON document (a plan's metadata, a data file): delete a key or item,
  replace a value with an edge value (other type, huge, negative, a name from elsewhere in
  the document), nudge a number, duplicate or shuffle a list.
- `mutate_proto`: an ONNX protobuf message, field by field: clear a field, set a scalar to an
  edge value of its type, drop, duplicate or reorder a repeated field's items.
- `mutate_bytes`: a byte string: flip, truncate, insert or repeat bytes.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

#: edge values a JSON field is replaced with (besides values taken from the document itself)
JSON_EDGES: tuple[Any, ...] = (
    None, True, False, 0, 1, -1, 2, 3, 255, 256, 2**31, -2**31, 2**40, -2**40, 2**63, 0.5, -0.0, 1e308,
    float("nan"), float("inf"), "", "x", "float16", "int64", "bool", "object", "../../etc/hostname", [], {}, [0],
    [-1, 2**40], {"a": 1},
)
INT_EDGES = (0, 1, -1, 2, 3, 7, 255, 2**31 - 1, -2**31, 2**40, -2**40, 2**62)
FLOAT_EDGES = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1e38, -1e38, float("nan"), float("inf"), float("-inf"))


def pick(rng: np.random.Generator, items: Any) -> Any:
    """One of `items`, drawn from `rng`."""
    return items[int(rng.integers(len(items)))]


# ---- JSON ------------------------------------------------------------------------------------
def _json_slots(doc: Any, path: str = "") -> list[tuple[Any, Any, str]]:
    """(container, key, path) of every value inside `doc` (not the root itself)."""
    slots: list[tuple[Any, Any, str]] = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        where = f"{path}[{key!r}]"
        slots.append((doc, key, where))
        slots.extend(_json_slots(value, where))
    return slots


def _json_leaves(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        return [v for value in doc.values() for v in _json_leaves(value)] + list(doc)
    if isinstance(doc, list):
        return [v for value in doc for v in _json_leaves(value)]
    return [doc]


def mutate_json(doc: Any, rng: np.random.Generator, focus: str = "") -> tuple[Any, str]:
    """A copy of `doc` with one value changed (see the module docstring); `focus` picks only
    values whose path contains it (e.g. "['attrs']"), when there are any."""
    doc = copy.deepcopy(doc)
    slots = _json_slots(doc)
    slots = [s for s in slots if focus in s[2]] or slots
    if not slots:
        return pick(rng, JSON_EDGES), "replaced the whole document"
    container, key, where = pick(rng, slots)
    value = container[key]
    op = int(rng.integers(7))
    if op == 0:
        del container[key]
        return doc, f"deleted {where}"
    if op == 1:
        container[key] = pick(rng, JSON_EDGES)
        return doc, f"set {where} = {container[key]!r}"
    if op == 2:
        container[key] = copy.deepcopy(pick(rng, _json_leaves(doc) or [0]))
        return doc, f"set {where} = {container[key]!r} (a value from the document)"
    if op == 3 and isinstance(value, (int, float)) and not isinstance(value, bool):
        container[key] = pick(rng, (value + 1, value - 1, value * 2, -value, value + 256, value * 1000))
        return doc, f"nudged {where} from {value!r} to {container[key]!r}"
    if op == 4 and isinstance(value, list) and value:
        i = int(rng.integers(len(value)))
        value.insert(i, copy.deepcopy(value[i]))
        return doc, f"duplicated item {i} of {where}"
    if op == 5 and isinstance(value, list) and len(value) > 1:
        rng.shuffle(value)
        return doc, f"shuffled {where}"
    if op == 6 and isinstance(value, dict) and value:
        extra = pick(rng, sorted(value))
        value[f"{extra}_copy"] = copy.deepcopy(value[extra])
        return doc, f"copied {where}[{extra!r}] under a new key"
    container[key] = pick(rng, JSON_EDGES)
    return doc, f"set {where} = {container[key]!r}"


# ---- protobuf (ONNX) -------------------------------------------------------------------------
def _proto_slots(message: Any, path: str = "model") -> list[tuple[Any, Any, str]]:
    """(message, field descriptor, path) of every field set in `message` and its sub-messages."""
    slots = []
    for field, value in message.ListFields():
        where = f"{path}.{field.name}"
        slots.append((message, field, where))
        if field.type == field.TYPE_MESSAGE:
            children = value if field.is_repeated else [value]
            for i, child in enumerate(children):
                slots.extend(_proto_slots(child, f"{where}[{i}]" if field.is_repeated else where))
    return slots


def _scalar_edge(field: Any, names: list[str], rng: np.random.Generator) -> Any:
    if field.type in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
        return float(pick(rng, FLOAT_EDGES))
    if field.type == field.TYPE_STRING:
        return pick(rng, names + ["", "x", "ai.polykit", "com.microsoft", "../x"])
    if field.type == field.TYPE_BYTES:
        return bytes(rng.integers(0, 256, size=int(rng.integers(0, 9)), dtype=np.uint8))
    if field.type == field.TYPE_BOOL:
        return bool(rng.integers(2))
    if field.type == field.TYPE_ENUM:
        return pick(rng, [v.number for v in field.enum_type.values])
    return int(pick(rng, INT_EDGES))


def mutate_proto(message: Any, rng: np.random.Generator) -> tuple[Any, str]:
    """A copy of the protobuf `message` with one field changed (see the module docstring)."""
    message = copy.deepcopy(message)
    slots = _proto_slots(message)
    if not slots:
        return message, "nothing to mutate"
    names = sorted({v for owner, field, _ in slots for v in _strings(owner, field)})
    for _ in range(8):  # an edge value may not fit the field's type: try another one
        owner, field, where = pick(rng, slots)
        try:
            return message, _mutate_field(owner, field, where, names, rng)
        except (ValueError, TypeError, OverflowError):
            continue
    return message, "no mutation fitted"


def _strings(owner: Any, field: Any) -> list[str]:
    if field.type != field.TYPE_STRING:
        return []
    value = getattr(owner, field.name)
    return list(value) if field.is_repeated else [value]


def _mutate_field(owner: Any, field: Any, where: str, names: list[str], rng: np.random.Generator) -> str:
    value = getattr(owner, field.name)
    if field.is_repeated:
        op = int(rng.integers(4))
        if op == 0 or len(value) == 0:
            owner.ClearField(field.name)
            return f"cleared {where}"
        i = int(rng.integers(len(value)))
        if op == 1:
            del value[i]
            return f"deleted item {i} of {where}"
        if op == 2:
            if field.type == field.TYPE_MESSAGE:
                value.add().CopyFrom(value[i])
            else:
                value.append(value[i])
            return f"duplicated item {i} of {where}"
        if field.type == field.TYPE_MESSAGE:
            return f"{where}[{i}]: " + _mutate_some_field(value[i], names, rng)
        edge = _scalar_edge(field, names, rng)
        value[i] = edge
        return f"set {where}[{i}] = {edge!r}"
    if field.type == field.TYPE_MESSAGE:
        owner.ClearField(field.name)
        return f"cleared {where}"
    edge = _scalar_edge(field, names, rng)
    setattr(owner, field.name, edge)
    return f"set {where} = {edge!r}"


def _mutate_some_field(message: Any, names: list[str], rng: np.random.Generator) -> str:
    """Change one field set directly on `message` (an item of a repeated message field)."""
    fields = [f for f, _ in message.ListFields()]
    if not fields:
        return "empty message left as is"
    field = pick(rng, fields)
    return _mutate_field(message, field, field.name, names, rng)


# ---- bytes -----------------------------------------------------------------------------------
def mutate_bytes(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """`data` with a few bytes flipped, cut, inserted or repeated."""
    if not data:
        return b"\0", "replaced empty data by one byte"
    op = int(rng.integers(4))
    pos = int(rng.integers(len(data)))
    if op == 0:
        buf = bytearray(data)
        buf[pos] ^= 1 << int(rng.integers(8))
        return bytes(buf), f"flipped a bit of byte {pos}"
    if op == 1:
        return data[:pos], f"truncated to {pos} bytes"
    if op == 2:
        extra = bytes(rng.integers(0, 256, size=int(rng.integers(1, 9)), dtype=np.uint8))
        return data[:pos] + extra + data[pos:], f"inserted {len(extra)} bytes at {pos}"
    end = min(len(data), pos + int(rng.integers(1, 64)))
    return data[:end] + data[pos:end] + data[end:], f"repeated bytes {pos}..{end}"
