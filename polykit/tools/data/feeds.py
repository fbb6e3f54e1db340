"""Feeds against a model's inputs, leniently as Polygraphy treats them, or strictly.

Lenient (the default): a feed whose name matches no input but matches exactly one input
case-insensitively (`x` for `X`) is renamed to it, and feeds for tensors that are not inputs
(e.g. the intermediate tensors of a layerwise `data to-input` file) are dropped; each kind is
warned about once. A dynamic dim that no shape gives becomes 1, with one warning.
Strict (`--strict-inputs`): each of these is a UsageError.

    match = FeedMatcher(["X"], source="inputs.json")
    match({"x": array})  # -> {"X": array}, after one warning
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Mapping

from polykit.errors import UsageError

log = logging.getLogger("polykit")

Shape = tuple[Any, ...]


class FeedMatcher:
    """Maps feed dicts onto `inputs` (the model's input names); warns once per kind of fix."""

    def __init__(self, inputs: Iterable[str], *, strict: bool = False, source: str = "the feeds", warn: bool = True):
        self.inputs = list(inputs)
        self.strict, self.source, self.warn = strict, source, warn
        self._warned: set[str] = set()

    def __call__(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        if not self.inputs:
            return dict(feed)
        known = set(self.inputs)
        renamed: dict[str, str] = {}
        extra: list[str] = []
        for name in feed:
            if name in known:
                continue
            match = [i for i in self.inputs if i.lower() == name.lower() and i not in feed]
            if len(match) == 1:
                renamed[name] = match[0]
            else:
                extra.append(name)
        if self.strict and (renamed or extra):
            what = [f"{a!r} (the model has {b!r})" for a, b in renamed.items()] + [repr(e) for e in extra]
            raise UsageError(f"feed(s) named for no model input: {', '.join(what)}", where=self.source,
                             hint=f"the model's inputs are: {', '.join(self.inputs)}; without --strict-inputs "
                                  "a feed matching one input case-insensitively is renamed and the rest are ignored")
        if renamed:
            self._once("renamed", f"{self.source}: feed(s) renamed to the model's input names: "
                                  + ", ".join(f"{a!r} -> {b!r}" for a, b in renamed.items()))
        if extra:
            self._once("extra", f"{self.source}: ignoring {len(extra)} feed(s) that are not model inputs: "
                                + ", ".join(repr(e) for e in extra[:8]) + (", ..." if len(extra) > 8 else ""))
        return {renamed.get(k, k): v for k, v in feed.items() if k not in extra}

    def _once(self, kind: str, message: str) -> None:
        if self.warn and kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", message)


def default_input_shapes(inputs: Mapping[str, Shape | None], given: Mapping[str, Any],
                         feeds: list[Mapping[str, Any]] | None = None, *, strict: bool = False) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for the inputs with dynamic dims that `given` (--input-shapes, profiles)
    does not cover: the first feed's shape when it has the input, else each dynamic dim 1.
    One warning names what was chosen; `strict` gives {} (the runners then refuse as before)."""
    import numpy as np

    chosen: dict[str, tuple[int, ...]] = {}
    first = feeds[0] if feeds else {}
    for name, shape in inputs.items():
        if name in given or shape is None or all(isinstance(d, int) and d >= 0 for d in shape):
            continue
        if name in first:
            value = np.shape(first[name])
            if len(value) == len(shape):
                chosen[name] = tuple(int(d) for d in value)
            continue  # the runners check a feed of another rank
        chosen[name] = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in shape)
    if strict or not chosen:
        return {}
    defaulted = {n: s for n, s in chosen.items() if n not in first}
    if defaulted:
        log.warning("input(s) with dynamic dims and no shape given: using %s (set them with --input-shapes, or "
                    "--trt-min/opt/max-shapes for a plan that takes a range)",
                    ", ".join(f"{n}:{list(s)}" for n, s in defaulted.items()))
    return chosen


def onnx_input_shapes(model: str | os.PathLike) -> dict[str, Shape | None] | None:
    """{graph input: dims (int, or a str/None for a dynamic dim)} of an ONNX file, weights not
    read; None when onnx cannot read it (the runners' loaders then explain why)."""
    import onnx

    try:
        graph = onnx.load(str(model), load_external_data=False).graph
    except Exception:  # protobuf's and onnx's errors: the runner reports the file properly
        return None
    inits = {t.name for t in graph.initializer}
    shapes: dict[str, Shape | None] = {}
    for vi in graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                for d in t.shape.dim) if t.HasField("shape") else None
    return shapes
