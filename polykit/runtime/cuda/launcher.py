"""Loaded kernels and the Launcher a tactic uses to launch them on a stream.

`KernelModules` loads the cubins a plan (or a harness run) declared and resolves each
KernelSource to a CUfunction; launching a kernel that was not declared is an error, so a
plan never compiles on demand. `CudaLauncher` implements polykit.kernels.cuda.base.Launcher.

With PDL (`KernelModules(arch, pdl=True)` on an sm_90+ device) every unit whose text the
instrumenter parses is compiled with PK_PDL (KernelSource.with_pdl: each kernel waits for the grids
before it first, polykit.kernels.cuda.pdl) and its kernels launch through cuLaunchKernelEx with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, so a kernel's launch overlaps the tail of
the one before it on the stream (in a captured graph: a programmatic edge). A unit that is not
instrumented launches with cuLaunchKernel as without PDL: only a kernel that waits may start early.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from polykit.compiler.ir.dtypes import EXTENDED_TYPES
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import DeviceTensor, KernelSource, TensorMapSpec
from polykit.kernels.cuda.pdl import supports_pdl
from polykit.runtime.cuda import driver
from polykit.runtime.cuda.memory import fill_bytes
from polykit.runtime.cuda.nvrtc import compile_many

_CTYPES: dict[np.dtype, Any] = {
    np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
    np.dtype(np.int8): ctypes.c_int8, np.dtype(np.uint8): ctypes.c_uint8,
    np.dtype(np.int16): ctypes.c_int16, np.dtype(np.uint16): ctypes.c_uint16,
    np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.bool_): ctypes.c_uint8,
}


#: the dynamic and static shared memory a function may use together without opting in (cuFuncSetAttribute)
DEFAULT_SHARED = 48 * 1024

_TMA_DTYPES = {np.dtype(np.float16): "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
               np.dtype(np.float32): "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
               # 8-bit operands are copied as bytes (the tensor-map type only matters for the OOB fill)
               np.dtype(np.int8): "CU_TENSOR_MAP_DATA_TYPE_UINT8", np.dtype(np.uint8): "CU_TENSOR_MAP_DATA_TYPE_UINT8",
               **({EXTENDED_TYPES[17]: "CU_TENSOR_MAP_DATA_TYPE_UINT8"} if 17 in EXTENDED_TYPES else {})}  # e4m3


#: a CUtensorMap as the kernel parameter receives it (128 bytes; the driver copies it into
#: the parameter buffer, where the kernel's __grid_constant__ declaration aligns it)
_TensorMapArg = ctypes.c_uint64 * 16


def encode_tensor_map(spec: TensorMapSpec) -> Any:
    """cuTensorMapEncodeTiled for `spec` (128-byte swizzle, zero fill out of bounds)."""
    d = driver.drv()
    dtype = np.dtype(spec.dtype)
    if dtype.name == "bfloat16":
        code = d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    elif dtype in _TMA_DTYPES:
        code = getattr(d.CUtensorMapDataType, _TMA_DTYPES[dtype])
    else:
        raise DeviceError(f"no TMA data type for {dtype}")
    rank = len(spec.dims)
    tmap = driver.call(
        "cuTensorMapEncodeTiled", code, rank, spec.ptr, [d.cuuint64_t(int(x)) for x in spec.dims],
        [d.cuuint64_t(int(x)) for x in spec.strides], [d.cuuint32_t(int(x)) for x in spec.box],
        [d.cuuint32_t(1)] * rank, d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        what=f"encode a TMA tensor map (dims {spec.dims}, box {spec.box})")
    out = _TensorMapArg()
    ctypes.memmove(ctypes.addressof(out), int(tmap.getPtr()), 128)
    return out


def pack_arg(arg: Any) -> Any:
    """A ctypes value for one kernel argument (see Launcher.launch for the rules)."""
    if isinstance(arg, DeviceTensor):
        return ctypes.c_uint64(arg.ptr)
    if isinstance(arg, TensorMapSpec):
        return encode_tensor_map(arg)
    if isinstance(arg, np.generic):
        if arg.dtype == np.float16:
            return ctypes.c_uint16(int(arg.view(np.uint16)))
        ct = _CTYPES.get(arg.dtype)
        if ct is None:
            raise DeviceError(f"cannot pass a numpy {arg.dtype} scalar as a kernel argument")
        return ct(arg.item())
    if isinstance(arg, (bool, np.bool_)):
        return ctypes.c_int32(int(arg))
    if isinstance(arg, int):
        return ctypes.c_int64(arg)
    if isinstance(arg, float):
        return ctypes.c_float(arg)
    raise DeviceError(f"cannot pass {type(arg).__name__} as a kernel argument",
                      hint="pass DeviceTensor, int, float or a numpy scalar")


class KernelModules:
    """Cubins loaded into the current context, by KernelSource.key(); functions by name.
    `pdl`: compile the units for programmatic dependent launch where the device runs it (sm_90+)."""

    def __init__(self, arch: str, pdl: bool = False):
        self.arch = arch
        #: units are compiled and launched for programmatic dependent launch (module docstring)
        self.pdl = bool(pdl) and supports_pdl(arch)
        self._modules: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], Any] = {}
        #: dynamic shared bytes each function may launch with now (48 KiB less its static, or what was set)
        self._smem_set: dict[tuple[str, str], int] = {}
        #: keys of the units loaded compiled with PK_PDL (their kernels wait first: they may start early)
        self._programmatic: set[str] = set()

    def load(self, sources: Iterable[KernelSource], *, cache: bool = True) -> None:
        """Compile (or fetch from the kernel cache) and load every unit of `sources` (with PDL: the
        instrumented unit where the instrumenter parses it, else the plain one)."""
        todo: dict[str, KernelSource] = {}
        for s in sources:
            if s.key() not in self._modules and s.key() not in todo:
                todo[s.key()] = (s.with_pdl() if self.pdl else None) or s
        cubins = compile_many(list(todo.values()), self.arch, cache=cache)
        for key, unit in todo.items():
            self._modules[key] = driver.call("cuModuleLoadData", cubins[unit.key()], what="load compiled kernel module")
            if unit.pdl:
                self._programmatic.add(key)

    def programmatic(self, kernel: KernelSource) -> bool:
        """Whether `kernel` launches as a programmatic dependent (its unit was compiled with PK_PDL)."""
        return bool(self._programmatic) and kernel.key() in self._programmatic

    def function(self, kernel: KernelSource) -> Any:
        fkey = (kernel.key(), kernel.name)
        fn = self._functions.get(fkey)
        if fn is None:
            module = self._modules.get(kernel.key())
            if module is None:
                raise DeviceError(f"kernel {kernel.name!r} was launched but not declared by its tactic",
                                  hint="add it to the tactic's kernels(layer) list so the plan records it")
            fn = driver.call("cuModuleGetFunction", module, kernel.name.encode(),
                             what=f"find kernel {kernel.name!r} in its module")
            self._functions[fkey] = fn
        return fn

    def ensure_shared(self, kernel: KernelSource, fn: Any, nbytes: int) -> None:
        """Raise the kernel's dynamic shared-memory limit when its static and dynamic shared memory together
        pass 48 KiB: CUDA's default limit on dynamic shared memory is 48 KiB less the static, and a launch past
        it fails with CUDA_ERROR_INVALID_VALUE (a 33 KB dynamic stage beside a 32 KB static array did)."""
        if nbytes <= 0:
            return
        fkey = (kernel.key(), kernel.name)
        allowed = self._smem_set.get(fkey)
        if allowed is None:
            static = int(driver.call("cuFuncGetAttribute",
                                     driver.drv().CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn,
                                     what=f"read the static shared memory of {kernel.name!r}"))
            allowed = self._smem_set[fkey] = max(0, DEFAULT_SHARED - static)
        if nbytes <= allowed:
            return
        driver.call("cuFuncSetAttribute", fn,
                    driver.drv().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes,
                    what=f"set shared memory of {kernel.name!r}")
        self._smem_set[fkey] = nbytes

    def close(self) -> None:
        for module in self._modules.values():
            driver.call("cuModuleUnload", module, what="unload kernel module")
        self._modules.clear()
        self._functions.clear()
        self._smem_set.clear()
        self._programmatic.clear()


def programmatic_config(grid: Sequence[int], block: Sequence[int], shared_mem: int, stream: Any) -> Any:
    """The CUlaunchConfig of a programmatic dependent launch: `grid` x `block` threads, `shared_mem`
    dynamic shared bytes on `stream`, with PROGRAMMATIC_STREAM_SERIALIZATION allowed (the kernel may
    start once the one before it on the stream has triggered, and waits for it in its
    griddepcontrol.wait)."""
    config = driver.drv().CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_mem
    config.hStream = stream
    config.attrs = _programmatic_attributes()
    config.numAttrs = 1
    return config


@functools.lru_cache(maxsize=1)
def _programmatic_attributes() -> list[Any]:
    """[PROGRAMMATIC_STREAM_SERIALIZATION = 1], made once (a launch config copies it in)."""
    d = driver.drv()
    attr = d.CUlaunchAttribute()
    attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    return [attr]


class CudaLauncher:
    """Launches a layer's kernels on one stream; errors name the layer."""

    #: a host-driven tactic's BodyDriver (polykit.runtime.cuda.bodies); None for every other tactic
    bodies: Any = None
    #: a host-driven tactic's allocator of the outputs it sizes (polykit.runtime.cuda.layer_outputs)
    outputs: Any = None
    #: the context's communicator (polykit.runtime.cuda.nccl) for collective tactics; None without one
    communicator: Any = None

    def __init__(self, modules: KernelModules, stream: Any, workspace: Callable[[int], int],
                 layer_name: str = "", check_each: bool = False, sm_count: int = 0):
        self._sm_count = sm_count
        self.modules = modules
        self.stream = stream
        self._workspace = workspace
        self.layer_name = layer_name
        self.check_each = check_each

    def launch(self, kernel: KernelSource, grid: Sequence[int], block: Sequence[int],
               args: Sequence[Any], shared_mem: int = 0) -> None:
        g = tuple(int(x) for x in grid) + (1,) * (3 - len(grid))
        b = tuple(int(x) for x in block) + (1,) * (3 - len(block))
        if min(g) <= 0:
            return  # nothing to do for an empty tensor
        fn = self.modules.function(kernel)
        self.modules.ensure_shared(kernel, fn, shared_mem)
        values = [pack_arg(a) for a in args]
        ptrs = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        if self.modules.programmatic(kernel):
            err, = driver.drv().cuLaunchKernelEx(programmatic_config(g, b, shared_mem, self.stream), fn,
                                                 ctypes.addressof(ptrs), 0)
        else:
            err, = driver.drv().cuLaunchKernel(fn, *g, *b, shared_mem, self.stream, ctypes.addressof(ptrs), 0)
        where = f"layer {self.layer_name!r}" if self.layer_name else None
        if int(err) != 0:
            raise DeviceError(f"launch of kernel {kernel.name!r} (grid {g}, block {b}, {shared_mem} B shared) "
                              f"failed: {driver.error_name(err)}", where=where,
                              hint="check the tactic's launch geometry for this layer's shapes")
        if self.check_each:
            driver.call("cuStreamSynchronize", self.stream, what=f"kernel {kernel.name!r}", where=where)

    def workspace(self, nbytes: int) -> int:
        return self._workspace(int(nbytes))

    def zero(self, ptr: int, nbytes: int) -> None:
        fill_bytes(ptr, int(nbytes), 0, self.stream)

    @property
    def sm_count(self) -> int:
        """SMs of the current context's device (given by the engine, else asked once)."""
        if not self._sm_count:
            attr = driver.drv().CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
            dev = driver.call("cuCtxGetDevice", what="find the current device")
            self._sm_count = int(driver.call("cuDeviceGetAttribute", attr, dev, what="count the device's SMs"))
        return self._sm_count


def device_tensors(ptrs: Mapping[str, int], specs: Mapping[str, tuple[tuple[int, ...], Any]]) -> dict[str, DeviceTensor]:
    return {n: DeviceTensor(ptrs[n], tuple(specs[n][0]), np.dtype(specs[n][1])) for n in ptrs}
