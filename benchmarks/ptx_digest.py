"""The sha256 of the PTX NVRTC makes of every kernel variant whose rendered source contains a marker (no GPU).

For a refactor of shared device code that should change nothing: run it on both trees, then compare.

    PYTHONPATH=. python benchmarks/ptx_digest.py --match "struct E4m3Quantizer" --match "Out int8_out(" \
        --arch sm_90 --arch sm_80 --workers 2 --out /tmp/before
    (same in the other tree with --out /tmp/after)
    python benchmarks/ptx_digest.py --compare /tmp/before /tmp/after

Variants come from `compile_variants()` of every module in `polykit.kernels.cuda.kernel_modules()`
(as tests/kernels/cuda/test_nvrtc_compile.py collects them); one compile unit per distinct rendered text, keyed
across trees by (file, name, defines, the generated code's own text before its includes, arch), since the rendered
text differs where a header moved. A variant that pins its arch (sm_90a) compiles once, for that arch. Writes
<out>/digests.json and <out>/ptx/<n>.ptx. --compare also tells, of the PTX that differs, which is the same
instruction sequence after `normalized()`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def variants(markers: list[str]):
    import polykit.kernels.cuda as cuda_kernels
    from polykit.runtime.cuda.nvrtc import unique_units

    return [u for u in unique_units(cuda_kernels.all_compile_variants()) if any(m in u.render() for m in markers)]


def label(unit, arch: str) -> str:
    d = unit.to_json()
    code = hashlib.sha256(d["code"].encode()).hexdigest()[:16] if d["code"] is not None else None
    return json.dumps([d["file"], d["name"], d["defines"], code, unit.arch or arch])


def ptx_of(job):
    """The PTX of one unit through NVRTC's own API (cuda.core's Program wants a driver for PTX), with the
    options polykit compiles its cubins with."""
    unit_json, arch = job
    from cuda.bindings import nvrtc

    from polykit.kernels.cuda.base import KernelSource
    from polykit.runtime.cuda.nvrtc import _program_options, unit_arch

    unit = KernelSource.from_json(unit_json)
    arch = unit_arch(unit, arch)
    name = unit.file or f"{unit.name}.cu"
    options = _program_options(arch, name).as_bytes("nvrtc")
    err, prog = nvrtc.nvrtcCreateProgram(unit.render().encode(), name.encode(), 0, [], [])
    assert int(err) == 0, err
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        if int(err) != 0:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"{name} {arch}: {log.decode(errors='replace')}")
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_REG = re.compile(r"%(rd|rs|fd|hh|f|r|p|h)(\d+)\b")
_ASM_MARK = re.compile(r"^\t// (begin|end) inline asm\n", re.M)


def normalized(ptx: str) -> str:
    """`ptx` less what an identical instruction sequence may still differ in: the `// begin / end inline asm`
    comment lines NVRTC puts around each asm statement (one asm of two instructions, or two asms of one each), the
    virtual registers' numbers (renumbered per register class in order of first use) and the `.reg` counts."""
    ptx = _ASM_MARK.sub("", ptx)
    ptx = re.sub(r"^(\t\.reg \.\w+ \t%\w+)<\d+>;", r"\1<N>;", ptx, flags=re.M)
    names: dict[tuple[str, str], int] = {}
    per_class: dict[str, int] = {}

    def rename(m: re.Match) -> str:
        key = (m.group(1), m.group(2))
        if key not in names:
            names[key] = per_class.get(key[0], 0)
            per_class[key[0]] = names[key] + 1
        return f"%{key[0]}{names[key]}"

    return _REG.sub(rename, ptx)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--match", action="append", default=[])
    ap.add_argument("--arch", action="append", default=[])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads((Path(p) / "digests.json").read_text()) for p in args.compare)
        same = sorted(k for k in a if b.get(k, {}).get("sha256") == a[k]["sha256"])
        diff = sorted(k for k in a if k in b and k not in same)
        only = sorted(set(a) ^ set(b))
        print(f"{len(a)} / {len(b)} variants hashed, {len(same)} identical, {len(diff)} differ, "
              f"{len(only)} in one only")
        norm_same = [k for k in diff
                     if normalized(Path(a[k]["ptx"]).read_text()) == normalized(Path(b[k]["ptx"]).read_text())]
        print(f"of the {len(diff)} that differ, {len(norm_same)} are the same instruction sequence (normalized(): "
              "registers renumbered, inline-asm comment lines and .reg counts dropped)")
        for k in diff:
            print("SAME-NORMALIZED" if k in norm_same else "DIFF", k, a[k]["ptx"], b[k]["ptx"])
        for k in only:
            print("ONLY", k)
        return 0 if len(norm_same) == len(diff) and not only else 1
    out = Path(args.out)
    (out / "ptx").mkdir(parents=True, exist_ok=True)
    units = variants(args.match)
    jobs, labels = [], []
    for arch in args.arch:
        for u in units:
            key = label(u, arch)
            if key not in labels:
                labels.append(key)
                jobs.append((u.to_json(), arch))
    print(f"{len(units)} units, {len(jobs)} compiles", flush=True)
    digests = {}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for i, (key, ptx) in enumerate(zip(labels, pool.map(ptx_of, jobs))):
            path = out / "ptx" / f"{i}.ptx"
            path.write_bytes(ptx)
            digests[key] = {"sha256": hashlib.sha256(ptx).hexdigest(), "ptx": str(path)}
            print(i, digests[key]["sha256"][:16], key, flush=True)
    (out / "digests.json").write_text(json.dumps(digests, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
