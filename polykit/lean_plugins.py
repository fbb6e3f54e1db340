"""The plugin manager of the lean runtime: polykit's hooks without pluggy.

`pip install polykit` (no `toolkit` extra) runs plans with numpy alone, and pluggy is a
toolkit dependency. Running a plan still needs the `polykit_ops` and `polykit_tactics`
hooks (reference kernels, tactic tables), so without pluggy polykit.plugins uses this
stand-in: the same markers (`@hookimpl` sets the attribute pluggy's marker sets), the same
registration by module, and hooks called in pluggy's order (the last registered first).
It covers what polykit calls, not pluggy's whole API: no hook wrappers, no historic hooks,
and `tryfirst`/`trylast` are accepted but not ordered on. A function marked as an
implementation whose name is no hook is an error, as pluggy's check_pending makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

PROJECT = "polykit"


class Marker:
    """`@hookimpl` / `@hookimpl(tryfirst=True)` (and `@hookspec`): marks a function as pluggy's
    marker of project `polykit` does (attribute `polykit_impl` / `polykit_spec`)."""

    def __init__(self, kind: str):
        self.attribute = f"{PROJECT}_{kind}"

    def __call__(self, function: Callable[..., Any] | None = None, **options: Any) -> Any:
        def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
            setattr(fn, self.attribute, dict(options))
            return fn

        return mark(function) if function is not None else mark


@dataclass(frozen=True)
class HookImpl:
    """One implementation of a hook: what polykit reads of pluggy's HookImpl."""

    plugin_name: str
    function: Callable[..., Any]
    argnames: tuple[str, ...]


class HookCaller:
    """The implementations of one hook, in registration order (pluggy's get_hookimpls)."""

    def __init__(self, name: str):
        self.name = name
        self._impls: list[HookImpl] = []

    def get_hookimpls(self) -> list[HookImpl]:
        return list(self._impls)

    def __call__(self, **kwargs: Any) -> list[Any]:
        """Results of the implementations that return one, the last registered first."""
        results = []
        for impl in reversed(self._impls):
            result = impl.function(*[kwargs[arg] for arg in impl.argnames])
            if result is not None:
                results.append(result)
        return results


class LeanPluginManager:
    """pluggy.PluginManager's register / get_plugin / is_registered / hook / check_pending,
    for plugin modules whose hook functions carry the `polykit_impl` marker."""

    def __init__(self, project: str, specs: type):
        self.project_name = project
        self._spec_names = {name for name in vars(specs) if name.startswith(f"{PROJECT}_")}
        self.hook = type("Hooks", (), {})()
        for name in self._spec_names:
            setattr(self.hook, name, HookCaller(name))
        self._plugins: dict[str, Any] = {}
        self._unknown: list[tuple[Any, str]] = []

    def register(self, plugin: Any, name: str) -> str:
        self._plugins[name] = plugin
        for attr in sorted(dir(plugin)):
            fn = getattr(plugin, attr, None)
            if not callable(fn) or not hasattr(fn, f"{PROJECT}_impl"):
                continue
            if attr not in self._spec_names:
                self._unknown.append((plugin, attr))
                continue
            code = fn.__code__
            args = tuple(a for a in code.co_varnames[:code.co_argcount] if a != "self")
            getattr(self.hook, attr)._impls.append(HookImpl(name, fn, args))
        return name

    def get_plugin(self, name: str) -> Any:
        return self._plugins.get(name)

    def get_name(self, plugin: Any) -> str | None:
        return next((n for n, p in self._plugins.items() if p is plugin), None)

    def is_registered(self, plugin: Any) -> bool:
        return any(p is plugin for p in self._plugins.values())

    def check_pending(self) -> None:
        """ValidationError for a marked function that names no hook."""
        if self._unknown:
            plugin, name = self._unknown[0]
            raise ValidationError(plugin, f"unknown hook {name!r} in plugin {self.get_name(plugin) or plugin!r}")


class ValidationError(Exception):
    """pluggy.PluginValidationError's stand-in: `plugin` is the offending plugin."""

    def __init__(self, plugin: Any, message: str):
        super().__init__(message)
        self.plugin = plugin
