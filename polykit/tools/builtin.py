"""polykit's own compare functions, data loaders, data readers and CLI subcommands, registered
through the same hooks a third-party plugin uses (see polykit.plugins)."""

from __future__ import annotations

import importlib
from typing import Any

from polykit.plugins import hookimpl
from polykit.tools.compare.funcs import CompareFuncSpec, builtin_compare_funcs
from polykit.tools.data.loaders import DataLoaderSpec, builtin_data_loaders


@hookimpl
def polykit_compare_funcs() -> list[CompareFuncSpec]:
    return builtin_compare_funcs()


@hookimpl
def polykit_data_loaders() -> list[DataLoaderSpec]:
    return builtin_data_loaders()


@hookimpl
def polykit_data_readers() -> list[Any]:
    from polykit.tools.data.inspect import builtin_data_readers

    return builtin_data_readers()


@hookimpl
def polykit_cli_commands(app: Any) -> None:
    from polykit.tools.cli import bench, check, convert, data, debug, inspect, refit, run, surgeon

    for command in (run, convert, refit, bench, inspect, surgeon, debug, check, data):
        command.register(app)
    _register_module_commands(app, "polykit.tools.conformance")


def _register_module_commands(app: Any, module_name: str) -> None:
    """A built-in command module that exposes `register(app)` (and no hookimpl of its own)."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return
        raise
    if callable(getattr(module, "register", None)) and not hasattr(module, "polykit_cli_commands"):
        module.register(app)
