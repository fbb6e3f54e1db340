"""The plan: what the builder produces and a runtime loads, and its binary file format.

Binary layout (little-endian):

    magic          8 bytes   b"PLYKPLAN"
    format         u32       FORMAT_VERSION
    polykit        u16 len + utf-8   polykit version that wrote it
    target         u16 len + utf-8   "cpu" / "cuda"
    gpu arch       u16 len + utf-8   e.g. "sm_90", "" for cpu
    json length    u64
    weights length u64
    checksum       32 bytes  sha256 over everything above (but the checksum) and the body
    JSON           metadata: sort_keys, compact separators
    padding        zero bytes up to a 256-byte file offset
    weights        raw little-endian bytes, each weight at a 256-byte aligned offset

No pickle: attributes that are arrays are stored as {"__ndarray__": dtype, shape, base64}.
The same graph and config give byte-identical plans (nothing time- or host-dependent).
Loading checks the header and checksum here, that this polykit version wrote the plan or that
it was built version-compatible (polykit.compiler.plan.compatibility: the document's
`compatibility` record says so, with the tactic set and the hardware-compatibility level), then
the metadata's contents against one schema (plan_check) before any target sees the plan.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

import polykit
from polykit.compiler.plan.compatibility import Compatibility, check_version
from polykit.compiler.plan.memory import ALIGNMENT, MemoryPlan, align
from polykit.compiler.plan.body_inputs import infer_body_plan
from polykit.compiler.plan.check import check_document, check_layers, drop_code_table
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.compiler.plan.profiles import ProfileSet
from polykit.compiler.ir.symbolic import expr_from_json, expr_to_json
from polykit.compiler.ops.control.bodies import register_body_inference
from polykit import limits
from polykit.errors import PlanError, PolykitError
from polykit.files import parse_json, require_file

MAGIC = b"PLYKPLAN"
#: 2: the kernel table names kernels (entry point, source key) and carries no source text
FORMAT_VERSION = 2
#: versions this polykit reads: a format-1 plan's CUDA source is dropped and its kernels are
#: regenerated (polykit.compiler.plan.check.drop_code_table; docs/HARDENING.md)
READABLE_VERSIONS = (1, FORMAT_VERSION)
_FIXED = struct.Struct("<8sI")
_LENGTHS = struct.Struct("<QQ")
_CHECKSUM_BYTES = 32


#: metadata keys of a freshly built Plan that describe the build, not the plan: not serialized
BUILD_REPORT_KEYS = frozenset({"tuning"})


@dataclass
class Plan:
    """A built engine: layers with tactics, tensor metadata, weights and the memory plan."""

    target: str
    layers: list[LayerDesc]
    tensors: dict[str, TensorDesc]
    inputs: list[str]
    outputs: list[str]
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    memory: MemoryPlan = field(default_factory=MemoryPlan)
    metadata: dict[str, Any] = field(default_factory=dict)
    gpu_arch: str = ""
    profiles: ProfileSet | None = None  # optimization profiles of a plan with dynamic shapes
    #: the version that built it and where it may load (a plan loaded from a file: the header's version)
    compatibility: Compatibility = field(default_factory=lambda: Compatibility(polykit.__version__))

    # ---- conveniences ---------------------------------------------------------------
    def layer(self, name: str) -> LayerDesc:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise PlanError(f"the plan has no layer {name!r}", hint="list layers with `polykit inspect`")

    @property
    def weight_bytes(self) -> int:
        return sum(int(w.nbytes) for w in self.weights.values())

    # ---- serialization --------------------------------------------------------------
    def serialize(self) -> bytes:
        """The plan as bytes (see the module docstring for the layout). Metadata that reports
        how this one build went (BUILD_REPORT_KEYS: what was timed, cache hits) stays out, so
        the same plan built again (a replay, a warm cache) has the same bytes."""
        packer = _WeightPacker()
        doc = self.to_document(packer)
        return encode_plan(doc, packer.blob(), self.target, self.gpu_arch)

    def to_document(self, packer: "_WeightPacker") -> dict[str, Any]:
        """The plan's JSON document; its weights (and those of the plans nested in control-flow
        layers, each a document of its own in its layer's attrs) go to `packer`'s one blob."""
        weight_index = packer.add(self.weights)
        doc = {
            "format": FORMAT_VERSION,
            "target": self.target,
            "gpu_arch": self.gpu_arch,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "tensors": {name: _tensor_to_json(t) for name, t in sorted(self.tensors.items())},
            "layers": [_layer_to_json(layer, packer) for layer in self.layers],
            "weights": weight_index,
            "memory": self.memory.to_json(),
            "metadata": _jsonable({k: v for k, v in self.metadata.items() if k not in BUILD_REPORT_KEYS}, "metadata"),
        }
        if self.profiles is not None:
            doc["profiles"] = self.profiles.to_json()
        doc["compatibility"] = self.compatibility.to_json()
        return doc

    @staticmethod
    def deserialize(data: bytes, expect_target: str | None = None, where: str = "plan") -> "Plan":
        """Parse plan bytes; PlanError for truncated, corrupt, foreign-version or wrong-target data,
        for a plan another polykit version built without --version-compatible, and for contents
        the schema check (polykit.compiler.plan.check) rejects."""
        header, doc, blob = decode_plan(data, where)
        check_version(header["polykit_version"], doc, where)
        if expect_target is not None and header["target"] != expect_target:
            raise PlanError(
                f"the plan was built for target {header['target']!r}, not {expect_target!r}",
                where=where,
                hint=f"rebuild the plan with --target {expect_target}, or load it with target {header['target']!r}",
            )
        plan = Plan.from_document(doc, blob, header["target"], where)
        plan.compatibility = Compatibility.from_json(doc.get("compatibility"), header["polykit_version"])
        check_memory(plan, where)
        return plan

    @staticmethod
    def from_document(doc: Any, blob: memoryview, target: str, where: str = "plan", depth: int = 0) -> "Plan":
        """The Plan of a JSON document (a file's, or one nested `depth` deep in control-flow
        layers) whose weights lie in `blob`, after the schema check (PlanError naming the field
        otherwise)."""
        if depth > limits.current().body_depth:
            raise PlanError(f"control-flow body plans nest more than {limits.current().body_depth} deep", where=where,
                            hint=limits.raise_hint("body_depth"))
        doc = drop_code_table(doc)
        check_document(doc, len(blob), where)
        if doc["target"] != target:
            raise PlanError(f"invalid plan field target: {doc['target']!r} differs from the header's "
                            f"{target!r}", where=where, hint="the file was edited; rebuild the plan")
        plan = _plan_from_json(doc, blob, where, depth)
        check_layers(plan, where)
        return plan

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_bytes(self.serialize())
        return path

    @staticmethod
    def load(path: str | os.PathLike, expect_target: str | None = None) -> "Plan":
        path = require_file(path, "plan file", PlanError)
        return Plan.deserialize(path.read_bytes(), expect_target=expect_target, where=str(path))

    def __repr__(self) -> str:
        return (f"Plan(target={self.target!r}, {len(self.layers)} layers, inputs={self.inputs}, "
                f"outputs={self.outputs}, arena={self.memory.arena_bytes} B, weights={self.weight_bytes} B)")


# ---- memory ------------------------------------------------------------------------------------
#: the limit of polykit.limits that bounds a plan's memory, by target (cpu runs in host memory)
MEMORY_LIMIT = {"cuda": "device_memory"}


def requested_memory(plan: Plan) -> int:
    """Bytes a plan asks its target for: its arena and weights, and those of the plans nested
    in its control-flow layers."""
    total, stack = 0, [plan]
    while stack:
        p = stack.pop()
        total += p.memory.arena_bytes + p.weight_bytes
        stack.extend(_nested_plans([layer.attrs for layer in p.layers]))
    return total


def _nested_plans(values: Any) -> list[Plan]:
    found, stack = [], [values]
    while stack:
        v = stack.pop()
        if isinstance(v, Plan):
            found.append(v)
        elif isinstance(v, Mapping):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return found


def check_memory(plan: Plan, where: str = "plan", error: type[PolykitError] = PlanError) -> None:
    """`error` when the plan asks for more memory than the limit of its target allows (a plan
    declares its arena; nothing may allocate 8 TB because a file says so)."""
    limit = MEMORY_LIMIT.get(plan.target, "host_memory")
    limits.check(limit, requested_memory(plan), f"the plan's arena and weights on target {plan.target!r}", error, where)


# ---- bytes <-> (header, document, weight blob) -------------------------------------------------
def encode_plan(doc: Mapping[str, Any], blob: bytes, target: str, gpu_arch: str) -> bytes:
    """Plan bytes of a metadata document and a weight blob: header, lengths and checksum."""
    body_json = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")
    head = _FIXED.pack(MAGIC, FORMAT_VERSION)
    for text in (polykit.__version__, target, gpu_arch):
        raw = text.encode("utf-8")
        head += struct.pack("<H", len(raw)) + raw
    head += _LENGTHS.pack(len(body_json), len(blob))
    start = len(head) + _CHECKSUM_BYTES + len(body_json)
    padding = b"\0" * (align(start) - start)
    digest = hashlib.sha256(head + body_json + padding + blob).digest()
    return head + digest + body_json + padding + blob


def decode_plan(data: bytes, where: str = "plan") -> tuple[dict[str, Any], Any, memoryview]:
    """(header, parsed JSON document, weight blob) of plan bytes whose header, lengths and
    checksum are sound (PlanError otherwise); the document is not checked yet."""
    data = bytes(data)
    header = _read_header(data, where)
    json_end = header["body_start"] + header["json_len"]
    doc = parse_json(data[header["body_start"]:json_end], where, "plan's metadata", PlanError, hint="rebuild the plan")
    blob_start = align(json_end)
    return header, doc, memoryview(data)[blob_start:blob_start + header["weights_len"]]


# ---- header ----------------------------------------------------------------------------
def _read_header(data: bytes, where: str) -> dict[str, Any]:
    def truncated(part: str) -> PlanError:
        return PlanError(f"the plan is truncated ({len(data)} bytes; ends inside the {part})", where=where,
                         hint="the file was cut short (interrupted copy or write); rebuild or re-copy it")

    if len(data) < _FIXED.size:
        if data and not MAGIC.startswith(data[: len(MAGIC)]):
            raise _not_a_plan(where)
        raise truncated("header")
    magic, version = _FIXED.unpack_from(data, 0)
    if magic != MAGIC:
        raise _not_a_plan(where)
    if version not in READABLE_VERSIONS:
        raise PlanError(
            f"the plan has format version {version}; this polykit ({polykit.__version__}) reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}",
            where=where,
            hint="rebuild the plan with this polykit version",
        )
    pos = _FIXED.size
    strings = []
    for _ in range(3):
        if pos + 2 > len(data):
            raise truncated("header")
        (n,) = struct.unpack_from("<H", data, pos)
        if pos + 2 + n > len(data):
            raise truncated("header")
        try:
            strings.append(data[pos + 2: pos + 2 + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise PlanError("the plan header is corrupt (undecodable text)", where=where, hint="rebuild the plan") from None
        pos += 2 + n
    if pos + _LENGTHS.size + _CHECKSUM_BYTES > len(data):
        raise truncated("header")
    json_len, weights_len = _LENGTHS.unpack_from(data, pos)
    pos += _LENGTHS.size
    digest = data[pos: pos + _CHECKSUM_BYTES]
    body_start = pos + _CHECKSUM_BYTES
    blob_start = align(body_start + json_len)
    expected = blob_start + weights_len
    if len(data) < expected:
        raise truncated("JSON metadata" if len(data) < body_start + json_len else "weights")
    if len(data) > expected:
        raise PlanError(f"the plan has {len(data) - expected} unexpected trailing bytes", where=where,
                        hint="the file is corrupt or was appended to; rebuild it")
    hasher = hashlib.sha256()
    view = memoryview(data)
    hasher.update(view[:pos])
    hasher.update(view[body_start:])
    if hasher.digest() != digest:
        raise PlanError("the plan is corrupt: its checksum does not match its contents", where=where,
                        hint="the file was modified or damaged; rebuild or re-copy it")
    return {"polykit_version": strings[0], "target": strings[1], "gpu_arch": strings[2],
            "json_len": json_len, "weights_len": weights_len, "body_start": body_start}


def _not_a_plan(where: str) -> PlanError:
    return PlanError("the data is not a polykit plan (bad magic bytes)", where=where,
                     hint="pass a file written by `polykit convert` / Plan.save, not an ONNX model")


# ---- weights -----------------------------------------------------------------------------
def weight_offsets(sizes: Mapping[str, int]) -> dict[str, int]:
    """Byte offset of each weight (name -> nbytes) in the plan's weight blob: sorted by name, 256-aligned."""
    offsets, pos = {}, 0
    for name in sorted(sizes):
        offsets[name] = pos
        pos += align(int(sizes[name]))
    return offsets


class _WeightPacker:
    """The one weight blob of a plan file: the plan's weights, then those of nested plans."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._pos = 0

    def add(self, weights: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Append `weights` (sorted by name, 256-aligned); their index into the blob."""
        blob, index = _pack_weights(weights, self._pos)
        self._parts.append(blob)
        self._pos += len(blob)
        return index

    def blob(self) -> bytes:
        return b"".join(self._parts)


def _pack_weights(weights: Mapping[str, np.ndarray], pos: int = 0) -> tuple[bytes, dict[str, Any]]:
    parts: list[bytes] = []
    index: dict[str, Any] = {}
    for name in sorted(weights):
        arr = np.asarray(weights[name], order="C")
        if arr.dtype == object:
            raise PlanError(f"weight {name!r} has dtype object, which a plan cannot store",
                            hint="polykit runs numeric and bool tensors only")
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        raw = arr.tobytes()
        index[name] = {"dtype": arr.dtype.name, "shape": list(arr.shape), "offset": pos, "nbytes": len(raw)}
        parts.append(raw + b"\0" * (align(len(raw)) - len(raw)))
        pos += align(len(raw))
    return b"".join(parts), index


def _unpack_weights(blob: memoryview, index: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in index.items():
        offset, nbytes = int(w["offset"]), int(w["nbytes"])
        dtype = np.dtype(w["dtype"]).newbyteorder("<")
        arr = np.frombuffer(blob[offset: offset + nbytes], dtype=dtype).reshape(w["shape"])
        # A view into the plan bytes on little-endian hosts (read-only: weights are shared by contexts).
        arr = arr.astype(arr.dtype.newbyteorder("="), copy=False)
        arr.setflags(write=False)
        out[name] = arr
    return out


# ---- records <-> JSON ------------------------------------------------------------------
def _tensor_to_json(t: TensorDesc) -> dict[str, Any]:
    d = {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "kind": t.kind, "offset": t.offset,
         "nbytes": t.nbytes}
    if t.dims:
        d["dims"] = [expr_to_json(x) for x in t.dims]
    if t.value:
        d["value"] = [expr_to_json(x) for x in t.value]
    return d


def _tensor_from_json(d: Mapping[str, Any], shared: "dict | None" = None) -> TensorDesc:
    """A tensor record; `shared`: one dict for the plan's tensors, so equal dim subexpressions are one
    object (the binder evaluates each once per shape set: symbolic.evaluate's memo)."""
    return TensorDesc(d["name"], str(d["dtype"]), tuple(int(x) for x in d["shape"]), d["kind"], int(d["offset"]),
                      int(d["nbytes"]), tuple(expr_from_json(x, shared=shared) for x in d.get("dims", ())),
                      tuple(expr_from_json(x, shared=shared) for x in d.get("value", ())))


def _layer_to_json(layer: LayerDesc, packer: _WeightPacker) -> dict[str, Any]:
    d = {
        "name": layer.name, "kind": layer.kind, "inputs": list(layer.inputs), "outputs": list(layer.outputs),
        "attrs": _jsonable(layer.attrs, f"layer {layer.name!r}", packer), "domain": layer.domain, "tactic": layer.tactic,
        "tactic_params": _jsonable(layer.tactic_params, f"layer {layer.name!r}"), "precision": layer.precision,
        "fused_nodes": list(layer.fused_nodes), "in_dtypes": list(layer.in_dtypes),
        "out_dtypes": list(layer.out_dtypes), "in_shapes": [list(s) for s in layer.in_shapes],
        "out_shapes": [list(s) for s in layer.out_shapes],
    }
    if layer.profile_tactics:
        d["profile_tactics"] = list(layer.profile_tactics)
    return d


def _layer_from_json(d: Mapping[str, Any], nested: "_Nested") -> LayerDesc:
    return LayerDesc(
        name=d["name"], kind=d["kind"], inputs=tuple(d["inputs"]), outputs=tuple(d["outputs"]),
        attrs=_from_jsonable(d["attrs"], nested.at(f"layers[{d['name']!r}].attrs")), domain=d["domain"], tactic=d["tactic"],
        tactic_params=_from_jsonable(d["tactic_params"]), precision=d["precision"],
        fused_nodes=tuple(d["fused_nodes"]), in_dtypes=tuple(d.get("in_dtypes", ())),
        out_dtypes=tuple(d.get("out_dtypes", ())),
        in_shapes=tuple(tuple(int(x) for x in s) for s in d.get("in_shapes", ())),
        out_shapes=tuple(tuple(int(x) for x in s) for s in d.get("out_shapes", ())),
        profile_tactics=tuple(d.get("profile_tactics", ())),
    )


@dataclass(frozen=True)
class _Nested:
    """What decoding a plan nested in a layer's attrs needs: the file's blob and target."""

    blob: memoryview
    target: str
    where: str
    depth: int  # of the plan whose attrs these are

    def at(self, path: str) -> "_Nested":
        return _Nested(self.blob, self.target, f"{self.where}: {path}", self.depth)


def _plan_from_json(doc: Mapping[str, Any], blob: memoryview, where: str = "plan", depth: int = 0) -> Plan:
    """The Plan of a document check_document accepted."""
    nested = _Nested(blob, doc["target"], where, depth)
    shared: dict = {}  # equal dim subexpressions of all tensors: one object each
    return Plan(
        target=doc["target"],
        layers=[_layer_from_json(x, nested) for x in doc["layers"]],
        tensors={name: _tensor_from_json(t, shared) for name, t in doc["tensors"].items()},
        inputs=list(doc["inputs"]),
        outputs=list(doc["outputs"]),
        weights=_unpack_weights(blob, doc["weights"]),
        memory=MemoryPlan.from_json(doc["memory"]),
        metadata=_from_jsonable(doc["metadata"]),
        gpu_arch=doc.get("gpu_arch", ""),
        profiles=ProfileSet.from_json(doc["profiles"]) if "profiles" in doc else None,
        compatibility=Compatibility.from_json(doc.get("compatibility"), polykit.__version__),
    )


_ND = "__ndarray__"
_PLAN = "__plan__"


def _jsonable(value: Any, where: str, packer: _WeightPacker | None = None) -> Any:
    """Attributes and metadata as JSON values; numpy arrays/scalars tagged so they come back,
    and plans (control-flow bodies) as their documents, their weights packed by `packer`."""
    if isinstance(value, Plan) and packer is not None:
        return {_PLAN: value.to_document(packer)}
    if isinstance(value, np.ndarray):
        arr = np.asarray(value, order="C")
        if arr.dtype == object:
            raise PlanError("an attribute holds an object array, which a plan cannot store", where=where)
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        return {_ND: {"dtype": arr.dtype.name, "shape": list(arr.shape),
                      "data": base64.b64encode(arr.tobytes()).decode("ascii")}}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, where, packer) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where, packer) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise PlanError(
        f"a value of type {type(value).__name__} cannot be stored in a plan", where=where,
        hint="layer attributes hold JSON values, arrays and (control-flow bodies) plans",
    )


def _from_jsonable(value: Any, nested: _Nested | None = None) -> Any:
    if isinstance(value, dict):
        if set(value) == {_PLAN} and nested is not None:
            return Plan.from_document(value[_PLAN], nested.blob, nested.target, nested.where, nested.depth + 1)
        if set(value) == {_ND}:
            spec = value[_ND]
            raw = base64.b64decode(spec["data"])
            dtype = np.dtype(spec["dtype"]).newbyteorder("<")
            arr = np.frombuffer(raw, dtype=dtype).reshape(spec["shape"])
            return arr.astype(arr.dtype.newbyteorder("="), copy=True)
        return {k: _from_jsonable(v, nested and nested.at(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_jsonable(v, nested) for v in value]
    return value


#: a plan as a control-flow body: the node must give it the inputs it was built for
register_body_inference(Plan, infer_body_plan)

#: re-exported for callers that need the alignment of weight offsets
WEIGHT_ALIGNMENT = ALIGNMENT
