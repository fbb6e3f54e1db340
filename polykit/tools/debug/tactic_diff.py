"""`polykit inspect diff-tactics`: the tactics that only bad builds chose (Polygraphy's
`inspect diff-tactics`).

Replays are loaded from a file or, recursively, a folder (`debug build --artifacts` sorts them
into good/ and bad/). Per layer, each replay contributes its choice: polykit's format (tactic,
input and output dtypes, per-profile tactics) or Polygraphy's TacticReplayData JSON
(implementation, tactic, input and output formats of a TensorRT algorithm). A layer's suspects
are the choices bad replays made and no good replay did. Files that are not tactic replays are
skipped (logged at -v), as Polygraphy does.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polykit.errors import UsageError

log = logging.getLogger("polykit")

#: a replay larger than this is not a replay (the largest zoo model's is under 1 MiB)
MAX_REPLAY_BYTES = 64 << 20
POLYGRAPHY_TYPE = "polygraphy_class"


@dataclass(frozen=True)
class ReplaySet:
    """The replays found under one path: their paths and, per layer, the choices they made."""

    paths: tuple[str, ...] = ()
    choices: dict[str, set[str]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class TacticDiff:
    good: ReplaySet
    bad: ReplaySet
    suspects: dict[str, tuple[str, ...]]

    def to_json(self) -> dict[str, Any]:
        return {"tool": "inspect diff-tactics", "good": list(self.good.paths), "bad": list(self.bad.paths),
                "suspects": {layer: list(choices) for layer, choices in self.suspects.items()}}


def diff_tactics(good: str | os.PathLike, bad: str | os.PathLike) -> TacticDiff:
    """Load the replays under `good` and `bad` (files or folders) and name the suspects."""
    good_set, bad_set = load_replays(good), load_replays(bad)
    suspects = {}
    for layer, choices in bad_set.choices.items():
        only_bad = choices - good_set.choices.get(layer, set())
        if only_bad:
            suspects[layer] = tuple(sorted(only_bad))
    return TacticDiff(good_set, bad_set, suspects)


def load_replays(path: str | os.PathLike) -> ReplaySet:
    """Every tactic replay at `path` (a file, or a folder searched recursively; a missing folder
    holds none, as `debug build` makes bad/ only when a build fails)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root] if root.exists() else []
    paths, choices = [], {}
    for file in files:
        replay = _read(file)
        if replay is None:
            continue
        paths.append(os.fspath(file))
        for layer, choice in replay.items():
            choices.setdefault(layer, set()).add(choice)
    return ReplaySet(tuple(paths), choices)


def _read(file: Path) -> dict[str, str] | None:
    """{layer: choice} of a replay file in either format; None for any other file."""
    from polykit.compiler.builder.tactic_replay import TacticReplay

    if file.stat().st_size > MAX_REPLAY_BYTES:
        log.info("%s: larger than %d bytes, not a tactic replay; skipped", file, MAX_REPLAY_BYTES)
        return None
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        log.info("%s does not look like a tactic replay file; skipped", file)
        return None
    try:
        if isinstance(doc, dict) and "replay" in doc:
            return _polygraphy_choices(doc, os.fspath(file))
        replay = TacticReplay.from_json(doc, os.fspath(file))
    except UsageError as exc:
        log.info("%s is not a tactic replay file (%s); skipped", file, exc.what)
        return None
    return {name: _polykit_choice(c) for name, c in replay.layers.items()}


def _polykit_choice(choice: Any) -> str:
    text = choice.tactic
    if choice.inputs is not None or choice.outputs is not None:
        text += f" | inputs: {', '.join(choice.inputs or ())} | outputs: {', '.join(choice.outputs or ())}"
    if choice.profiles:
        text += f" | profiles: {', '.join(choice.profiles)}"
    return text


def _polygraphy_choices(doc: dict[str, Any], where: str) -> dict[str, str]:
    """Polygraphy's TacticReplayData: {"replay": {layer: Algorithm}}, each Algorithm
    {"implementation", "tactic", "inputs", "outputs"} with TensorInfo {"dtype", "strides",
    "vectorized_dim", "components_per_element"}; written as Polygraphy's Algorithm.__str__."""
    replay = doc["replay"]
    if not isinstance(replay, dict):
        raise UsageError("\"replay\" is not an object {layer: algorithm}", where=where, hint='give a tactic replay file written by polykit (--save-tactics) or Polygraphy')
    choices = {}
    for layer, algo in replay.items():
        if not isinstance(algo, dict) or not {"implementation", "tactic", "inputs", "outputs"} <= set(algo):
            raise UsageError(f"the algorithm of layer {layer!r} lacks implementation, tactic, inputs or outputs",
                             where=where, hint='give a tactic replay file written by polykit (--save-tactics) or Polygraphy')
        if not all(isinstance(algo[k], int) and not isinstance(algo[k], bool) for k in ("implementation", "tactic")):
            raise UsageError(f"the implementation and tactic of layer {layer!r} are not integers", where=where, hint='give a tactic replay file written by polykit (--save-tactics) or Polygraphy')
        inputs, outputs = (_tensor_infos(algo[k], where, f"{layer}.{k}") for k in ("inputs", "outputs"))
        choices[layer] = (f"(Implementation: {algo['implementation']}, Tactic: {algo['tactic']}) | "
                          f"Inputs: {inputs} | Outputs: {outputs}")
    return choices


def _tensor_infos(infos: Any, where: str, what: str) -> str:
    if not isinstance(infos, list):
        raise UsageError(f"{what} is not a list of tensor formats", where=where, hint='give a tactic replay file written by polykit (--save-tactics) or Polygraphy')
    text = []
    for info in infos:
        if not isinstance(info, dict) or not isinstance(info.get("dtype"), str) or not isinstance(info.get("strides"),
                                                                                                 list):
            raise UsageError(f"{what} holds a tensor format without dtype and strides", where=where, hint='give a tactic replay file written by polykit (--save-tactics) or Polygraphy')
        text.append(f"TensorInfo({info['dtype']}, {tuple(info['strides'])}, {info.get('vectorized_dim')}, "
                    f"{info.get('components_per_element')})")
    return f"({', '.join(text)}{',' if len(text) == 1 else ''})"
