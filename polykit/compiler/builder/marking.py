"""Marking intermediate tensors as plan outputs, in two ways (docs/DEBUGGING.md):

- **forced** (BuilderConfig.mark_outputs): the tensors become graph outputs before the passes,
  which keep them under their names. They are real engine outputs, at the price of the
  fusions that would have hidden them: the engine differs from the unmarked one.
  With BuilderConfig.force_marks, mark_all and expose_tensors are forced too (Polygraphy's
  marking: `polykit run --mark-all` builds so).
- **observed** (BuilderConfig.mark_all, BuilderConfig.expose_tensors): the passes, lowering and
  tactic selection run as for the unmarked build; then the wanted ONNX tensors that a layer
  already writes, under their name and with their ONNX shape, become extra outputs. The layers
  and tactics are those of the unmarked build (only the memory plan changes: an output keeps
  its own slot). The other wanted tensors were fused into a layer, folded into a constant or
  rewritten by a layout pass: they are listed as fused away, not compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.ir.graph import Graph
from polykit.compiler.plan.records import LayerDesc
from polykit.errors import BuildError


@dataclass(frozen=True)
class Exposure:
    """What observed marking made of the wanted tensors: `exposed` (plan outputs now, in layer
    order) and `fused_away` (no layer writes them as they are in the ONNX graph; in graph order)."""

    exposed: tuple[str, ...] = ()
    fused_away: tuple[str, ...] = ()


def _check_known(g: Graph, names: Iterable[str], option: str) -> None:
    known = {o for n in g.nodes for o in n.outputs if o} | set(g.inputs)
    for name in names:
        if name not in known:
            raise BuildError(f"cannot mark {name!r} as an output ({option}): no node produces it",
                             where=f"graph {g.name!r}",
                             hint="list the model's tensors with `polykit inspect model MODEL --show layers`")


def forced_outputs(g: Graph, cfg: BuilderConfig) -> list[str]:
    """mark_outputs (with force_marks, the tensors mark_all / expose_tensors name too) not already
    graph outputs: made graph outputs before the passes run."""
    _check_known(g, cfg.mark_outputs, "mark_outputs")
    names = list(cfg.mark_outputs) + (_marked(g, cfg) if cfg.force_marks else [])
    return [n for n in dict.fromkeys(names) if n not in g.outputs]


def observed_tensors(g: Graph, cfg: BuilderConfig) -> dict[str, Any]:
    """Tensors to observe (expose_tensors, or every node output for mark_all; graph outputs and
    forced marks left out) -> their shape in the unoptimized graph, in graph order; none with
    force_marks."""
    if cfg.force_marks:
        return {}
    skip = set(g.outputs) | set(cfg.mark_outputs)
    return {n: g.value(n).shape for n in dict.fromkeys(_marked(g, cfg)) if n not in skip}


def _marked(g: Graph, cfg: BuilderConfig) -> list[str]:
    """expose_tensors, and every node output (Constant nodes' aside) with mark_all."""
    _check_known(g, cfg.expose_tensors, "expose_tensors")
    names = list(cfg.expose_tensors)
    if cfg.mark_all:
        names += [o for n in g.nodes if not (n.op_type == "Constant" and n.domain == "") for o in n.outputs if o]
    return names


def expose(wanted: Mapping[str, Any], layers: list[LayerDesc], shapes: Mapping[str, tuple[int, ...]]) -> Exposure:
    """Split `wanted` (name -> ONNX shape) into the tensors some layer writes with that shape
    (`shapes`: the plan's tensor shapes) and the rest."""
    written = [o for layer in layers for o in layer.outputs if o in wanted]
    exposed = tuple(dict.fromkeys(n for n in written if _same_shape(wanted[n], shapes[n])))
    chosen = set(exposed)
    return Exposure(exposed, tuple(n for n in wanted if n not in chosen))


def _same_shape(onnx_shape: Any, plan_shape: tuple[int, ...]) -> bool:
    """The plan's static shape is the ONNX one (unknown ONNX dims match any size)."""
    if onnx_shape is None:
        return True
    return len(onnx_shape) == len(plan_shape) and all(not isinstance(a, int) or a == b
                                                      for a, b in zip(onnx_shape, plan_shape))
