"""A corpus of small hostile files, built at test time: one case per class of input an attacker
or a careless user can hand polykit (zip bombs, sizes a file declares but does not hold,
numbers of 5,000 digits, JSON nested 10,000 deep, loops of 2**62 iterations, ...).

    for case in CASES:
        path = case.build(folder)                          # writes the file into folder
        for argv in case.commands(path, valid_model(folder)):  # the CLI commands that read it
            ...                  # run under case.limits (POLYKIT_LIMITS): exit 2, no traceback
                                 # (polykit.testing.hostile_run does this)

Every case is a few KB on disk. Those whose harm is size (a bomb) are built against the small
limits in `case.limits`, so a test proves the limit is checked before the allocation without
making gigabytes; the file's declared sizes are far above the limits either way.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

#: the limits every case runs under: small, so a bomb is refused in milliseconds
SMALL_LIMITS = {"data_bytes": 1 << 20, "host_memory": 64 << 20, "device_memory": 64 << 20,
                "fold_iterations": 1000, "run_iterations": 1000}


@dataclass(frozen=True)
class Case:
    """One hostile file: how to build it, and which CLI commands read it."""

    name: str
    build: Callable[[Path], Path]
    readers: tuple[str, ...]  # keys of READERS
    limits: dict[str, int] = field(default_factory=lambda: dict(SMALL_LIMITS))
    #: readers for which an exit code besides 2 is right, with the codes: a viewer may show a
    #: file it need not decode (0), a comparison against outputs that name nothing the model
    #: computes fails as a comparison (1)
    accept: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def accepted(self, reader: str) -> tuple[int, ...]:
        return dict(self.accept).get(reader, (2,))

    def readings(self, path: Path, model: Path) -> list[tuple[str, list[str]]]:
        """(reader, argv) of every command that reads `path`."""
        return [(r, [part.format(path=path, model=model) for part in READERS[r]]) for r in self.readers]

    def commands(self, path: Path, model: Path) -> list[list[str]]:
        """The argv of every command that reads `path` (`model`: a valid model a feed file needs)."""
        return [[part.format(path=path, model=model) for part in READERS[r]] for r in self.readers]


#: how each command reads a file: argv templates ({path}: the hostile file, {model}: a valid model)
READERS: dict[str, tuple[str, ...]] = {
    "inspect-data": ("inspect", "data", "{path}"),
    "load-inputs": ("run", "{model}", "--trt", "--target", "cpu", "--load-inputs", "{path}"),
    "load-outputs": ("run", "{model}", "--trt", "--target", "cpu", "--load-outputs", "{path}"),
    "inspect-model": ("inspect", "model", "{path}"),
    "convert": ("convert", "{path}", "--target", "cpu", "-o", "{path}.plan"),
    "run-trt": ("run", "{path}", "--trt", "--target", "cpu"),
    "timing-cache": ("convert", "{model}", "--target", "cpu", "--load-timing-cache", "{path}", "-o", "{path}.plan"),
    "tactic-replay": ("convert", "{model}", "--target", "cpu", "--load-tactics", "{path}", "-o", "{path}.plan"),
    "inspect-tactics": ("inspect", "tactics", "{path}"),
    "calibration-cache": ("convert", "{model}", "--target", "cpu", "--int8", "--calibration-cache", "{path}",
                          "-o", "{path}.plan"),
}


# ---- data files -----------------------------------------------------------------------------
def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _zip(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def npz_deflate_bomb(folder: Path) -> Path:
    """A genuine bomb: 64 MiB of zeros deflated to ~64 KB (64x the test's data_bytes limit)."""
    return _zip(folder / "deflate_bomb.npz", {"x.npy": npy_bytes(np.zeros(16 << 20, np.float32))})


def npz_bzip2_bomb(folder: Path) -> Path:
    """64 MiB of zeros under bzip2 (a ~100 byte member: ratios deflate cannot reach)."""
    return _zip(folder / "bzip2_bomb.npz", {"x.npy": npy_bytes(np.zeros(16 << 20, np.float32))}, zipfile.ZIP_BZIP2)


def npz_lying_size(folder: Path) -> Path:
    """A 1 KB archive whose member declares 8 GiB uncompressed (central directory and npy header agree)."""
    arr_header = npy_bytes(np.zeros(0, np.float32))
    header = arr_header.replace(b"(0,)", b"(%d,)" % (2 << 30)).ljust(len(arr_header))
    path = _zip(folder / "lying_size.npz", {"x.npy": header + b"\0" * 512})
    return _patch_sizes(path, 8 << 30)


def _patch_sizes(path: Path, size: int) -> Path:
    """Rewrite the uncompressed size of every member (local header and central directory) to
    `size` (ZIP64 fields when it needs them are beyond this; 4 GiB - 1 is the plain maximum)."""
    data = bytearray(path.read_bytes())
    size = min(size, 0xFFFFFFFE)
    for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        pos = data.find(sig)
        while pos >= 0:
            struct.pack_into("<I", data, pos + off, size)
            pos = data.find(sig, pos + 4)
    path.write_bytes(bytes(data))
    return path


def npy_huge_shape(folder: Path) -> Path:
    """An .npz whose member's npy header claims 2**40 float32 elements and holds 16 bytes."""
    raw = npy_bytes(np.zeros(4, np.float32)).replace(b"(4,)", b"(%d,)" % (1 << 40))
    return _zip(folder / "huge_shape.npz", {"x.npy": raw}, zipfile.ZIP_STORED)


def _json(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def json_deep(folder: Path) -> Path:
    return _json(folder / "deep.json", "[" * 100_000 + "]" * 100_000)


def json_long_int(folder: Path) -> Path:
    return _json(folder / "long_int.json", '[{"x": [' + "9" * 5000 + "]}]")


def json_float_overflow(folder: Path) -> Path:
    return _json(folder / "float_overflow.json", '[{"x": {"dtype": "float32", "data": [1e400]}}]')


def polygraphy_lazy_nest(folder: Path) -> Path:
    """A Polygraphy LazyArray nested 700 deep around one ndarray."""
    value: dict = {"array": "", "polygraphy_class": "ndarray"}
    for _ in range(700):
        value = {"values": value, "polygraphy_class": "LazyArray"}
    return _json(folder / "lazy_nest.json", json.dumps([{"x": value}]))


def polygraphy_huge_array(folder: Path) -> Path:
    """A Polygraphy ndarray whose .npy header claims 2**40 elements."""
    import base64

    raw = npy_bytes(np.zeros(4, np.float32)).replace(b"(4,)", b"(%d,)" % (1 << 40))
    doc = [{"x": {"array": base64.b64encode(raw).decode(), "polygraphy_class": "ndarray"}}]
    return _json(folder / "polygraphy_huge.json", json.dumps(doc))



# ---- ONNX models --------------------------------------------------------------------------------
def _model(nodes: list, inputs: list, outputs: list, inits: list = (), opset: int = 21) -> "onnx.ModelProto":  # noqa: F821
    from onnx import helper

    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _save(model: "onnx.ModelProto", path: Path) -> Path:  # noqa: F821
    path.write_bytes(model.SerializeToString())
    return path


def _vi(name: str, shape: list, elem: int = 1) -> "onnx.ValueInfoProto":  # noqa: F821
    from onnx import helper

    return helper.make_tensor_value_info(name, elem, shape)


def valid_model(folder: Path) -> Path:
    """y = Relu(x @ w), x float[1, 2]: the model a feed file or a cache is given with (its MatMul
    has weights, so an INT8 build reads a calibration cache)."""
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")
    return _save(_model([helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
                         helper.make_node("Relu", ["h"], ["y"], name="relu")], [_vi("x", [1, 2])], [_vi("y", [1, 2])],
                        [w]), folder / "valid.onnx")


def model_huge_shape(folder: Path) -> Path:
    """Relu on float[1, 2**20, 2**20]: 4 TiB of activations declared in 150 bytes."""
    from onnx import helper

    return _save(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", [1, 1 << 20, 1 << 20])],
                        [_vi("y", [1, 1 << 20, 1 << 20])]), folder / "huge_shape.onnx")


def model_conv_timing(folder: Path) -> Path:
    """A Conv on [1, 2, 5, 2**40]: its tactics would be timed on inputs of 40 TiB."""
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.ones((3, 2, 3, 3), np.float32), "w")
    return _save(_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
                        [_vi("x", [1, 2, 5, 1 << 40])], [_vi("y", [1, 3, 5, 1 << 40])], [w]),
                 folder / "conv_timing.onnx")


def _loop_model(trip: int, cond_from_input: bool) -> "onnx.ModelProto":  # noqa: F821
    """y = x + the sum over `trip` iterations of 1 (a Loop whose condition is a constant true, or
    x == x: true, but known only when the model runs)."""
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
         helper.make_node("Add", ["s_in", "one"], ["s_out"], name="step")], "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("s_in", [1])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("s_out", [1])],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    inits = [numpy_helper.from_array(np.array(trip, np.int64), "trip"),
             numpy_helper.from_array(np.zeros(1, np.float32), "s0")]
    nodes = []
    if cond_from_input:
        nodes.append(helper.make_node("Equal", ["x", "x"], ["go1"], name="same"))
        nodes.append(helper.make_node("Squeeze", ["go1"], ["go"], name="scalar"))
    else:
        inits.append(numpy_helper.from_array(np.array(True), "go"))
    nodes += [helper.make_node("Loop", ["trip", "go", "s0"], ["s"], name="loop", body=body),
              helper.make_node("Add", ["s", "x"], ["y"], name="add")]
    return _model(nodes, [_vi("x", [1])], [_vi("y", [1])], inits)


def model_loop_constant(folder: Path) -> Path:
    """A Loop of 2**62 iterations on constants (constant folding would run it)."""
    return _save(_loop_model(1 << 62, cond_from_input=False), folder / "loop_constant.onnx")


def model_loop_runtime(folder: Path) -> Path:
    """A Loop of 2**62 iterations whose condition is an input (only a run executes it)."""
    return _save(_loop_model(1 << 62, cond_from_input=True), folder / "loop_runtime.onnx")


def model_nested_bodies(folder: Path, depth: int = 20) -> Path:
    """If nodes nested `depth` deep (past the test's body_depth limit of 8; protobuf refuses ~33)."""
    from onnx import TensorProto, helper

    def leaf(d: int) -> "onnx.GraphProto":  # noqa: F821
        return helper.make_graph([helper.make_node("Identity", ["x"], [f"y{d}"], name=f"leaf{d}")], f"leaf{d}", [],
                                 [_vi(f"y{d}", [2])])

    inner = leaf(0)
    for d in range(1, depth):
        node = helper.make_node("If", ["c"], [f"y{d}"], name=f"if{d}", then_branch=inner, else_branch=leaf(d))
        inner = helper.make_graph([node], f"level{d}", [], [_vi(f"y{d}", [2])])
    top = helper.make_node("If", ["c"], ["y"], name="top", then_branch=inner, else_branch=leaf(depth))
    return _save(_model([top], [_vi("c", [], TensorProto.BOOL), _vi("x", [2])], [_vi("y", [2])]),
                 folder / "nested_bodies.onnx")


def model_negative_dims(folder: Path) -> Path:
    """An initializer with dims [-3, 4] (read as (0, 4) by a trusting reader)."""
    from onnx import TensorProto, helper

    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[-3, 4])
    return _save(_model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [1, 4])],
                        [_vi("y", [0, 4])], [w]), folder / "negative_dims.onnx")


def model_opset_99(folder: Path) -> Path:
    from onnx import helper

    return _save(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", [2])], [_vi("y", [2])],
                        opset=99), folder / "opset_99.onnx")


def _external(folder: Path, name: str, location: str, offset: str | None, length: str | None) -> Path:
    """y = x + w, with w float[4] in external data at (location, offset, length)."""
    from onnx import TensorProto, helper

    (folder / "weights.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            w.external_data.add(key=key, value=value)
    return _save(_model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [4])], [_vi("y", [4])],
                        [w]), folder / f"{name}.onnx")


def external_nul(folder: Path) -> Path:
    return _external(folder, "external_nul", "weights.bin\0/etc/passwd", None, None)


def external_offset_huge(folder: Path) -> Path:
    return _external(folder, "external_offset", "weights.bin", str(10 ** 30), "16")


def external_length_huge(folder: Path) -> Path:
    return _external(folder, "external_length", "weights.bin", "0", str(10 ** 12))


def external_length_2_63(folder: Path) -> Path:
    return _external(folder, "external_length63", "weights.bin", "0", str(1 << 63))


def external_unicode_digit(folder: Path) -> Path:
    return _external(folder, "external_digit", "weights.bin", "0", "1²")



# ---- plans (edited documents, checksums recomputed: what a crafted plan looks like) --------------
def _plan_of(model: "onnx.ModelProto", **config: object) -> tuple[dict, bytes]:  # noqa: F821
    """(JSON document, weight blob) of the cpu plan of `model`."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.compiler.plan.file import decode_plan

    _, doc, blob = decode_plan(build_plan(model, BuilderConfig(target="cpu", **config)).serialize())
    return doc, bytes(blob)


def _write_plan(path: Path, doc: dict, blob: bytes) -> Path:
    import sys

    from polykit.compiler.plan.file import encode_plan

    saved = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # a crafted plan may hold integers Python would refuse to print
    try:
        path.write_bytes(encode_plan(doc, blob, doc["target"], doc.get("gpu_arch", "")))
    finally:
        sys.set_int_max_str_digits(saved)
    return path


def _relu_model() -> "onnx.ModelProto":  # noqa: F821
    from onnx import helper

    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", [2])], [_vi("y", [2])])


def plan_long_int(folder: Path) -> Path:
    doc, blob = _plan_of(_relu_model())
    doc["memory"]["arena_bytes"] = 10 ** 5000
    return _write_plan(folder / "long_int.plan", doc, blob)


def plan_huge_arena(folder: Path) -> Path:
    """A plan whose arena claims 2**46 bytes (64 TiB; its tensors unchanged)."""
    doc, blob = _plan_of(_relu_model())
    doc["memory"]["arena_bytes"] = 1 << 46
    return _write_plan(folder / "huge_arena.plan", doc, blob)


def plan_nested_bodies(folder: Path, depth: int = 150) -> Path:
    """A plan whose layer attrs nest body plans `depth` deep."""
    doc, blob = _plan_of(_relu_model())
    inner = json.loads(json.dumps(doc))
    for _ in range(depth):
        outer = json.loads(json.dumps(doc))
        outer["layers"][0]["attrs"]["body"] = {"__plan__": inner}
        inner = outer
    return _write_plan(folder / "nested_bodies.plan", inner, blob)


def plan_profile_missing_tensor(folder: Path) -> Path:
    """A plan with optimization profiles whose input's tensor record is deleted."""
    from onnx import helper

    from polykit.compiler.plan.profiles import Profile

    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", ["n", 4])], [_vi("y", ["n", 4])])
    doc, blob = _plan_of(model, profiles=(Profile({"x": ((1, 4), (2, 4), (8, 4))}),))
    del doc["tensors"]["x"]
    return _write_plan(folder / "profile_missing.plan", doc, blob)



# ---- builder caches ---------------------------------------------------------------------------
def _timing_cache(ms: str) -> str:
    return '{"format": 1, "entries": {"%s": {"ms": %s, "tactic": "t", "kind": "k", "device": "d"}}}' % ("0" * 64, ms)


def timing_cache_huge_ms(folder: Path) -> Path:
    return _json(folder / "huge_ms.cache", _timing_cache("1" + "0" * 400))


def timing_cache_float_overflow(folder: Path) -> Path:
    return _json(folder / "overflow_ms.cache", _timing_cache("1e400"))


def timing_cache_deep(folder: Path) -> Path:
    return _json(folder / "deep.cache", "[" * 50_000 + "]" * 50_000)


def replay_long_int(folder: Path) -> Path:
    return _json(folder / "long_int.replay.json", '{"format": ' + "7" * 5000 + ', "layers": {}}')


def replay_deep(folder: Path) -> Path:
    return _json(folder / "deep.replay.json", '{"layers": ' + "[" * 50_000 + "]" * 50_000 + "}")


def _calibration(path: Path, version: str, scale: str) -> Path:
    import polykit
    from polykit.compiler.builder.calibration_cache import MAGIC

    return _json(path, f"{MAGIC} {version} polykit={polykit.__version__} calibrator=minmax\nx: {scale}\n")


def calibration_scale_overflow(folder: Path) -> Path:
    return _calibration(folder / "overflow.calib", "1", "0x1p99999")


def calibration_long_version(folder: Path) -> Path:
    return _calibration(folder / "long_version.calib", "1" * 5000, "0x1p-6")


def calibration_unicode_version(folder: Path) -> Path:
    return _calibration(folder / "unicode_version.calib", "²", "0x1p-6")


_MODEL = ("inspect-model", "convert", "run-trt")
_DATA = ("inspect-data", "load-inputs", "load-outputs")
_PLAN = ("inspect-model", "run-trt")
_CACHE = ("timing-cache",)
_REPLAY = ("tactic-replay", "inspect-tactics")
_CALIBRATION = ("calibration-cache", "inspect-data")

#: every hostile case (name, builder, the commands that read it; limits: SMALL_LIMITS unless given)
CASES: list[Case] = [Case(*row) for row in (
    ("npz-deflate-bomb", npz_deflate_bomb, _DATA),
    ("npz-bzip2-bomb", npz_bzip2_bomb, _DATA),
    ("npz-lying-size", npz_lying_size, _DATA),
    ("npy-huge-shape", npy_huge_shape, _DATA),
    ("json-deep", json_deep, _DATA),
    ("json-long-int", json_long_int, _DATA),
    ("json-float-overflow", json_float_overflow, _DATA),
    ("polygraphy-lazy-nest", polygraphy_lazy_nest, _DATA),
    ("polygraphy-huge-array", polygraphy_huge_array, _DATA),
    ("model-huge-shape", model_huge_shape, ("convert", "run-trt")),
    ("model-conv-timing", model_conv_timing, ("convert",)),
    ("model-loop-constant", model_loop_constant, ("convert", "run-trt")),
    ("model-loop-runtime", model_loop_runtime, ("run-trt",)),
    ("model-nested-bodies", model_nested_bodies, _MODEL, {**SMALL_LIMITS, "body_depth": 8}),
    ("model-negative-dims", model_negative_dims, _MODEL),
    ("model-opset-99", model_opset_99, _MODEL),
    ("external-nul", external_nul, _MODEL),
    ("external-offset-huge", external_offset_huge, _MODEL),
    ("external-length-huge", external_length_huge, _MODEL),
    ("external-length-2-63", external_length_2_63, _MODEL),
    ("external-unicode-digit", external_unicode_digit, _MODEL),
    ("plan-long-int", plan_long_int, _PLAN),
    ("plan-huge-arena", plan_huge_arena, _PLAN),
    ("plan-nested-bodies", plan_nested_bodies, _PLAN),
    ("plan-profile-missing-tensor", plan_profile_missing_tensor, _PLAN),
    ("timing-cache-huge-ms", timing_cache_huge_ms, _CACHE),
    ("timing-cache-float-overflow", timing_cache_float_overflow, _CACHE),
    ("timing-cache-deep", timing_cache_deep, _CACHE),
    ("replay-long-int", replay_long_int, _REPLAY),
    ("replay-deep", replay_deep, _REPLAY),
    ("calibration-scale-overflow", calibration_scale_overflow, _CALIBRATION),
    ("calibration-long-version", calibration_long_version, _CALIBRATION),
    ("calibration-unicode-version", calibration_unicode_version, _CALIBRATION),
)]
