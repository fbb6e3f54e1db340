"""The contract between CUDA kernel families and the cuda target.

A kernel family is a `.cu` file in this folder plus a Python module here that declares
its tactics (`cuda_tactic`; the built-in plugin registers them through the
`polykit_tactics` hook). A CudaTactic says which layers it runs (`supports`; `stored_as`
for the storage dtypes its kernels take), the GPU archs it needs (`archs`), the workspace
it borrows per layer (`workspace`), which kernels it needs compiled for a layer (`kernels`:
KernelSource records; the plan stores only their names and source keys, and loading it
regenerates them from the layer and compiles or fetches exactly those),
and how to launch them (`enqueue`). Nothing here
imports cuda-python: the runtime passes in a Launcher that does the launching, so CI can
import every tactic and compile every KernelSource with NVRTC without a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from polykit.compiler.ops.nn.channels_last import DEPTH_TO_SPACE

from polykit.compiler.plan.schema import KERNEL_FILE
from polykit.errors import DeviceError, PlanError
from polykit.kernels.cuda.pdl import PREAMBLE, instrument
from polykit.kernels.tactics import ANY, Tactic, WorkspaceFn, no_workspace

CUDA_DIR = Path(__file__).parent / "src"


@dataclass(frozen=True)
class KernelSource:
    """One compilable kernel: an `extern "C"` function `name` in `file` (a .cu beside this
    module) or in generated `code`, specialized by `defines` (emitted as #define lines)."""

    name: str
    file: str | None = None
    code: str | None = None
    defines: tuple[tuple[str, str], ...] = ()
    #: the exact architecture to compile for ("sm_90a" for wgmma / setmaxnreg kernels, which
    #: run only on compute capability 9.0); "" compiles for the device's own arch
    arch: str = ""
    #: compiled for programmatic dependent launch (polykit.kernels.cuda.pdl): PK_PDL defined and every
    #: kernel waiting for the grids before it first; made by `with_pdl` (False: the text as ever)
    pdl: bool = False

    def render(self) -> str:
        head = "".join(f"#define {k} {v}\n" for k, v in self.defines)
        if self.pdl:
            text = _pdl_text(replace(self, pdl=False))
            if text is None:
                raise DeviceError(f"kernel {self.name!r} ({self.file or 'generated code'}) cannot be compiled for "
                                  "programmatic dependent launch: a __global__ of its source is not in a form "
                                  "polykit.kernels.cuda.pdl parses", hint="launch it without PDL (with_pdl gives None)")
            return head + PREAMBLE + text
        body = self.code if self.code is not None else kernel_file(self.file, self.name).read_text()
        return head + inline_includes(body)

    def with_pdl(self) -> "KernelSource | None":
        """This unit compiled for programmatic dependent launch: every `__global__` function of its
        text waits for the grids before it first (polykit.kernels.cuda.pdl); None when its text has a
        kernel in a form the instrumenter does not parse (the unit then launches without PDL)."""
        if self.pdl:
            return self
        return replace(self, pdl=True) if _pdl_text(self) is not None else None

    def key(self) -> str:
        """Stable identity of the source text (part of the kernel-cache key); memoized, since
        launchers look kernels up by it on every launch."""
        return _source_key(self)

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "file": self.file, "code": self.code, "defines": [list(d) for d in self.defines]}
        if self.arch:
            out["arch"] = self.arch
        if self.pdl:
            out["pdl"] = True
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "KernelSource":
        return KernelSource(d["name"], d.get("file"), d.get("code"), tuple((k, v) for k, v in d.get("defines", [])),
                            d.get("arch", ""), d.get("pdl") is True)


def kernel_file(file: str | None, kernel: str = "") -> Path:
    """The path of kernel source `file` in this folder; PlanError for anything but the bare
    name of a .cu file here (a kernel generator, a plugin's too, must not reach outside the folder)."""
    if not isinstance(file, str) or not KERNEL_FILE.fullmatch(file) or not (CUDA_DIR / file).is_file():
        raise PlanError(f"kernel {kernel!r} names source file {file!r}, which is not a .cu file of polykit's "
                        "kernel folder", hint="the kernel generator (a plugin's?) names a file polykit does not ship; rebuild "
                             "the plan, or fix the plugin")
    return CUDA_DIR / file


def pack_kernel_table(per_layer: Mapping[str, Sequence[KernelSource]], layers: Sequence[Any] = ()) -> dict[str, Any]:
    """The plan's kernel record: per layer the name and source key of each kernel it compiles
    (no source text: a plan carries no code; the runtime regenerates the sources from the layers'
    tactics and compares keys, polykit.runtime.tactic_check), and the installed plugin (name,
    version) of each tactic of `layers` that comes from one.
    Returns {"layers": {...}} plus {"plugins": {tactic: {"plugin", "version"}}} when any."""
    table: dict[str, Any] = {"layers": {name: kernel_rows(sources) for name, sources in per_layer.items()}}
    plugins = plugin_tactics(layers)
    if plugins:
        table["plugins"] = plugins
    return table


def kernel_rows(sources: Sequence[KernelSource]) -> list[dict[str, Any]]:
    """A layer's rows of the kernel table: {"name", "key"} (and "arch" when pinned) per kernel."""
    rows = []
    for src in sources:
        row: dict[str, Any] = {"name": src.name, "key": src.key()}
        if src.arch:
            row["arch"] = src.arch
        rows.append(row)
    return rows


def plugin_tactics(layers: Sequence[Any]) -> dict[str, dict[str, str]]:
    """{tactic name: {"plugin", "version"}} for the cuda tactics of `layers` (every profile's) that
    an installed plugin registered (polykit's own are left out)."""
    from polykit.kernels.tactics import find_tactic, tactic_origin

    out: dict[str, dict[str, str]] = {}
    for layer in layers:
        for name in (layer.tactic, *layer.profile_tactics):
            tactic = find_tactic("cuda", layer.kind, name)
            origin = tactic_origin(tactic) if tactic is not None else None
            if origin is not None:
                out[name] = origin.to_json()
    return dict(sorted(out.items()))


#: what a generated kernel's entry point, define names and arch may look like, and a define's value
#: (an integer or an identifier: a storage type, a mode): the generators' output schema
_C_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFINE_VALUE = re.compile(r"-?[0-9]+|[A-Za-z_][A-Za-z0-9_]*")
_ARCH = re.compile(r"(sm_[0-9]+a?)?")


def check_generated(source: KernelSource, where: str) -> KernelSource:
    """`source` when a kernel generator's output has the shape polykit's generators give it (a C
    identifier for its entry point, identifiers defined to integers or identifiers, one of
    polykit's own .cu files): the last guard between a plan's layer record and NVRTC, so a value
    a generator passed through unchecked is a PlanError, not text in a kernel."""
    def bad(what: str) -> PlanError:
        return PlanError(f"a kernel generated for this layer {what}", where=where,
                         hint="the layer's attributes are outside what its tactic generates kernels for (an edited "
                              "plan); rebuild the plan with `polykit convert`")

    if not isinstance(source.name, str) or not _C_NAME.fullmatch(source.name):
        raise bad(f"has entry point {source.name!r}, which is not a C identifier")
    if not isinstance(source.arch, str) or not _ARCH.fullmatch(source.arch):
        raise bad(f"targets arch {source.arch!r}")
    for key, value in source.defines:
        if not (isinstance(key, str) and _C_NAME.fullmatch(key) and isinstance(value, str)
                and _DEFINE_VALUE.fullmatch(value)):
            raise bad(f"defines {key!r} as {value!r} (an identifier defined to an integer or identifier expected)")
    if source.code is None:
        kernel_file(source.file, source.name)
    return source


@functools.lru_cache(maxsize=256)
def _pdl_text(source: KernelSource) -> str | None:
    """The body of `source` (a plain unit) instrumented for PDL, or None (KernelSource.with_pdl)."""
    body = source.code if source.code is not None else kernel_file(source.file, source.name).read_text()
    return instrument(inline_includes(body))


@functools.lru_cache(maxsize=1 << 16)
def _source_key(source: KernelSource) -> str:
    return hashlib.sha256(source.render().encode()).hexdigest()[:24]


_INCLUDE = re.compile(r'^[ \t]*#include[ \t]+"([A-Za-z0-9_.]+\.cuh)"[ \t]*$', re.M)


def inline_includes(text: str, _seen: set[str] | None = None) -> str:
    """Replace `#include "x.cuh"` lines naming a header in this folder by its text (once
    each), so NVRTC needs no include path and the cache key covers the headers too."""
    seen = set() if _seen is None else _seen

    def expand(m: re.Match) -> str:
        name = m.group(1)
        if name in seen or not (CUDA_DIR / name).is_file():
            return "" if name in seen else m.group(0)
        seen.add(name)
        return inline_includes((CUDA_DIR / name).read_text(), seen)

    return _INCLUDE.sub(expand, text)


def defines(**kv: Any) -> tuple[tuple[str, str], ...]:
    """Sorted (name, value) pairs for KernelSource.defines."""
    return tuple(sorted((k, str(v)) for k, v in kv.items()))


@dataclass(frozen=True)
class TensorMapSpec:
    """A TMA tensor map (CUtensorMap) passed by value as a kernel argument: the launcher
    encodes it (cuTensorMapEncodeTiled) for `ptr`. Dims and boxes innermost first; `strides`
    are the byte strides of dims 1.. (dim 0 is contiguous); swizzle is 128 bytes."""

    ptr: int
    dtype: np.dtype
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]


def count_slot(layer: str) -> str:
    """The key of a layer's count word among the tensors an enqueue gets: an int64 [1] device word
    where a layer whose output size depends on values writes that size (polykit.runtime.output_alloc)."""
    return f"{layer}#count"


@dataclass(frozen=True)
class DeviceTensor:
    """A tensor in device memory as a kernel sees it: pointer, shape, dtype; contiguous unless
    `row_stride` is set: then it is placed in a Concat's output (polykit.compiler.builder.
    concat_placement), its rows of `row` elements (CudaTactic.places) `row_stride` elements
    apart, which only its producer writes (through a tactic that declared it can)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    row_stride: int = 0

    def rows_apart(self, row: int) -> int:
        """Elements between consecutive rows of `row` elements: `row` when contiguous."""
        return self.row_stride or row

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class Launcher(Protocol):
    """What the cuda target lends a tactic at enqueue time."""

    #: the stream the layer's work goes on (a CUstream; collective tactics enqueue NCCL there)
    stream: Any
    #: the execution context's communicator (polykit.runtime.cuda.nccl), None without one
    communicator: Any

    def launch(self, kernel: KernelSource, grid: Sequence[int], block: Sequence[int],
               args: Sequence[Any], shared_mem: int = 0) -> None:
        """Launch `kernel` (compiled at load time) on the context's stream. `args` are
        DeviceTensor (passed as its pointer), python ints (as int64 unless wrapped in a
        numpy scalar of another type) and numpy scalars (passed as their type)."""

    def workspace(self, nbytes: int) -> int:
        """A device pointer to `nbytes` of scratch memory (256-byte aligned) valid until the
        layer's enqueue returns; each call of one layer gets its own region."""

    def zero(self, ptr: int, nbytes: int) -> None:
        """Set `nbytes` at device pointer `ptr` to zero on the context's stream, ordered before
        the layer's next launch (a memset; a captured graph holds it as a memset node)."""

    @property
    def sm_count(self) -> int:
        """Streaming multiprocessors of the device the stream runs on (launch sizing)."""


@dataclass(frozen=True)
class CudaTactic(Tactic):
    """A Tactic of the cuda target with the two hooks the runtime calls.

    Kernel families take sizes at run time: `enqueue` reads them from the DeviceTensors it
    gets (a plan built for optimization profiles binds each run's shapes there), so a tactic
    serves dynamic layers where its `kernels` are the same at every profile corner (sizes
    baked into defines are not; polykit.compiler.builder.tuner.serves_corners checks)."""

    #: kernels(layer) -> list[KernelSource] to compile for this layer
    kernels_fn: Any = field(default=None, hash=False, compare=False)
    #: enqueue(layer, launcher, tensors: dict[name, DeviceTensor], weights: dict) -> None
    enqueue_fn: Any = field(default=None, hash=False, compare=False)
    #: drives the layer from the host (control flow: launcher.bodies runs its body plans and
    #: reads values back), so a context with such a layer is not captured as a CUDA graph
    host_driven: bool = False
    dynamic_sizes: bool = True
    #: idle(layer, tensors) -> bool: whether enqueue launches nothing for these tensors (a view
    #: whose output is its input's bytes); the profiler charges such a layer no time
    idle_fn: Any = field(default=None, hash=False, compare=False)

    def kernels(self, layer: Any) -> list[KernelSource]:
        return list(self.kernels_fn(layer))

    def enqueue(self, layer: Any, launcher: Launcher, tensors: Mapping[str, DeviceTensor]) -> None:
        self.enqueue_fn(layer, launcher, tensors)

    def idle(self, layer: Any, tensors: Mapping[str, DeviceTensor]) -> bool:
        """Whether `enqueue` would launch nothing for `tensors` (only a family that says so is)."""
        return self.idle_fn is not None and bool(self.idle_fn(layer, tensors))

    def source_key(self, layer: Any) -> str:
        """The rendered sources of the layer's kernels (and the host code that launches them)."""
        keys = "".join(sorted(k.key() for k in self.kernels(layer)))
        return hashlib.sha256((super().source_key(layer) + keys).encode()).hexdigest()[:24]


def places_last_axis(layer: Any, row: int, stride: int, offset: int) -> bool:
    """Tactic.places of a family that writes its output a pixel row at a time (the channels of a
    channels-last tensor) with a runtime row stride, checking its own store alignment at run time:
    placeable where the rows are whole pixels (a Concat on the last axis)."""
    outs = getattr(layer, "out_shapes", ())
    return bool(outs) and len(outs[0]) >= 2 and row == int(outs[0][-1]) and stride >= row


def reads_last_axis(layer: Any, index: int, row: int, stride: int, offset: int) -> bool:
    """Tactic.reads_placed of a family that reads its first input a pixel at a time (the channels
    of a channels-last tensor) with a runtime row stride, checking its own load alignment at run
    time: it reads input 0 placed where the rows are whole pixels (a Concat on the last axis)."""
    ins = getattr(layer, "in_shapes", ())
    return index == 0 and bool(ins) and len(ins[0]) >= 2 and row == int(ins[0][-1]) and stride >= row


def storage_code(layer: Any, t: DeviceTensor, codes: Mapping[str, str], allowed: Sequence[str],
                 what: str = "") -> str:
    """The kernel-name suffix of `t`'s storage type (`codes`: numpy dtype name -> suffix) when
    the family has a kernel for it (`allowed`); a DeviceError naming the layer otherwise."""
    code = codes.get(t.dtype.name)
    if code not in allowed:
        raise DeviceError(f"{layer.kind}{' ' + what if what else ''} has no CUDA kernel for {t.dtype}",
                          where=f"layer {layer.name!r}", hint="use --target cpu")
    return code


def stored_as(*dtypes: str, then: Any = None):
    """supports(layer) of a family whose kernels take these storage dtypes (numpy names) for the
    layer's first input (layers without stamped dtypes pass), and then `then(layer)` if given."""
    allowed = frozenset(dtypes)

    def supports(layer: Any) -> bool:
        stored = layer.in_dtypes[0] if layer.in_dtypes else ""
        return (not stored or stored in allowed) and (then is None or then(layer))

    return supports


def refusing_depth_to_space(supports: Any):
    """`supports` that refuses layers with a `depth_to_space` attribute first."""

    def refusing(layer: Any) -> bool:
        return DEPTH_TO_SPACE not in (getattr(layer, "attrs", None) or {}) and supports(layer)

    return refusing


#: every CudaTactic the family modules declare, in import order; the built-in plugin
#: (polykit.kernels.builtin) registers them through the `polykit_tactics` hook
DECLARED: list[CudaTactic] = []


def cuda_tactic(kind: str, name: str, *, kernels, supports=lambda layer: True, priority: int = 0,
                params: Mapping[str, Any] | None = None, archs: Sequence[str] = (),
                workspace: WorkspaceFn = no_workspace, estimate: Any = None, conservative: bool = False,
                domain: str = ANY, serves: Any = None, places: Any = None, reads_placed: Any = None,
                depth_to_space: bool = False, idle: Any = None, variant_of: str | None = None):
    """Decorator for an enqueue function: declares a CudaTactic for layer `kind` of `domain` (any
    by default; `conservative`: the kind's trusted plain kernel, `polykit debug tactics`' good side;
    `serves`, `places`, `reads_placed`, `variant_of`: polykit.kernels.tactics.Tactic.serves / places_fn /
    reads_placed_fn / variant_of; `idle`: CudaTactic.idle_fn). A ConvNHWC storing its output depth-to-space
    (its `depth_to_space` attribute, ops/nn/channels_last.py) is refused unless the family says
    it stores so (`depth_to_space`): a new family cannot run one by mistake."""
    if not depth_to_space:
        supports = refusing_depth_to_space(supports)

    def declare(enqueue_fn):
        DECLARED.append(CudaTactic("cuda", kind, name, dict(params or {}), supports, priority, archs=tuple(archs),
                                   workspace_fn=workspace, estimate_fn=estimate, kernels_fn=kernels,
                                   enqueue_fn=enqueue_fn, conservative=conservative, domain=domain,
                                   serves=serves, places_fn=places, reads_placed_fn=reads_placed, idle_fn=idle,
                                   variant_of=variant_of))
        return enqueue_fn

    return declare


def all_cuda_tactics() -> list[CudaTactic]:
    """Every registered cuda tactic (imports the families first)."""
    from polykit.kernels.tactics import all_tactics

    return [t for t in all_tactics("cuda") if isinstance(t, CudaTactic)]
