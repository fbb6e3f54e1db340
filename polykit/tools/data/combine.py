"""Combining saved data files (`polykit data merge` / `to-input`, `data concat`, `data join`),
any format polykit reads (polykit.tools.data.formats).

    feeds = to_input(["inputs.json", "layer_outputs.json"])   # Polygraphy's `data merge` (0.49: `to-input`)
    kind, data = concat(["run1.json", "run2.json"])           # Polygraphy 0.53's `data concat`
    outputs = join_outputs(["trt.json", "onnxrt.json"])       # one results file of every runner

to_input: per iteration, one feed dict holding every tensor of every file in order (a later
file's tensor replaces an earlier one of the same name, with one warning): saved inputs as they
are, saved outputs of each runner as if they were inputs (Polygraphy's rule; give outputs of one
runner, or the last runner's win). Files of different iteration counts warn once; the shorter
ones leave later iterations incomplete, as Polygraphy does. Each iteration is its own dict
(Polygraphy 0.53.6 pads with one shared dict, so there every iteration of a several-iteration
file ends up holding the last iteration's tensors).

concat: the iterations of files of one kind, one file's after the other's: saved inputs give
one list, saved outputs one results set whose runners are matched by name (a runner new to a
later file is added after the others), as Polygraphy 0.53's `data concat` / `RunResults.concat`.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Sequence

from polykit.errors import UsageError
from polykit.tools.data import results_io

log = logging.getLogger("polykit")


def _require_paths(paths: Sequence[str | os.PathLike], command: str) -> None:
    if not paths:
        raise UsageError("no data files given", hint=f"e.g. polykit data {command} inputs.json outputs.json -o out.json")


def to_input(paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """One feed dict per iteration combining every tensor of `paths` (module docstring)."""
    _require_paths(paths, "merge")
    feeds: list[dict[str, Any]] = []
    warned_count = warned_overwrite = False
    for path in paths:
        kind, data = results_io.load_data(path)
        groups: Iterable[list[dict[str, Any]]] = (data.values() if kind == "outputs" else [data if kind == "feeds"
                                                                                          else [data]])
        for iterations in groups:
            if feeds and len(feeds) != len(iterations) and not warned_count:
                warned_count = True
                log.warning("the files have different numbers of iterations (%d so far, %d in %s): some iterations "
                            "will hold incomplete data", len(feeds), len(iterations), path)
            feeds += [{} for _ in range(len(iterations) - len(feeds))]
            for feed, tensors in zip(feeds, iterations):
                replaced = next((name for name in tensors if name in feed), None)
                if replaced is not None and not warned_overwrite:
                    warned_overwrite = True
                    log.warning("overwriting input '%s' while merging data from %s; to concatenate iterations, use "
                                "`polykit data concat`", replaced, path)
                feed.update(tensors)
    return feeds


def concat(paths: Sequence[str | os.PathLike]) -> tuple[str, Any]:
    """("feeds", [feed dict per iteration]) or ("outputs", {runner: [outputs per iteration]}):
    the iterations of `paths` one file's after the other's (module docstring). Files of both
    kinds are a UsageError; an iteration whose tensor names differ from the first's warns."""
    _require_paths(paths, "concat")
    feeds: list[dict[str, Any]] = []
    outputs: dict[str, list[dict[str, Any]]] = {}
    first_names: dict[str, list[str]] = {}
    kinds: set[bool] = set()
    for path in paths:
        kind, data = results_io.load_data(path)
        kinds.add(kind == "outputs")
        if len(kinds) > 1:
            raise UsageError("cannot concatenate saved inputs with saved outputs", where=str(path),
                             hint="give files of one kind; `polykit data merge` combines inputs and outputs "
                                  "into one input file")
        streams = data.items() if kind == "outputs" else [("", data if kind == "feeds" else [data])]
        for runner, iterations in streams:
            for index, tensors in enumerate(iterations):
                names = first_names.setdefault(runner, list(tensors))
                if list(tensors) != names:
                    log.warning("iteration %d of %s holds other tensors than earlier iterations: %s, expected %s",
                                index, path, list(tensors), names)
            (outputs.setdefault(runner, []) if kind == "outputs" else feeds).extend(iterations)
    return ("outputs", outputs) if True in kinds else ("feeds", feeds)


def join_outputs(paths: Sequence[str | os.PathLike]) -> dict[str, list[dict[str, Any]]]:
    """Every runner's outputs of the saved-output files `paths`, in order (a runner name seen
    before gets a "-<n>" suffix, as --load-outputs A --load-outputs B names them)."""
    _require_paths(paths, "join")
    return results_io.load_reference_outputs(paths)
