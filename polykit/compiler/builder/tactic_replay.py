"""Tactic replay files: which tactic each layer of a build ran with, saved and forced again.

    {"format": 1,
     "layers": {"<layer name>": {"tactic": "<tactic name>", "inputs": ["float32", ""], "outputs": ["float32"]}}}

A layer whose optimization profiles chose different tactics (LayerDesc.profile_tactics) also
has `"profiles": ["<profile 0's tactic>", "<profile 1's>", ...]` (its first entry is
`tactic`); a replay forces those per profile, and a build with another number of profiles
refuses it. An entry without `profiles` (every file before it) forces `tactic` in every profile.

`inputs`/`outputs` are the numpy dtype names of the layer's tensors ("" for an omitted
optional input), as the build saw them: a replay recorded for other dtypes (another
precision, another model) is refused rather than silently applied. A replay file is
untrusted input: `load_replay` checks its whole structure and names the file and the field
of any fault (UsageError); it is JSON, never pickle.

Forcing happens in the builder's tactic selection (`TacticReplay.check_layers` before it,
`forced_tactic` per layer, `unsupported` when the forced tactic cannot run the layer): a
layer the replay names must exist, its tactic must exist on the target for the layer's
kind and must support the layer — each a BuildError naming the layer and the tactic.
Layers a replay does not name are chosen as usual, so a replay may force a subset.

`build_with_tactics(model, {layer: tactic}, config)` builds with an in-process assignment,
no file involved (what `polykit debug tactics` bisects with).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from polykit.errors import BuildError, UsageError
from polykit.files import read_json

FORMAT_VERSION = 1
_TOP_KEYS = frozenset({"format", "layers"})
_LAYER_KEYS = frozenset({"tactic", "inputs", "outputs"})
_OPTIONAL_KEYS = frozenset({"profiles"})


@dataclass(frozen=True)
class LayerChoice:
    """The tactic of one layer and the dtypes it was chosen for (None: not recorded, not checked);
    `profiles`: each optimization profile's tactic where they differ (empty: `tactic` in all)."""

    tactic: str
    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None
    profiles: tuple[str, ...] = ()

    def tactic_of(self, profile: int) -> str:
        return self.profiles[profile] if self.profiles else self.tactic


@dataclass(frozen=True)
class TacticReplay:
    """Layer name -> LayerChoice; `source` names where it came from (a file, "assignment")."""

    layers: Mapping[str, LayerChoice] = field(default_factory=dict, hash=False)
    source: str = "assignment"

    # ---- making one --------------------------------------------------------------------
    @staticmethod
    def from_layers(layers: Iterable[Any], source: str = "build") -> "TacticReplay":
        """The choices of built layers (LayerDescs with tactic and dtypes), e.g. `plan.layers`."""
        return TacticReplay({layer.name: LayerChoice(layer.tactic, tuple(layer.in_dtypes), tuple(layer.out_dtypes),
                                                     tuple(layer.profile_tactics)) for layer in layers}, source)

    @staticmethod
    def from_assignment(tactics: Mapping[str, str]) -> "TacticReplay":
        """{layer: tactic} with no dtypes recorded (dtypes are then not checked)."""
        return TacticReplay({str(name): LayerChoice(str(tactic)) for name, tactic in tactics.items()})

    # ---- the file format -----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        layers = {}
        for name, choice in sorted(self.layers.items()):
            entry: dict[str, Any] = {"tactic": choice.tactic}
            if choice.inputs is not None:
                entry["inputs"] = list(choice.inputs)
            if choice.outputs is not None:
                entry["outputs"] = list(choice.outputs)
            if choice.profiles:
                entry["profiles"] = list(choice.profiles)
            layers[name] = entry
        return {"format": FORMAT_VERSION, "layers": layers}

    @staticmethod
    def from_json(doc: Any, where: str) -> "TacticReplay":
        """Validate a parsed replay document; UsageError naming `where` and the faulty field."""
        _expect(isinstance(doc, dict), where, "", "an object {\"format\": 1, \"layers\": {...}}", doc)
        if "format" not in doc:
            raise UsageError("the file has no \"format\" field: it is not a polykit tactic replay, or one from an "
                             "older polykit", where=where, hint="save the replay again with --save-tactics")
        _no_unknown_keys(doc, _TOP_KEYS, where, "")
        version = doc["format"]
        _expect(type(version) is int, where, "format", "the integer 1", version)
        if version != FORMAT_VERSION:
            raise UsageError(f"tactic replay format {version} is not one this polykit reads ({FORMAT_VERSION})",
                             where=_field(where, "format"), hint="save the replay again with this polykit version")
        layers = doc.get("layers")
        _expect(isinstance(layers, dict), where, "layers", "an object {layer name: {\"tactic\": ...}}", layers)
        choices = {}
        for name, entry in layers.items():
            path = f"layers[{name!r}]"
            _expect(isinstance(entry, dict), where, path, "an object with tactic, inputs and outputs", entry)
            _no_unknown_keys(entry, _LAYER_KEYS | _OPTIONAL_KEYS, where, path)
            missing = sorted(_LAYER_KEYS - set(entry))
            if missing:
                raise UsageError(f"the tactic replay's {path} has no {missing[0]!r}", where=_field(where, path),
                                 hint="every layer entry has tactic, inputs and outputs")
            tactic = entry["tactic"]
            _expect(isinstance(tactic, str) and tactic != "", where, f"{path}.tactic", "a tactic name", tactic)
            choices[name] = LayerChoice(tactic, _dtypes(entry["inputs"], where, f"{path}.inputs"),
                                        _dtypes(entry["outputs"], where, f"{path}.outputs"),
                                        _profiles(entry.get("profiles"), tactic, where, f"{path}.profiles"))
        return TacticReplay(choices, where)

    # ---- forcing -----------------------------------------------------------------------
    def __contains__(self, layer: str) -> bool:
        return layer in self.layers

    def __len__(self) -> int:
        return len(self.layers)

    def check_layers(self, layers: Iterable[Any], profiles: int = 1) -> None:
        """BuildError when the replay names a layer the build does not have, or gives a layer
        tactics for another number of optimization profiles than the build's `profiles`."""
        names = [layer.name for layer in layers]
        for name, choice in sorted(self.layers.items()):
            if choice.profiles and len(choice.profiles) != profiles:
                raise BuildError(f"the tactic replay gives layer {name!r} tactics for {len(choice.profiles)} "
                                 f"optimization profiles; this build has {profiles}",
                                 where=f"layer {name!r}, tactic replay {self.source}",
                                 hint="save the replay again from a build with these profiles, or drop the "
                                      "layer's \"profiles\" entry to force its tactic in every profile")
        unknown = sorted(set(self.layers) - set(names))
        if unknown:
            shown = ", ".join(repr(n) for n in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
            raise BuildError(f"the tactic replay names {len(unknown)} layer(s) this build does not have: {shown} "
                             f"(tactic {self.layers[unknown[0]].tactic!r} for {unknown[0]!r})",
                             where=f"tactic replay {self.source}",
                             hint="the replay was saved for another model or other builder options; "
                                  f"this build's layers include: {', '.join(names[:8])}")

    def forced_tactic(self, layer: Any, target: str, profile: int = 0) -> Any:
        """The Tactic the replay forces for `layer` in optimization profile `profile` (None when it
        names none); BuildError when the tactic is unknown for the layer's kind on `target` or the
        dtypes differ from the recorded ones."""
        from polykit.kernels.tactics import find_tactic

        choice = self.layers.get(layer.name)
        if choice is None:
            return None
        where = f"layer {layer.name!r}, tactic replay {self.source}"
        tactic = find_tactic(target, layer.kind, choice.tactic_of(profile))
        if tactic is None:
            raise BuildError(f"the tactic replay asks for tactic {choice.tactic_of(profile)!r}, which the {target} target does not "
                             f"have for {layer.kind} layers", where=where,
                             hint="save the replay again with this polykit version and target")
        for what, recorded, built in (("input", choice.inputs, layer.in_dtypes), ("output", choice.outputs, layer.out_dtypes)):
            if recorded is not None and tuple(built) and tuple(recorded) != tuple(built):
                raise BuildError(f"the tactic replay chose tactic {choice.tactic!r} for {what} dtypes {list(recorded)}; "
                                 f"this build's layer has {list(built)}", where=where,
                                 hint="the replay was saved with other precision flags or another model")
        return tactic

    def unsupported(self, layer: Any, target: str, profile: int = 0) -> BuildError:
        """The error for a forced tactic that cannot run `layer` (shapes, dtypes or attributes)."""
        tactic = self.layers[layer.name].tactic_of(profile)
        at = f" at optimization profile {profile}'s shapes" if profile else ""
        return BuildError(f"the tactic replay forces tactic {tactic!r}, which cannot run this {layer.kind} layer on "
                          f"{target}{at} (its shapes, dtypes or attributes are outside what the tactic supports)",
                          where=f"layer {layer.name!r}, tactic replay {self.source}",
                          hint="remove the layer from the replay to let the builder choose")


def load_replay(source: "str | os.PathLike | TacticReplay | Mapping[str, str] | None") -> TacticReplay:
    """A TacticReplay from a replay file, an in-process {layer: tactic}, a TacticReplay, or None (empty)."""
    if source is None:
        return TacticReplay()
    if isinstance(source, TacticReplay):
        return source
    if isinstance(source, Mapping):
        return TacticReplay.from_assignment(source)
    where = os.fspath(source)
    doc = read_json(source, "tactic replay file", UsageError, hint="pass a file written by --save-tactics")
    return TacticReplay.from_json(doc, where)


def save_replay(path: str | os.PathLike, replay: TacticReplay) -> Path:
    """Write `replay` as JSON to `path`: one layer per line, sorted, so replays diff well."""
    doc = replay.to_json()
    rows = [f"    {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}" for name, entry in doc["layers"].items()]
    layers = "{\n" + ",\n".join(rows) + "\n  }" if rows else "{}"
    text = f'{{\n  "format": {doc["format"]},\n  "layers": {layers}\n}}\n'
    from polykit.files import write_text

    return write_text(path, text, "tactic replay file")


def build_with_tactics(model: Any, tactics: "Mapping[str, str] | TacticReplay", config: Any = None) -> Any:
    """Build `model` (path, ModelProto or Graph) with the tactics of `tactics` forced; other layers as usual."""
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig

    return build_plan(model, replace(config or BuilderConfig(), tactic_replay=load_replay(tactics)))


# ---- validation helpers ---------------------------------------------------------------------
def _expect(ok: bool, where: str, path: str, wanted: str, got: Any) -> None:
    """`path` "" is the top level of the document."""
    if not ok:
        raise UsageError(f"the tactic replay's {path or 'top level'} must be {wanted}, not {_show(got)}",
                         where=_field(where, path), hint="pass a file written by --save-tactics")


def _no_unknown_keys(obj: dict, known: frozenset, where: str, path: str) -> None:
    extra = sorted(str(k) for k in set(obj) - known)
    if extra:
        raise UsageError(f"the tactic replay's {path or 'top level'} has unknown field(s) {extra}",
                         where=_field(where, path), hint=f"known fields: {', '.join(sorted(known))}")


def _field(where: str, path: str) -> str:
    return f"{where}, field {path}" if path else where


def _dtypes(value: Any, where: str, path: str) -> tuple[str, ...]:
    known = _dtype_names()
    _expect(isinstance(value, list), where, path, "a list of dtype names", value)
    for i, item in enumerate(value):
        _expect(isinstance(item, str) and item in known, where, f"{path}[{i}]",
                "a dtype name (e.g. \"float32\") or \"\" for an omitted input", item)
    return tuple(value)


def _profiles(value: Any, tactic: str, where: str, path: str) -> tuple[str, ...]:
    """A layer entry's per-profile tactics: two or more names, the first its `tactic`."""
    if value is None:
        return ()
    _expect(isinstance(value, list) and len(value) >= 2, where, path,
            "a list of two or more tactic names, one per optimization profile", value)
    for i, item in enumerate(value):
        _expect(isinstance(item, str) and item != "", where, f"{path}[{i}]", "a tactic name", item)
    _expect(value[0] == tactic, where, f"{path}[0]", f"the entry's tactic {tactic!r} (profile 0's)", value[0])
    return tuple(value)


def _dtype_names() -> frozenset[str]:
    from polykit.compiler.ir.dtypes import ONNX_TO_NUMPY

    return frozenset({dt.name for dt in ONNX_TO_NUMPY.values() if dt.kind != "O"} | {""})


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
