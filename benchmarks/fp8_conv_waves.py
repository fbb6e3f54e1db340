"""ResNet-50's FP8 convs against the sm_90a FP8 tiles, without a GPU: waves on the SMs and the cost model's times.

    PYTHONPATH=. python benchmarks/fp8_conv_waves.py [--batch 32] [--sms 132]

For each distinct conv of ResNet-50 (torchvision's v1.5: the stride in the 3x3 conv; the stem's 3 channels padded to
16 as an `--fp8` plan pads them) it prints a markdown row: its count, the implicit GEMM's M, N and K, the waves
(tiles / (blocks x SMs)) of fp8_sm90's tiles and fp8_conv_sm90's, the level-0 choice with the cost model's time
(`int8_sm90._estimate`: waves at each tile's guessed rate on K / 2 plus FP8's epilogue term in whole tiles; an estimate,
nothing measured), and the candidate the model likes best among the tiles that take the layer (fp8_gemm_sm90's only
for GEMMs over rows). The sums at the end compare level 0 with each layer's best (docs/INT8.md, "FP8 conv tiles with
the promotion in pieces").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: ResNet-50's stages: (blocks, bottleneck width, input size of the stage's first block)
STAGES = ((3, 64, 56), (4, 128, 56), (6, 256, 28), (3, 512, 14))


def resnet50_convs(batch: int) -> list[tuple[str, Any]]:
    """(name, a stand-in record with the shapes and attributes the FP8 tactics read) for each of the 53 convs."""

    def conv(name: str, size: int, cin: int, cout: int, k: int, stride: int) -> tuple[str, Any]:
        out = (size + 2 * (k // 2) - k) // stride + 1
        attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [k // 2] * 4}
        return name, SimpleNamespace(attrs=attrs, in_shapes=((batch, size, size, cin), (), (cout, k, k, cin)),
                                     out_shapes=((batch, out, out, cout),), in_dtypes=("float8_e4m3fn",) * 3)

    convs = [conv("stem 7x7/2", 224, 16, 64, 7, 2)]
    cin = 64
    for stage, (blocks, width, size) in enumerate(STAGES, 1):
        for block in range(blocks):
            stride = 2 if stage > 1 and block == 0 else 1
            at = size if block == 0 or stage == 1 else size // 2  # this block's input size
            convs.append(conv(f"l{stage} 1x1 {cin}->{width}", at, cin, width, 1, 1))
            convs.append(conv(f"l{stage} 3x3{'/2' if stride == 2 else ''} {width}", at, width, width, 3, stride))
            out = at // stride
            convs.append(conv(f"l{stage} 1x1 {width}->{4 * width}", out, width, 4 * width, 1, 1))
            if block == 0:
                convs.append(conv(f"l{stage} shortcut 1x1{'/2' if stride == 2 else ''} {cin}->{4 * width}", at, cin,
                                  4 * width, 1, stride))
            cin = 4 * width
    return convs


def rows(batch: int, sms: int) -> tuple[list[str], dict[str, float]]:
    from polykit.kernels.cuda.int8 import fp8_conv_sm90, fp8_gemm_sm90, fp8_sm90
    from polykit.kernels.cuda.int8.fp8_gemm_sm90 import over_rows
    from polykit.kernels.cuda.int8.int8_sm90 import _estimate, _geometry

    conv_tiles = [(t, f"sm90_{t.label}") for t in fp8_sm90.TILES]
    piece_tiles = [(t, f"conv_sm90_{t.label}") for t, _, _ in fp8_conv_sm90.TILES]
    gemm_tiles = [(t, f"gemm_sm90_{t.label}") for t, _, _ in fp8_gemm_sm90.TILES]
    counts: dict[tuple, list] = {}
    for name, layer in resnet50_convs(batch):
        key = (layer.in_shapes, layer.out_shapes, str(layer.attrs))
        counts.setdefault(key, [name, layer, 0])[2] += 1
    lines = ["| conv | count | M | N | K | waves " + " / ".join(t.label for t, _ in conv_tiles) + " (fp8_sm90) | waves "
             + " / ".join(t.label for t, _ in piece_tiles) + " (pieces) | level 0 (model us) | model's best (us) |",
             "|---|--:|--:|--:|--:|---|---|---|---|"]
    sums = {"level 0": 0.0, "best": 0.0}
    for name, layer, count in counts.values():
        geo = _geometry(layer)
        tiles = conv_tiles + piece_tiles + (gemm_tiles if over_rows(geo) else [])
        cost = {label: _estimate(t)(layer, sms) for t, label in tiles}
        level0 = min((cost[label], label) for _, label in conv_tiles)
        best = min((c, label) for label, c in cost.items())
        sums["level 0"] += level0[0] * count
        sums["best"] += best[0] * count

        def waves(group):
            return " / ".join(f"{-(-geo.M // t.bm) * -(-geo.N // t.bn) / (t.blocks * sms):.2f}" for t, _ in group)

        lines.append(f"| {name} | {count} | {geo.M} | {geo.N} | {geo.K} | {waves(conv_tiles)} | {waves(piece_tiles)} "
                     f"| {level0[1]} {level0[0]:.0f} | {best[1]} {best[0]:.0f} |")
    return lines, sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sms", type=int, default=132, help="SMs of the GPU (H100 SXM: 132)")
    args = parser.parse_args()
    lines, sums = rows(args.batch, args.sms)
    print("\n".join(lines))
    print(f"\nsum over the convs (model us): level 0 {sums['level 0']:.0f}, each layer's best {sums['best']:.0f}")


if __name__ == "__main__":
    main()
