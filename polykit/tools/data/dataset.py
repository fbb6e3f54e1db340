"""What a data reader gives: a DataSet of DataGroups (name -> numpy array), and the reader
contract the `polykit_data_readers` plugin hook returns (DataReaderSpec). polykit's own
formats (formats.read_saved) give the same records a plugin's reader does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from polykit.errors import DataFileError


@dataclass(frozen=True)
class DataGroup:
    """Tensors that belong together: one feed dict, one runner's outputs of one iteration, or a
    file's arrays (runner and iteration None)."""

    tensors: Mapping[str, Any]
    runner: str | None = None
    iteration: int | None = None

    @property
    def label(self) -> str:
        parts = ([f"runner {self.runner!r}"] if self.runner is not None else []) + \
                ([f"iteration {self.iteration}"] if self.iteration is not None else [])
        return ", ".join(parts)


@dataclass(frozen=True)
class DataSet:
    """What a reader found: `kind` ("feeds", "outputs", "arrays" or the reader's own) and groups.
    A file of per-tensor records rather than arrays (a calibration cache) gives `rows` instead:
    one mapping per tensor, shown as one table, and `notes` (its header's fields)."""

    kind: str
    groups: tuple[DataGroup, ...] = ()
    rows: tuple[Mapping[str, Any], ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class DataReaderSpec:
    """A data format `polykit inspect data` reads: `matches(path)` says whether a file looks like
    it (cheaply: suffix, magic bytes), `read(path)` gives the DataSet (DataFileError if malformed)."""

    name: str
    matches: Callable[[Path], bool]
    read: Callable[[Path], DataSet]
    help: str = ""


def feeds_set(feeds: list[dict[str, Any]]) -> DataSet:
    """Saved inputs: one group per iteration."""
    return DataSet("feeds", tuple(DataGroup(feed, iteration=i) for i, feed in enumerate(feeds)))


def outputs_set(outputs: Mapping[str, list[dict[str, Any]]]) -> DataSet:
    """Saved outputs: one group per runner and iteration."""
    return DataSet("outputs", tuple(DataGroup(outs, runner=runner, iteration=i)
                                    for runner, its in outputs.items() for i, outs in enumerate(its)))


def runnable_array(arr: Any, where: str) -> Any:
    """`arr` when polykit runs its dtype (numbers, booleans, the float types of ml_dtypes);
    DataFileError naming `where` otherwise."""
    from polykit.compiler.plan.schema import DTYPES

    if arr.dtype.kind not in "biuf" and arr.dtype.name not in DTYPES:
        raise DataFileError(f"the array has dtype {arr.dtype}, which polykit does not run", where=where,
                            hint="store numbers or booleans")
    return arr
