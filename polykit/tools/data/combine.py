"""Combining saved data files (`polykit data to-input`, `polykit data merge`), any format polykit
reads (polykit.tools.data.formats).

    feeds = to_input(["inputs.json", "layer_outputs.json"])   # Polygraphy's `data to-input`
    outputs = merge_outputs(["trt.json", "onnxrt.json"])      # one RunResults of every runner

to_input: per iteration, one feed dict holding every tensor of every file in order (a later
file's tensor replaces an earlier one of the same name): saved inputs as they are, saved
outputs of each runner as if they were inputs (Polygraphy's rule; give outputs of one runner,
or the last runner's win). Files of different iteration counts warn once; the shorter ones
leave later iterations incomplete, as Polygraphy does.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Sequence

from polykit.errors import UsageError
from polykit.tools.data import results_io

log = logging.getLogger("polykit")


def to_input(paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """One feed dict per iteration combining every tensor of `paths` (module docstring)."""
    if not paths:
        raise UsageError("no data files given", hint="e.g. polykit data to-input inputs.json outputs.json -o out.json")
    feeds: list[dict[str, Any]] = []
    warned = False
    for path in paths:
        kind, data = results_io.load_data(path)
        groups: Iterable[list[dict[str, Any]]] = (data.values() if kind == "outputs" else [data if kind == "feeds"
                                                                                          else [data]])
        for iterations in groups:
            if feeds and len(feeds) != len(iterations) and not warned:
                warned = True
                log.warning("the files have different numbers of iterations (%d so far, %d in %s): some iterations "
                            "will hold incomplete data", len(feeds), len(iterations), path)
            feeds += [{} for _ in range(len(iterations) - len(feeds))]
            for feed, tensors in zip(feeds, iterations):
                feed.update(tensors)
    return feeds


def merge_outputs(paths: Sequence[str | os.PathLike]) -> dict[str, list[dict[str, Any]]]:
    """Every runner's outputs of the saved-output files `paths`, in order (a runner name seen
    before gets a "-<n>" suffix, as --load-outputs A --load-outputs B names them)."""
    return results_io.load_reference_outputs(paths)


def merge_feeds(paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """The iterations of the saved-input files `paths`, one file's after the other's."""
    return [feed for path in paths for feed in results_io.load_feeds(path)]
