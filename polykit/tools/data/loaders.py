"""Data loaders: where the comparator's feed dicts come from.

A data loader is an iterable of feed dicts (input name -> numpy array). Loaders that need
to know the model's inputs define `bind(input_metadata)`, which the comparator calls with
the first runner's input metadata before iterating. Each iteration gives every runner the
same arrays.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import runpy
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from polykit.errors import UsageError
from polykit.files import require_file
from polykit.tools.data.feeds import FeedMatcher

log = logging.getLogger("polykit")

ValRange = tuple[float, float]


@dataclass(frozen=True)
class DataLoaderOptions:
    """seed; iterations; val_ranges: input name -> (low, high), key "" for every other input;
    input_shapes: concrete shapes for dynamic inputs; script: "file.py[:function]" for the
    script loader (function defaults to load_data); strict_inputs: a dynamic dim no shape gives,
    and a feed named for no input, are errors (else 1 / matched or ignored, with a warning:
    polykit.tools.data.feeds)."""

    seed: int = 1
    iterations: int = 1
    val_ranges: Mapping[str, ValRange] = field(default_factory=dict)
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    script: str | None = None
    strict_inputs: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise UsageError(f"--seed {self.seed!r} is not a non-negative integer", hint="e.g. --seed 1")
        if self.iterations < 1:
            raise UsageError(f"--iterations {self.iterations} is less than 1",
                             hint="run at least one iteration: --iterations 1")
        for name, (low, high) in self.val_ranges.items():
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise UsageError(f"--val-range {_named(name, [low, high])} is not a finite range with low <= high",
                                 hint="e.g. --val-range x:[-1,1]")
        for name, shape in self.input_shapes.items():
            if any(int(d) < 0 for d in shape):
                raise UsageError(f"--input-shapes {name}:{list(shape)} has a negative dim",
                                 hint="dims are >= 0, e.g. --input-shapes x:[1,3,224,224]")


@dataclass(frozen=True)
class DataLoaderSpec:
    """A data loader offered on the command line: `factory(options)` makes the iterable."""

    name: str
    factory: Callable[[DataLoaderOptions], Iterable[dict[str, Any]]]
    help: str = ""


class DataLoader:
    """Random feeds from a seed: floats uniform in the input's range (default [0, 1]),
    integers in [low, high] inclusive, bools at random. Dynamic dims come from
    `input_shapes`; a dim still unknown becomes 1 (with a notice)."""

    def __init__(self, options: DataLoaderOptions | None = None, input_metadata: Mapping[str, Any] | None = None):
        self.options = options or DataLoaderOptions()
        self.input_metadata = dict(input_metadata or {})

    def bind(self, input_metadata: Mapping[str, Any]) -> None:
        if not self.input_metadata:
            self.input_metadata = dict(input_metadata)

    def __len__(self) -> int:
        return self.options.iterations

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import numpy as np

        unknown = set(self.options.val_ranges) - set(self.input_metadata) - {""}
        unknown |= set(self.options.input_shapes) - set(self.input_metadata)
        if unknown and self.input_metadata:
            raise UsageError(
                f"--val-range/--input-shapes name input(s) the model does not have: {sorted(unknown)}",
                hint=f"the model's inputs are: {list(self.input_metadata)}",
            )
        rng = np.random.default_rng(self.options.seed)
        shapes = {name: self._shape(meta) for name, meta in self.input_metadata.items()}
        for _ in range(self.options.iterations):
            yield {name: self._generate(rng, meta, shapes[name]) for name, meta in self.input_metadata.items()}

    def _shape(self, meta: Any) -> tuple[int, ...]:
        if meta.name in self.options.input_shapes:
            return tuple(int(d) for d in self.options.input_shapes[meta.name])
        if meta.shape is None:
            raise UsageError(f"input {meta.name!r} has an unknown rank", hint=f"pass --input-shapes {meta.name}:[...]")
        dynamic = [d for d in meta.shape if not (isinstance(d, int) and d >= 0)]
        if dynamic and self.options.strict_inputs:
            raise UsageError(f"input {meta.name!r} has dynamic dim(s) {', '.join(map(repr, dynamic))} and no shape "
                             "is given (--strict-inputs)", hint=f"pass --input-shapes {meta.name}:[...]")
        if dynamic:
            log.warning("input %r has dynamic dim(s) %s; using 1 (set them with --input-shapes)",
                        meta.name, ", ".join(map(repr, dynamic)))
        return tuple(d if isinstance(d, int) and d >= 0 else 1 for d in meta.shape)

    def _generate(self, rng: Any, meta: Any, shape: tuple[int, ...]) -> Any:
        try:
            return self._random(rng, meta, shape)
        except MemoryError:
            raise UsageError(f"input {meta.name!r} of shape {list(shape)} is too large to generate in host memory",
                             hint=f"pass a smaller shape with --input-shapes {meta.name}:[...]") from None

    def _random(self, rng: Any, meta: Any, shape: tuple[int, ...]) -> Any:
        import numpy as np

        from polykit.tools.compare.funcs import is_float_dtype

        low, high = self.options.val_ranges.get(meta.name, self.options.val_ranges.get("", (0.0, 1.0)))
        dtype = np.dtype(meta.dtype)
        if dtype == np.bool_:
            return rng.integers(0, 2, size=shape).astype(np.bool_)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            ilow, ihigh = max(int(np.ceil(low)), int(info.min)), min(int(np.floor(high)), int(info.max))
            if ilow > ihigh:
                raise UsageError(f"value range [{low}, {high}] holds no {dtype} value for input {meta.name!r}",
                                 hint=f"widen it: --val-range {meta.name}:[LOW,HIGH]")
            draw = np.uint64 if dtype == np.uint64 else np.int64
            return rng.integers(ilow, ihigh, size=shape, endpoint=True, dtype=draw).astype(dtype)
        if is_float_dtype(dtype):
            return rng.uniform(low, high, size=shape).astype(dtype)
        raise UsageError(f"cannot generate data for input {meta.name!r} of dtype {dtype}",
                         hint="supply inputs with --load-inputs or --data-loader-script")


class ScriptDataLoader:
    """Feeds from a user script's function (default `load_data`) that returns or yields feed dicts;
    bound to the model's inputs, feed names are matched to them (polykit.tools.data.feeds)."""

    def __init__(self, script: str, strict_inputs: bool = False):
        path, _, func = script.partition(":")
        self.path = path
        self.func = func or "load_data"
        self.match = FeedMatcher((), strict=strict_inputs, source=path)

    def bind(self, input_metadata: Mapping[str, Any]) -> None:
        self.match = FeedMatcher(input_metadata, strict=self.match.strict, source=self.path)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        path = require_file(self.path, "data loader script")
        namespace = self._run(lambda: runpy.run_path(str(path)))
        fn = namespace.get(self.func)
        if not callable(fn):
            raise UsageError(f"{self.path} defines no function {self.func!r}",
                             hint="define `def load_data(): yield {'input': array}`")
        feeds = self._run(fn)
        try:
            iterator = iter(feeds)
        except TypeError:
            raise UsageError(f"{self.path}:{self.func}() returned a {type(feeds).__name__}, not an iterable of feed dicts",
                             hint="return a list of dicts or yield dicts of input name -> array") from None
        for i in itertools.count():
            item = self._run(lambda: next(iterator, _END))
            if item is _END:
                return
            if not isinstance(item, Mapping):
                raise UsageError(f"{self.path}:{self.func} gave a {type(item).__name__} at iteration {i}, "
                                 "not a dict of input name -> array",
                                 hint="load_data() yields dicts of input name -> array")
            yield self.match(item)

    def _run(self, step: Callable[[], Any]) -> Any:
        """Run user code; an exception it raises becomes a UsageError naming the script's line."""
        try:
            return step()
        except Exception as exc:
            raise UsageError(f"the data loader script raised {type(exc).__name__}: {exc}",
                             where=f"{self.path}:{_script_line(exc, self.path)}",
                             hint="fix the script (run it with python to debug it)") from exc


_END = object()


def _named(name: str, value: Any) -> str:
    return f"{name}:{value}" if name else str(value)


def _script_line(exc: BaseException, path: str) -> str:
    """The line of `path` where `exc` was raised (the innermost frame in that file), or "?"."""
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        return str(exc.lineno)
    target = os.path.realpath(path)
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if os.path.realpath(f.filename) == target]
    return str(lines[-1]) if lines and lines[-1] is not None else "?"


class FeedsDataLoader:
    """Feeds given up front (a list of feed dicts, e.g. from --load-inputs); bound to the model's
    inputs, feed names are matched to them (polykit.tools.data.feeds)."""

    def __init__(self, feeds: list[dict[str, Any]], strict_inputs: bool = False, source: str = "the feeds"):
        self.feeds = list(feeds)
        self.match = FeedMatcher((), strict=strict_inputs, source=source)

    def bind(self, input_metadata: Mapping[str, Any]) -> None:
        self.match = FeedMatcher(input_metadata, strict=self.match.strict, source=self.match.source)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter([self.match(f) for f in self.feeds])


def make_data_loader(name: str, options: DataLoaderOptions, specs: Mapping[str, DataLoaderSpec]) -> Iterable[dict[str, Any]]:
    """The loader registered as `name` (through the polykit_data_loaders hook)."""
    spec = specs.get(name)
    if spec is None:
        raise UsageError(f"unknown data loader {name!r}", hint=f"use one of: {', '.join(sorted(specs))}")
    return spec.factory(options)


def builtin_data_loaders() -> list[DataLoaderSpec]:
    return [
        DataLoaderSpec("default", lambda o: DataLoader(o), "random data from --seed, --val-range, --input-shapes"),
        DataLoaderSpec("script", lambda o: ScriptDataLoader(o.script or "", o.strict_inputs),
                       "load_data() from --data-loader-script"),
    ]
