"""The fuzzer's corpus: small valid models, the plans built from them and saved data files,
and the structure-aware mutation of data files (.npz members and headers, JSON values)."""

from __future__ import annotations

import base64
import io
import json
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polykit.testing.mutate import pick, mutate_bytes, mutate_json


def seed_models() -> dict[str, Any]:
    """name -> onnx.ModelProto: small models whose nodes carry shapes, axes, perms, pads,
    dtypes and constants for the mutator to break."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)

    def model(name: str, nodes: list, inputs: list, outputs: list, inits: list = ()) -> onnx.ModelProto:
        graph = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        m.ir_version = 10
        return m

    vi = helper.make_tensor_value_info
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return {
        "mlp": model("mlp", [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], name="fc2", transB=1),
            helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
        ], [vi("x", T.FLOAT, [1, 8])], [vi("logits", T.FLOAT, [1, 4]), vi("probs", T.FLOAT, [1, 4])],
            [("w1", f32(8, 6)), ("b1", f32(6)), ("w2", f32(4, 6)), ("b2", f32(4))]),
        "shapes": model("shapes", [
            helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
            helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[1, 0]),
            helper.make_node("Concat", ["t", "c"], ["cat"], name="concat", axis=0),
            helper.make_node("Slice", ["cat", "starts", "ends", "axes"], ["sl"], name="slice"),
            helper.make_node("ReduceSum", ["sl"], ["s"], name="sum", keepdims=0),
            helper.make_node("Unsqueeze", ["s", "axes"], ["y"], name="unsqueeze"),
        ], [vi("x", T.FLOAT, [2, 3, 4])], [vi("y", T.FLOAT, [1])],
            [("shape", np.array([6, 4], np.int64)), ("c", f32(2, 6)), ("starts", np.array([1], np.int64)),
             ("ends", np.array([5], np.int64)), ("axes", np.array([0], np.int64))]),
        "conv": model("conv", [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1]),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Flatten", ["p"], ["y"], name="flatten", axis=1),
        ], [vi("x", T.FLOAT, [1, 2, 5, 5])], [vi("y", T.FLOAT, [1, 12])],
            [("w", f32(3, 2, 3, 3)), ("b", f32(3))]),
        "mixed": model("mixed", [
            helper.make_node("Gather", ["table", "ids"], ["g"], name="gather", axis=0),
            helper.make_node("Cast", ["g"], ["h"], name="to_half", to=T.FLOAT16),
            helper.make_node("Cast", ["h"], ["f"], name="to_float", to=T.FLOAT),
            helper.make_node("Greater", ["f", "zero"], ["m"], name="positive"),
            helper.make_node("Where", ["m", "f", "zero"], ["y"], name="where"),
            helper.make_node("ArgMax", ["y"], ["i"], name="argmax", axis=1, keepdims=0),
        ], [vi("ids", T.INT64, [3])], [vi("y", T.FLOAT, [3, 4]), vi("i", T.INT64, [3])],
            [("table", f32(5, 4)), ("zero", np.array(0.0, np.float32))]),
    }


def plan_corpus(models: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(name, plan bytes): cpu plans of every seed model, unfused and fp16 variants, and a cuda
    plan (built without a GPU: the builder needs none; the fuzzer checks it without running)."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    configs = {"cpu": BuilderConfig(target="cpu"), "cpu-unfused": BuilderConfig(target="cpu", fuse=False),
               "cpu-fp16": BuilderConfig(target="cpu", fp16=True)}
    out = [(f"{name}.{label}", build_plan(m, cfg).serialize()) for name, m in models.items() for label, cfg in configs.items()]
    out += [(f"{name}.cuda", build_plan(models[name], BuilderConfig(target="cuda")).serialize()) for name in ("mlp", "conv")]
    return out


@dataclass(frozen=True)
class DataFile:
    """A saved data file of the corpus: what it holds ("feeds" or "outputs"), its suffix, its bytes."""

    role: str
    suffix: str
    data: bytes


def data_corpus(workdir: Path, plan: Any) -> list[tuple[str, DataFile]]:
    """(name, DataFile): feeds for `plan` and outputs of it, as .npz, polykit JSON and Polygraphy JSON,
    with 0-d, bool, integer and float16 tensors among them."""
    from polykit.tools.data.results_io import save_feeds, save_outputs

    rng = np.random.default_rng(1)
    feeds = [{name: rng.standard_normal(t.shape).astype(t.dtype) for name, t in
              ((n, plan.tensors[n]) for n in plan.inputs)} for _ in range(2)]
    outputs = {"trt": [{"logits": rng.standard_normal((1, 4)).astype(np.float32), "n": np.float32(3.5),
                        "mask": np.array([True, False]), "ids": np.arange(3), "h": np.ones((2, 2), np.float16)}]}
    files = []
    for suffix in (".npz", ".json"):
        files.append((f"feeds{suffix}", DataFile("feeds", suffix, save_feeds(
            workdir / f"corpus_in{suffix}", feeds, "polykit").read_bytes())))
        files.append((f"outputs{suffix}", DataFile("outputs", suffix, save_outputs(
            workdir / f"corpus_out{suffix}", outputs, "polykit").read_bytes())))
    files.append(("polygraphy-feeds.json", DataFile("feeds", ".json", json.dumps(
        [{k: _polygraphy_array(v) for k, v in f.items()} for f in feeds]).encode())))
    iteration = {"outputs": {k: {"values": _polygraphy_array(v), "polygraphy_class": "LazyArray"}
                             for k, v in outputs["trt"][0].items()},
                 "runtime": 0.01, "runner_name": "trt-runner", "polygraphy_class": "IterationResult"}
    files.append(("polygraphy-outputs.json", DataFile("outputs", ".json", json.dumps(
        {"lst": [["trt-runner", [iteration]]], "polygraphy_class": "RunResults"}).encode())))
    return files


def _polygraphy_array(arr: Any) -> dict[str, str]:
    buf = io.BytesIO()
    np.save(buf, np.asarray(arr), allow_pickle=False)
    return {"array": base64.b64encode(buf.getvalue()).decode(), "polygraphy_class": "ndarray"}


# ---- mutating data files -----------------------------------------------------------------------
_DESCRS = ("'<f4'", "'<f8'", "'<f2'", "'|b1'", "'<i8'", "'|O'", "'<U3'", "'>f4'", "'<c8'", "'|V8'", "'<M8[s]'")
_SHAPES = ("()", "(0,)", "(1, 8)", "(8, 1)", "(2, 3)", "(1099511627776,)", "(-1,)", "(3, 0, 2)", "(1, 4)")


def mutate_data(file: DataFile, rng: np.random.Generator, steps: int) -> tuple[bytes, str]:
    """A data file with one to three structure-aware changes (or, now and then, damaged bytes)."""
    if rng.random() < 0.15:
        return mutate_bytes(file.data, rng)
    if file.suffix == ".json":
        doc, notes = json.loads(file.data), []
        for _ in range(steps):
            doc, note = mutate_json(doc, rng)
            notes.append(note)
        return json.dumps(doc).encode(), "; ".join(notes)
    members = _zip_members(file.data)
    notes = [_mutate_members(members, rng) for _ in range(steps)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a renamed member may duplicate a name: that is the point
        for name, raw in members:
            zf.writestr(name, raw)
    return buf.getvalue(), "; ".join(notes)


def _zip_members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(name, zf.read(name)) for name in zf.namelist()]


def _mutate_members(members: list[tuple[str, bytes]], rng: np.random.Generator) -> str:
    """Change one member of an .npz in place: its name, its .npy header's descr/shape/order, its bytes."""
    if not members:
        members.append(("0/x.npy", b"\x93NUMPY"))
        return "added a truncated member"
    i = int(rng.integers(len(members)))
    name, raw = members[i]
    op = int(rng.integers(5))
    if op == 0:
        new = pick(rng, ("x.npy", "0.npy", "a/b/c.npy", "99999999/x.npy", "0/", "-1/x.npy", "0/x"))
        members[i] = (new, raw)
        return f"renamed member {name} to {new}"
    if op in (1, 2, 3):
        end = raw.find(b"}")
        if raw.startswith(b"\x93NUMPY") and end > 0:
            header = raw[:end + 1].decode("latin-1")
            key, choices = (("'descr': ", _DESCRS), ("'shape': ", _SHAPES), ("'fortran_order': ", ("True", "1")))[op - 1]
            start = header.find(key) + len(key)
            stop = header.find(", '", start) if op != 3 else header.find(",", start)
            stop = header.find("}", start) if stop < 0 else stop
            value = pick(rng, choices)
            header = header[:start] + value + header[stop:]
            members[i] = (name, header.encode("latin-1") + raw[end + 1:])
            return f"set {key.strip(': ')} of member {name} to {value}"
    if op == 4 and len(members) > 1:
        del members[i]
        return f"dropped member {name}"
    data, note = mutate_bytes(raw, rng)
    members[i] = (name, data)
    return f"member {name}: {note}"
