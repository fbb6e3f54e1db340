"""The plugin contract: pluggy hook specifications for the polykit toolkit.

polykit's own ops (importer, shape rule, reference kernel), tactics, runners, compare
functions, data loaders, data readers and CLI subcommands register through these hooks
exactly like a third-party package does; there is no private path. A hook implementation
whose name matches no hook below is a PluginError (pluggy's check_pending), so a misspelt
hook fails loudly instead of being ignored.

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

A plugin that cannot be imported, fails to register, raises in a hook or registers
something malformed is skipped with a warning naming it and the error, so commands that
do not need it still work; with ``--strict-plugins`` (``create_plugin_manager(strict=True)``)
it is a PluginError (exit code 2) instead. polykit calls each plugin's hook implementation
on its own (``PolykitPluginManager.call_each``) so one failing plugin does not hide the others.

Hook implementations must be cheap to call: return specs whose factories import heavy
modules (onnxruntime, your framework) only when called, so ``polykit --help`` stays fast.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from polykit.errors import PolykitError

try:
    import pluggy
except ImportError:  # the lean runtime (no `toolkit` extra): polykit's hooks without pluggy
    pluggy = None

if TYPE_CHECKING:  # pragma: no cover
    from polykit.backends.base import RunnerSpec
    from polykit.compiler.ops.registry import OpRegistry
    from polykit.kernels.tactics import TacticRegistry
    from polykit.tools.compare.funcs import CompareFuncSpec
    from polykit.tools.data.loaders import DataLoaderSpec
    from polykit.tools.data.dataset import DataReaderSpec

log = logging.getLogger("polykit")

PROJECT = "polykit"
ENTRY_POINT_GROUP = "polykit"
ENV_VAR = "POLYKIT_PLUGINS"

if pluggy is not None:
    hookspec = pluggy.HookspecMarker(PROJECT)
    hookimpl = pluggy.HookimplMarker(PROJECT)
    _Manager: type = pluggy.PluginManager
    _ValidationError: type[Exception] = pluggy.PluginValidationError
else:
    from polykit import lean_plugins

    hookspec = lean_plugins.Marker("spec")
    hookimpl = lean_plugins.Marker("impl")
    _Manager = lean_plugins.LeanPluginManager
    _ValidationError = lean_plugins.ValidationError

#: Modules that register polykit's own ops, tactics, runners, compare functions, data loaders
#: and commands. An entry whose module does not exist (yet) is skipped silently: optional built-ins.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "polykit.kernels.builtin",
    "polykit.backends.builtin",
    "polykit.tools.builtin",
    "polykit.compat.builtin",
    "polykit.tools.conformance",
)
_OPTIONAL_BUILTINS = frozenset({"polykit.tools.conformance"})
#: what `pip install polykit[toolkit]` adds to the lean runtime: a built-in plugin that needs one
#: of them (the runners, the CLI's tools) is left out where it is not installed
TOOLKIT_MODULES = frozenset({"onnx", "onnxruntime", "pluggy", "typer", "rich"})


class PluginError(PolykitError):
    """A plugin module cannot be imported or registers something malformed."""


class HookSpecs:
    """The hooks polykit calls. Each returns a list of specs (or registers commands)."""

    @hookspec
    def polykit_ops(self, registry: "OpRegistry") -> None:
        """Register ops: importers, shape rules and reference kernels.

        ``registry`` is a ``polykit.compiler.ops.registry.OpRegistry`` whose ``importer(op,
        since=, domain=)``, ``shape_rule(*ops, domain=)`` and ``reference(*ops, domain=)``
        are decorators of the functions described in polykit.compiler.ops.registry and
        polykit.compiler.ops.references. Called once per plugin manager, before the first model is
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

        Each ``polykit.tools.compare.funcs.CompareFuncSpec(name, factory, help)`` has
        ``factory(options: CompareOptions) -> fn`` and ``fn(name, reference, actual) ->
        OutputComparison`` (numpy arrays in; the record says passed/failed and the errors).
        """

    @hookspec
    def polykit_data_loaders(self) -> "list[DataLoaderSpec]":
        """Return data loaders selectable with ``polykit run --data-loader NAME``.

        Each ``polykit.tools.data.loaders.DataLoaderSpec(name, factory, help)`` has
        ``factory(options: DataLoaderOptions) -> iterable of feed dicts``; the loader may
        also define ``bind(input_metadata)`` to learn the model's inputs before iteration.
        """

    @hookspec
    def polykit_data_readers(self) -> "list[DataReaderSpec]":
        """Return readers of data file formats for ``polykit inspect data FILE`` (``--reader NAME``).

        Each ``polykit.tools.data.dataset.DataReaderSpec(name, matches, read, help)`` has
        ``matches(path) -> bool`` (a cheap look: suffix, magic bytes) and ``read(path) ->
        DataSet`` (groups of name -> numpy array; a DataFileError for a malformed file). A
        plugin's reader is asked before the built-ins, so it may claim a suffix they read.
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


class PolykitPluginManager(_Manager):
    """polykit's plugin manager: a plugin that fails is skipped with a warning, or is a
    PluginError when `strict`. Built on pluggy's, or without pluggy installed (the lean
    runtime) on polykit.lean_plugins' stand-in, which calls the same hooks."""

    def __init__(self, strict: bool = False):
        if pluggy is not None:
            super().__init__(PROJECT)
            self.add_hookspecs(HookSpecs)
        else:
            super().__init__(PROJECT, HookSpecs)
        self.strict = strict
        self._warned: set[str] = set()  # hooks run more than once per command: warn once
        self._versions: dict[str, str] = {}  # plugin name -> its distribution's version

    def plugin_version(self, name: str) -> str:
        """The version of plugin `name`: its installed distribution's (an entry-point plugin), else
        its module's `__version__` ("" when it states none). A plan records it beside the plugin's
        tactics, so loading the plan with another version of the plugin is refused."""
        if name in self._versions:
            return self._versions[name]
        version = getattr(self.get_plugin(name), "__version__", "")
        return version if isinstance(version, str) else ""

    def is_builtin(self, name: str) -> bool:
        """Whether plugin `name` is part of polykit (BUILTIN_PLUGINS): versioned with polykit itself."""
        return name in BUILTIN_PLUGINS

    def plugin_failed(self, plugin: str, what: str, exc: BaseException | None = None, hint: str | None = None) -> None:
        """Report that `plugin` failed (`what`, e.g. "cannot be imported"): PluginError when
        strict, else a warning (the caller then skips the plugin's contribution)."""
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        error = PluginError(f"plugin {plugin!r} {what}{detail}",
                            hint=hint or "fix or uninstall the plugin; without --strict-plugins polykit skips it")
        if self.strict:
            raise error from exc
        if error.what not in self._warned:
            self._warned.add(error.what)
            log.warning("%s (skipped; --strict-plugins makes this an error)", error.what)

    def register_module(self, name: str, load: Callable[[], Any], source: str, version: str = "") -> None:
        """Import a plugin with `load()` and register it under `name` (`version`: its distribution's);
        failures go to plugin_failed."""
        try:
            plugin = load()
            if not self.is_registered(plugin) and self.get_plugin(name) is None:
                self.register(plugin, name=name)
                if version:
                    self._versions[name] = version
        except Exception as exc:  # an import error, or anything the plugin's module raises
            self.plugin_failed(name, f"cannot be loaded ({source})", exc,
                               hint=f"install the plugin's package, or fix {ENV_VAR} / the entry point")

    def call_each(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """(plugin name, result) of every implementation of a hook, in pluggy's calling order;
        an implementation that raises goes to plugin_failed and gives no result."""
        results = []
        for impl in reversed(getattr(self.hook, hook_name).get_hookimpls()):
            try:
                result = impl.function(*[kwargs[arg] for arg in impl.argnames])
            except Exception as exc:  # whatever a plugin's hook raises
                self.plugin_failed(impl.plugin_name, f"failed in hook {hook_name}", exc)
                continue
            if result is not None:
                results.append((impl.plugin_name, result))
        return results


@dataclass(frozen=True)
class PluginEntryPoint:
    """One `polykit` entry point of an installed distribution: `name = module[:attr]`."""

    name: str
    value: str
    dist: str
    version: str = ""

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
            stem = folder.rsplit(".", 1)[0].split("-")
            dist = stem[0].lower().replace("_", "-").replace(".", "-")
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(entry or ".", folder, "entry_points.txt"), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            version = stem[1] if len(stem) > 1 else ""
            found.extend(PluginEntryPoint(n, v, dist, version) for n, v in _group_entries(text, ENTRY_POINT_GROUP))
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


def create_plugin_manager(env: dict[str, str] | None = None, strict: bool = False) -> PolykitPluginManager:
    """A plugin manager with built-ins, entry-point plugins and ``POLYKIT_PLUGINS`` loaded."""
    env = os.environ if env is None else env
    pm = PolykitPluginManager(strict=strict)
    for name in BUILTIN_PLUGINS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if name in _OPTIONAL_BUILTINS and exc.name == name:
                continue
            if (exc.name or "").split(".")[0] in TOOLKIT_MODULES:
                log.debug("built-in plugin %s left out: %s is not installed (polykit[toolkit])", name, exc.name)
                continue
            raise
        if not pm.is_registered(module):
            pm.register(module, name=name)
    for ep in _entry_points():
        pm.register_module(ep.name, ep.load, f"entry point {ep.value!r} of {ep.dist}", ep.version)
    for name in (n.strip() for n in env.get(ENV_VAR, "").split(",")):
        if name and pm.get_plugin(name) is None:
            pm.register_module(name, lambda name=name: importlib.import_module(name), f"${ENV_VAR}")
    try:
        pm.check_pending()
    except _ValidationError as exc:
        raise PluginError(f"{exc}", where=f"plugin {pm.get_name(exc.plugin) or exc.plugin!r}",
                          hint="hook implementations must be named after a polykit hook (see polykit.plugins)") from exc
    return pm


_MANAGER: PolykitPluginManager | None = None


def plugin_manager(strict: bool | None = None) -> PolykitPluginManager:
    """The process-wide plugin manager (created on first use; a registry filled at plugin load).
    `strict` (the CLI's --strict-plugins) re-creates it when it was made with the other setting."""
    global _MANAGER
    if _MANAGER is None or (strict is not None and _MANAGER.strict != strict):
        _MANAGER = create_plugin_manager(strict=bool(strict))
    return _MANAGER


def reset_plugin_manager() -> None:
    """Forget the process-wide manager, so the next call re-discovers plugins (tests, REPLs)."""
    global _MANAGER
    _MANAGER = None


def _collect(pm: PolykitPluginManager, hook_name: str, kind: str) -> dict[str, tuple[str, Any]]:
    """name -> (plugin, spec) from every plugin's hook (built-ins first); a malformed or
    duplicate spec goes to plugin_failed."""
    table: dict[str, tuple[str, Any]] = {}
    for plugin, specs in reversed(pm.call_each(hook_name)):
        if not isinstance(specs, (list, tuple)) or not all(isinstance(getattr(s, "name", None), str) for s in specs):
            pm.plugin_failed(plugin, f"returned something other than a list of specs from {hook_name}")
            continue
        for spec in specs:
            if spec.name in table:
                pm.plugin_failed(plugin, f"registers a {kind} named {spec.name!r}, which plugin "
                                         f"{table[spec.name][0]!r} registered", hint="uninstall one of them")
                continue
            table[spec.name] = (plugin, spec)
    return table


def runner_specs(pm: PolykitPluginManager | None = None) -> "dict[str, RunnerSpec]":
    """Runner name -> spec, from every registered plugin (built-ins first)."""
    pm = pm or plugin_manager()
    table: dict[str, Any] = {}
    owner: dict[str, str] = {}  # flag -> plugin
    for name, (plugin, spec) in _collect(pm, "polykit_runners", "runner").items():
        clash = [flag for flag in spec.flags if flag in owner]
        if clash:
            pm.plugin_failed(plugin, f"gives runner {name!r} the flag {clash[0]}, which plugin {owner[clash[0]]!r} "
                                     "claims", hint="uninstall one of them, or give the runner another flag")
            continue
        owner.update(dict.fromkeys(spec.flags, plugin))
        table[name] = spec
    return table


def compare_func_specs(pm: PolykitPluginManager | None = None) -> "dict[str, CompareFuncSpec]":
    return {n: spec for n, (_, spec) in _collect(pm or plugin_manager(), "polykit_compare_funcs", "compare function").items()}


def data_loader_specs(pm: PolykitPluginManager | None = None) -> "dict[str, DataLoaderSpec]":
    return {n: spec for n, (_, spec) in _collect(pm or plugin_manager(), "polykit_data_loaders", "data loader").items()}


def data_reader_specs(pm: PolykitPluginManager | None = None) -> "dict[str, DataReaderSpec]":
    """Data reader name -> spec (built-ins first, then plugins')."""
    return {n: spec for n, (_, spec) in _collect(pm or plugin_manager(), "polykit_data_readers", "data reader").items()}
