"""Tactics per optimization profile (TensorRT's model): one engine serves small and large shapes fast.

- **Build** (`pick_tactics`): a layer that reads or writes a dynamic tensor of a plan with
  several profiles gets a tactic per profile: the candidates that serve every corner of *that*
  profile (tuner.serves_corners), ordered by priority and estimate at the profile's opt shapes
  and timed there (the layer stamped as tuner.at_corner does; the timing cache keys by shapes).
  The layer's precision is one for all profiles: the first profile's choice among the
  precisions every profile has a tactic for.
- **Plan**: `LayerDesc.profile_tactics` names each profile's tactic where they differ (empty
  otherwise: single-profile plans are unchanged); the layer's kernel list holds the kernels of
  every profile's tactic. `check_profile_tactics` (a rule of polykit.compiler.plan.check) validates
  the field; the runtime checks that each tactic exists (polykit.runtime.tactic_check).
- **Run** (`profile_layers`): the layers as one profile runs them, each with that profile's
  tactic and stamped at that profile's opt shapes; the targets keep one step list per profile
  and launch the one of the shapes they are bound to (ShapeSet.key starts with the profile).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.compiler.plan.profiles import at_corner, generic_corners, tensors_at
from polykit.errors import BuildError

Pair = tuple[LayerDesc, Any]  # (the layer at one precision, a tactic), as in polykit.compiler.builder.tuner


@dataclass(frozen=True)
class ProfileShapes:
    """The dynamic tensors of one profile as tactic selection sees them: at its opt, at each of
    its corners (min/opt/max, and data symbols at small sizes), and at the generic corners
    (dims of 1 raised to 2: serves_corners)."""

    opt: Mapping[str, TensorDesc]
    corners: tuple[Mapping[str, TensorDesc], ...]
    generic: tuple[Mapping[str, TensorDesc], ...]
    #: the corners' symbol values (polykit.compiler.plan.witnesses searches between them)
    envs: tuple[Mapping[str, int], ...] = ()


def profile_groups(profiles: Any) -> list[list[dict[str, int]]]:
    """Per profile of a ProfileSet (None: a static build, no profile), the symbol values of its
    corners (min, opt, max, then those with data symbols small: data_dims.small_data_corners, and
    those with rule symbols at other values: shape_rules.small_rule_corners)."""
    if profiles is None:
        return []
    from polykit.compiler.ops.data_dims import small_data_corners
    from polykit.compiler.graph.shape_rules import small_rule_corners

    groups = [[env for i, _, env in profiles.corners() if i == p] for p in range(len(profiles.ranges))]
    return [group + small_data_corners(group, profiles.data) + small_rule_corners(group, profiles.rules)
            for group in groups]


def profile_views(tensors: Mapping[str, TensorDesc], groups: Sequence[Sequence[Mapping[str, int]]]
                  ) -> tuple[ProfileShapes, list[ProfileShapes]]:
    """(every profile at once, each profile alone) for `groups`: per profile its corners' symbol
    values, opt second. The first view is what a layer no profile changes is chosen with."""
    def view(envs: Sequence[Mapping[str, int]], opt: Mapping[str, int] | None) -> ProfileShapes:
        return ProfileShapes(tensors_at(tensors, opt) if opt is not None else {},
                             tuple(tensors_at(tensors, env) for env in envs),
                             tuple(tensors_at(tensors, env) for env in generic_corners(envs)), tuple(envs))

    every = [env for group in groups for env in group]
    return (view(every, groups[0][1] if groups else None),
            [view(group, group[1]) for group in groups])


def touches(layer: LayerDesc, dynamic: Mapping[str, TensorDesc]) -> bool:
    """Whether `layer` reads or writes one of the `dynamic` tensors."""
    return any(n in dynamic for n in layer.inputs + layer.outputs if n)


def pick_tactics(layer: LayerDesc, every: ProfileShapes, views: Sequence[ProfileShapes],
                 candidates_at: Callable[[LayerDesc, ProfileShapes], list[Pair]],
                 choose: Callable[[LayerDesc, list[Pair], ProfileShapes], Pair],
                 forced: Callable[[LayerDesc, int], Pair | None]) -> list[tuple[Pair, ProfileShapes]]:
    """(pair, the profile's shapes) per profile for `layer` (one entry when no profile changes the
    layer's shapes, or the plan has one profile). `candidates_at(stamped layer, view)`: its pairs
    in preference order; `choose(stamped layer, pairs, view)`: the tuner's pick; `forced(layer at
    precision, profile)`: a replay's pair, None where the replay names no tactic for the layer."""
    if len(views) < 2 or not touches(layer, every.opt):
        pair = forced(layer, 0) or choose(layer, candidates_at(layer, every), every)
        return [(pair, every)]
    stamped = [layer] + [at_opt(layer, view) for view in views[1:]]
    first = forced(layer, 0)
    if first is not None:
        return [(first, views[0])] + [(forced(replace(s, precision=first[0].precision), p), view)
                                      for p, (s, view) in enumerate(zip(stamped, views)) if p]
    pairs = [candidates_at(s, view) for s, view in zip(stamped, views)]
    common = set.intersection(*({variant.precision for variant, _ in found} for found in pairs))
    if not common:
        raise BuildError(f"no precision of this {layer.kind} layer has a tactic for every optimization profile "
                         f"({'; '.join(f'profile {p}: ' + '/'.join(sorted({v.precision for v, _ in found})) for p, found in enumerate(pairs))})",
                         where=f"layer {layer.name!r}", hint="narrow the profiles, or relax --precision-constraints")
    base = choose(layer, [pair for pair in pairs[0] if pair[0].precision in common], views[0])
    picks = [(base, views[0])]
    for s, view, found in zip(stamped[1:], views[1:], pairs[1:]):
        picks.append((choose(s, [pair for pair in found if pair[0].precision == base[0].precision], view), view))
    return picks


def at_opt(layer: LayerDesc, view: ProfileShapes) -> LayerDesc:
    """`layer` stamped with its dynamic tensors' shapes at the profile's opt."""
    return at_corner(layer, view.opt)


def recorded(names: Sequence[str]) -> tuple[str, ...]:
    """LayerDesc.profile_tactics for per-profile tactic `names`: empty when they are all one."""
    return tuple(names) if len(set(names)) > 1 else ()


def tactic_names(layer: LayerDesc, profiles: int) -> tuple[str, ...]:
    """The tactic of `layer` in each of `profiles` profiles."""
    return tuple(layer.profile_tactics) or (layer.tactic,) * profiles


# ---- the run ---------------------------------------------------------------------------------
def profile_layers(plan: Any, profile: int) -> list[LayerDesc]:
    """`plan.layers` as optimization profile `profile` runs them: with that profile's tactic (and
    its params) and stamped at that profile's opt shapes, as the builder judged them."""
    if plan.profiles is None or len(plan.profiles.ranges) < 2:
        return list(plan.layers)
    from polykit.kernels.tactics import find_tactic

    env = next(env for p, label, env in plan.profiles.corners() if p == profile and label == "opt")
    opt = tensors_at(plan.tensors, env)
    out = []
    for layer in plan.layers:
        name = layer.profile_tactics[profile] if layer.profile_tactics else layer.tactic
        if name != layer.tactic:
            tactic = find_tactic(plan.target, layer.kind, name)
            layer = replace(layer, tactic=name, tactic_params=dict(tactic.params) if tactic is not None else {})
        out.append(replace(at_corner(layer, opt), profile_tactics=()))
    return out
