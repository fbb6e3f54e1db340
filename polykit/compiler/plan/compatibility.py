"""Where a plan may load: the polykit version and tactic set that built it, and the promises its
build made (TensorRT's version- and hardware-compatible engines; Polygraphy's spellings).

The file header records the polykit version, the format version, the target and (cuda) the
compute capability (`gpu_arch`, e.g. "sm_90"); the document's `compatibility` record adds:

- `tactic_set`: a digest of polykit's own tactics of the target (polykit.kernels.tactics.tactic_set);
- `version_compatible` (`--version-compatible`): the plan names each tactic with its revision
  (`tactics`: name -> revision). A tactic's revision covers what it computes and the layouts it
  reads, writes and packs its weights in, and a cuda plan's kernels are regenerated from the
  tactics anyway, so another polykit version loads the plan where every tactic has the same
  revision there (and the same parameters: polykit.runtime.tactic_check) and recompiles its
  kernels from its own sources. A plan built without it loads only with the polykit version
  that built it;
- `hardware_compatibility_level` (`--hardware-compatibility-level`): "none" (the plan runs on
  the compute capability it was built on) or "ampere+" (its tactics are only those that run on
  every GPU of compute capability 8.0 and later: no sm_90-only wgmma/TMA tactics).

The checks against the running polykit and device are the runtime's (polykit.runtime.compatibility).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import polykit
from polykit.compiler.plan.schema import Field, Invalid, integer, map_of, one_of, text
from polykit.errors import PlanError

#: hardware-compatibility level -> the lowest compute capability it runs on (None: the build's own)
HARDWARE_LEVELS: dict[str, int | None] = {"none": None, "ampere+": 80}


def _flag(value: Any, path: str) -> None:
    if type(value) is not bool:
        raise Invalid(path, f"must be true or false, not {value!r}"[:120])


COMPATIBILITY_FIELDS = (
    Field("tactic_set", text(re.compile(r"[0-9a-f]{1,64}"), empty=True)),
    Field("version_compatible", _flag),
    Field("hardware_compatibility_level", one_of(HARDWARE_LEVELS)),
    Field("tactics", map_of(integer(0, 1 << 31)), required=False),
)


@dataclass(frozen=True)
class Compatibility:
    """A plan's compatibility record (`polykit` is the file header's version)."""

    polykit: str = ""
    tactic_set: str = ""
    version_compatible: bool = False
    hardware_level: str = "none"
    #: versioned names of a version-compatible plan's tactics: tactic name -> revision
    tactics: Mapping[str, int] = field(default_factory=dict, hash=False)

    @property
    def foreign(self) -> bool:
        """Whether another polykit version built the plan (loaded: then a version-compatible one)."""
        return self.polykit != polykit.__version__

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tactic_set": self.tactic_set, "version_compatible": self.version_compatible,
                             "hardware_compatibility_level": self.hardware_level}
        if self.tactics:
            d["tactics"] = dict(sorted(self.tactics.items()))
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any] | None, polykit: str) -> "Compatibility":
        """The record of a checked document (None: a plan written before plans had one)."""
        if d is None:
            return Compatibility(polykit)
        return Compatibility(polykit, d["tactic_set"], d["version_compatible"], d["hardware_compatibility_level"],
                             dict(d.get("tactics", {})))


def check_version(written_by: str, doc: Any, where: str = "plan") -> None:
    """PlanError when another polykit version wrote the plan and did not build it version-compatible
    (run on the document before its schema check: a newer version's document may not pass it)."""
    if written_by == polykit.__version__:
        return
    record = doc.get("compatibility") if isinstance(doc, dict) else None
    if isinstance(record, dict) and record.get("version_compatible") is True:
        return
    raise PlanError(f"the plan was built by polykit {written_by or '(unknown)'}; this is polykit {polykit.__version__}, "
                    "which loads only its own plans and version-compatible ones", where=where,
                    hint="rebuild the plan with this polykit (`polykit convert`), or build it with --version-compatible")


def arch_number(arch: str) -> int | None:
    """80 for "sm_80" (and "sm_90a"'s 90); None for "" or anything else."""
    m = re.fullmatch(r"sm_([0-9]{2,3})a?", arch or "")
    return int(m.group(1)) if m else None
