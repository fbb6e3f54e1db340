"""The fuzzer's builder files: timing caches and tactic replays the seed MLP's build writes, and
the MLP saved with its weights as ONNX external data; and their mutations: JSON values
(polykit.testing.mutate) and, in the JSON text, numbers of thousands of digits, out-of-range
floats and nesting thousands deep; external data locations, offsets and lengths set to edge
values (NUL bytes, 10**30, 2**63, non-ASCII digits, paths out of the folder) and data files
cut short."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from polykit.testing.mutate import mutate_bytes, mutate_json, mutate_proto, pick

#: text a JSON number or value may be replaced with: what json.loads alone crashes or chokes on
JSON_TEXT_EDGES = ("9" * 5000, "-" + "1" * 4400, "1e400", "-1e999", "0." + "0" * 5000 + "1", "[" * 5000 + "]" * 5000,
                   '{"a":' * 3000 + "1" + "}" * 3000, "1" * 45, "NaN", "Infinity", '"\\ud800"')
#: values an external data entry may be set to
EXTERNAL_EDGES = ("", "0", "1", "16", "-1", "10" + "0" * 29, str(1 << 63), str(1 << 64), "1²", "٣", " 1", "1 ",
                  "0x10", "weights.bin\0x", "../weights.bin", "/etc/hostname", "weights.bin", "nope.bin", ".",
                  "9" * 5000)


def builder_file_corpus(models: dict[str, Any]) -> dict[str, list[tuple[str, Any]]]:
    """kind -> [(name, original)]: "timing-cache" and "replay" (bytes the MLP's build wrote) and
    "external" ((model bytes, external data bytes) of the MLP)."""
    import onnx

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    with tempfile.TemporaryDirectory(prefix="polykit-fuzz-corpus-") as tmp:
        folder = Path(tmp)
        build_plan(models["mlp"], BuilderConfig(target="cpu", builder_optimization_level=5,
                                                save_timing_cache=str(folder / "mlp.cache"),
                                                save_tactics=str(folder / "mlp.replay.json")))
        model = copy.deepcopy(models["mlp"])
        onnx.save_model(model, folder / "mlp.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=0)
        return {"timing-cache": [("mlp.cache", (folder / "mlp.cache").read_bytes())],
                "replay": [("mlp.replay.json", (folder / "mlp.replay.json").read_bytes())],
                "external": [("mlp.onnx+weights.bin", ((folder / "mlp.onnx").read_bytes(),
                                                       (folder / "weights.bin").read_bytes()))]}


def mutate_json_file(data: bytes, rng: np.random.Generator, steps: int) -> tuple[bytes, str]:
    """A JSON file changed value by value, and now and then in its text (JSON_TEXT_EDGES)."""
    if rng.random() < 0.1:
        return mutate_bytes(data, rng)
    doc, notes = json.loads(data), []
    for _ in range(steps):
        doc, note = mutate_json(doc, rng)
        notes.append(note)
    text = json.dumps(doc)
    if rng.random() < 0.3:
        numbers = [i for i, ch in enumerate(text) if ch.isdigit() and (i == 0 or not text[i - 1].isalnum())]
        if numbers:
            at, edge = pick(rng, numbers), pick(rng, JSON_TEXT_EDGES)
            end = at
            while end < len(text) and (text[end].isdigit() or text[end] in ".eE+-"):
                end += 1
            text = text[:at] + edge + text[end:]
            notes.append(f"number at {at} -> {edge[:20]!r}{'...' if len(edge) > 20 else ''}")
    return text.encode(), "; ".join(notes)


def mutate_external(original: tuple[bytes, bytes], rng: np.random.Generator, steps: int) -> tuple[Any, str]:
    """The model with its external data entries changed (or a field of the protobuf), or its data
    file cut short or grown."""
    import onnx

    model_bytes, data = original
    model = onnx.load_model_from_string(model_bytes)
    notes = []
    for _ in range(steps):
        op = int(rng.integers(4))
        tensors = [t for t in model.graph.initializer if t.external_data]
        if op <= 1 and tensors:
            tensor = pick(rng, tensors)
            key = pick(rng, ("location", "offset", "length", "checksum"))
            value = pick(rng, EXTERNAL_EDGES)
            entry = next((e for e in tensor.external_data if e.key == key), None) or tensor.external_data.add(key=key)
            entry.value = value
            notes.append(f"{tensor.name}.{key} = {value[:20]!r}")
        elif op == 2:
            cut = int(rng.integers(len(data) + 1))
            data = data[:cut] if rng.random() < 0.7 else data + bytes(cut)
            notes.append(f"data file now {len(data)} bytes")
        else:
            model, note = mutate_proto(model, rng)
            notes.append(note)
    return (model.SerializeToString(), data), "; ".join(notes)
