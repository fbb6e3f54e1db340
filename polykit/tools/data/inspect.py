"""`polykit inspect data FILE`: what a data file holds, tensor by tensor (per runner and
iteration where it has them): shape, dtype, min/max/mean/std of the finite values, NaN/Inf
counts, a text histogram, and with --show-values the values (numpy's printing, bounded).

Files are read by data readers, a registry filled through the `polykit_data_readers` plugin
hook like runners and data loaders are: built-ins read polykit's and Polygraphy's saved
inputs and outputs, plain .npz archives, lone .npy arrays and INT8 calibration caches (their
scales and thresholds per tensor); another format (a framework's dump) is one DataReaderSpec
more, and this command needs no change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import typer

from polykit.errors import DataFileError, UsageError
from polykit.files import require_file
from polykit.tools.data.dataset import DataGroup, DataReaderSpec, DataSet

#: histogram bins of each tensor; elements --show-values prints before it elides (numpy's threshold)
BINS = 10
VALUES_THRESHOLD = 64


def _saved_data(path: Path) -> DataSet:
    from polykit.tools.data.formats import read_saved

    return read_saved(path)[1]


def _npy_file(path: Path) -> DataSet:
    from polykit.npy_io import read_npy

    path = require_file(path, "data file", DataFileError)
    with open(path, "rb") as fh:
        return DataSet("arrays", (DataGroup({path.stem: read_npy(fh, path.stat().st_size, str(path))}),))


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(magic)) == magic
    except OSError:
        return False


def _calibration_cache(path: Path) -> DataSet:
    """Per tensor its INT8 scale and the threshold it implies (|x| that maps to 127), widest first."""
    from polykit.compiler.builder.calibration_cache import read_calibration_cache

    cache = read_calibration_cache(path)
    order = sorted(cache.scales.items(), key=lambda item: (-item[1], item[0]))
    rows = tuple({"tensor": name, "scale": scale, "scale_hex": float(scale).hex(), "threshold": 127.0 * scale}
                 for name, scale in order)
    return DataSet("calibration cache", rows=rows,
                   notes={"calibrator": cache.calibrator, "polykit_version": cache.polykit_version})


def builtin_data_readers() -> list[DataReaderSpec]:
    from polykit.compiler.builder.calibration_cache import MAGIC
    from polykit.npy_io import NPY_MAGIC

    return [
        DataReaderSpec("saved", lambda p: p.is_dir() or p.suffix in (".npz", ".json"), _saved_data,
                       "saved inputs/outputs: polykit's .npz/.json, Polygraphy's JSON file or folder, a plain .npz"),
        DataReaderSpec("npy", lambda p: p.suffix == ".npy" or _starts_with(p, NPY_MAGIC), _npy_file,
                       "one numpy .npy array"),
        DataReaderSpec("calibration-cache", lambda p: p.is_file() and _starts_with(p, MAGIC.encode()),
                       _calibration_cache, "polykit's INT8 calibration cache: scale and threshold per tensor"),
    ]


def read_data(path: str | Path, reader: str | None = None,
              specs: Mapping[str, DataReaderSpec] | None = None) -> tuple[str, DataSet]:
    """(reader name, DataSet) of `path`: the reader named, else the first that matches it
    (plugins' readers before the built-ins, so a plugin may claim a suffix they read)."""
    from polykit.plugins import data_reader_specs

    path = Path(path)
    specs = data_reader_specs() if specs is None else specs
    if reader is not None:
        if reader not in specs:
            raise UsageError(f"unknown data reader {reader!r}", hint=f"use one of: {', '.join(specs)}")
        return reader, specs[reader].read(path)
    if not path.exists():
        require_file(path, "data file", DataFileError)
    for name, spec in reversed(list(specs.items())):
        if spec.matches(path):
            return name, spec.read(path)
    raise DataFileError("no data reader recognizes the file", where=str(path),
                        hint=f"name one with --reader ({', '.join(specs)}), or give an .npz, .npy or .json file")


@dataclass(frozen=True)
class TensorStats:
    """One tensor's summary; statistics over its finite values (None when it has none)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int
    #: histogram of the finite values: BINS + 1 edges and BINS counts
    edges: tuple[float, ...] = ()
    counts: tuple[int, ...] = field(default=())


#: elements one step of tensor_stats widens to float64: memory beyond the array stays ~32 MiB
STATS_CHUNK = 1 << 22


def tensor_stats(name: str, array: Any, bins: int = BINS) -> TensorStats:
    """Statistics of `array` computed chunk by chunk, so a tensor of a GiB costs its own bytes and
    not eight times them in float64 copies (a 1 MB .npz can hold a GiB of zeros)."""
    import numpy as np

    from polykit.tools.compare.funcs import is_float_dtype

    arr = np.asarray(array)
    if not (arr.dtype.kind in "biu" or is_float_dtype(arr.dtype)):
        raise DataFileError(f"tensor {name!r} has dtype {arr.dtype}, which has no statistics",
                            hint="inspect numeric data (numbers or booleans)")
    flat = arr.reshape(-1)
    chunks = [flat[i:i + STATS_CHUNK].astype(np.float64) for i in range(0, flat.size, STATS_CHUNK)] \
        if flat.size <= STATS_CHUNK else None

    def each():  # the finite float64 values chunk by chunk, and the chunk's NaN / Inf counts
        for i in range(0, flat.size, STATS_CHUNK):
            values = chunks[i // STATS_CHUNK] if chunks is not None else flat[i:i + STATS_CHUNK].astype(np.float64)
            ok = np.isfinite(values)
            yield values[ok], int(np.isnan(values).sum()), int((~ok).sum()) - int(np.isnan(values).sum())

    nan = inf = count = 0
    low, high, total = np.inf, -np.inf, 0.0
    for finite, n_nan, n_inf in each():
        nan, inf, count = nan + n_nan, inf + n_inf, count + finite.size
        if finite.size:
            low, high, total = min(low, finite.min()), max(high, finite.max()), total + finite.sum()
    if not count:
        return TensorStats(name, arr.dtype.name, tuple(arr.shape), None, None, None, None, nan, inf)
    mean = total / count
    squares, counts, edges = 0.0, np.zeros(bins, np.int64), None
    for finite, _, _ in each():
        squares += float(((finite - mean) ** 2).sum())
        got, edges = np.histogram(finite, bins=bins, range=(low, high))
        counts += got
    return TensorStats(name, arr.dtype.name, tuple(arr.shape), float(low), float(high), float(mean),
                       float(np.sqrt(squares / count)), nan, inf,
                       tuple(float(e) for e in edges), tuple(int(c) for c in counts))


def format_values(array: Any) -> str:
    """numpy's printing of `array`, eliding the middle past VALUES_THRESHOLD elements."""
    import numpy as np

    return np.array2string(np.asarray(array), threshold=VALUES_THRESHOLD, edgeitems=3, max_line_width=120)


def describe_data(path: str | Path, reader: str | None = None, show_values: bool = False) -> dict[str, Any]:
    """A JSON-able description of a data file: reader, kind and every group's tensor statistics."""
    from dataclasses import asdict

    name, dataset = read_data(path, reader)
    if dataset.rows:
        return {"file": str(path), "reader": name, "kind": dataset.kind, **dict(dataset.notes),
                "rows": [dict(row) for row in dataset.rows]}
    groups = []
    for group in dataset.groups:
        tensors = []
        for tensor, array in group.tensors.items():
            row = asdict(tensor_stats(tensor, array))
            row["shape"], row["edges"], row["counts"] = list(row["shape"]), list(row["edges"]), list(row["counts"])
            if show_values:
                row["values"] = format_values(array)
            tensors.append(row)
        groups.append({"runner": group.runner, "iteration": group.iteration, "tensors": tensors})
    return {"file": str(path), "reader": name, "kind": dataset.kind, "groups": groups}


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def histogram_lines(edges: Sequence[float], counts: Sequence[int], width: int = 40) -> list[str]:
    """One line per bin: its range, a bar scaled to the fullest bin, its count."""
    top = max(counts, default=0) or 1
    return [f"  [{_g(lo):>10}, {_g(hi):>10}) {'█' * math.ceil(width * c / top):<{width}} {c}"
            for lo, hi, c in zip(edges, edges[1:], counts)]


def data(
    path: str = typer.Argument(..., metavar="FILE", help="saved inputs/outputs (.npz, .json, a Polygraphy folder), "
                                                        ".npy, or a calibration cache"),
    show_values: bool = typer.Option(False, "--show-values", help=f"print the values too (numpy's printing; past "
                                                                  f"{VALUES_THRESHOLD} elements the middle is elided)"),
    reader: Optional[str] = typer.Option(None, "--reader", help="read the file with this data reader (default: by its "
                                                                "suffix and contents)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    info = describe_data(path, reader, show_values)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return 0
    console = Console(highlight=False)
    if "rows" in info:
        _print_rows(console, info)
        return 0
    count = sum(len(g["tensors"]) for g in info["groups"])
    console.print(f"[bold]{escape(info['kind'])}[/] {escape(path)} (reader {info['reader']}): "
                  f"{len(info['groups'])} group(s), {count} tensor(s)")
    for group in info["groups"]:
        label = DataGroup({}, group["runner"], group["iteration"]).label
        table = Table(title=escape(label) or None, title_justify="left")
        for col in ("tensor", "dtype", "shape", "min", "max", "mean", "std", "NaN", "Inf"):
            table.add_column(col, justify="left" if col in ("tensor", "dtype", "shape") else "right", overflow="fold")
        for t in group["tensors"]:
            table.add_row(escape(t["name"]), t["dtype"], str(t["shape"]), _g(t["min"]), _g(t["max"]), _g(t["mean"]),
                          _g(t["std"]), str(t["nan"]), str(t["inf"]))
        console.print(table)
        for t in group["tensors"]:
            console.print(f"{escape(t['name'])}: " + ("histogram of the finite values" if t["counts"] else "no finite values"))
            for line in histogram_lines(t["edges"], t["counts"]):
                console.print(line)
            if show_values:
                console.print(escape(t["values"]), soft_wrap=True)
    return 0


def _print_rows(console: Any, info: Mapping[str, Any]) -> None:
    """A reader's per-tensor records as one table (numbers to 6 significant digits), its notes above."""
    from rich.markup import escape
    from rich.table import Table

    notes = ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("file", "reader", "kind", "rows"))
    console.print(f"[bold]{escape(info['kind'])}[/] {escape(info['file'])} (reader {info['reader']}): "
                  f"{len(info['rows'])} tensor(s){', ' + escape(notes) if notes else ''}")
    table = Table()
    columns = list(info["rows"][0])
    for col in columns:
        table.add_column(col, justify="right" if isinstance(info["rows"][0][col], float) else "left", overflow="fold")
    for row in info["rows"]:
        table.add_row(*(f"{v:.6g}" if isinstance(v, float) else escape(str(v)) for v in row.values()))
    console.print(table)
