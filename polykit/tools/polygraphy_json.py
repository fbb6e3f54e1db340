"""Reading Polygraphy's JSON files (`polygraphy run --save-inputs/--save-outputs`), so saved
Polygraphy data can feed and check polykit runs.

Polygraphy's encoder (polygraphy/json/serde.py) tags each object with its class under
"polygraphy_class" (older versions: a key "__polygraphy_encoded_<class>"):
  ndarray          {"array": base64 of the .npy file's bytes}  (oldest: the bytes as latin-1 text;
                   the oldest versions' .npz-in-JSON arrays are not read)
  LazyArray        {"values": <ndarray>}                       (alias LazyNumpyArray)
  IterationResult  {"outputs": {name: <array>}, "runtime": s, "runner_name": str}
  RunResults       {"lst": [[runner name, [<IterationResult>, ...]], ...]}
Inputs are a list of feed dicts {name: <ndarray>}. Arrays are read with numpy's .npy reader
and allow_pickle=False: a file that holds objects is refused, never unpickled.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any, Callable

from polykit.errors import DataFileError
from polykit.tools.npy_io import read_npy

TYPE_MARKER = "polygraphy_class"
LEGACY_PREFIX = "__polygraphy_encoded_"


def polygraphy_class(value: Any) -> str | None:
    """The Polygraphy class a decoded JSON value encodes, or None for a plain value."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get(TYPE_MARKER), str):
        return value[TYPE_MARKER]
    legacy = [k[len(LEGACY_PREFIX):] for k in value if isinstance(k, str) and k.startswith(LEGACY_PREFIX)]
    return legacy[0] if legacy else None


def decode(value: Any, where: str) -> Any:
    """The array (or dict/list of arrays) a Polygraphy-encoded value holds."""
    cls = polygraphy_class(value)
    decoder = _DECODERS.get(cls or "")
    if decoder is None:
        raise DataFileError(f"Polygraphy class {cls!r} is not one polykit reads", where=where,
                            hint="polykit reads Polygraphy's saved inputs (ndarray) and outputs (RunResults)")
    return decoder(value, where)


def _field(value: dict, key: str, where: str) -> Any:
    if key not in value:
        raise DataFileError(f"the Polygraphy {polygraphy_class(value)} object has no {key!r}", where=where)
    return value[key]


def _ndarray(value: dict, where: str) -> Any:
    text = _field(value, "array", where)
    if not isinstance(text, str):
        raise DataFileError("a Polygraphy array's 'array' is not a string", where=where)
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        try:
            raw = text.encode("latin-1")  # Polygraphy's oldest encoding
        except UnicodeEncodeError:
            raise DataFileError("a Polygraphy array is neither base64 nor latin-1 text", where=where) from None
    if not raw.startswith(b"\x93NUMPY"):
        raise DataFileError("a Polygraphy array does not decode: its data is not .npy bytes", where=where,
                            hint="polykit reads arrays Polygraphy saved with numpy's .npy format")
    return read_npy(io.BytesIO(raw), len(raw), where)


def _lazy_array(value: dict, where: str) -> Any:
    return decode(_field(value, "values", where), where)


def _iteration_result(value: dict, where: str) -> dict[str, Any]:
    outputs = _field(value, "outputs", where)
    if not isinstance(outputs, dict):
        raise DataFileError("a Polygraphy IterationResult's outputs are not a name -> array object", where=where)
    return {name: decode(v, f"{where}: output {name!r}") for name, v in outputs.items()}


def _run_results(value: dict, where: str) -> dict[str, list[dict[str, Any]]]:
    entries = _field(value, "lst", where)
    out: dict[str, list[dict[str, Any]]] = {}
    for i, entry in enumerate(entries if isinstance(entries, list) else [None]):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], list)):
            raise DataFileError(f"entry {i} of a Polygraphy RunResults is not [runner name, [results...]]", where=where)
        runner, iterations = entry
        name = runner if runner not in out else f"{runner}-{len(out)}"
        out[name] = [_outputs(decode(it, f"{where}: runner {runner!r}"), f"{where}: runner {runner!r}")
                     for it in iterations]
    return out


def _outputs(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataFileError("a Polygraphy RunResults iteration is not an IterationResult", where=where)
    return value


_DECODERS: dict[str, Callable[[dict, str], Any]] = {
    "ndarray": _ndarray,
    "LazyArray": _lazy_array,
    "LazyNumpyArray": _lazy_array,
    "IterationResult": _iteration_result,
    "RunResults": _run_results,
}
