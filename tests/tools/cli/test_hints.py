"""Every hint and error message polykit prints names options and commands that exist: each
`--option` in a hint string or in the message of a PolykitError anywhere in polykit/ is an
option of some command (of the command it names, for `polykit CMD ... --opt`), each quoted
`polykit CMD` is a command, and a value a hint shows for an option with a syntax of its own
(--input-shapes x:[1,3]) parses."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

import pytest
import typer

from polykit.plugins import runner_specs
from polykit.tools.cli.app import build_app
from polykit.tools.cli.args import MULTI_VALUE_OPTIONS

pytestmark = pytest.mark.usefixtures("fresh_plugins")
PACKAGE = Path(__file__).resolve().parents[3] / "polykit"
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
COMMAND = re.compile(r"(?P<quote>[`']?)polykit(?P<words>(?: [a-z][a-z-]*)+)")
PLACEHOLDER = "NAME"


def _text(node: ast.AST) -> str | None:
    """A string expression as text, each {formatted value} of an f-string as NAME."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) or PLACEHOLDER for v in node.values)
    return None


def _strings(node: ast.AST) -> list[str]:
    """The string texts an expression may give (branches of `a if c else b`, `a or b`, `a + b` joined)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [a + b for a in _strings(node.left) for b in _strings(node.right)] or \
            _strings(node.left) + _strings(node.right)
    text = _text(node)
    if text is not None:
        return [text]
    return [s for child in ast.iter_child_nodes(node) for s in _strings(child)]


def _error_classes() -> set[str]:
    """The names of PolykitError and every subclass of it polykit defines."""
    import polykit.backends.base  # noqa: F401  (RunnerError)
    import polykit.plugins  # noqa: F401  (PluginError)
    from polykit.errors import PolykitError

    names, todo = set(), [PolykitError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return names


@functools.cache
def _nodes() -> tuple[tuple[Path, tuple[ast.AST, ...]], ...]:
    """Every node of every file of polykit/, parsed once a test session (the tests only read them)."""
    return tuple((path, tuple(ast.walk(ast.parse(path.read_text(), str(path))))) for path in sorted(PACKAGE.rglob("*.py")))


def _scan(wanted: Any) -> list[tuple[str, str]]:
    """(file:line, text) of every string expression `wanted(node)` picks from a node of polykit/."""
    found = []
    for path, nodes in _nodes():
        for node in nodes:
            for value in wanted(node):
                found += [(f"{path.relative_to(PACKAGE.parent)}:{value.lineno}", text) for text in _strings(value)]
    return found


def _hints() -> list[tuple[str, str]]:
    """Every `hint=...` argument and `hint = ...` assignment in polykit/."""
    def hints(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, ast.Call):
            return [kw.value for kw in node.keywords if kw.arg == "hint"]
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "hint" for t in node.targets):
            return [node.value]
        return []

    return _scan(hints)


def _messages() -> list[tuple[str, str]]:
    """The message (first argument, or what=) of every PolykitError polykit makes."""
    classes = _error_classes()

    def messages(node: ast.AST) -> list[ast.AST]:
        if not isinstance(node, ast.Call):
            return []
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in classes:
            return []
        return node.args[:1] + [kw.value for kw in node.keywords if kw.arg == "what"]

    return _scan(messages)


def _texts() -> list[tuple[str, str]]:
    return _hints() + _messages()


def _commands() -> dict[tuple[str, ...], Any]:
    """Every command of the `polykit` app by its path, e.g. ("inspect", "model")."""
    root = typer.main.get_command(build_app())
    table: dict[tuple[str, ...], Any] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        table[path] = cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, path + (name,))

    walk(root, ())
    return table


def _options(cmd: Any) -> set[str]:
    return {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}


@pytest.fixture(scope="module")
def cli() -> tuple[dict[tuple[str, ...], Any], set[str]]:
    from polykit.plugins import reset_plugin_manager

    reset_plugin_manager()
    commands = _commands()
    runner_flags = {flag for spec in runner_specs().values() for flag in spec.flags}
    return commands, runner_flags | _options(commands[()])


def test_the_scan_finds_the_hints_and_the_error_messages():
    texts = [text for _, text in _hints()]
    assert len(texts) > 100 and any("--input-shapes" in t for t in texts) and any("polykit run" in t for t in texts)
    messages = dict(_messages())
    assert len(messages) > 300 and "--format NAME is not one of NAME" in messages.values()
    assert any(where.startswith("polykit/compiler/") for where in messages)


def test_every_option_a_hint_or_an_error_names_exists_on_some_command(cli):
    commands, everywhere = cli
    known = everywhere | {opt for cmd in commands.values() for opt in _options(cmd)}
    missing = [(where, opt, text) for where, text in _texts() for opt in OPTION.findall(text) if opt not in known]
    assert not missing, "hints and errors name options no command has:\n" + "\n".join(map(str, missing))


def test_options_after_polykit_cmd_in_a_hint_or_an_error_are_that_commands(cli):
    commands, everywhere = cli
    wrong = []
    for where, text in _texts():
        for match in COMMAND.finditer(text):
            words = match["words"].split()
            path: tuple[str, ...] = ()
            while words and path + (words[0],) in commands:
                path += (words.pop(0),)
            if not path and not match["quote"]:
                continue  # prose ("polykit runs float16 ..."), not a command line
            assert path, f"{where}: {text!r} quotes `polykit {match['words'].strip()}`, which is no command"
            rest = text[match.end():].split("`")[0].split("'")[0]
            wrong += [(where, " ".join(path), opt) for opt in OPTION.findall(rest)
                      if opt not in _options(commands[path]) | everywhere]
    assert not wrong, "hints and errors give commands options they do not have:\n" + "\n".join(map(str, wrong))


def test_values_hints_show_for_options_with_a_syntax_parse():
    """(Error messages quote the user's value, which need not parse: only hints are examples.)"""
    bad = []
    for where, text in _hints():
        for match in re.finditer(r"(--[a-z-]+) (\S+)", text):
            option, value = match.groups()
            pattern = MULTI_VALUE_OPTIONS.get(option)
            value = value.rstrip(")`',;.") if not value.endswith("...") else value
            if pattern is None or not (":" in value or value.startswith("[")):
                continue
            concrete = re.sub(r"\b[A-Z][A-Z0-9_]*\b", "1", value).replace("...", "1")
            if not pattern.match(concrete):
                bad.append((where, option, value))
    assert not bad, "hints show values their option does not take:\n" + "\n".join(map(str, bad))
