"""polykit's .npz (numpy's zip of .npy files, never pickle): feeds under keys "<iteration>/<tensor
name>", outputs per runner under "<runner>/<iteration>/<tensor name>". Tensor names may contain
"/" (they are split off at the first one or two slashes only). A plain name-keyed .npz
(`numpy.savez("in.npz", x=...)`, keys that are not all of one of these forms) is one
iteration of arrays: a feed dict, or the outputs of one runner named after the file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from polykit.npy_io import open_npz
from polykit.tools.data.dataset import DataGroup, DataSet, feeds_set, outputs_set

_FEED_KEY = re.compile(r"^\d+/.")
_OUTPUT_KEY = re.compile(r"^[^/]+/\d+/.")
#: how each kind lays out its keys, for messages
LAYOUTS = {"feeds": "keys '<iteration>/<name>'", "outputs": "keys '<runner>/<iteration>/<name>'"}


def npz_layout(keys: Iterable[str]) -> str:
    """"feeds" ("<iteration>/<name>" keys), "outputs" ("<runner>/<iteration>/<name>") or "plain"."""
    keys = list(keys)
    if keys and all(_FEED_KEY.match(k) for k in keys):
        return "feeds"
    if keys and all(_OUTPUT_KEY.match(k) for k in keys):
        return "outputs"
    return "plain"


def _split_iterations(flat: Mapping[str, Any]) -> list[dict[str, Any]]:
    iters: dict[int, dict[str, Any]] = {}
    for key, arr in flat.items():
        index, _, name = key.partition("/")
        iters.setdefault(int(index), {})[name] = arr
    return [iters[i] for i in sorted(iters)]


def read(path: Path) -> DataSet:
    """The feeds, outputs or plain arrays ("arrays": one group) of an .npz; a file that is not
    one (a lone .npy, text, a damaged archive) is a DataFileError saying what it is."""
    flat = open_npz(path)
    layout = npz_layout(flat)
    if layout == "feeds":
        return feeds_set(_split_iterations(flat))
    if layout == "outputs":
        per_runner: dict[str, dict[str, Any]] = {}
        for key, arr in flat.items():
            runner, _, rest = key.partition("/")
            per_runner.setdefault(runner, {})[rest] = arr
        return outputs_set({r: _split_iterations(rest) for r, rest in per_runner.items()})
    return DataSet("arrays", (DataGroup(flat),))


def feed_members(feeds: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The archive members of saved inputs."""
    return {f"{i}/{name}": arr for i, feed in enumerate(feeds) for name, arr in feed.items()}


def output_members(outputs: Mapping[str, list[Mapping[str, Any]]]) -> dict[str, Any]:
    """The archive members of saved outputs."""
    return {f"{r}/{i}/{name}": arr for r, its in outputs.items() for i, outs in enumerate(its) for name, arr in outs.items()}
