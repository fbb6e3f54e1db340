"""Write the SASS of the sm90 GEMM kernel for one tile and fused epilogue (needs cuobjdump).

    PYTHONPATH=. python3 benchmarks/cuda_sass.py --tile 128x64 --epilogue bias --out gemm.sass
    PYTHONPATH=. python3 benchmarks/cuda_sass.py --conv 32,32,3 --tile 64x32x2 --out conv.sass

--conv C,N,K: the fp16 conv_sm90 kernel of a KxK, pad K//2 channels-last convolution of C into N channels
instead, and the instruction count of its producer's k-tile loop (the smallest loop around the im2col
cp.async copies, LDGSTS): the producer's cost a k-tile, which bounds the narrow tiles. cuobjdump comes
with the CUDA toolkit, or `pip install nvidia-cuda-cuobjdump` (its nvidia/cu13/bin; set CUOBJDUMP).

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
    args = parser.parse_args()
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


def producer_loop(sass: str) -> int:
    """Instructions of the smallest loop (a backward branch) that holds every LDGSTS of the kernel."""
    rows = [(int(m[1], 16), line) for line in sass.splitlines() if (m := re.match(r"\s+/\*([0-9a-f]{4})\*/", line))]
    copies = [a for a, line in rows if "LDGSTS.E" in line]
    loops = [(int(m[1], 16), a) for a, line in rows if (m := re.search(r"BRA (0x[0-9a-f]+)", line))]
    first, last = min((lp for lp in loops if lp[0] <= min(copies) and lp[1] >= max(copies)), key=lambda lp: lp[1] - lp[0])
    return sum(first <= a <= last for a, _ in rows)


if __name__ == "__main__":
    main()
