"""Count the pointwise (1x1) convolutions of ONNX models: what they move and what the tiles waste.

    PYTHONPATH=. python3 benchmarks/pointwise_count.py /work/zoo_cache/efficientnet_b0_bs1.onnx \
        /work/zoo_cache/mobilenet_v3_large_bs1.onnx --batch 32 [--sm-count 132] [--markdown]

Reads each model (static shapes at its export batch, rescaled to --batch) and lists every 1x1,
stride-1, unpadded, group-1 Conv as the GEMM it is (M = batch x H x W pixels, K = input channels,
N = output channels), with its fp16 bytes (X and W read once, Y written once) and flops, its
roofline time at 4.8 TB/s (H200 HBM3e), the sm90 wgmma tile the cost model (gemm_sm90.predicted_us)
puts first with the fraction of that tile's work lost to N padding (to BN) and K padding (to its
64-deep stage), and the skinny tile (gemm_skinny.skinny_us) it would put first. Needs only onnx and
polykit (no torch, no GPU): the numbers are counts, not timings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx

from polykit.kernels.cuda.conv.conv_sm90 import CONV_TILES
from polykit.kernels.cuda.gemm.gemm_skinny import TILES, skinny_us
from polykit.kernels.cuda.gemm.gemm_sm90 import BK, predicted_us

HBM_BYTES_PER_US = 4.8e6


def pointwise_convs(path: Path, batch: int) -> list[tuple[str, int, int, int]]:
    """(node name, M, N, K) of every pointwise Conv in the model at `batch`."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False))
    graph = model.graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    shapes.update({t.name: list(t.dims) for t in graph.initializer})
    out = []
    for node in graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        w, x = shapes.get(node.input[1]), shapes.get(node.input[0])
        if not w or not x or len(w) != 4 or list(w[2:]) != [1, 1] or attrs.get("group", 1) != 1:
            continue
        if any(s != 1 for s in attrs.get("strides", [1, 1])) or any(attrs.get("pads", [0] * 4)):
            continue
        out.append((node.name, batch // max(1, x[0]) * x[0] * x[2] * x[3], w[0], w[1]))
    return out


def row(M: int, N: int, K: int, sm_count: int) -> dict:
    nbytes, flops = 2 * (M * K + K * N + M * N), 2.0 * M * N * K
    if K % 8:  # neither kernel family takes rows that are not 16-byte aligned (conv_sm90.plan_conv)
        return {"M": M, "N": N, "K": K, "MB": nbytes / 1e6, "GFLOP": flops / 1e9,
                "roofline_us": nbytes / HBM_BYTES_PER_US, "sm90_tile": "-", "sm90_us": float("nan"),
                "waste": float("nan"), "n_pad": float("nan"), "k_pad": float("nan"), "skinny_tile": "-",
                "skinny_us": float("nan")}
    costs = [predicted_us(t, M, N, K, 1, sm_count) for t in CONV_TILES]
    tile = CONV_TILES[costs.index(min(costs))]
    n_pad = 1 - N / (-(-N // tile.bn) * tile.bn)
    k_pad = 1 - K / (-(-K // BK) * BK)
    fitting = [t for t in TILES if t.fits(K, False)]
    skinny = min(fitting, key=lambda t: skinny_us(t, M, N, K, sm_count)) if fitting else None
    return {"M": M, "N": N, "K": K, "MB": nbytes / 1e6, "GFLOP": flops / 1e9, "roofline_us": nbytes / HBM_BYTES_PER_US,
            "sm90_tile": tile.label, "sm90_us": min(costs), "waste": 1 - (1 - n_pad) * (1 - k_pad), "n_pad": n_pad,
            "k_pad": k_pad, "skinny_tile": skinny.label if skinny else "-",
            "skinny_us": skinny_us(skinny, M, N, K, sm_count) if skinny else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sm-count", type=int, default=132)
    parser.add_argument("--markdown", action="store_true", help="a table per model (docs/CUDA_KERNELS.md)")
    args = parser.parse_args()
    for path in args.models:
        convs = pointwise_convs(path, args.batch)
        counted: dict[tuple[int, int, int], int] = {}
        for _, M, N, K in convs:
            counted[(M, N, K)] = counted.get((M, N, K), 0) + 1
        rows = [(n, row(M, N, K, args.sm_count)) for (M, N, K), n in counted.items()]
        print(f"\n{path.name} at batch {args.batch}: {len(convs)} pointwise convolutions, {len(rows)} shapes")
        if args.markdown:
            print("| layers | M | N | K | MB | GFLOP | roofline us | sm90 tile | N pad | K pad | skinny tile |\n"
                  "|---|---|---|---|---|---|---|---|---|---|---|")
        for n, r in rows:
            if args.markdown:
                print(f"| {n} | {r['M']} | {r['N']} | {r['K']} | {r['MB']:.1f} | {r['GFLOP']:.2f} | "
                      f"{r['roofline_us']:.1f} | {r['sm90_tile']} | {r['n_pad']:.0%} | {r['k_pad']:.0%} | "
                      f"{r['skinny_tile']} |")
            else:
                print(f"{n:3}x M {r['M']:7} N {r['N']:5} K {r['K']:5} {r['MB']:7.1f} MB {r['GFLOP']:6.2f} GFLOP "
                      f"roofline {r['roofline_us']:6.1f} us | sm90 {r['sm90_tile']:8} est {r['sm90_us']:6.1f} us "
                      f"waste {r['waste']:4.0%} (N {r['n_pad']:4.0%}, K {r['k_pad']:4.0%}) | skinny "
                      f"{r['skinny_tile']:6} est {r['skinny_us']:6.1f} us")
        roof = sum(n * r["roofline_us"] for n, r in rows)
        taken = [(n, r) for n, r in rows if r["sm90_tile"] != "-"]
        print(f"total roofline {roof:.1f} us over {len(convs)} layers; sm90 estimate "
              f"{sum(n * r['sm90_us'] for n, r in taken):.1f} us over the {sum(n for n, _ in taken)} it takes")


if __name__ == "__main__":
    main()
