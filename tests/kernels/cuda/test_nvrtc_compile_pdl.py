"""CI (no GPU): kernel variants compiled for programmatic dependent launch (KernelSource.with_pdl,
polykit.kernels.cuda.pdl) compile with NVRTC for sm_90a, and in their PTX every entry waits
(`griddepcontrol.wait`) before any memory access other than its parameters (a kernel that defers its wait,
pdl.DEFER: before any but global reads), then triggers its dependents; below sm_90 the entry macro compiles to nothing.

The sample runs in every CI pass: every fourth kernel source file's first unit, the shortest generated
unit (rendered, headers inlined) and the first sm_90a unit (one of each file took ~150 s of a 2-core CI run: the instrumentation is
one text rule, checked on every unit by test_pdl_instrument.py, so a sample shows NVRTC takes it). The
whole set (457 units, every compile variant) compiled for sm_90a on 2026-12-06 (branch pdl, 2 workers,
1980 s): too long for CI, whose plain all-variants compile (test_nvrtc_compile) already covers the kernels."""

from __future__ import annotations

import re

import pytest

from polykit.kernels.cuda.pdl import _GLOBAL, _kernel_body, _mask, defers
from polykit.runtime.cuda.nvrtc import unique_units

from .test_nvrtc_compile import all_variants

#: a PTX instruction that may touch memory other than the kernel's parameters and the module's constants (a
#: __constant__ array, written by the host only: weight_only_mma.cuh's masks)
_MEMORY = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:ld|st|atom|red|cp|prefetch|prefetchu|multimem|tex|tld4|suld|sust|sured|"
                     r"cp\.async|cp\.reduce\.async|wgmma|tcgen05)\b(?!\.param|\.const)", re.M)
_ENTRY = re.compile(r"^\.(?:visible|weak)?\s*\.entry\s+(\w+)\(.*?^\{(.*?)^\}", re.M | re.S)


def ptx(text: str, arch: str) -> str:
    """NVRTC's PTX for `text` (the options kernels compile with), or AssertionError with the log."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), b"unit.cu", 0, [], [])
    assert int(err) == 0
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise AssertionError(log.decode(errors="replace"))
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        out = b" " * size
        nvrtc.nvrtcGetPTX(prog, out)
        return out.decode().rstrip("\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def entries_wait_first(code: str) -> list[str]:
    """The entries of PTX `code`, each checked: griddepcontrol.wait before any memory instruction but
    ld.param, then griddepcontrol.launch_dependents."""
    names = []
    for m in _ENTRY.finditer(code):
        name, body = m.group(1), m.group(2)
        wait = body.find("griddepcontrol.wait;")
        assert wait >= 0, f"{name} never waits"
        first = _MEMORY.search(body)
        assert first is None or first.start() > wait, f"{name}: {first.group(0).strip()} before the wait"
        assert body.find("griddepcontrol.launch_dependents;") > wait, f"{name} does not trigger after its wait"
        names.append(name)
    return names


#: what a kernel that defers its wait (pdl.DEFER) may do before it: read global memory (its plan weights) into
#: registers or, by cp.async, into its shared memory; nothing that writes global memory
_EARLY = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:ld\.global|cp\.async\.c[ag]\.shared\.global|cp\.async\.commit_group|"
                    r"cp\.async\.wait)", re.M)


def entries_defer_reads_only(code: str, names: set) -> list[str]:
    """entries_wait_first, but the entries in `names` may read global memory (ld.global, cp.async to shared memory)
    before their griddepcontrol.wait; every other memory instruction comes after it, then the trigger."""
    out = []
    for m in _ENTRY.finditer(code):
        name, body = m.group(1), m.group(2)
        if name not in names:
            out += entries_wait_first(m.group(0))
            continue
        wait = body.find("griddepcontrol.wait;")
        assert wait >= 0, f"{name} never waits"
        early = [i for i in _MEMORY.finditer(body[:wait])]
        assert early, f"{name} reads nothing before its wait"
        for i in early:
            line = body[i.start():].lstrip().split("\n", 1)[0]
            assert _EARLY.match(line), f"{name}: {line.strip()} before the wait"
        assert body.find("griddepcontrol.launch_dependents;") > wait, f"{name} does not trigger after its wait"
        out.append(name)
    return out


def sample() -> list:
    """Every fourth kernel source file's first unit (by file name), the shortest generated unit and the
    first sm_90a unit, and the units test_the_entry_is_a_no_op_below_sm90 reads."""
    units = unique_units(all_variants())
    by_file: dict = {}
    for u in units:
        by_file.setdefault(u.file or f"code:{u.name.split('_')[0]}", u)
    files = sorted(by_file)
    keep = {f for i, f in enumerate(files) if i % 4 == 0} | {"hold.cu", "norm.cu", "reduce.cu"}
    keep.add(min((f for f in files if by_file[f].code is not None), key=lambda f: len(by_file[f].render())))
    keep.add(next(f for f in files if by_file[f].arch == "sm_90a"))
    return [by_file[f] for f in files if f in keep]


SAMPLE = sample()


def test_the_sample_holds_generated_and_sm90a_units():
    assert any(u.code is not None for u in SAMPLE) and any(u.arch == "sm_90a" for u in SAMPLE)


@pytest.mark.parametrize("unit", SAMPLE, ids=lambda u: u.file or u.name)
def test_every_entry_waits_before_touching_memory_on_sm90a(unit):
    text = unit.with_pdl().render()
    assert entries_defer_reads_only(ptx(text, "sm_90a"), deferring_names(text))


def deferring_names(text: str) -> set:
    """The kernels of `text` whose body starts with PK_PDL_DEFER (extern "C" names, as in the PTX)."""
    masked, names = _mask(text), set()
    for m in _GLOBAL.finditer(masked):
        body = _kernel_body(masked, m.start())
        if defers(masked, body):
            names.add(re.findall(r"(\w+)\s*\(", masked[m.start():body])[-1])
    return names


@pytest.mark.parametrize("file", ["hold.cu", "norm.cu", "reduce.cu"])
def test_the_entry_is_a_no_op_below_sm90(file):
    unit = next(u for u in SAMPLE if u.file == file)
    code = ptx(unit.with_pdl().render(), "sm_80")
    assert "griddepcontrol" not in code and _ENTRY.search(code)



@pytest.mark.parametrize("file, entry", [("weight_only_mma_staged.cu", "weight_only_mma_staged"),
                                         ("weight_only_mma_rows.cu", "weight_only_mma_rows")])
def test_the_weight_only_mma_kernels_read_only_their_weights_before_the_wait(file, entry):
    unit = next(u for u in unique_units(all_variants()) if u.file == file)
    text = unit.with_pdl().render()
    assert deferring_names(text) == {entry}
    names = entries_defer_reads_only(ptx(text, "sm_90a"), {entry})
    assert entry in names and len(names) >= 1
