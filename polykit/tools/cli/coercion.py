"""Fast value coercion for the CLI's plain option types (start-up budget).

typer >= 0.2x coerces every non-flag parameter through a pydantic TypeAdapter, which imports
pydantic and builds an adapter per option: about a third of `polykit run m.onnx --onnxrt`'s
start-up (measured in docs/PERFORMANCE.md, "Start-up"). polykit's options are all str, int,
float, bool, Optional[...] or List[...] of those, which need no pydantic. `install()` makes
typer coerce exactly those annotations with plain Python and leaves every other annotation
(e.g. a plugin's Enum or Path option) to typer's own machinery.

This touches a private typer hook (`typer.core.build_runtime_param`); if a typer version
lacks it, `install()` does nothing and typer's default coercion runs (slower, same results).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

_PLAIN = (str, int, float, bool)
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


def _leaf_type(annotation: Any) -> Any:
    """str/int/float/bool for plain, Optional[plain], List[plain] and Optional[List[plain]]; else None."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if annotation in _PLAIN:
        return annotation
    if origin is typing.Union and len(args) == 1:
        return _leaf_type(args[0])
    if origin is list and len(args) == 1 and args[0] in _PLAIN:
        return args[0]
    return None


def _convert(leaf: type, value: Any) -> Any:
    if isinstance(value, leaf) and not (leaf is int and isinstance(value, bool)):
        return value
    text = str(value).strip()
    if leaf is bool:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{value!r} is not a valid boolean")
    if leaf is int:
        try:
            return int(text, 10)
        except ValueError:
            raise ValueError(f"{value!r} is not a valid integer") from None
    if leaf is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a valid number") from None
    return str(value)


def install() -> None:
    """Route typer's coercion of plain annotations through `_convert` (idempotent)."""
    try:
        import typer
        import typer.core as core
        from typer._coercion import RuntimeParam
    except ImportError:  # pragma: no cover - another typer layout: keep its default coercion
        return
    original = getattr(core, "build_runtime_param", None)
    if original is None or getattr(original, "_polykit_plain", False):
        return

    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        leaf: type = str

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                if isinstance(value, (list, tuple)):
                    return [_convert(self.leaf, v) for v in value]
                return _convert(self.leaf, value)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), ctx=ctx, param=param) from None

    def build_runtime_param(descriptor: Any) -> Any:
        info = descriptor.parameter_info
        leaf = _leaf_type(descriptor.annotation)
        plain = (leaf is not None and descriptor.file_annotation is None and getattr(info, "parser", None) is None
                 and getattr(info, "click_type", None) is None and not _has_constraints(info))
        if not plain:
            return original(descriptor)
        return PlainRuntimeParam(parameter_info=info, annotation=descriptor.annotation, leaf=leaf)

    build_runtime_param._polykit_plain = True  # type: ignore[attr-defined]
    core.build_runtime_param = build_runtime_param


def _has_constraints(info: Any) -> bool:
    """min/max/clamp and the like need typer's validating coercion."""
    return any(getattr(info, name, None) not in (None, False) for name in ("min", "max", "clamp", "min_open", "max_open"))
