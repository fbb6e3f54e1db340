"""The checks of a plan that need this polykit's tactic table, run when an Engine loads it.

The plan's own check (polykit.compiler.plan.check, at Plan.deserialize) needs no tactic:
it runs for `inspect` on any machine and sits below the kernels. What only the tactic
table can say is checked here, before the target sees the plan:

- each layer's tactic, and each profile's (LayerDesc.profile_tactics), is one its target has
  for the layer's kind. Whether the tactic accepts the layer (its `supports`) may depend on
  the device, so the target asks that when it loads the plan (CudaEngine);
- each kernel row's `file` (its name pattern is the plan schema's) is a source of this
  polykit's kernel folder.

Plans nested in control-flow layers are checked with their layer. A violation is a
PlanError naming the field, as the plan's own check words it.
"""

from __future__ import annotations

from typing import Any, Iterator

from polykit.compiler.plan.check import plan_error
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.schema import Invalid
from polykit.kernels.tactics import find_tactic


def check_tactics(plan: Plan, where: str = "plan") -> None:
    """PlanError when a layer of `plan` (or of a plan nested in one) names a tactic its target
    does not have for the layer's kind, or a kernel file this polykit does not have."""
    for nested, at in _plans(plan, where):
        try:
            _kernel_files(nested)
            _tactics_exist(nested)
        except Invalid as bad:
            raise plan_error(bad, at) from None


def _plans(plan: Plan, where: str) -> Iterator[tuple[Plan, str]]:
    """`plan`, then the plans nested in its layers' attrs, each with its `where` as the plan
    file names it (polykit.compiler.plan.file._Nested)."""
    yield plan, where
    for layer in plan.layers:
        yield from _nested(layer.attrs, f"{where}: layers[{layer.name!r}].attrs")


def _nested(value: Any, where: str) -> Iterator[tuple[Plan, str]]:
    if isinstance(value, Plan):
        yield from _plans(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nested(item, f"{where}: {key}")
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _nested(item, where)


def _kernel_files(plan: Plan) -> None:
    table = plan.metadata.get("kernels")
    if not table:
        return
    from polykit.kernels.cuda.base import CUDA_DIR  # imported when a plan has kernels: it imports every family

    for layer, rows in table["layers"].items():
        for i, row in enumerate(rows):
            file = row.get("file")
            if file is not None and not (CUDA_DIR / file).is_file():
                raise Invalid(f"metadata.kernels.layers[{layer!r}][{i}].file",
                              f"{file!r} is not a kernel source of this polykit")


def _tactics_exist(plan: Plan) -> None:
    for layer in plan.layers:
        if find_tactic(plan.target, layer.kind, layer.tactic) is None:
            raise Invalid(f"layers[{layer.name!r}].tactic", f"{layer.tactic!r} is not a {plan.target} tactic for "
                                                          f"{layer.kind} layers")
        for p, name in enumerate(layer.profile_tactics):
            if find_tactic(plan.target, layer.kind, name) is None:
                raise Invalid(f"layers[{layer.name!r}].profile_tactics[{p}]",
                              f"{name!r} is not a {plan.target} tactic for {layer.kind} layers")
