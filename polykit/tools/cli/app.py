"""The `polykit` command: a typer app whose subcommands come from the polykit_cli_commands hook.

Start-up matters (`polykit run m.onnx --onnxrt` must start as fast as Polygraphy's): this
module and the command modules import only typer, rich and polykit's light modules;
numpy, onnx, onnxruntime and the compiler are imported inside the commands.

Exit codes (pytest's convention): 0 success / comparison passed, 1 accuracy failure only,
2 usage, input or model error (a PolykitError, printed without a traceback; with -v, with
one), 3 internal error (any other exception: a bug in polykit or a plugin; one line asking
for a report, the traceback with -v).
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Callable, Optional, Sequence

import typer

import polykit
from polykit.errors import PolykitError

log = logging.getLogger("polykit")

EXIT_OK, EXIT_ACCURACY, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _configure_logging(verbose: int, quiet: bool) -> Callable[[], None]:
    """Set the polykit logger's level for -v/-q and give it a stderr handler; returns the undo,
    so that a command run in-process (main() from a test or a script) leaves the process's
    logging as it found it (a -q left behind silenced every later warning)."""
    saved = (log.level, log.propagate, list(log.handlers))
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    log.setLevel(level)
    if not any(getattr(h, "_polykit_cli", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
        handler._polykit_cli = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.propagate = False

    def restore() -> None:
        log.setLevel(saved[0])
        log.propagate = saved[1]
        log.handlers[:] = saved[2]

    return restore


def _set_limits(specs: list[str]) -> Callable[[], None]:
    """Put --limit NAME=VALUE options into POLYKIT_LIMITS (checked now: a bad one is a usage
    error before any work); returns the undo, for commands run in-process."""
    import os

    from polykit import limits

    saved = os.environ.get(limits.ENV)
    values = {**limits.parse(saved or ""), **limits.parse(",".join(specs))}
    os.environ[limits.ENV] = limits.encode(values)

    def restore() -> None:
        if saved is None:
            os.environ.pop(limits.ENV, None)
        else:
            os.environ[limits.ENV] = saved

    return restore


def _version(value: bool) -> None:
    if value:
        typer.echo(f"polykit {polykit.__version__}")
        raise typer.Exit(0)


def build_app(pm=None) -> typer.Typer:
    """The typer app with every plugin's subcommands registered."""
    from polykit.plugins import plugin_manager
    from polykit.tools.cli.coercion import install

    install()
    pm = pm or plugin_manager()
    app = typer.Typer(
        name="polykit",
        help="polykit: an ONNX inference engine of its own, and a toolkit to compare, convert and inspect models.",
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def root(
        ctx: typer.Context,
        verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="more output (-vv: debug); tracebacks on errors"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="errors only"),
        version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True, help="print the version"),
        strict_plugins: bool = typer.Option(False, "--strict-plugins",
                                            help="a plugin that fails to load or raises is an error, not a warning"),
        log_file: Optional[str] = typer.Option(None, "--log-file", metavar="FILE",
                                               help="also write polykit's log messages to FILE (Polygraphy's option; "
                                                    "it may follow the subcommand)"),
        limit: list[str] = typer.Option([], "--limit", metavar="NAME=VALUE",
                                        help="raise a resource limit, e.g. --limit data_bytes=4GiB (names and "
                                             "defaults: docs/HARDENING.md; sets POLYKIT_LIMITS)"),
    ) -> None:
        ctx.call_on_close(_configure_logging(verbose, quiet))
        if limit:
            ctx.call_on_close(_set_limits(limit))

    pm.call_each("polykit_cli_commands", app=app)
    return app


def prepare_argv(argv: Sequence[str], pm=None) -> list[str]:
    """Expand multi-value options and turn runner flags into `--runner NAME` (see polykit.tools.cli.args)."""
    from polykit.plugins import runner_specs
    from polykit.tools.cli.args import expand_multi_values, rewrite_runner_flags

    flags = {flag: spec.name for spec in runner_specs(pm).values() for flag in spec.flags}
    return rewrite_runner_flags(expand_multi_values(list(argv)), flags)


_GLOBAL_FLAGS = ("-v", "-vv", "-vvv", "--verbose", "-q", "--quiet", "--strict-plugins")


def hoist_global_options(argv: list[str]) -> list[str]:
    """Let -v/-q, --log-file FILE and --limit NAME=VALUE appear anywhere (`polykit run m.onnx
    --onnxrt -v`): move them before the subcommand."""
    if "--" in argv:
        head, tail = argv[: argv.index("--")], argv[argv.index("--"):]
    else:
        head, tail = argv, []
    flags, rest, i = [], [], 0
    while i < len(head):
        a = head[i]
        if a in _GLOBAL_FLAGS or a.startswith(("--log-file=", "--limit=")):
            flags.append(a)
        elif a in ("--log-file", "--limit") and i + 1 < len(head):
            flags += [a, head[i + 1]]
            i += 1
        else:
            rest.append(a)
        i += 1
    return flags + rest + tail


def _log_file(argv: list[str]) -> Callable[[], None]:
    """With --log-file FILE in `argv`, a handler writing polykit's log to FILE; returns its undo."""
    path = next((a.split("=", 1)[1] for a in argv if a.startswith("--log-file=")), None)
    if "--log-file" in argv and argv.index("--log-file") + 1 < len(argv):
        path = argv[argv.index("--log-file") + 1]
    if not path:
        return lambda: None
    try:
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        from polykit.errors import UsageError

        raise UsageError(f"cannot open the log file: {exc.strerror or exc}", where=path, hint='give a writable path, e.g. --log-file polykit.log') from None
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    log.addHandler(handler)

    def close() -> None:
        log.removeHandler(handler)
        handler.close()

    return close


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `polykit` console script; returns (and exits with) the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _escape_unprintable_output()
    if "debug" in argv:  # --check takes the rest of the line, as in Polygraphy: kept out of the rewriting below
        from polykit.tools.cli.debug import fold_check_command

        argv = fold_check_command(argv)
    argv = hoist_global_options(argv)
    restore = _configure_logging(argv.count("-v") + 2 * argv.count("-vv") + 3 * argv.count("-vvv") +
                                 argv.count("--verbose"), any(a in ("-q", "--quiet") for a in argv))
    try:  # (configured here too: plugin warnings come before typer parses)
        close = _log_file(argv)
    except PolykitError as exc:
        restore()
        stderr_console().print(f"error: {exc}", soft_wrap=True)
        return exc.exit_code
    try:
        return _run(argv)
    finally:
        close()
        restore()


def _escape_unprintable_output() -> None:
    """Names read from files may hold what the terminal's encoding cannot show (a lone UTF-16
    surrogate from JSON, say): print them escaped rather than fail while reporting."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _run(argv: list[str]) -> int:
    from polykit.plugins import plugin_manager

    verbose = any(a in ("-v", "-vv", "-vvv", "--verbose") for a in argv)
    code = EXIT_OK
    try:
        pm = plugin_manager(strict="--strict-plugins" in argv)
        app = build_app(pm)
        result = app(args=prepare_argv(argv, pm), prog_name="polykit", standalone_mode=False)
        code = result if isinstance(result, int) else EXIT_OK
    except PolykitError as exc:
        if verbose:
            traceback.print_exc()
        from rich.text import Text

        stderr_console().print(Text("error", style="bold red") + Text(f": {exc}"), soft_wrap=True)
        code = exc.exit_code
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        stderr_console().print("aborted")
        code = EXIT_USAGE
    except Exception as exc:
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # click's UsageError & co (vendored by typer)
            exc.show()
            return EXIT_USAGE
        if verbose:
            traceback.print_exc()
        from rich.text import Text

        stderr_console().print(
            Text("internal error", style="bold red") + Text(f": {type(exc).__name__}: {exc}\n  this is a bug in "
                                                             "polykit or a plugin: please report it with the command "
                                                             "line" + ("" if verbose else " and the traceback of -v")),
            soft_wrap=True)
        code = EXIT_INTERNAL
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
