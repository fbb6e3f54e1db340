"""The launch side of PDL with a fake driver (no GPU): KernelModules compiles the instrumented unit
and the launcher passes CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION exactly when PDL is
on, the device is sm_90+ and the kernel's unit was instrumented; otherwise the launch is the plain
cuLaunchKernel it always was. The switch travels from BuilderConfig (recorded in the plan only when
on) or Engine(pdl=...) to the target, and into the engines of body plans."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from polykit.compiler.builder.config import BuilderConfig
from polykit.errors import PlanError
from polykit.kernels.cuda.base import KernelSource
from polykit.kernels.cuda.hold import HOLD
from polykit.kernels.cuda.pdl import PREAMBLE
from polykit.runtime.cuda import bodies, driver, launcher
from polykit.runtime.cuda.launcher import CudaLauncher, KernelModules

#: a kernel the instrumenter refuses (its __global__ hides behind a macro): it must launch plainly
HIDDEN = KernelSource("hidden", code='#define KERNEL __global__\nextern "C" KERNEL void hidden(float* x) { x[0] = 1; }\n')


class FakeDriver:
    """cuda.bindings.driver's records (launch configs, attribute ids) with the calls recorded."""

    def __init__(self):
        from cuda.bindings import driver as real

        self._real = real
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _record(self, name, *args):
        self.calls.append((name, args))
        return (self._real.CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(self, *args):
        return self._record("cuLaunchKernel", *args)

    def cuLaunchKernelEx(self, *args):
        return self._record("cuLaunchKernelEx", *args)

    def cuModuleLoadData(self, cubin):
        self.calls.append(("cuModuleLoadData", (cubin,)))
        return self._real.CUresult.CUDA_SUCCESS, f"module:{cubin.decode()}"

    def cuModuleGetFunction(self, module, name):
        return self._real.CUresult.CUDA_SUCCESS, f"{module}/{name.decode()}"

    def cuModuleUnload(self, module):
        return (self._real.CUresult.CUDA_SUCCESS,)

    #: a function's static shared bytes (cuFuncGetAttribute's SHARED_SIZE_BYTES); 0 unless a test sets it
    static_shared = 0

    def cuFuncGetAttribute(self, attribute, fn):
        self.calls.append(("cuFuncGetAttribute", (attribute, fn)))
        return self._real.CUresult.CUDA_SUCCESS, self.static_shared

    def cuFuncSetAttribute(self, fn, attribute, value):
        return self._record("cuFuncSetAttribute", fn, attribute, value)

    def launches(self):
        return [(name, args) for name, args in self.calls if name.startswith("cuLaunch")]


@pytest.fixture
def fake(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(driver, "drv", lambda: fake)
    compiled: list[KernelSource] = []

    def compile_many(units, arch, cache=True):  # NVRTC stands in: a "cubin" naming the unit it came from
        compiled.extend(units)
        return {u.key(): f"{u.name}{'+pdl' if u.pdl else ''}".encode() for u in units}

    monkeypatch.setattr(launcher, "compile_many", compile_many)
    fake.compiled = compiled
    return fake


def launch(modules: KernelModules, kernel: KernelSource, stream=7):
    modules.load([kernel])
    CudaLauncher(modules, stream, lambda n: 0, "layer").launch(kernel, (3, 2), (128,), [np.int64(5)], shared_mem=64)


def test_pdl_on_sm90_launches_an_instrumented_kernel_with_the_attribute(fake):
    modules = KernelModules("sm_90", pdl=True)
    launch(modules, HOLD)
    (name, args), = fake.launches()
    assert name == "cuLaunchKernelEx"
    config, fn, params, extra = args
    assert fn == "module:hold_stream+pdl/hold_stream" and extra == 0 and isinstance(params, int)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (3, 2, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (128, 1, 1)
    assert config.sharedMemBytes == 64 and int(config.hStream) == 7
    assert config.numAttrs == 1
    attr = config.attrs[0]
    assert attr.id == fake.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1
    unit, = fake.compiled
    assert unit.pdl and PREAMBLE in unit.render() and modules.programmatic(HOLD)


def test_pdl_off_is_the_plain_launch_of_the_plain_unit(fake):
    modules = KernelModules("sm_90")
    launch(modules, HOLD)
    (name, args), = fake.launches()
    assert name == "cuLaunchKernel"
    assert args[:8] == ("module:hold_stream/hold_stream", 3, 2, 1, 128, 1, 1, 64) and args[8] == 7
    assert fake.compiled == [HOLD] and not modules.pdl and not modules.programmatic(HOLD)


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_pdl_before_sm90_is_off(fake, arch):
    modules = KernelModules(arch, pdl=True)
    launch(modules, HOLD)
    assert not modules.pdl and [n for n, _ in fake.launches()] == ["cuLaunchKernel"] and fake.compiled == [HOLD]


def test_pdl_on_a_later_arch_is_on(fake):
    modules = KernelModules("sm_100", pdl=True)
    launch(modules, HOLD)
    assert modules.pdl and [n for n, _ in fake.launches()] == ["cuLaunchKernelEx"]


def test_a_kernel_the_instrumenter_refuses_launches_plainly_beside_instrumented_ones(fake):
    modules = KernelModules("sm_90a", pdl=True)
    modules.load([HIDDEN, HOLD])
    run = CudaLauncher(modules, 1, lambda n: 0, "layer")
    run.launch(HIDDEN, (1,), (32,), [])
    run.launch(HOLD, (1,), (1,), [np.int64(0)])
    run.launch(HIDDEN, (1,), (32,), [])
    assert [n for n, _ in fake.launches()] == ["cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel"]
    assert {u.name: u.pdl for u in fake.compiled} == {"hidden": False, "hold_stream": True}
    assert fake.launches()[0][1][0] == "module:hidden/hidden"


def test_units_are_found_by_their_plain_key_and_loaded_once(fake):
    modules = KernelModules("sm_90", pdl=True)
    modules.load([HOLD, HOLD])
    modules.load([HOLD])
    assert len(fake.compiled) == 1 and [n for n, _ in fake.calls].count("cuModuleLoadData") == 1
    modules.close()
    assert not modules.programmatic(HOLD)


def test_an_empty_grid_launches_nothing_with_pdl(fake):
    modules = KernelModules("sm_90", pdl=True)
    modules.load([HOLD])
    CudaLauncher(modules, 1, lambda n: 0, "layer").launch(HOLD, (0,), (1,), [np.int64(0)])
    assert fake.launches() == []


def test_the_launch_arguments_reach_cuLaunchKernelEx(fake, monkeypatch):
    seen = []

    def read_first_argument(config, fn, params, extra):  # while the launcher's buffers are alive
        first = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0]
        seen.append(ctypes.cast(first, ctypes.POINTER(ctypes.c_int64))[0])
        return (fake.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(fake, "cuLaunchKernelEx", read_first_argument, raising=False)
    modules = KernelModules("sm_90", pdl=True)
    modules.load([HOLD])
    CudaLauncher(modules, 1, lambda n: 0, "layer").launch(HOLD, (1,), (1,), [np.int64(1234)])
    assert seen == [1234]


# ---- the switch -------------------------------------------------------------------------------

def test_builder_config_records_pdl_only_when_on():
    assert "pdl" not in BuilderConfig().to_json()  # plans built without it keep their bytes
    assert BuilderConfig(pdl=True).to_json()["pdl"] is True
    assert BuilderConfig.from_json(BuilderConfig(pdl=True).to_json()).pdl is True
    assert BuilderConfig.from_json({}).pdl is False


def _tiny_plan(**config):
    from onnx import TensorProto, helper

    from polykit.compiler.builder.builder import build_plan

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return build_plan(model, BuilderConfig(target="cpu", **config))


def test_the_engine_takes_the_plans_setting_unless_told(monkeypatch):
    from polykit.runtime.cpu import CpuTarget
    from polykit.runtime.engine import Engine, Runtime

    seen = []
    load = CpuTarget.load
    monkeypatch.setattr(CpuTarget, "load", lambda self, plan, allocator=None, pdl=False:
                        seen.append(pdl) or load(self, plan, allocator, pdl))
    on, off = _tiny_plan(pdl=True), _tiny_plan()
    assert on.metadata["builder_config"]["pdl"] is True and "pdl" not in off.metadata["builder_config"]
    assert [Engine(on).pdl, Engine(off).pdl, Engine(on, pdl=False).pdl, Engine(off, pdl=True).pdl] == \
        [True, False, False, True]
    assert Runtime(pdl=True).deserialize_engine(off).pdl and not Runtime().deserialize_engine(off).pdl
    assert seen == [True, False, False, True, True, False]
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    with Engine(on).create_execution_context() as ctx:  # the cpu target runs it as ever
        assert np.array_equal(ctx.execute({"x": x})["y"], np.maximum(x, 0))


def test_a_plan_whose_pdl_setting_is_not_a_bool_is_a_plan_error():
    from polykit.runtime.engine import Engine

    plan = _tiny_plan()
    plan.metadata["builder_config"]["pdl"] = "yes"
    with pytest.raises(PlanError, match="pdl"):
        Engine(plan)


def test_body_plans_load_with_the_outer_engines_setting(monkeypatch):
    import polykit.runtime.engine as engine_module

    made = []

    class FakeEngine:
        def __init__(self, plan, allocator=None, pdl=None):
            made.append(pdl)

        def create_execution_context(self, cuda_graph=True):
            return object()

    monkeypatch.setattr(engine_module, "Engine", FakeEngine)
    body = type("Body", (), {"profiles": None})()
    bodies.BodyContexts(pdl=True).context(body)
    bodies.BodyContexts().context(body)
    assert made == [True, False]


@pytest.mark.parametrize("static, dynamic, raised", [
    (0, 48 * 1024, None),              # all of the default 48 KiB dynamic: no opt-in
    (0, 48 * 1024 + 16, 48 * 1024 + 16),
    (32768, 16640, 16640),             # the rows kernel's 32 KB static array beside a 16 KB stage: over 48 KiB
    (16384, 32768, None),              # exactly 48 KiB together
])
def test_dynamic_shared_memory_is_raised_when_static_and_dynamic_pass_48_kib(fake, static, dynamic, raised):
    fake.static_shared = static
    modules = KernelModules("sm_90")
    modules.load([HOLD])
    run = CudaLauncher(modules, 7, lambda n: 0, "layer")
    for _ in range(2):  # the second launch asks the driver nothing more
        run.launch(HOLD, (1,), (32,), [np.int64(5)], shared_mem=dynamic)
    sets = [args for name, args in fake.calls if name == "cuFuncSetAttribute"]
    reads = [args for name, args in fake.calls if name == "cuFuncGetAttribute"]
    assert len(reads) == 1 and reads[0][0] == fake.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
    if raised is None:
        assert sets == []
    else:
        assert sets == [("module:hold_stream/hold_stream",
                         fake.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, raised)]
    assert len(fake.launches()) == 2 and all(args[7] == dynamic for _, args in fake.launches())
