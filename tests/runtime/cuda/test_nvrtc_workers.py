"""compile_many's worker processes: no __main__ re-import, failures reported with the NVRTC log."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from polykit.errors import DeviceError
from polykit.kernels.cuda.base import KernelSource
from polykit.runtime.cuda.nvrtc import compile_many

GOOD = 'extern "C" __global__ void k{i}(float* x) {{ x[threadIdx.x] += {i}.0f; }}\n'


def test_cold_units_compile_in_workers_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(tmp_path))
    units = [KernelSource(f"k{i}", code=GOOD.format(i=i)) for i in range(3)]
    cubins = compile_many(units, "sm_80", workers=2)
    assert sorted(cubins) == sorted(u.key() for u in units)
    assert len(list((tmp_path / "kernels" / "sm_80").glob("*.cubin"))) == 3


def test_a_broken_unit_among_several_raises_with_the_compiler_log(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKIT_CACHE_DIR", str(tmp_path))
    units = [KernelSource("k0", code=GOOD.format(i=0)),
             KernelSource("broken", code='extern "C" __global__ void broken() { undeclared_thing(); }\n')]
    with pytest.raises(DeviceError, match="broken") as err:
        compile_many(units, "sm_80", workers=2)
    assert "undeclared_thing" in str(err.value)


def test_a_script_without_a_main_guard_can_compile_many_units(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(f"""
        from polykit.kernels.cuda.base import KernelSource
        from polykit.runtime.cuda.nvrtc import compile_many
        units = [KernelSource(f"k{{i}}", code={GOOD!r}.format(i=i)) for i in range(3)]
        print(len(compile_many(units, "sm_80", workers=2)))
    """))
    env = {"POLYKIT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    import os

    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"
