"""The checks of a plan's compatibility record (polykit.compiler.plan.compatibility) that need
the running polykit's tactics or the device, run when an Engine loads the plan.

- A plan another polykit version built `--version-compatible` (Plan.deserialize refused any
  other) loads where each of its tactics has here the revision the plan names it with
  (`name@revision`); its kernels are then regenerated from this version's sources, not compared
  with the keys the other version recorded (polykit.runtime.tactic_check).
- A cuda plan built on one compute capability loads on another only when it was built for a
  hardware-compatibility level the device meets (`ampere+`: 8.0 and later); the cuda target
  calls `check_hardware` with its device's arch before it compiles or uploads anything.
"""

from __future__ import annotations

import polykit
from polykit.compiler.plan.compatibility import HARDWARE_LEVELS, arch_number
from polykit.compiler.plan.file import Plan
from polykit.errors import PlanError
from polykit.kernels.tactics import find_tactic
from polykit.runtime.tactic_check import plans_within


def check_versioned_tactics(plan: Plan, where: str = "plan") -> None:
    """PlanError naming the first tactic of a plan from another polykit version whose revision
    differs here (a tactic missing here is tactic_check's error). Plans nested in control-flow
    layers share the file's record."""
    if not plan.compatibility.foreign:
        return
    record = plan.compatibility
    for nested, at in plans_within(plan, where):
        nested.compatibility = record
        for layer in nested.layers:
            for name in dict.fromkeys((layer.tactic, *layer.profile_tactics)):
                tactic = find_tactic(nested.target, layer.kind, name)
                if tactic is None:
                    continue
                want = record.tactics.get(name)
                if want != tactic.revision:
                    named = f"{name}@{want}" if want is not None else f"{name} (no revision recorded)"
                    raise PlanError(f"the plan (polykit {record.polykit}, version-compatible) runs tactic {named}; "
                                    f"polykit {polykit.__version__} has {tactic.versioned_name}",
                                    where=f"{at}: layer {layer.name!r}",
                                    hint="the tactic changed what it computes or the layouts it uses between the "
                                         "versions; rebuild the plan with this polykit (`polykit convert`)")


def check_hardware(plan: Plan, device_arch: str, where: str = "plan") -> None:
    """PlanError when a cuda plan built on another compute capability may not run on `device_arch`
    (the device's, e.g. "sm_80"): it names both, and the level the plan was built for."""
    if not plan.gpu_arch or plan.gpu_arch == device_arch:
        return
    level = plan.compatibility.hardware_level
    least = HARDWARE_LEVELS.get(level)
    if least is None:
        raise PlanError(f"the plan was built for compute capability {plan.gpu_arch}; this GPU is {device_arch}",
                        where=where, hint="rebuild the plan on this GPU, or build it with "
                                          "--hardware-compatibility-level ampere+ to run it on any GPU of compute "
                                          "capability 8.0 and later")
    have = arch_number(device_arch)
    if have is None or have < least:
        raise PlanError(f"the plan was built on {plan.gpu_arch} for hardware compatibility level {level} "
                        f"(compute capability {least // 10}.{least % 10} and later); this GPU is {device_arch}",
                        where=where, hint="rebuild the plan on this GPU")
