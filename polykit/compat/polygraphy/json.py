"""`polygraphy.json`: save_json / load_json in Polygraphy's JSON format (arrays as base64 .npy,
marked "polygraphy_class": "ndarray"), written and read by polykit.tools.data."""

from __future__ import annotations

import json
import os
from typing import Any

TYPE_MARKER = "polygraphy_class"


def to_json(obj: Any) -> str:
    """Polygraphy's JSON text of `obj`: arrays, feed dicts, lists of them, RunResults, plain values."""
    return json.dumps(_encode(obj), indent=4)


def save_json(obj: Any, dest: str | os.PathLike, description: str | None = None) -> None:
    from polykit.files import write_text

    write_text(dest, to_json(obj), description or "JSON file")


def load_json(src: str | os.PathLike, description: str | None = None) -> Any:
    """What save_json wrote: saved inputs (Polygraphy's or polykit's) come back as a list of
    feed dicts of numpy arrays, outputs as a RunResults; other JSON as it is."""
    from pathlib import Path

    from polykit.compat.polygraphy.comparator import RunResults
    from polykit.errors import PolykitError
    from polykit.tools.data import polygraphy_json, results_io

    doc = json.loads(Path(src).read_text(encoding="utf-8"))
    if polygraphy_json.polygraphy_class(doc) == "RunResults":
        return RunResults.load(src)
    try:
        return results_io.load_feeds(src)  # Polygraphy's saved inputs, or polykit's
    except PolykitError:
        return doc


def _encode(obj: Any) -> Any:
    import numpy as np

    from polykit.tools.data.polygraphy_json import encode_array

    if hasattr(obj, "polygraphy_json"):
        return obj.polygraphy_json()
    if isinstance(obj, np.ndarray) or isinstance(obj, np.generic):
        return encode_array(obj)
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    return obj
