"""Write the SASS of the sm90 GEMM kernel for one tile and fused epilogue (needs cuobjdump).

    PYTHONPATH=. python3 benchmarks/cuda_sass.py --tile 128x64 --epilogue bias --out gemm.sass
    PYTHONPATH=. python3 benchmarks/cuda_sass.py --conv 32,32,3 --tile 64x32x2 --out conv.sass

--int8 int8|float32, --fp8 e4m3|float32: the INT8 (FP8) conv_sm90 kernel of a ResNet-50 1x1 layer
(64 -> 256 channels on 32x56x56, per-channel scale and bias; int8 / e4m3 output with its residual +
Relu epilogue, float32 output plain: the downsampling shortcut) on its tile (--tile, default 128x64x2
/ 128x64), and the thread instructions per output of its 16-byte epilogue (epilogue_per_output: the
hot path from the last wgmma wait to the tile loop's end, divided by a thread's outputs; --hot-division
for a kernel that divides every value). CUOBJDUMP=... as below.

--norm ELEM,L: norm_warp.cu (cuda.norm.warp) for rows of L elements of ELEM (float16 / bfloat16 / float32), its
LayerNormQuantize form (NW_Q8, e4m3 output) against the plain norm, both compiled with the run-time choices of the
common case pinned (16-byte vectors, a float output, a scale inside the division-free range: norm_hot) so that the
SASS is that path alone: the instructions the e4m3 output stage adds a row element (the difference of the two
kernels' instructions less NOPs, divided by the elements a thread holds) and the opcodes that say how the
quotient and the encode are computed (MUFU.RCP and FCHK: the IEEE division; F2FP.SATFINITE: the hardware e4m3
conversion; CALL: the division's slow path). --arch sm_80 for the software encode.

--fp8-gemm TILE: the FP8 GEMM tile's kernel (fp8_gemm_sm90.py) and its QGMMA, wgmma waits and local memory;
--fp8-conv TILE the same for an FP8 conv tile with the promotion in pieces (fp8_conv_sm90.py).

--conv C,N,K: the fp16 conv_sm90 kernel of a KxK, pad K//2 channels-last convolution of C into N channels
instead, and the instruction count of its producer's k-tile loop (the smallest loop around the im2col
cp.async copies, LDGSTS): the producer's cost a k-tile, which bounds the narrow tiles. cuobjdump comes
with the CUDA toolkit, or `pip install nvidia-cuda-cuobjdump` (its nvidia/cu13/bin; set CUOBJDUMP).

--flash ELEM,HD,BKV[,ROWS]: flash_attention.cu (cuda.attention.flash and its tiles: half_t / bf16_t, head
size, key tile, m-tiles a warp) instead, and its key-tile loop: instructions and branches (BRA; BSSY, a
region where a warp may split; CALL) and the kernel's CALL sites: the count that says whether the softmax,
mask and store passes of flash_common.cuh can diverge (issue 30: none but uniform branches in the loop).

Compiles exactly what a plan would (NVRTC, sm_90a) for a MatMul [M, K] x [K, N] whose epilogue
is one of benchmarks/cuda_gemm.py's EPILOGUES, then disassembles the cubin: the way to check
that loads are 16 bytes wide, that HGMMA is there, and what the epilogue really executes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path


def main() -> None:
    from cuda_gemm import EPILOGUES

    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.gemm.gemm_sm90 import TILES, kernel_for
    from polykit.runtime.cuda.nvrtc import compile_source

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tile", default="128x64")
    parser.add_argument("--epilogue", default="none", choices=sorted(EPILOGUES))
    parser.add_argument("--shape", default="1024x3072x768", help="MxNxK")
    parser.add_argument("--out", default="gemm.sass")
    parser.add_argument("--conv", help="C,N,K: a KxK conv_sm90 kernel (fp16) instead of the GEMM")
    parser.add_argument("--int8", choices=("int8", "float32"), help="the INT8 1x1 conv kernel with this output")
    parser.add_argument("--int8-body", choices=("residual", "none", "relu"), default="residual",
                        help="--int8 int8's epilogue: the int8 residual + Relu (default), none, or Relu alone")
    parser.add_argument("--int8-zero", choices=("const", "runtime"), default="const",
                        help="--int8 int8's output zero point: a constant 0 (Y_ZERO 0, what --int8 builds stamp; "
                             "default) or read at run time (an asymmetric model's)")
    parser.add_argument("--fp8", choices=("e4m3", "float32"), help="the FP8 1x1 conv kernel with this output")
    parser.add_argument("--fp8-family", choices=("conv", "gemm", "gemm_fast"), default="conv",
                        help="--fp8: the conv tiles (fp8_sm90.py) or the GEMM tiles (fp8_gemm_sm90.py), fast or not")
    parser.add_argument("--fp8-residual", choices=("float32", "e4m3", "none"), default="float32",
                        help="--fp8 e4m3: the residual the epilogue adds (none: no epilogue)")
    parser.add_argument("--hot-division", action="store_true",
                        help="count the IEEE division's fast path (a kernel that divides for every output)")
    parser.add_argument("--flash", help="ELEM,HD,BKV[,ROWS]: the mma.sync flash kernel and its key-tile loop")
    parser.add_argument("--norm", metavar="ELEM,L", help="norm_warp.cu's NW_Q8 output stage against the plain norm")
    parser.add_argument("--arch", default="sm_90", help="--norm's target (sm_90, sm_80)")
    parser.add_argument("--fp8-gemm", metavar="TILE",
                        help="the FP8 GEMM tile's kernel (fp8_gemm_sm90.py; e4m3 out, float32 residual): its wgmma")
    parser.add_argument("--fp8-conv", metavar="TILE",
                        help="the FP8 conv tile with pieces (fp8_conv_sm90.py; e4m3 out, float32 residual): its wgmma")
    parser.add_argument("--w4", metavar="TILE[,ELEM]",
                        help="weight_only_mma_staged's tile (c16_k4096) or weight_only_mma_rows's (rows_n16_k4096): "
                        "its LDG.128 spacing, registers, spills")
    args = parser.parse_args()
    if args.w4:
        print(w4_report(args.w4, args.arch, args.out))
        return
    if args.norm:
        report = norm_sass(args.norm, args.arch, args.out)
        print(report)
        return
    if args.fp8_gemm or args.fp8_conv:
        sass = fp8_gemm_sass(args.fp8_gemm) if args.fp8_gemm else fp8_conv_sass(args.fp8_conv)
        Path(args.out).write_text(sass)
        waits = Counter(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x\d)", sass))
        print(f"{args.out}: {len(sass.splitlines())} lines; QGMMA {len(re.findall(r'QGMMA[.]', sass))}, "
              f"wgmma waits {dict(waits)}, local memory {len(re.findall(r'[^.](?:LDL|STL)[. ]', sass))}")
        return
    if args.flash:
        sass = flash_sass(args.flash)
        Path(args.out).write_text(sass)
        count, branches = flash_loop(sass)
        print(f"{args.out}: key-tile loop {count} instructions, BRA {branches['BRA']}, BSSY {branches['BSSY']}, "
              f"CALL {branches['CALL']}; CALL sites in the kernel {len(re.findall(r'CALL[.]', sass))}")
        return
    if args.int8 or args.fp8:
        sass, vector_store, outputs, cold = quantized_sass(args)
        Path(args.out).write_text(sass)
        count, classes = epilogue_per_output(sass, vector_store, cold)
        print(f"{args.out}: {len(sass.splitlines())} lines; epilogue hot path {count} instructions for {outputs} "
              f"outputs a thread = {count / outputs:.1f} an output")
        print("  by opcode:", ", ".join(f"{op} {n / outputs:.2f}" for op, n in classes.most_common()))
        return
    if args.conv:
        sass = conv_sass(args)
        Path(args.out).write_text(sass)
        print(f"{args.out}: {len(sass.splitlines())} lines; producer k-tile loop: {producer_loop(sass)} instructions")
        return
    M, N, K = (int(x) for x in args.shape.split("x"))
    tile = next(t for t in TILES if t.label == args.tile)
    body, extras = EPILOGUES[args.epilogue]
    names = ("A", "B", *extras)
    epi = {"epilogue": {"input": "raw", "body": body}} if body else {}
    shapes = [(M, K), (K, N)] + [f(M, N) for f in extras.values()]
    layer = LayerDesc("mm", "MatMul", names, ("Y",), epi, domain="ai.polykit" if body else "",
                      in_dtypes=("float16",) * len(names), out_dtypes=("float16",), in_shapes=tuple(shapes),
                      out_shapes=((M, N),))
    sass = disassemble(compile_source(kernel_for(layer, tile, "half_t", True), "sm_90"))
    Path(args.out).write_text(sass)
    print(f"{args.out}: {len(sass.splitlines())} lines")


def disassemble(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        tool = os.environ.get("CUOBJDUMP", "cuobjdump")
        return subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout


#: opcodes that tell the e4m3 output stage's arithmetic (the division, its slow path, the conversion)
NORM_OPS = ("MUFU.RCP", "FCHK", "CALL", "F2FP.SATFINITE", "FMNMX", "FFMA", "STG")


def norm_hot(source):
    """`source` (norm_warp.cu) with vec 1, a float output and (e4m3_quantize.cuh) rcp_ok fixed: the common
    case's path alone in the SASS (the patches that do not apply to a text leave it as it is)."""
    from dataclasses import replace

    text = source.render().replace("norm_warp(NW_PARAMS) {", "norm_warp(NW_PARAMS) {\n  vec = 1;\n  __builtin_assume(Y != nullptr);")
    text = text.replace("q.rcp_ok = ys >= 0x1p-90f && ys <= 0x1p90f;", "q.rcp_ok = true;")
    return replace(source, defines=(), code=text)


def norm_sass(spec: str, arch: str, out: str) -> str:
    """The SASS of norm_warp.cu with and without NW_Q8 for rows of L elements of ELEM, written to `out` (the
    NW_Q8 kernel) and `out`.plain; the report: instructions of each (NOPs left out), the output stage's
    instructions an element and the opcodes of NORM_OPS an element."""
    from polykit.kernels.cuda.reduce.norm import WARP_ELEMS, warp_geometry, warp_kernel
    from polykit.runtime.cuda.nvrtc import compile_source

    elem, length = spec.split(",")
    geometry = warp_geometry(int(length), WARP_ELEMS[elem][1])
    per_thread = geometry.chunks * 16 // WARP_ELEMS[elem][1]
    sass = {q8: disassemble(compile_source(norm_hot(warp_kernel(elem, geometry, q8=q8)), arch)) for q8 in (True, False)}
    Path(out).write_text(sass[True])
    Path(out + ".plain").write_text(sass[False])

    def ops(text: str) -> list[str]:
        return [m[1] for line in text.splitlines() if (m := re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", line))
                and m[1] != "NOP"]

    q8, plain = ops(sass[True]), ops(sass[False])
    count = {op: sum(o == op or o.startswith(op + ".") for o in q8) - sum(o == op or o.startswith(op + ".") for o in plain)
             for op in NORM_OPS}
    return (f"{out}: norm_warp {elem} L {length} ({geometry.lanes} lanes x {geometry.chunks} chunks, {per_thread} "
            f"elements a thread), {arch}: NW_Q8 {len(q8)} instructions, plain {len(plain)}; the e4m3 stage "
            f"{(len(q8) - len(plain)) / per_thread:.2f} an element\n  added an element: "
            + ", ".join(f"{op} {n / per_thread:.2f}" for op, n in count.items()))


def fp8_gemm_sass(label: str) -> str:
    """The SASS of fp8_gemm_sm90's `label` tile (an e4m3 output with a float32 residual read 8 at a time): its
    QGMMA (4 a piece of a stage), its wgmma waits (wait_group 1 between two pieces), no local memory."""
    from polykit.kernels.cuda.int8 import fp8_gemm_sm90, fp8_sm90
    from polykit.runtime.cuda.nvrtc import compile_source

    tile, pieces, bufs = next(t for t in fp8_gemm_sm90.TILES if t[0].label == label)
    layer = fp8_sm90.fp8_layer(fp8_sm90.E4M3, residual="float32")
    return disassemble(compile_source(fp8_gemm_sm90.kernel(layer, tile, pieces, bufs), "sm_90a"))


def fp8_conv_sass(label: str) -> str:
    """The SASS of fp8_conv_sm90's `label` tile (conv_sm90 F8, an e4m3 output with a float32 residual read 8 at a
    time): its QGMMA (4 a piece of a stage), its wgmma waits, no local memory."""
    from polykit.kernels.cuda.int8 import fp8_conv_sm90, fp8_sm90
    from polykit.runtime.cuda.nvrtc import compile_source

    tile, pieces, bufs = next(t for t in fp8_conv_sm90.TILES if t[0].label == label)
    layer = fp8_sm90.fp8_layer(fp8_sm90.E4M3, residual="float32")
    return disassemble(compile_source(fp8_sm90.kernel(layer, tile, pieces=pieces, bufs=bufs), "sm_90a"))


def conv_sass(args) -> str:
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN
    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES, ELEMS
    from polykit.kernels.cuda.gemm.gemm_sm90 import kernel_for
    from polykit.runtime.cuda.nvrtc import compile_source

    C, N, K = (int(v) for v in args.conv.split(","))
    x, w, y = (8, 64, 64, C), (N, K, K, C), (8, 64, 64, N)
    layer = LayerDesc("conv", "ConvNHWC", ("X", "W", "B"), ("Y",), {"kernel_shape": [K, K], "pads": [K // 2] * 4},
                      domain=POLYKIT_DOMAIN, precision="fp16", in_dtypes=("float16",) * 3, out_dtypes=("float16",),
                      in_shapes=(x, w, (N,)), out_shapes=(y,))
    tile = next(t for t in CONV_TILES if t.label == args.tile)
    return disassemble(compile_source(kernel_for(layer, tile, ELEMS["float16"], False, "conv_sm90", False), "sm_90a"))


def quantized_sass(args) -> tuple[str, str, int, tuple[str, ...]]:
    """(SASS, the 16-byte path's store, outputs a consumer thread finishes a tile, the opcodes of its slow
    paths) of the INT8 / FP8 conv_sm90 kernel of ResNet-50's layer1 1x1 conv3 (64 -> 256 on 32x56x56)."""
    from dataclasses import replace

    from polykit.kernels.cuda.gemm.gemm_sm90 import kernel_for
    from polykit.kernels.cuda.int8 import fp8_gemm_sm90, fp8_sm90, int8_sm90
    from polykit.runtime.cuda.nvrtc import compile_source

    x, w, y = (32, 56, 56, 64), (256, 1, 1, 64), (32, 56, 56, 256)
    sizes = {"x": x, "w": w, "s": (256,), "b": (256,), "skip": y}

    def with_bias(layer):  # a per-channel bias (the folded batch norm), slot 5
        names, dtypes = list(layer.inputs), list(layer.in_dtypes)
        names[5], dtypes[5] = "b", "float32"
        return replace(layer, inputs=tuple(names), in_dtypes=tuple(dtypes))

    if args.int8:
        tile = next(t for t in int8_sm90.TILES if t.label == (args.tile if args.tile != "128x64" else "128x64x2"))
        base = int8_sm90._shaped_residual_layer("int8")
        if args.int8 == "float32":  # the shortcut: no epilogue, no requantization
            base = replace(base, inputs=base.inputs[:8], in_dtypes=base.in_dtypes[:8], attrs={})
        else:
            base = replace(base, inputs=("x", "xz", "w", "wz", "s", "", "ys", "yz", *base.inputs[8:]),
                           in_dtypes=base.in_dtypes[:6] + ("float32", "int8") + base.in_dtypes[8:])
            if args.int8_body != "residual":  # no residual read: no epilogue, or Relu alone
                relu = [{"op": "Relu", "inputs": ["raw"], "outputs": ["y"], "attrs": {}}]
                base = replace(base, inputs=base.inputs[:8], in_dtypes=base.in_dtypes[:8],
                               attrs={"epilogue": {"input": "raw", "body": relu}} if args.int8_body == "relu" else {})
        base = with_bias(base)
        layer = replace(base, in_shapes=tuple(sizes.get(n, ()) for n in base.inputs), out_shapes=(y,),
                        out_dtypes=(args.int8,), precision="int8")
        source = kernel_for(layer, tile, "float", False, "conv_sm90", int8=True)
    else:
        out = fp8_sm90.E4M3 if args.fp8 == "e4m3" else "float32"
        residual = {"none": None, "e4m3": fp8_sm90.E4M3}.get(args.fp8_residual, args.fp8_residual)
        base = with_bias(fp8_sm90.fp8_layer(out, residual=residual if args.fp8 == "e4m3" else None))
        layer = replace(base, in_shapes=tuple(sizes.get(n, ()) for n in base.inputs), out_shapes=(y,))
        if args.fp8_family == "conv":
            tile = next(t for t in fp8_sm90.TILES if t.label == args.tile)
            source = fp8_sm90.kernel(layer, tile)
        else:  # the GEMM tiles (fp8_gemm_sm90.py), promoted in pieces or fast
            tile, pieces, bufs = next(t for t in fp8_gemm_sm90.TILES if t[0].label == args.tile)
            fast = args.fp8_family == "gemm_fast"
            source = fp8_gemm_sm90.kernel(layer, tile, 1 if fast else pieces, 1 if fast else bufs, fast=fast)
    # the output compiled in as the tactics compile it (int8_out.cuh: Y_OUT, a per-channel scale and bias)
    fixed = {"Y_OUT": {"int8": "1", "e4m3": "1", "float32": "0"}[args.int8 or args.fp8], "SCALE_STEP": "1",
             "BIAS_STEP": "1"}
    if args.int8 == "int8" and args.int8_zero == "const":
        fixed["Y_ZERO"] = "0"
    source = replace(source, defines=tuple(d for d in source.defines if d[0] not in fixed) + tuple(fixed.items()))
    # the IEEE division: a slow path (its F2I too, but for Y_ZERO 0, whose 16-byte path converts by F2I)
    cold = ("CALL",) + (() if fixed.get("Y_ZERO") == "0" else ("F2I",)) + (() if args.hot_division else ("MUFU.RCP", "FCHK"))
    # the 16-byte path's store: 8 bytes of int8 / e4m3, or of float32 column pairs (gemm_sm90_epilogue.cuh's
    # I8_NATIVE, no transpose: INT8, and FP8 since the nineteenth session)
    vector_store = "STG.E.64"
    return disassemble(compile_source(source, "sm_90a")), vector_store, tile.msub * tile.bn // 2, cold


#: signs of a slow form where a uniform branch chooses between two (epilogue_per_output): acc_float's
#: range test of a sum against 2^22 (int8_out.cuh; the fast form is the shifter alone)
SLOW_SIGNS = (", 0x800000, PT",)


def opcode(text: str, name: str) -> bool:
    """Whether the instruction `text` is `name` (with any modifiers): F2I, not the packed F2IP of Y_ZERO 0's hot path."""
    return re.search(rf"(?:^|[\s;]){re.escape(name)}(?![\w])", re.sub(r"^@!?U?P\w+\s+", "", text)) is not None


def epilogue_per_output(sass: str, vector_store: str, cold: tuple[str, ...]) -> tuple[int, Counter]:
    """Instructions (and their opcodes) a consumer thread issues on the epilogue's 16-byte path of one tile:
    the basic blocks reachable from that path's entry (the first forward branch after the last
    `WARPGROUP.DEPBAR.LE gsb0, 0x0` whose target reaches a quad shuffle, SHFL, or `vector_store` before any
    unpredicated store of another kind)
    up to the tile loop's back edge, never entering a block that holds a `cold` opcode (slow paths) or
    unpredicated stores but no `vector_store` (the per-element path, the other output type's stores);
    where a branch chooses between the output types, or between a fast and a slow form (SLOW_SIGNS, `cold`
    met on the straight line before the next store), only the output's and the fast side count."""
    rows = [(int(m[1], 16), m[2].strip()) for line in sass.splitlines()
            if (m := re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line))]
    at = {a: i for i, (a, _) in enumerate(rows)}
    wait = max(i for i, (_, t) in enumerate(rows) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in t)

    def branch(t: str) -> int | None:
        m = re.search(r"\bBRA(?:\.\w+)? (?:!?U?P\w+, )?(0x[0-9a-f]+)$", t)
        return int(m[1], 16) if m else None

    def store(t: str) -> str | None:
        m = re.search(r"\b(STG\.E(?:\.\w+)?) ", t)
        return m[1] if m else None

    def shuffles_first(i: int) -> bool:  # the 16-byte path opens with its quad transposes (or, with none, meets
        # its store before any unpredicated store of another width: the per-element path's)
        return next((t.startswith("SHFL") or store(t) == vector_store for _, t in rows[i:]
                     if t.startswith("SHFL") or store(t) == vector_store or (store(t) and not t.startswith("@"))),
                    False)

    entry = next(at[b] for i in range(wait, len(rows)) if (b := branch(rows[i][1])) is not None and b > rows[i][0]
                 and shuffles_first(at[b]))
    leaders = {entry} | {at[b] for _, t in rows if (b := branch(t)) is not None and b in at}
    leaders |= {i + 1 for i, (_, t) in enumerate(rows) if branch(t) is not None or "EXIT" in t}

    def block(i: int) -> list[int]:
        out = [i]
        while out[-1] + 1 < len(rows) and out[-1] + 1 not in leaders:
            out.append(out[-1] + 1)
        return out

    def is_cold(ins: list[int]) -> bool:  # (a predicated store of the other kind issues on this path too,
        texts = [rows[i][1] for i in ins]  # and ptxas splits a 16-byte store into 4-byte ones at times)
        stores = [s for t in texts if (s := store(t)) and not t.startswith("@")]
        return any(opcode(t, c) for t in texts for c in cold) or (bool(stores) and vector_store not in stores)

    def first_store(i: int) -> str | None:  # on the straight line from row i (branches not taken)
        return next((s for _, t in rows[i:i + 600] if (s := store(t))), None)

    def slow_before_store(i: int) -> bool:  # the straight line from row i meets a slow-path sign first
        for _, t in rows[i:i + 600]:
            if store(t) == vector_store:
                return False
            if any(opcode(t, c) for c in cold) or any(c in t for c in SLOW_SIGNS):
                return True
        return False

    seen: set[int] = set()
    todo, classes = [entry], Counter()
    while todo:
        i = todo.pop()
        if i in seen or i >= len(rows) or is_cold(ins := block(i)):
            continue
        seen.add(i)
        classes.update(re.sub(r"^@!?U?P\w+\s+", "", rows[j][1]).split(" ")[0].split(".")[0] for j in ins)
        last = rows[ins[-1]][1]
        target, conditional = branch(last), last.startswith("@")
        nexts = [at[target]] if target is not None and target >= rows[wait][0] else []  # not the tile loop's back edge
        if conditional or (target is None and not last.endswith("EXIT") and not last.startswith("RET")):
            nexts.append(ins[-1] + 1)
        if len(nexts) == 2:  # a runtime test of the output type: the other type's side is not this path
            firsts = [first_store(j) for j in nexts]
            if vector_store in firsts and any(f not in (None, vector_store) for f in firsts):
                nexts = [j for j, f in zip(nexts, firsts) if f == vector_store]
        if len(nexts) == 2:  # a uniform test between a fast and a slow form of the same values
            slow = [slow_before_store(j) for j in nexts]
            if slow[0] != slow[1]:
                nexts = [j for j, w in zip(nexts, slow) if not w]
        todo += nexts
    return sum(classes.values()), classes


def producer_loop(sass: str) -> int:
    """Instructions of the smallest loop (a backward branch) that holds every LDGSTS of the kernel."""
    rows = [(int(m[1], 16), line) for line in sass.splitlines() if (m := re.match(r"\s+/\*([0-9a-f]{4})\*/", line))]
    copies = [a for a, line in rows if "LDGSTS.E" in line]
    loops = [(int(m[1], 16), a) for a, line in rows if (m := re.search(r"BRA (0x[0-9a-f]+)", line))]
    first, last = min((lp for lp in loops if lp[0] <= min(copies) and lp[1] >= max(copies)), key=lambda lp: lp[1] - lp[0])
    return sum(first <= a <= last for a, _ in rows)


def w4_report(spec: str, arch: str, out: str) -> str:
    """weight_only_mma_staged's tile `spec` (TILE[,ELEM]; weight_only_mma_rows's where TILE starts with `rows_`)
    compiled for `arch`: the SASS to `out` and the report of w4_groups plus the cubin's registers and local memory
    (cuobjdump -res-usage)."""
    from polykit.kernels.cuda.int8 import weight_only_mma_rows, weight_only_mma_staged
    from polykit.runtime.cuda.nvrtc import compile_source

    name, elem = (spec.split(",") + ["half_t"])[:2]
    if name.startswith("rows_"):
        kernel, tiles = weight_only_mma_rows.KERNEL, weight_only_mma_rows.ROWS_TILES
    else:
        kernel, tiles = weight_only_mma_staged.KERNEL, weight_only_mma_staged.STAGED_TILES + \
            weight_only_mma_staged.ROLLED_TILES
    tile = next(t for t in tiles if t.name.endswith("_" + name))
    cubin = compile_source(tile.source(elem), arch)
    sass = disassemble(cubin)
    Path(out).write_text(sass)
    groups = w4_groups(kernel_sass(sass, kernel))
    usage = resource_usage(cubin, kernel)
    return (f"{out}: {tile.name} {elem} {arch}: registers {usage.get('REG')}, local memory {usage.get('LOCAL', 0)} "
            f"bytes, stack {usage.get('STACK', 0)}; LDG.E.128 groups (loads / instructions first to last / others "
            "between): " + ", ".join(f"{n} / {span} / {span - n}" for n, span in groups))


def kernel_sass(sass: str, kernel: str) -> list[str]:
    """The instruction texts of `kernel`'s function in cuobjdump's SASS (addresses dropped, NOPs kept)."""
    text = sass.split(f"Function : {kernel}\n", 1)[1].split("Function : ", 1)[0]
    return [m[1] for line in text.splitlines() if (m := re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line))]


def w4_groups(body: list[str]) -> list[tuple[int, int]]:
    """The staged kernel's 16-byte weight loads (LDG.E.128) in runs that no cp.async (LDGSTS) or mma (HMMA) or
    unconditional branch (a copy's end) separates, in SASS order: (loads, instructions from the first to the last) a
    run. The kernel has a body a weight type (int4, uint4), and ptxas may copy a body (with / without zero points); a
    body issues its first loads before staging X (LDGSTS)."""
    runs: list[list[int]] = []
    for i, t in enumerate(body):
        if re.search(r"\bLDG\.E\.128\b", t):
            if runs and not any(re.search(r"LDGSTS|HMMA|^BRA\b", u) for u in body[runs[-1][-1] + 1:i]):
                runs[-1].append(i)
            else:
                runs.append([i])
    return [(len(r), r[-1] - r[0] + 1) for r in runs]


def resource_usage(cubin: bytes, kernel: str) -> dict[str, int]:
    """cuobjdump -res-usage's numbers (REG, STACK, SHARED, LOCAL, ...) of `kernel` in `cubin`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        tool = os.environ.get("CUOBJDUMP", "cuobjdump")
        text = subprocess.run([tool, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    block = text.split(f"Function {kernel}:", 1)[1].split("Function ", 1)[0]
    return {k: int(v) for k, v in re.findall(r"\b([A-Z]+):(\d+)", block)}


def flash_sass(spec: str) -> str:
    """The SASS of flash_attention.cu for ELEM,HD,BKV[,ROWS] (the SHAPES entry with that key tile and those
    m-tiles), compiled as a plan compiles it for an H100 (NVRTC, sm_90)."""
    from polykit.kernels.cuda.attention.flash_attention import SHAPES
    from polykit.runtime.cuda.nvrtc import compile_source

    elem, head, bkv, *rows = spec.split(",")
    shape = next(s for s in SHAPES if s.block_kv(int(head)) == int(bkv) and s.rows == int(rows[0] if rows else 1))
    return disassemble(compile_source(shape.kernel(elem, int(head)), "sm_90"))


def flash_loop(sass: str) -> tuple[int, Counter]:
    """(instructions, counts of BRA / BSSY / CALL) of the flash kernel's key-tile loop: the widest backward
    branch around every HMMA."""
    rows = [(int(m[1], 16), m[2]) for line in sass.splitlines()
            if (m := re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line))]
    mma = [a for a, t in rows if "HMMA" in t]
    loops = [(int(m[1], 16), a) for a, t in rows if (m := re.search(r"\bBRA (0x[0-9a-f]+)$", t)) and int(m[1], 16) < a]
    first, last = max((lp for lp in loops if lp[0] <= min(mma) and lp[1] >= max(mma)), key=lambda lp: lp[1] - lp[0])
    body = [t for a, t in rows if first <= a <= last]
    return len(body), Counter(op for t in body for op in ("BRA", "BSSY", "CALL") if re.search(rf"\b{op}\b", t))


if __name__ == "__main__":
    main()
