"""What `debug precision` and `debug reduce` do about an INT8 / FP8 build (BuilderConfig.int8 / fp8).

A search builds the model (or parts of it) many times; every build takes the scales of one
calibration of the whole model, as TensorRT's builds share one calibration cache. The first
build calibrates and writes the cache (BuilderConfig.calibration_cache, else a file in the
tool's temporary folder); every later build reads it (polykit.compiler.builder.quantize). A
subgraph of the model needs no other scale: its tensors keep the model's names. The calibration
data is the config's, else the check's own feeds (as Polygraphy's --int8 calibrates from the
data loader).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import UsageError

CACHE_NAME = "calibration.cache"


def quantizes(config: BuilderConfig) -> bool:
    """Whether the build quantizes implicitly (--int8 or --fp8)."""
    return bool(config.int8 or config.fp8)


def quantized_kind(config: BuilderConfig) -> str | None:
    """"int8", "fp8" or None."""
    return "int8" if config.int8 else "fp8" if config.fp8 else None


def needs_data(config: BuilderConfig) -> bool:
    """Whether the first build must calibrate with data the config does not carry."""
    cache = config.calibration_cache
    return quantizes(config) and config.calibration_data is None and not (cache is not None and Path(cache).is_file())


def shared_calibration(config: BuilderConfig, folder: Path, feeds: Sequence[dict[str, Any]] | None
                       ) -> BuilderConfig:
    """`config` with the calibration every build of a search shares (module docstring): its
    cache, else `folder`/calibration.cache; its data, else `feeds` (only read when the cache
    does not exist yet)."""
    cache = config.calibration_cache if config.calibration_cache is not None else folder / CACHE_NAME
    data = config.calibration_data
    if data is None and feeds is not None and not Path(cache).is_file():
        data = [dict(feed) for feed in feeds]
    return replace(config, calibration_cache=str(cache), calibration_data=data)


def reading_cache(config: BuilderConfig, tensors: Iterable[str]) -> BuilderConfig:
    """The config of a build of a subgraph holding `tensors`: the shared cache only (no data: it
    never calibrates) and the --tensor-ranges of the tensors it has (a range naming a tensor the
    subgraph lacks would be a BuildError)."""
    names = set(tensors)
    return replace(config, calibration_data=None,
                   tensor_ranges={n: r for n, r in config.tensor_ranges.items() if n in names})


def quantized_nodes(graph: Any) -> list[str]:
    """Names of the nodes an --int8 / --fp8 build of `graph` quantizes (insert_qdq's candidates), in order."""
    from polykit.compiler.passes.insert_qdq import constant_tensors, int8_candidates

    return [node.name for node, _ in int8_candidates(graph, constant_tensors(graph))]


def refuse_explicit(graph: Any, config: BuilderConfig, tool: str) -> None:
    """UsageError for --int8 / --fp8 on a model that carries Q/DQ: it is quantized as written, and
    no per-layer precision takes a layer out of the model's own quantization."""
    from polykit.compiler.builder.quantize import QDQ_OPS

    explicit = [n.name for n in graph.nodes if n.op_type in QDQ_OPS and n.domain == ""]
    if quantizes(config) and explicit:
        flag = "--int8" if config.int8 else "--fp8"
        raise UsageError(f"{tool} {flag} debugs the quantization a build adds; this model carries its own "
                         f"Q/DQ (node {explicit[0]!r}), which every build keeps as written",
                         hint=f"debug the float model with {flag}, or this one with --fp16 / --bf16 alone")
