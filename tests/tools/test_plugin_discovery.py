"""Plugins are found through POLYKIT_PLUGINS and the `polykit` entry-point group, and what they
register (runners, compare functions, data loaders, commands) is usable from `polykit`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polykit.plugins import (
    PluginError, compare_func_specs, create_plugin_manager, data_loader_specs, runner_specs,
)
from polykit.tools.cli.app import main
from tests.cli_models import fresh_plugins  # noqa: F401  (pytest fixture)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "polykit-plugin-example"
MLP = str(REPO / "examples" / "models" / "mlp.onnx")

EXTRA_PLUGIN = '''
import numpy as np
from polykit.plugins import hookimpl
from polykit.tools.compare.funcs import CompareFuncSpec, OutputComparison
from polykit.tools.data.loaders import DataLoaderSpec


def _exact(options):
    def compare(name, ref, act):
        return OutputComparison(name, bool(np.array_equal(ref, act)), "exact")
    return compare


class Ones:
    def bind(self, meta):
        self.meta = meta

    def __iter__(self):
        yield {n: np.ones([d if isinstance(d, int) else 1 for d in m.shape], m.dtype) for n, m in self.meta.items()}


@hookimpl
def polykit_compare_funcs():
    return [CompareFuncSpec("exact", _exact, "bitwise equality")]


@hookimpl
def polykit_data_loaders():
    return [DataLoaderSpec("ones", lambda options: Ones(), "all ones")]


@hookimpl
def polykit_cli_commands(app):
    @app.command("hello")
    def hello(name: str = "world"):
        print(f"hello {name}")
        return 0
'''


pytestmark = pytest.mark.usefixtures("fresh_plugins")


@pytest.fixture
def extra_plugin(tmp_path, monkeypatch):
    (tmp_path / "polykit_extra_plugin.py").write_text(EXTRA_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "polykit_extra_plugin"


def _dist_info(root: Path, name: str, module: str) -> None:
    info = root / f"{name}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[polykit]\n{name} = {module}\n")


def test_builtins_register_through_the_same_hooks():
    pm = create_plugin_manager(env={})
    assert pm.has_plugin("polykit.backends.builtin") and pm.has_plugin("polykit.tools.builtin")
    assert {"trt", "onnxrt"} <= set(runner_specs(pm))
    assert {"simple", "l2", "cosine", "snr"} <= set(compare_func_specs(pm))
    assert {"default", "script"} <= set(data_loader_specs(pm))


def test_env_var_loads_example_plugin_runner(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    pm = create_plugin_manager(env={"POLYKIT_PLUGINS": " polykit_numpy_ref , "})
    assert runner_specs(pm)["numpy-ref"].flags == ("--numpy-ref",)


def test_entry_point_loads_example_plugin(tmp_path, monkeypatch):
    _dist_info(tmp_path, "polykit_plugin_example", "polykit_numpy_ref")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = create_plugin_manager(env={})
    assert pm.has_plugin("polykit_plugin_example")
    assert "numpy-ref" in runner_specs(pm)


def test_missing_plugin_module_is_skipped_with_a_warning_naming_it(caplog):
    pm = create_plugin_manager(env={"POLYKIT_PLUGINS": "no_such_polykit_plugin"})
    assert "trt" in runner_specs(pm)
    assert "plugin 'no_such_polykit_plugin' cannot be loaded ($POLYKIT_PLUGINS): ModuleNotFoundError" in caplog.text


def test_missing_plugin_module_is_plugin_error_when_strict():
    with pytest.raises(PluginError, match="no_such_polykit_plugin"):
        create_plugin_manager(env={"POLYKIT_PLUGINS": "no_such_polykit_plugin"}, strict=True)


def test_missing_plugin_warns_and_the_run_still_works(monkeypatch, capsys):
    monkeypatch.setenv("POLYKIT_PLUGINS", "no_such_polykit_plugin")
    assert main(["run", MLP, "--onnxrt"]) == 0
    assert "plugin 'no_such_polykit_plugin' cannot be loaded" in capsys.readouterr().err


def test_missing_plugin_exits_2_from_cli_with_strict_plugins(monkeypatch, capsys):
    monkeypatch.setenv("POLYKIT_PLUGINS", "no_such_polykit_plugin")
    assert main(["run", MLP, "--onnxrt", "--strict-plugins"]) == 2
    assert "no_such_polykit_plugin" in capsys.readouterr().err


def _plugin(tmp_path, monkeypatch, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


CLASH = """
    from polykit.backends.base import RunnerSpec
    from polykit.plugins import hookimpl

    @hookimpl
    def polykit_runners():
        return [RunnerSpec("other", ("--trt",), lambda request: None)]
"""


def test_two_runners_claiming_one_flag_is_plugin_error_when_strict(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch, "polykit_clash", CLASH)
    with pytest.raises(PluginError, match="--trt"):
        runner_specs(create_plugin_manager(env={"POLYKIT_PLUGINS": "polykit_clash"}, strict=True))


def test_a_runner_claiming_a_taken_flag_is_skipped_and_the_first_keeps_it(tmp_path, monkeypatch, caplog):
    _plugin(tmp_path, monkeypatch, "polykit_clash", CLASH)
    specs = runner_specs(create_plugin_manager(env={"POLYKIT_PLUGINS": "polykit_clash"}))
    assert specs["trt"].flags[0] == "--trt" and "other" not in specs
    assert "plugin 'polykit_clash' gives runner 'other' the flag --trt" in caplog.text


BROKEN = {
    "raises at import": "raise RuntimeError('no licence server')\n",
    "raises in a hook": """
        from polykit.plugins import hookimpl

        @hookimpl
        def polykit_runners():
            raise KeyError('config')

        @hookimpl
        def polykit_cli_commands(app):
            raise ValueError('bad command table')
    """,
    "returns garbage": """
        from polykit.plugins import hookimpl

        @hookimpl
        def polykit_compare_funcs():
            return 42
    """,
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_plugin_is_a_warning_and_commands_still_work(tmp_path, monkeypatch, capsys, case):
    monkeypatch.setenv("POLYKIT_PLUGINS", _plugin(tmp_path, monkeypatch, "polykit_broken", BROKEN[case]))
    assert main(["--version"]) == 0
    assert main(["run", MLP, "--onnxrt", "--onnxrt"]) == 0
    err = capsys.readouterr().err
    assert "plugin 'polykit_broken'" in err and "--strict-plugins" in err


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_plugin_is_an_error_with_strict_plugins(tmp_path, monkeypatch, capsys, case):
    monkeypatch.setenv("POLYKIT_PLUGINS", _plugin(tmp_path, monkeypatch, "polykit_broken", BROKEN[case]))
    assert main(["--strict-plugins", "run", MLP, "--onnxrt"]) == 2
    assert "error: plugin 'polykit_broken'" in capsys.readouterr().err


def test_example_plugin_runner_usable_from_polykit_run(tmp_path):
    env = {**os.environ, "POLYKIT_PLUGINS": "polykit_numpy_ref", "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "polykit.tools.cli.app", "run", MLP, "--numpy-ref", "--onnxrt"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "onnxrt vs numpy-ref (reference)" in proc.stdout and "PASSED" in proc.stdout


def test_entry_point_plugin_runner_usable_in_process(tmp_path, monkeypatch, capsys):
    _dist_info(tmp_path, "polykit_plugin_example", "polykit_numpy_ref")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", MLP, "--onnxrt", "--numpy-ref"]) == 0
    assert "numpy-ref vs onnxrt" in capsys.readouterr().out


def test_plugin_compare_func_and_data_loader_are_selectable(extra_plugin, monkeypatch, capsys):
    monkeypatch.setenv("POLYKIT_PLUGINS", extra_plugin)
    assert main(["run", MLP, "--onnxrt", "--onnxrt", "--compare", "exact", "--data-loader", "ones"]) == 0
    assert "onnxrt-1 vs onnxrt" in capsys.readouterr().out


def test_plugin_cli_command_is_added(extra_plugin, monkeypatch, capsys):
    monkeypatch.setenv("POLYKIT_PLUGINS", extra_plugin)
    assert main(["hello", "--name", "polykit"]) == 0
    assert "hello polykit" in capsys.readouterr().out


def test_unknown_compare_func_is_usage_error(capsys):
    assert main(["run", MLP, "--onnxrt", "--compare", "nope"]) == 2
    assert "unknown compare function" in capsys.readouterr().err
