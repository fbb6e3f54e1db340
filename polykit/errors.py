"""The one PolykitError hierarchy.

Every error raised because of user input (a model, a plan, a flag, a feed) is a
PolykitError whose message says what went wrong, where (node, layer, tensor, file)
and what to do. The CLI prints these without a traceback and exits with `exit_code`.
"""

from __future__ import annotations


class PolykitError(Exception):
    """Base of every error polykit raises on bad input or an unusable environment."""

    exit_code = 2

    def __init__(self, what: str, *, where: str | None = None, hint: str | None = None):
        self.what = what
        self.where = where
        self.hint = hint
        super().__init__(self._format())

    def _format(self) -> str:
        text = self.what
        if self.where:
            text = f"{self.where}: {text}"
        if self.hint:
            text = f"{text}\n  hint: {self.hint}"
        return text


class ModelLoadError(PolykitError):
    """The model file or protobuf cannot be read (missing, malformed, external data missing)."""


class UnsupportedModelError(PolykitError):
    """The model uses ops polykit does not implement; lists every such node at once."""

    def __init__(self, unsupported: list[tuple[str, str, str, int]], *, where: str | None = None):
        self.unsupported = unsupported
        lines = [f"  - node {name!r}: {op} (domain {dom or 'ai.onnx'!r}, opset {ver})" for name, op, dom, ver in unsupported]
        super().__init__(
            f"{len(unsupported)} node(s) use ops polykit does not support:\n" + "\n".join(lines),
            where=where,
            hint="remove or replace these nodes (polykit surgeon), or register the op through a plugin",
        )


class GraphError(PolykitError):
    """The graph is structurally invalid: dangling names, cycles, duplicate outputs."""


class NodeAttributeError(PolykitError):
    """A node attribute is missing, of the wrong type or out of range."""


class ShapeError(PolykitError):
    """Shape or dtype inference found inconsistent shapes (broadcast, rank, dtype mismatch)."""


class PlanError(PolykitError):
    """A plan file is truncated, corrupt, of a foreign format version or for another target."""


class BuildError(PolykitError):
    """The builder cannot lower the graph into a plan (dynamic shapes left, no tactic)."""


class RuntimeInputError(PolykitError):
    """Feeds given to an execution context do not match the engine's inputs."""


class DeviceError(PolykitError):
    """No usable GPU, out of device memory, a failed launch or kernel compilation."""


class DataFileError(PolykitError):
    """Saved inputs/outputs or another data file polykit reads is unreadable or malformed."""


class UsageError(PolykitError):
    """A command-line flag or API argument is malformed."""


class LimitError(PolykitError):
    """A model or run needs more than a limit of polykit.limits allows (loop iterations, memory);
    the hint names the limit and how to raise it."""


class AccuracyError(PolykitError):
    """A comparison between runners failed its tolerances."""

    exit_code = 1



class RankError(PolykitError):
    """A rank of a distributed run failed, timed out or disagrees with the others; names the rank."""
