"""The calibration cache: exact round trips, strict parsing with line numbers, a build that
writes it and a rebuild that reads it instead of calibrating, a cache that does not fit."""

from __future__ import annotations

import numpy as np
import pytest

import polykit
from polykit.compiler.builder.builder import build_plan
from polykit.compiler.builder.calibration_cache import (CalibrationCache, parse_calibration_cache, read_calibration_cache,
                                                write_calibration_cache)
from polykit.compiler.builder.config import BuilderConfig
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.errors import DataFileError

from .int8_models import convnet, feeds_for


def test_scales_round_trip_bit_for_bit(tmp_path):
    rng = np.random.default_rng(0)
    scales = {f"t{i}": float(np.float32(s)) for i, s in enumerate(rng.uniform(1e-6, 10, 50))}
    scales["/conv1/Conv_output_0: odd name"] = float(np.float32(1 / 3))
    write_calibration_cache(tmp_path / "c.cache", CalibrationCache("minmax", scales))
    back = read_calibration_cache(tmp_path / "c.cache")
    assert back.scales == scales and back.calibrator == "minmax" and back.polykit_version == polykit.__version__


def test_the_file_is_a_header_and_one_hex_scale_per_line():
    text = CalibrationCache("entropy", {"x": 0.5, "y": 0.01}, "9.9").text()
    assert text.splitlines() == ["polykit-calibration-cache 1 polykit=9.9 calibrator=entropy",
                                 "x: 0x1.0000000000000p-1", f"y: {float(np.float32(0.01)).hex()}"]


HEADER = "polykit-calibration-cache 1 polykit=0.1.0 calibrator=entropy\n"


@pytest.mark.parametrize("text, line, message", [
    ("", 1, "empty"),
    ("TRT-8601-EntropyCalibration2\nx: 3c010a14\n", 1, "header"),
    ("polykit-calibration-cache 2 polykit=0.1.0 calibrator=entropy\n", 1, "format 2"),
    ("polykit-calibration-cache 1 polykit=0.1.0 calibrator=kl\n", 1, "header"),
    (HEADER + "x: 0x1.0p-7\nx 0x1.0p-7\n", 3, "tensor name: scale"),
    (HEADER + "x: 0.0078125\n", 2, "hexadecimal"),
    (HEADER + "x: 0x0p+0\n", 2, "positive"),
    (HEADER + "x: -0x1.0p-7\n", 2, "hexadecimal"),
    (HEADER + "x: 0x1.0p+200\n", 2, "positive, finite float32"),
    (HEADER + "x: 0x1.0000000000001p-7\n", 2, "float32"),
    (HEADER + "x: 0x1.0p-7\ny: 0x1.0p-6\nx: 0x1.0p-5\n", 4, "twice"),
    (HEADER + "x: 0x1.0p-7\n\n", 3, "tensor name: scale"),
])
def test_malformed_caches_name_the_file_and_line(text, line, message):
    with pytest.raises(DataFileError, match=message) as info:
        parse_calibration_cache(text, "c.cache")
    assert info.value.where == f"c.cache:{line}"


def test_unreadable_cache_files_are_data_file_errors(tmp_path):
    (tmp_path / "bin.cache").write_bytes(b"\xff\xfe" + HEADER.encode())
    with pytest.raises(DataFileError, match="UTF-8"):
        read_calibration_cache(tmp_path / "bin.cache")
    with pytest.raises(DataFileError, match="does not exist"):
        read_calibration_cache(tmp_path / "missing.cache")
    with pytest.raises(DataFileError, match="cannot be written"):
        CalibrationCache("entropy", {"a\nb": 0.5}).text()


def test_a_build_writes_the_cache_and_a_rebuild_reads_it_without_data(tmp_path):
    graph, cache = load_onnx(convnet()), tmp_path / "convnet.cache"
    batches = [feeds_for(convnet(), seed) for seed in range(3)]
    first = build_plan(graph, BuilderConfig(target="cpu", int8=True, calibration_data=batches,
                                            calibration_cache=str(cache), builder_optimization_level=0))
    assert set(read_calibration_cache(cache).scales) == {"x", "r1", "f"}
    again = build_plan(graph, BuilderConfig(target="cpu", int8=True, calibration_cache=str(cache),
                                            builder_optimization_level=0))
    assert again.serialize() == first.serialize()


def test_a_cache_missing_tensors_of_the_network_names_them(tmp_path):
    cache = tmp_path / "partial.cache"
    write_calibration_cache(cache, CalibrationCache("entropy", {"x": 0.01, "unrelated": 0.2}))
    with pytest.raises(DataFileError, match=r"no scale for 2 tensor\(s\): 'r1', 'f'") as info:
        build_plan(load_onnx(convnet()), BuilderConfig(target="cpu", int8=True, calibration_cache=str(cache)))
    assert info.value.where == str(cache)
