"""`polygraphy.comparator.RunResults` as Polygraphy's scripts use it: runner name -> a list of
output dicts (one per iteration), in insertion order; saved and loaded in Polygraphy's format."""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping, Sequence


class RunResults:
    """Polygraphy's RunResults: `add(out_list, runner_name=None)`, `items()`, `save(path)`,
    `RunResults.load(path)`, indexing by runner name."""

    def __init__(self, lst: Sequence[tuple[str, list[Mapping[str, Any]]]] = ()):
        self.lst = [(name, [dict(outs) for outs in its]) for name, its in lst]

    def add(self, out_list: Sequence[Mapping[str, Any]], runtime: float | None = None,
            runner_name: str | None = None) -> None:
        name = runner_name or f"custom_runner_{len(self.lst)}"
        self.lst.append((name, [dict(outs) for outs in out_list]))

    def items(self) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        return iter(self.lst)

    def keys(self) -> list[str]:
        return [name for name, _ in self.lst]

    def __getitem__(self, name: str) -> list[dict[str, Any]]:
        for runner, its in self.lst:
            if runner == name:
                return its
        raise KeyError(name)

    def __len__(self) -> int:
        return len(self.lst)

    def polygraphy_json(self) -> dict[str, Any]:
        from polykit.tools.data.polygraphy_json import encode_run_results

        return encode_run_results(dict(self.lst))

    def save(self, dest: str | os.PathLike) -> None:
        from polykit.compat.polygraphy.json import save_json

        save_json(self, dest, "inference results")

    @staticmethod
    def load(src: str | os.PathLike) -> "RunResults":
        from polykit.tools.data import results_io

        return RunResults(list(results_io.load_outputs(src).items()))
