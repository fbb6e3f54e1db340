"""The contract of cpu tactics: `run(node, inputs) -> outputs`, the reference kernel's shape.

A CpuTactic runs one layer as a numpy function of the layer's Node (polykit.compiler.plan.records.
layer_as_node) and its input arrays. Tactics of the kinds that take an epilogue (Conv, Gemm,
MatMul) also serve the fused ai.polykit layers: `cpu_tactic` runs the epilogue body after
the tactic's own base computation, exactly as the reference does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.plan.records import storage_precision
from polykit.kernels.tactics import ANY, Tactic, function_source

RunFn = Callable[[Node, Sequence["np.ndarray | None"]], "list[np.ndarray]"]


def writes_anywhere(layer: Any, row: int, stride: int, offset: int) -> bool:
    """The cpu target writes every layer's outputs itself (polykit.runtime.cpu), so any cpu
    tactic's output can be placed in rows of a Concat's output."""
    return True


#: layers that run nested plans on the values they get (their bodies read outer tensors by name)
NESTED_KINDS = ("Loop", "If", "Scan")


def reads_anywhere(layer: Any, index: int, row: int, stride: int, offset: int) -> bool:
    """The cpu target hands a layer a placed input as a strided numpy view of its rows in the
    root's slot (polykit.runtime.cpu); numpy kernels read any strides, so every cpu tactic reads
    placed inputs but those of the layers running nested plans."""
    return getattr(layer, "kind", "") not in NESTED_KINDS


@dataclass(frozen=True)
class CpuTactic(Tactic):
    """A Tactic of the cpu target: `run_fn(node, inputs)` computes the layer's outputs;
    `code_of(layer)`, when given, is the function that really runs a layer (whose source
    keys the timing cache), for a tactic that dispatches per op."""

    run_fn: RunFn | None = field(default=None, hash=False, compare=False)
    dynamic_sizes: bool = True  # numpy kernels take their sizes from the arrays they get
    code_of: Callable[[Any], Any] | None = field(default=None, hash=False, compare=False)
    communicates: bool = False  # run_fn takes the context's communicator as a third argument
    places_fn: Callable[[Any, int, int, int], bool] | None = field(default=writes_anywhere, hash=False,
                                                                   compare=False)
    reads_placed_fn: Callable[[Any, int, int, int, int], bool] | None = field(default=reads_anywhere, hash=False,
                                                                              compare=False)

    def run(self, node: Node, inputs: Sequence[np.ndarray | None], communicator: Any = None) -> list[np.ndarray]:
        return self.run_fn(node, inputs, communicator) if self.communicates else self.run_fn(node, inputs)

    def source_key(self, layer: Any) -> str:
        key = super().source_key(layer)
        code = self.code_of(layer) if self.code_of is not None else None
        if code is None:
            return key
        return hashlib.sha256((key + function_source(code)).encode()).hexdigest()[:24]


#: every CpuTactic the family modules declare; the built-in plugin registers them
DECLARED: list[CpuTactic] = []


def computes_in_storage_precision(layer: Any) -> bool:
    """cpu kernels compute on the arrays they get, floats in float64: a layer runs in its
    storage's precision, or is labelled "fp32" when a build asks for that (its math is)."""
    if not layer.in_dtypes:
        return True  # a layer built by hand (tests): nothing stamped to judge by
    return layer.precision in (storage_precision(layer), "fp32")


def _reference_supports(layer: Any) -> bool:
    """Layers the op's reference runs alone (a collective needs its rank's communicator: cpu.collective)."""
    from polykit.compiler.ops.models.collective import is_collective
    from polykit.compiler.ops.references import find_reference

    return computes_in_storage_precision(layer) and find_reference(layer.domain, layer.kind) is not None \
        and not is_collective(layer)


def _run_reference(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    from polykit.compiler.ops.references import run_reference

    return run_reference(node, inputs)


def _reference_of(layer: Any) -> Any:
    from polykit.compiler.ops.references import find_reference

    return find_reference(layer.domain, layer.kind)


#: the conservative tactic of every layer: the op's reference kernel
REFERENCE = CpuTactic("cpu", ANY, "cpu.reference", supports=_reference_supports, priority=10, conservative=True,
                      run_fn=_run_reference, code_of=_reference_of)
DECLARED.append(REFERENCE)


def _with_epilogue(fn: RunFn) -> RunFn:
    def run(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        if node.domain != POLYKIT_DOMAIN:
            return fn(node, inputs)
        from polykit.compiler.ops.nn.fused_reference import run_epilogue

        return run_epilogue(node, inputs, fn)

    run.__wrapped__ = fn  # type: ignore[attr-defined]  (inspect.getsource keys the timing cache by fn's text)
    return run


def cpu_tactic(kinds: Sequence[str], name: str, *, supports: Callable[[Any], bool], priority: int = 0,
               params: Mapping[str, Any] | None = None) -> Callable[[RunFn], RunFn]:
    """Decorator for `fn(node, inputs) -> outputs`: declares a CpuTactic for each of `kinds`
    (plain ONNX layers and their fused ai.polykit epilogue forms, `supports` permitting)."""

    def declare(fn: RunFn) -> RunFn:
        run = _with_epilogue(fn)
        for kind in kinds:
            DECLARED.append(CpuTactic("cpu", kind, name, dict(params or {}),
                                      lambda layer: computes_in_storage_precision(layer) and supports(layer),
                                      priority, run_fn=run))
        return fn

    return declare


def plain_or_fused(layer: Any) -> bool:
    """A plain ONNX layer, or a fused ai.polykit one (whose epilogue runs after the tactic)."""
    return layer.domain in ("", POLYKIT_DOMAIN)


def float_layer(layer: Any) -> bool:
    """Float inputs and outputs (when the builder stamped them): the cpu tactics compute in float64."""
    from polykit.compiler.ir.dtypes import is_float

    return all(is_float(np.dtype(d)) for d in (*layer.in_dtypes, *layer.out_dtypes) if d)
