"""The plugin contract: pluggy hook specifications for the polykit toolkit.

polykit's own ops (importer, shape rule, reference kernel), tactics, runners, compare
functions, data loaders and CLI subcommands register through these hooks exactly like a
third-party package does; there is no private path. A hook implementation whose name
matches no hook below is a PluginError (pluggy's check_pending), so a misspelt hook fails
loudly instead of being ignored.

Writing a plugin
----------------
A plugin is a module with functions decorated by ``polykit.plugins.hookimpl`` whose names
are the hook names below. polykit finds plugins in three places, in this order:

1. built-ins (``BUILTIN_PLUGINS`` below);
2. the ``polykit`` entry-point group of installed packages, e.g. in pyproject.toml::

       [project.entry-points.polykit]
       my_plugin = "my_package.polykit_plugin"

3. the ``POLYKIT_PLUGINS`` environment variable: comma-separated module names importable
   from ``sys.path`` (no packaging needed), e.g. ``POLYKIT_PLUGINS=my_plugin,other.mod``.

A plugin that cannot be imported is a PluginError (exit code 2) naming the plugin.

Hook implementations must be cheap to call: return specs whose factories import heavy
modules (onnxruntime, your framework) only when called, so ``polykit --help`` stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

from polykit.errors import PolykitError

if TYPE_CHECKING:  # pragma: no cover
    from polykit.backends.base import RunnerSpec
    from polykit.compiler.registry import OpRegistry
    from polykit.kernels.tactics import TacticRegistry
    from polykit.tools.compare_funcs import CompareFuncSpec
    from polykit.tools.data_loader import DataLoaderSpec

PROJECT = "polykit"
ENTRY_POINT_GROUP = "polykit"
ENV_VAR = "POLYKIT_PLUGINS"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Modules that register polykit's own ops, tactics, runners, compare functions, data loaders
#: and commands. An entry whose module does not exist (yet) is skipped silently: optional built-ins.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "polykit.kernels.builtin",
    "polykit.backends.builtin",
    "polykit.tools.builtin",
    "polykit.tools.conformance",
)
_OPTIONAL_BUILTINS = frozenset({"polykit.tools.conformance"})


class PluginError(PolykitError):
    """A plugin module cannot be imported or registers something malformed."""


class HookSpecs:
    """The hooks polykit calls. Each returns a list of specs (or registers commands)."""

    @hookspec
    def polykit_ops(self, registry: "OpRegistry") -> None:
        """Register ops: importers, shape rules and reference kernels.

        ``registry`` is a ``polykit.compiler.registry.OpRegistry`` whose ``importer(op,
        since=, domain=)``, ``shape_rule(*ops, domain=)`` and ``reference(*ops, domain=)``
        are decorators of the functions described in polykit.compiler.registry and
        polykit.kernels.registry. Called once per plugin manager, before the first model is
        imported or built (from the CLI and from Python alike); register module-level
        functions (the same function registered again is a no-op, another one an error).
        """

    @hookspec
    def polykit_tactics(self, registry: "TacticRegistry") -> None:
        """Register tactics of ``registry.target`` ("cpu", "cuda") with ``registry.register``.

        ``registry`` is a ``polykit.kernels.tactics.TacticRegistry``; a tactic is a
        ``polykit.kernels.cpu.base.CpuTactic`` (``run_fn(node, inputs) -> outputs``) or a
        ``polykit.kernels.cuda.base.CudaTactic`` (kernels + enqueue). Called the first time a
        build or a plan needs the target's tactics; import heavy modules only for the target
        asked. A name already taken for that (target, domain, kind) is an error.
        """

    @hookspec
    def polykit_runners(self) -> "list[RunnerSpec]":
        """Return runners a user can select on the command line.

        Each ``polykit.backends.base.RunnerSpec(name, flags, help, factory)`` maps CLI flags
        (e.g. ``("--trt", "--polykit")``) to ``factory(request) -> BaseRunner`` where
        ``request`` is a ``polykit.backends.base.RunnerRequest`` (model path, target, fp16,
        input shapes, providers, outputs to mark, ...). The factory is called only when the
        runner is selected; import heavy modules inside it. Flags must be unique across
        plugins; ``polykit run model.onnx --my-flag`` then runs the returned runner.
        """

    @hookspec
    def polykit_compare_funcs(self) -> "list[CompareFuncSpec]":
        """Return compare functions selectable with ``polykit run --compare NAME``.

        Each ``polykit.tools.compare_funcs.CompareFuncSpec(name, factory, help)`` has
        ``factory(options: CompareOptions) -> fn`` and ``fn(name, reference, actual) ->
        OutputComparison`` (numpy arrays in; the record says passed/failed and the errors).
        """

    @hookspec
    def polykit_data_loaders(self) -> "list[DataLoaderSpec]":
        """Return data loaders selectable with ``polykit run --data-loader NAME``.

        Each ``polykit.tools.data_loader.DataLoaderSpec(name, factory, help)`` has
        ``factory(options: DataLoaderOptions) -> iterable of feed dicts``; the loader may
        also define ``bind(input_metadata)`` to learn the model's inputs before iteration.
        """

    @hookspec
    def polykit_cli_commands(self, app: Any) -> None:
        """Add subcommands to the ``polykit`` typer app (``app`` is a ``typer.Typer``).

        Register with ``@app.command("name")`` or ``app.add_typer(sub, name="name")``.
        Commands raise PolykitError subclasses for bad input; the CLI prints them without a
        traceback and exits with the error's ``exit_code``. A module that already exposes
        ``register(app)`` needs only::

            @hookimpl
            def polykit_cli_commands(app):
                register(app)
        """


def _import_plugin(module: str, source: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PluginError(
            f"cannot import plugin module {module!r}: {exc}",
            where=source,
            hint=f"install the plugin's package or fix {ENV_VAR} / the entry point",
        ) from exc


@dataclass(frozen=True)
class PluginEntryPoint:
    """One `polykit` entry point of an installed distribution: `name = module[:attr]`."""

    name: str
    value: str
    dist: str

    def load(self) -> Any:
        module, _, attr = self.value.partition(":")
        obj = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


def _entry_points() -> list[PluginEntryPoint]:
    """Entry points of group `polykit` from the *.dist-info / *.egg-info folders on sys.path.

    The same lookup importlib.metadata does (first distribution of a name on sys.path wins),
    without importing it: importlib.metadata costs ~10% of `polykit run`'s start-up.
    """
    found: list[PluginEntryPoint] = []
    seen: set[str] = set()
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for folder in names:
            if not folder.endswith((".dist-info", ".egg-info")):
                continue
            dist = folder.rsplit(".", 1)[0].split("-")[0].lower().replace("_", "-").replace(".", "-")
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(entry or ".", folder, "entry_points.txt"), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            found.extend(PluginEntryPoint(n, v, dist) for n, v in _group_entries(text, ENTRY_POINT_GROUP))
    return found


def _group_entries(text: str, group: str) -> list[tuple[str, str]]:
    """`name = value` lines of one [group] section of an entry_points.txt (INI syntax)."""
    entries, current = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == group and "=" in line:
            name, _, value = line.partition("=")
            entries.append((name.strip(), value.strip()))
    return entries


def create_plugin_manager(env: dict[str, str] | None = None) -> pluggy.PluginManager:
    """A plugin manager with built-ins, entry-point plugins and ``POLYKIT_PLUGINS`` loaded."""
    env = os.environ if env is None else env
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(HookSpecs)
    for name in BUILTIN_PLUGINS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if name in _OPTIONAL_BUILTINS and exc.name == name:
                continue
            raise
        if not pm.is_registered(module):
            pm.register(module, name=name)
    for ep in _entry_points():
        try:
            plugin = ep.load()
        except ImportError as exc:
            raise PluginError(
                f"cannot load plugin {ep.name!r} ({ep.value}): {exc}",
                where=f"entry point group {ENTRY_POINT_GROUP!r}",
                hint="reinstall the package that provides it, or uninstall it",
            ) from exc
        if not pm.is_registered(plugin) and pm.get_plugin(ep.name) is None:
            pm.register(plugin, name=ep.name)
    for name in (n.strip() for n in env.get(ENV_VAR, "").split(",")):
        if name and pm.get_plugin(name) is None:
            module = _import_plugin(name, f"${ENV_VAR}")
            if not pm.is_registered(module):
                pm.register(module, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"{exc}", where=f"plugin {pm.get_name(exc.plugin) or exc.plugin!r}",
                          hint="hook implementations must be named after a polykit hook (see polykit.plugins)") from exc
    return pm


_MANAGER: pluggy.PluginManager | None = None


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager (created on first use; a registry filled at plugin load)."""
    global _MANAGER
    if _MANAGER is None:
        _MANAGER = create_plugin_manager()
    return _MANAGER


def reset_plugin_manager() -> None:
    """Forget the process-wide manager, so the next call re-discovers plugins (tests, REPLs)."""
    global _MANAGER
    _MANAGER = None


def _collect(results: list[list[Any]], kind: str) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for specs in results:
        for spec in specs or ():
            if spec.name in table:
                raise PluginError(
                    f"two plugins register a {kind} named {spec.name!r}",
                    hint="uninstall one of them or rename its spec",
                )
            table[spec.name] = spec
    return table


def runner_specs(pm: pluggy.PluginManager | None = None) -> "dict[str, RunnerSpec]":
    """Runner name -> spec, from every registered plugin (built-ins first)."""
    pm = pm or plugin_manager()
    table = _collect(list(reversed(pm.hook.polykit_runners())), "runner")
    seen: dict[str, str] = {}
    for spec in table.values():
        for flag in spec.flags:
            if flag in seen:
                raise PluginError(f"runners {seen[flag]!r} and {spec.name!r} both claim the flag {flag}")
            seen[flag] = spec.name
    return table


def compare_func_specs(pm: pluggy.PluginManager | None = None) -> "dict[str, CompareFuncSpec]":
    pm = pm or plugin_manager()
    return _collect(list(reversed(pm.hook.polykit_compare_funcs())), "compare function")


def data_loader_specs(pm: pluggy.PluginManager | None = None) -> "dict[str, DataLoaderSpec]":
    pm = pm or plugin_manager()
    return _collect(list(reversed(pm.hook.polykit_data_loaders())), "data loader")
