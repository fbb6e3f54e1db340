"""A second hostile corpus, written apart from `polykit.testing.hostile` (issue 34's "fresh corpus
you write independently"): other ways to hurt a reader than the first corpus's bombs and deep
nesting -- truncated and random protobufs, graphs with cycles and undefined names, shape
arithmetic that asks for exabytes only once constants are folded (ConstantOfShape, Expand,
Tile, Range, Pad, Resize, OneHot), tensors whose data does not match their dims, archives of
thousands of members or with paths that climb out, .npy headers of structured or Unicode
dtypes, JSON with lone surrogates, NaN tokens and shapes that disagree with their data, plans
cut short or with their checksum intact but a JSON array for a document, caches of wrong shape.

The cases reuse `hostile.Case` and its READERS, so `polykit.testing.hostile_run --corpus fresh`
runs them exactly like the first corpus: every command must exit 2 with no traceback.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from polykit.testing.hostile import Case, _model, _save, _vi, _zip, npy_bytes


# ---- ONNX models -----------------------------------------------------------------------------
def _ints(name: str, values: list[int]):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(values, np.int64), name)


def _one_op(folder: Path, name: str, op: str, inputs: list[str], inits: list, attrs: dict | None = None,
            in_shape: list | None = None, out_shape: list | None = None) -> Path:
    """y = op(x, *constants): one node fed by the graph input x (float[in_shape]) and initializers."""
    from onnx import helper

    node = helper.make_node(op, inputs, ["y"], name=op.lower(), **(attrs or {}))
    return _save(_model([node], [_vi("x", in_shape or [2])], [_vi("y", out_shape)], inits), folder / f"{name}.onnx")


def onnx_truncated(folder: Path) -> Path:
    """A valid two-node model's protobuf cut in the middle of its graph."""
    from onnx import helper

    model = _model([helper.make_node("Relu", ["x"], ["h"], name="relu"),
                    helper.make_node("Neg", ["h"], ["y"], name="neg")], [_vi("x", [4])], [_vi("y", [4])])
    data = model.SerializeToString()
    path = folder / "truncated.onnx"
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


def onnx_random_bytes(folder: Path) -> Path:
    path = folder / "random.onnx"
    path.write_bytes(np.random.default_rng(34).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return path


def onnx_cycle(folder: Path) -> Path:
    """a = Add(x, b); b = Relu(a): each node reads the other's output."""
    from onnx import helper

    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Identity", ["b"], ["y"], name="out")]
    return _save(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]), folder / "cycle.onnx")


def onnx_undefined_input(folder: Path) -> Path:
    from onnx import helper

    return _save(_model([helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")], [_vi("x", [2])],
                        [_vi("y", [2])]), folder / "undefined.onnx")


def onnx_output_written_twice(folder: Path) -> Path:
    from onnx import helper

    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Neg", ["x"], ["y"], name="neg")]
    return _save(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]), folder / "written_twice.onnx")


def onnx_constant_of_shape_exabytes(folder: Path) -> Path:
    """ConstantOfShape([2**31, 2**31]): 16 EiB from a 16-byte shape, computable at build time."""
    from onnx import helper

    node = helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill")
    add = helper.make_node("Add", ["c", "x"], ["y"], name="add")
    return _save(_model([node, add], [_vi("x", [1])], [_vi("y", None)], [_ints("shape", [1 << 31, 1 << 31])]),
                 folder / "constant_of_shape.onnx")


def onnx_expand_huge(folder: Path) -> Path:
    return _one_op(folder, "expand", "Expand", ["x", "shape"], [_ints("shape", [1 << 20, 1 << 20, 2])])


def onnx_tile_huge(folder: Path) -> Path:
    return _one_op(folder, "tile", "Tile", ["x", "repeats"], [_ints("repeats", [1 << 40])])


def onnx_range_huge(folder: Path) -> Path:
    """Range(0, 10**18, 1) on int64 constants (folding would materialize it)."""
    from onnx import helper

    rng = helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range")
    cast = helper.make_node("Cast", ["r"], ["rf"], name="cast", to=1)
    add = helper.make_node("Add", ["rf", "x"], ["y"], name="add")
    inits = [_scalar("start", 0), _scalar("limit", 10 ** 18), _scalar("delta", 1)]
    return _save(_model([rng, cast, add], [_vi("x", [1])], [_vi("y", None)], inits), folder / "range.onnx")


def _scalar(name: str, value: int):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, np.int64), name)


def onnx_pad_huge(folder: Path) -> Path:
    return _one_op(folder, "pad", "Pad", ["x", "pads"], [_ints("pads", [0, 1 << 42])])


def onnx_resize_scale_huge(folder: Path) -> Path:
    from onnx import numpy_helper

    scales = numpy_helper.from_array(np.array([1.0, 1.0, 1e9, 1e9], np.float32), "scales")
    return _one_op(folder, "resize", "Resize", ["x", "", "scales"], [scales], {"mode": "nearest"},
                   in_shape=[1, 1, 4, 4])


def onnx_onehot_huge(folder: Path) -> Path:
    from onnx import helper, numpy_helper

    idx = numpy_helper.from_array(np.array([0, 1], np.int64), "idx")
    values = numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "values")
    node = helper.make_node("OneHot", ["idx", "depth", "values"], ["h"], name="onehot")
    add = helper.make_node("Add", ["h", "x"], ["y"], name="add")
    return _save(_model([node, add], [_vi("x", [1])], [_vi("y", None)], [idx, _scalar("depth", 1 << 45), values]),
                 folder / "onehot.onnx")


def onnx_raw_data_short(folder: Path) -> Path:
    """An initializer declaring [1024, 1024] float32 with 16 bytes of raw data."""
    from onnx import TensorProto, helper

    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1024, 1024], raw_data=b"\0" * 16)
    return _save(_model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [1024, 1024])],
                        [_vi("y", [1024, 1024])], [w]), folder / "raw_short.onnx")


def onnx_dims_without_data(folder: Path) -> Path:
    """An initializer of [2**31, 2**31] holding no data at all."""
    from onnx import TensorProto, helper

    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 31, 1 << 31])
    return _save(_model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [1])], [_vi("y", None)],
                        [w]), folder / "no_data.onnx")


def onnx_transpose_perm_huge(folder: Path) -> Path:
    return _one_op(folder, "perm", "Transpose", ["x"], [], {"perm": [1 << 62, 0]}, in_shape=[2, 3])


def onnx_topk_huge_k(folder: Path) -> Path:
    from onnx import helper

    node = helper.make_node("TopK", ["x", "k"], ["y", "i"], name="topk")
    return _save(_model([node], [_vi("x", [1, 8])], [_vi("y", None)], [_ints("k", [1 << 40])]), folder / "topk.onnx")


def onnx_einsum_garbage(folder: Path) -> Path:
    return _one_op(folder, "einsum", "Einsum", ["x"], [], {"equation": "a" * 300 + "->" + "z?"}, in_shape=[2])


def onnx_split_negative(folder: Path) -> Path:
    from onnx import helper

    node = helper.make_node("Split", ["x", "split"], ["a", "b"], name="split", axis=0)
    add = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    return _save(_model([node, add], [_vi("x", [4])], [_vi("y", None)], [_ints("split", [9, -5])]),
                 folder / "split.onnx")


def onnx_if_branch_ranks(folder: Path) -> Path:
    """An If whose branches give outputs of different ranks and a consumer that needs one."""
    from onnx import TensorProto, helper

    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"], name="t")], "then", [], [_vi("t", [2])])
    other = helper.make_graph([helper.make_node("Unsqueeze", ["x", "axes"], ["e"], name="e")], "else", [],
                              [_vi("e", [1, 2])], [_ints("axes", [0])])
    node = helper.make_node("If", ["c"], ["z"], name="if", then_branch=then, else_branch=other)
    mm = helper.make_node("MatMul", ["z", "w"], ["y"], name="mm")
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.ones((5, 3), np.float32), "w")
    return _save(_model([node, mm], [_vi("c", [], TensorProto.BOOL), _vi("x", [2])], [_vi("y", None)], [w]),
                 folder / "if_ranks.onnx")


def onnx_input_dtype_complex(folder: Path) -> Path:
    from onnx import TensorProto, helper

    return _save(_model([helper.make_node("Identity", ["x"], ["y"], name="id")], [_vi("x", [2], TensorProto.COMPLEX128)],
                        [_vi("y", [2], TensorProto.COMPLEX128)]), folder / "complex.onnx")


def onnx_string_names_long(folder: Path) -> Path:
    """Names of 200 KB each (node, tensors): within 1 MB, hard on messages and tables."""
    from onnx import helper

    long = "n" * 200_000
    return _save(_model([helper.make_node("Relu", ["x"], [long], name=long),
                         helper.make_node("Neg", [long], ["y"], name=long + "2")], [_vi("x", [2])], [_vi("y", [2])]),
                 folder / "long_names.onnx")


# ---- data files --------------------------------------------------------------------------------
def npz_many_members(folder: Path) -> Path:
    """4,000 empty members (a directory larger than the data, under 1 MB)."""
    path = folder / "many.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        empty = npy_bytes(np.zeros(0, np.float32))
        for i in range(4_000):
            zf.writestr(f"m{i}.npy", empty)
    return path


def npz_deflate_at_one_megabyte(folder: Path) -> Path:
    """The largest deflate bomb under 1 MB (deflate's ratio is at most ~1032:1; polykit reads no
    other compression): 960 MiB of float32 zeros in a ~975 KB archive, below the default
    data_bytes limit (1 GiB), so the defaults let polykit read it. Only `hostile_run --isolated
    --corpus at-defaults` uses it (about 1 GiB once read: the case measures what that costs)."""
    count = (960 << 20) // 4
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (count,)})
    path = folder / "deflate_960mib.npz"
    chunk = bytes(1 << 24)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf, \
            zf.open("x.npy", "w", force_zip64=True) as member:
        member.write(buf.getvalue())
        for _ in range(count * 4 // len(chunk)):
            member.write(chunk)
    return path


def npz_climbing_name(folder: Path) -> Path:
    return _zip(folder / "climb.npz", {"../../../tmp/x.npy": npy_bytes(np.ones(2, np.float32))})


def npy_structured_dtype(folder: Path) -> Path:
    arr = np.zeros(2, dtype=[("a", np.float32), ("b", np.int64, (3,))])
    return _zip(folder / "structured.npz", {"x.npy": npy_bytes(arr)})


def npy_unicode_dtype_huge(folder: Path) -> Path:
    """A '<U' member whose header asks for 2**30 characters per element."""
    raw = npy_bytes(np.array(["ab"], dtype="<U2")).replace(b"'<U2'", b"'<U%d'" % (1 << 30))
    return _zip(folder / "unicode.npz", {"x.npy": raw}, zipfile.ZIP_STORED)


def npy_header_expression(folder: Path) -> Path:
    """A header that is a Python expression rather than a literal dict."""
    raw = npy_bytes(np.ones(2, np.float32))
    start = raw.index(b"{")
    end = raw.index(b"}") + 1
    evil = b"__import__('os').system('true')"
    header = raw[start:end]
    raw = raw[:start] + evil.ljust(len(header)) + raw[end:] if len(evil) <= len(header) else raw
    return _zip(folder / "expression.npz", {"x.npy": raw}, zipfile.ZIP_STORED)


def json_lone_surrogate(folder: Path) -> Path:
    path = folder / "surrogate.json"
    path.write_text('[{"\\ud800": {"dtype": "float32", "data": [1.0]}}]')
    return path


def json_nan_tokens(folder: Path) -> Path:
    path = folder / "nan.json"
    path.write_text('[{"x": {"dtype": "float32", "shape": [2], "data": [NaN, -Infinity]}}, Infinity]')
    return path


def json_shape_disagrees(folder: Path) -> Path:
    """A polykit JSON feed declaring shape [2**40] with two values."""
    path = folder / "shape.json"
    path.write_text(json.dumps([{"x": {"dtype": "float32", "shape": [1 << 40], "data": [1.0, 2.0]}}]))
    return path


def json_ragged(folder: Path) -> Path:
    path = folder / "ragged.json"
    path.write_text(json.dumps([{"x": [[1.0, 2.0], [3.0], [[4.0]]]}]))
    return path


def json_dtype_unknown(folder: Path) -> Path:
    path = folder / "dtype.json"
    path.write_text(json.dumps([{"x": {"dtype": "float1024", "data": [1.0]}}]))
    return path


def polygraphy_bad_base64(folder: Path) -> Path:
    path = folder / "bad_base64.json"
    path.write_text(json.dumps([{"x": {"array": "!!!not base64!!!", "polygraphy_class": "ndarray"}}]))
    return path


# ---- plans ---------------------------------------------------------------------------------------
def _relu_plan_bytes() -> bytes:
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.testing.hostile import _relu_model

    return build_plan(_relu_model(), BuilderConfig(target="cpu")).serialize()


def plan_truncated(folder: Path) -> Path:
    data = _relu_plan_bytes()
    path = folder / "truncated.plan"
    path.write_bytes(data[: len(data) // 2])
    return path


def plan_random_after_magic(folder: Path) -> Path:
    data = _relu_plan_bytes()
    noise = np.random.default_rng(7).integers(0, 256, len(data), dtype=np.uint8).tobytes()
    path = folder / "noise.plan"
    path.write_bytes(data[:8] + noise[8:])
    return path


def plan_document_is_array(folder: Path) -> Path:
    """A well-formed plan file (checksum right) whose JSON document is a list."""
    from polykit.compiler.plan.file import decode_plan
    from polykit.testing.hostile import _write_plan

    _, doc, blob = decode_plan(_relu_plan_bytes())
    path = folder / "array.plan"
    _write_plan(path, doc, bytes(blob))
    from polykit.compiler.plan.file import encode_plan

    path.write_bytes(encode_plan([doc], bytes(blob), doc["target"], doc.get("gpu_arch", "")))  # type: ignore[arg-type]
    return path


def plan_many_layers(folder: Path) -> Path:
    """A plan whose layer list is 3,000 copies of its one layer (each reading and writing the same tensors)."""
    from polykit.compiler.plan.file import decode_plan
    from polykit.testing.hostile import _write_plan

    _, doc, blob = decode_plan(_relu_plan_bytes())
    doc["layers"] = doc["layers"] * 3_000
    return _write_plan(folder / "many_layers.plan", doc, bytes(blob))


def plan_weight_offset_negative(folder: Path) -> Path:
    """A plan whose tensor lies at a negative arena offset."""
    from polykit.compiler.plan.file import decode_plan
    from polykit.testing.hostile import _write_plan

    _, doc, blob = decode_plan(_relu_plan_bytes())
    for record in doc["tensors"].values():
        if "offset" in record:
            record["offset"] = -(1 << 40)
    return _write_plan(folder / "negative_offset.plan", doc, bytes(blob))


# ---- caches --------------------------------------------------------------------------------------
def timing_cache_wrong_shape(folder: Path) -> Path:
    path = folder / "wrong_shape.cache"
    path.write_text(json.dumps({"format": 1, "entries": [["k", 1.0]] * 1000}))
    return path


def replay_huge_names(folder: Path) -> Path:
    path = folder / "huge_names.replay.json"
    path.write_text(json.dumps({"format": 1, "layers": {"x" * 300_000: {"tactic": "t" * 300_000}}}))
    return path


def calibration_many_lines(folder: Path) -> Path:
    """A calibration cache header followed by 60,000 scale lines for tensors no model has."""
    import polykit
    from polykit.compiler.builder.calibration_cache import MAGIC

    path = folder / "many.calib"
    lines = [f"{MAGIC} 1 polykit={polykit.__version__} calibrator=minmax"] + [f"t{i}: 0x1p-6" for i in range(60_000)]
    path.write_text("\n".join(lines) + "\n")
    return path


def calibration_binary(folder: Path) -> Path:
    path = folder / "binary.calib"
    path.write_bytes(b"\xff\xfe\x00\x01" * 256)
    return path


_MODEL = ("inspect-model", "convert", "run-trt")
_DATA = ("inspect-data", "load-inputs", "load-outputs")
_PLAN = ("inspect-model", "run-trt")
#: a model that parses is shown by `inspect model` as Polygraphy shows it, however wrong its graph
_SHOWN = (("inspect-model", (0, 2)),)
#: a file whose arrays load but name nothing the model has: shown, and a failed comparison
_FOREIGN = (("inspect-data", (0, 2)), ("load-outputs", (1, 2)))

#: the fresh corpus (rows: name, builder, readers, and the readers for which codes besides 2 pass)
CASES: list[Case] = [Case(*row[:3], accept=row[3] if len(row) > 3 else ()) for row in (
    ("onnx-truncated", onnx_truncated, _MODEL),
    ("onnx-random-bytes", onnx_random_bytes, _MODEL),
    ("onnx-cycle", onnx_cycle, _MODEL, _SHOWN),
    ("onnx-undefined-input", onnx_undefined_input, _MODEL, _SHOWN),
    ("onnx-output-written-twice", onnx_output_written_twice, _MODEL, _SHOWN),
    ("onnx-constant-of-shape-exabytes", onnx_constant_of_shape_exabytes, _MODEL, _SHOWN),
    ("onnx-expand-huge", onnx_expand_huge, _MODEL, _SHOWN),
    ("onnx-tile-huge", onnx_tile_huge, _MODEL, _SHOWN),
    ("onnx-range-huge", onnx_range_huge, _MODEL, _SHOWN),
    ("onnx-pad-huge", onnx_pad_huge, _MODEL, _SHOWN),
    ("onnx-resize-scale-huge", onnx_resize_scale_huge, _MODEL, _SHOWN),
    ("onnx-onehot-huge", onnx_onehot_huge, _MODEL, _SHOWN),
    ("onnx-raw-data-short", onnx_raw_data_short, _MODEL, _SHOWN),
    ("onnx-dims-without-data", onnx_dims_without_data, _MODEL, _SHOWN),
    ("onnx-transpose-perm-huge", onnx_transpose_perm_huge, _MODEL, _SHOWN),
    ("onnx-topk-huge-k", onnx_topk_huge_k, _MODEL, _SHOWN),
    ("onnx-einsum-garbage", onnx_einsum_garbage, _MODEL, _SHOWN),
    ("onnx-split-negative", onnx_split_negative, _MODEL, _SHOWN),
    ("onnx-if-branch-ranks", onnx_if_branch_ranks, _MODEL, _SHOWN),
    ("onnx-complex-input", onnx_input_dtype_complex, _MODEL, _SHOWN),
    ("onnx-long-names", onnx_string_names_long, _MODEL,  # a valid model: it runs
     (("inspect-model", (0,)), ("convert", (0,)), ("run-trt", (0,)))),
    ("npz-many-members", npz_many_members, _DATA, _FOREIGN),
    ("npz-climbing-name", npz_climbing_name, _DATA, _FOREIGN),
    ("npy-structured-dtype", npy_structured_dtype, _DATA, _FOREIGN),
    ("npy-unicode-dtype-huge", npy_unicode_dtype_huge, _DATA),
    ("npy-header-expression", npy_header_expression, _DATA),
    ("json-lone-surrogate", json_lone_surrogate, _DATA, _FOREIGN),
    ("json-nan-tokens", json_nan_tokens, _DATA),
    ("json-shape-disagrees", json_shape_disagrees, _DATA),
    ("json-ragged", json_ragged, _DATA),
    ("json-dtype-unknown", json_dtype_unknown, _DATA),
    ("polygraphy-bad-base64", polygraphy_bad_base64, _DATA),
    ("plan-truncated", plan_truncated, _PLAN),
    ("plan-random-after-magic", plan_random_after_magic, _PLAN),
    ("plan-document-is-array", plan_document_is_array, _PLAN),
    ("plan-many-layers", plan_many_layers, _PLAN),
    ("plan-negative-offset", plan_weight_offset_negative, _PLAN),
    ("timing-cache-wrong-shape", timing_cache_wrong_shape, ("timing-cache",)),
    ("replay-huge-names", replay_huge_names, ("tactic-replay", "inspect-tactics")),
    ("calibration-many-lines", calibration_many_lines, ("calibration-cache",)),
    ("calibration-binary", calibration_binary, ("calibration-cache", "inspect-data")),
)]

#: cases sized against the *default* limits (slow to build, large once read): run only by
#: `hostile_run --isolated --corpus at-defaults`, where each command's peak memory is measured
AT_DEFAULT_LIMITS: list[Case] = [
    Case("npz-deflate-at-one-megabyte", npz_deflate_at_one_megabyte, _DATA, accept=_FOREIGN),
]
