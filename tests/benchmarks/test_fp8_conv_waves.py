"""benchmarks/fp8_conv_waves.py: ResNet-50's FP8 convs against the sm_90a FP8 tiles (waves, the cost model's times)."""

from __future__ import annotations

from collections import Counter

from benchmarks import fp8_conv_waves


def test_the_listing_holds_resnet50s_53_convs_with_their_gemm_shapes():
    convs = fp8_conv_waves.resnet50_convs(32)
    kinds = Counter(layer.attrs["kernel_shape"][0] for _, layer in convs)
    assert len(convs) == 53 and kinds == {1: 36, 3: 16, 7: 1}
    strided = [name for name, layer in convs if layer.attrs["strides"] == [2, 2]]
    assert len(strided) == 7  # the stem, three 3x3 convs and three shortcuts
    assert [layer.out_shapes[0] for _, layer in convs[-3:]] == [(32, 7, 7, 512)] * 2 + [(32, 7, 7, 2048)]


def test_each_row_counts_its_convs_and_the_best_candidate_is_never_worse_than_level_0():
    lines, sums = fp8_conv_waves.rows(32, 132)
    body = lines[2:]
    assert sum(int(line.split("|")[2]) for line in body) == 53
    assert 0 < sums["best"] <= sums["level 0"]
    stem = next(line for line in body if line.startswith("| stem"))
    assert "| 401408 | 64 | 784 |" in stem  # 32 x 112 x 112 pixels, 7 x 7 x 16 (the image padded to 16 channels)
