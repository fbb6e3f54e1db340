"""Write the SASS of the sm90 GEMM kernel for one tile and fused epilogue (needs cuobjdump).

    PYTHONPATH=. python3 benchmarks/cuda_sass.py --tile 128x64 --epilogue bias --out gemm.sass

Compiles exactly what a plan would (NVRTC, sm_90a) for a MatMul [M, K] x [K, N] whose epilogue
is one of benchmarks/cuda_gemm.py's EPILOGUES, then disassembles the cubin: the way to check
that loads are 16 bytes wide, that HGMMA is there, and what the epilogue really executes.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    M, N, K = (int(x) for x in args.shape.split("x"))
    tile = next(t for t in TILES if t.label == args.tile)
    body, extras = EPILOGUES[args.epilogue]
    names = ("A", "B", *extras)
    epi = {"epilogue": {"input": "raw", "body": body}} if body else {}
    shapes = [(M, K), (K, N)] + [f(M, N) for f in extras.values()]
    layer = LayerDesc("mm", "MatMul", names, ("Y",), epi, domain="ai.polykit" if body else "",
                      in_dtypes=("float16",) * len(names), out_dtypes=("float16",), in_shapes=tuple(shapes),
                      out_shapes=((M, N),))
    cubin = compile_source(kernel_for(layer, tile, "half_t", True), "sm_90")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    Path(args.out).write_text(sass)
    print(f"{args.out}: {len(sass.splitlines())} lines")


if __name__ == "__main__":
    main()
