"""The checks of a plan that need this polykit's tactic table, run when an Engine loads it.

The plan's own check (polykit.compiler.plan.check, at Plan.deserialize) needs no tactic:
it runs for `inspect` on any machine and sits below the kernels. What only the tactic
table can say is checked here, before the target sees the plan:

- each layer's tactic, and each profile's (LayerDesc.profile_tactics), is one its target has
  for the layer's kind. Whether the tactic accepts the layer (its `supports`) may depend on
  the device, so the target asks that again when it loads the plan (CudaEngine);
- a tactic that an installed plugin registered is recorded in a cuda plan with that plugin's
  name and version, and the same plugin at the same version provides it here;
- a cuda plan carries no kernel source: each layer's kernels are regenerated from its tactic
  (`plan_kernels`), the generator's parameters validated first (the layer's `tactic_params`
  are exactly the tactic's own, its `supports` accepts the layer, each generated kernel has
  the shape polykit's generators give: polykit.kernels.cuda.base.check_generated), and the
  regenerated sources must be the ones the plan records (entry point and source key), so the
  runtime compiles exactly what the builder compiled. A version-compatible plan from another
  polykit version (polykit.runtime.compatibility checked its tactics' revisions) is the
  exception: its kernels are this version's, and its kernel table is replaced by theirs.

Plans nested in control-flow layers are checked with their layer. A violation is a
PlanError naming the field, as the plan's own check words it, or the layer.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import polykit
from polykit.compiler.plan.check import plan_error
from polykit.compiler.plan.file import Plan
from polykit.compiler.plan.schema import Invalid
from polykit.errors import PlanError, PolykitError
from polykit.kernels.profile_tactics import profile_layers
from polykit.kernels.tactics import find_tactic, tactic_origin

_REBUILD = "rebuild the plan with `polykit convert` and this polykit"


def check_tactics(plan: Plan, where: str = "plan") -> None:
    """PlanError when a layer of `plan` (or of a plan nested in one) names a tactic its target
    does not have for the layer's kind, a plugin tactic not installed as the plan records it, a
    placed tensor's producer a tactic that cannot write it at its rows (memory.placements), another
    reader of one a tactic that cannot read it there, or
    (cuda) kernels this polykit does not generate for the layer. A format-1 cuda plan (no source
    keys recorded) gets its kernel table's keys filled in from the regenerated sources."""
    for nested, at in plans_within(plan, where):
        try:
            _tactics_exist(nested)
            _placements_written(nested)
        except Invalid as bad:
            raise plan_error(bad, at) from None
        if nested.target == "cuda" and nested.layers:
            _plugins_as_recorded(nested, at)
            rows = {layer.name: _verified(nested, layer, at) for layer in nested.layers}
            table = nested.metadata["kernels"]
            if nested.compatibility.foreign or any("key" not in row for recorded in table["layers"].values()
                                                   for row in recorded):
                # a format-1 plan as format 2 records it; a version-compatible one as this version compiles it
                nested.metadata["kernels"] = {**table, "layers": rows}


def plan_kernels(plan: Plan, layer: Any, where: str = "plan") -> list[Any]:
    """The KernelSources of `layer` of cuda `plan` (every profile's, each once), regenerated from
    its tactics by this polykit and checked against the plan's record (PlanError otherwise)."""
    sources = _regenerated(plan, layer, where)
    _compare(plan, layer, sources, where)
    return sources


def _verified(plan: Plan, layer: Any, where: str) -> list[dict[str, Any]]:
    from polykit.kernels.cuda.base import kernel_rows

    return kernel_rows(plan_kernels(plan, layer, where))


def _regenerated(plan: Plan, layer: Any, where: str) -> list[Any]:
    from polykit.kernels.cuda.base import CudaTactic, check_generated

    count = len(plan.profiles.ranges) if plan.profiles is not None else 1
    out: list[Any] = []
    at = f"{where}: layer {layer.name!r}"
    for profile in range(count):
        ran = next((l for l in profile_layers(plan, profile) if l.name == layer.name), None) if count > 1 else layer
        if ran is None:
            raise PlanError(f"layer {layer.name!r} is not a layer of the plan", where=where, hint=_REBUILD)
        tactic = find_tactic(plan.target, ran.kind, ran.tactic)
        if not isinstance(tactic, CudaTactic):
            raise PlanError(f"layer uses tactic {ran.tactic!r}, which the cuda target does not have", where=at,
                            hint=_REBUILD)
        for kernel in _generate(tactic, ran, at):
            if kernel not in out:
                out.append(check_generated(kernel, at))
    return out


def _generate(tactic: Any, layer: Any, where: str) -> list[Any]:
    """tactic.kernels(layer) once its parameters are the generator's: the tactic's own params, a
    layer the tactic's `supports` accepts; anything the generator raises on it is a PlanError."""
    if _canonical(layer.tactic_params) != _canonical(dict(tactic.params)):
        raise PlanError(f"tactic_params {_short(layer.tactic_params)} are not tactic {tactic.name!r}'s parameters "
                        f"{_short(dict(tactic.params))}", where=where,
                        hint="a tactic's parameters (tile sizes, stages) come with its name; " + _REBUILD)
    try:
        accepted = bool(tactic.supports(layer))
    except Exception:  # a predicate fed a layer it was never meant for (a crafted plan)
        accepted = False
    if not accepted:
        raise PlanError(f"tactic {tactic.name!r} does not generate kernels for this {layer.kind} layer: its dtypes, "
                        "shapes or attributes are outside what the tactic takes", where=where, hint=_REBUILD)
    try:
        return list(tactic.kernels(layer))
    except Exception as exc:  # a value of the wrong type or outside a generator's table
        detail = exc.what if isinstance(exc, PolykitError) else f"{type(exc).__name__}: {exc}"
        raise PlanError(f"tactic {tactic.name!r} cannot generate kernels for this layer ({detail})",
                        where=where, hint=_REBUILD) from None


def _compare(plan: Plan, layer: Any, sources: list[Any], where: str) -> None:
    """The regenerated sources are the ones the plan records: the same entry points with the same
    source keys (rows of a format-1 plan record no key: their names are compared)."""
    if plan.compatibility.foreign:  # version-compatible: the tactics' revisions matched; their kernels are ours
        return
    recorded = ((plan.metadata.get("kernels") or {}).get("layers") or {}).get(layer.name)
    if recorded is None:
        raise PlanError(f"the plan records no kernels for layer {layer.name!r}", where=f"{where}: layer {layer.name!r}",
                        hint=_REBUILD)
    keyed = all("key" in row for row in recorded)
    want = sorted((row["name"], row.get("key", "")) for row in recorded)
    have = sorted((k.name, k.key() if keyed else "") for k in sources)
    if want != have:
        differ = sorted(set(want) ^ set(have))
        first = f"first difference: {differ[0][0]!r}" if differ else \
            f"{len(want)} kernel rows recorded, {len(have)} generated"  # the same kernels, a row repeated
        built = plan.metadata.get("polykit_version", "another version")
        raise PlanError(f"the plan records kernels this polykit ({polykit.__version__}) does not generate for the "
                        f"layer ({first})", where=f"{where}: layer {layer.name!r}",
                        hint=f"the plan was built by polykit {built}, whose kernel sources differ, or was edited; "
                             + _REBUILD)


def _plugins_as_recorded(plan: Plan, where: str) -> None:
    """Each tactic of the plan comes from the plugin (name, version) the plan records for it, or
    from polykit itself when it records none."""
    recorded = (plan.metadata.get("kernels") or {}).get("plugins") or {}
    for layer in plan.layers:
        for name in dict.fromkeys((layer.tactic, *layer.profile_tactics)):
            tactic = find_tactic(plan.target, layer.kind, name)
            origin = tactic_origin(tactic) if tactic is not None else None
            have, want = (origin.to_json() if origin else None), recorded.get(name)
            if have == want:
                continue
            at = f"{where}: layer {layer.name!r}"
            if want is None:
                raise PlanError(f"tactic {name!r} comes from plugin {have['plugin']!r} here, but the plan records it "
                                "as polykit's own", where=at, hint=_REBUILD)
            need = f"plugin {want['plugin']!r} version {want['version'] or '(unversioned)'}"
            if have is None:
                raise PlanError(f"tactic {name!r} comes from {need}, which is not installed here", where=at,
                                hint=f"install {need} (or name its module in POLYKIT_PLUGINS), or " + _REBUILD)
            raise PlanError(f"tactic {name!r} comes from {need}; here plugin {have['plugin']!r} is version "
                            f"{have['version'] or '(unversioned)'}", where=at,
                            hint=f"install {need}, or " + _REBUILD)


def _canonical(params: Any) -> str:
    return json.dumps(params, sort_keys=True, default=repr)


def _short(params: Any) -> str:
    text = _canonical(params)
    return text if len(text) <= 80 else text[:77] + "..."


def plans_within(plan: Plan, where: str) -> Iterator[tuple[Plan, str]]:
    """`plan`, then the plans nested in its layers' attrs, each with its `where` as the plan
    file names it (polykit.compiler.plan.file._Nested)."""
    yield plan, where
    for layer in plan.layers:
        yield from _nested(layer.attrs, f"{where}: layers[{layer.name!r}].attrs")


def _nested(value: Any, where: str) -> Iterator[tuple[Plan, str]]:
    if isinstance(value, Plan):
        yield from plans_within(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nested(item, f"{where}: {key}")
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _nested(item, where)


def _tactics_exist(plan: Plan) -> None:
    recorded = (plan.metadata.get("kernels") or {}).get("plugins") or {}
    for layer in plan.layers:
        for field, name in [("tactic", layer.tactic)] + [(f"profile_tactics[{p}]", n)
                                                          for p, n in enumerate(layer.profile_tactics)]:
            if find_tactic(plan.target, layer.kind, name) is None and name not in recorded:
                raise Invalid(f"layers[{layer.name!r}].{field}", f"{name!r} is not a {plan.target} tactic for "
                                                                 f"{layer.kind} layers")


def _placements_written(plan: Plan) -> None:
    """Each placed tensor (memory.placements) is written by a tactic (every profile's) that can
    write it at its rows: another would write it contiguously over its neighbours' rows."""
    placements = plan.memory.placements
    if not placements:
        return
    producer = {layer.outputs[0]: layer for layer in plan.layers if layer.outputs and layer.outputs[0]}
    for name, p in sorted(placements.items()):
        if name in plan.memory.aliases:  # a view: its placed source's bytes (the plan check), which its writer writes
            continue
        layer = producer.get(name)
        for tactic_name in (layer.profile_tactics or (layer.tactic,)) if layer is not None else ("",):
            tactic = find_tactic(plan.target, layer.kind, tactic_name) if layer is not None else None
            if tactic is None or not tactic.places(layer, p.row, p.stride, p.offset):
                raise Invalid(f"memory.placements[{name!r}]", f"{name!r} is not the first output of a layer whose "
                                                              f"tactic writes rows {p.row} elements long "
                                                              f"{p.stride} apart")
    aliases = plan.memory.aliases
    for layer in plan.layers:  # the other readers of a placed tensor read its rows strided
        out = layer.outputs[0] if layer.outputs else ""
        for index, name in enumerate(layer.inputs):
            p = placements.get(name)
            if p is None or name in aliases or out == p.root or (aliases.get(out) == name and placements.get(out) == p):
                continue  # not placed, a placed view, its Concat, or the placed view of a placed source
            for tactic_name in layer.profile_tactics or (layer.tactic,):
                tactic = find_tactic(plan.target, layer.kind, tactic_name)
                if tactic is None or not tactic.reads_placed(layer, index, p.row, p.stride, p.offset):
                    raise Invalid(f"memory.placements[{name!r}]", f"layer {layer.name!r} reads {name!r} with a "
                                                                  f"tactic that cannot read rows {p.row} elements "
                                                                  f"long {p.stride} apart")
