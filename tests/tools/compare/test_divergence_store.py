"""Layerwise outputs go to disk as they are produced and are compared one tensor at a time:
the OutputStore's .npz is an ordinary --save-outputs file, saved files are read lazily, and
peak memory does not grow with the number of marked tensors."""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polykit.backends.base import RunnerRequest
from polykit.errors import DataFileError, UsageError
from polykit.tools.data import results_io
from polykit.tools.compare.accuracy import AccuracySettings, make_runners, run_comparison
from polykit.tools.compare.comparator import Comparator, RunResults
from polykit.tools.compare.divergence import GraphOrder
from polykit.tools.data.output_store import OutputStore, open_outputs
from polykit.tools.cli.app import main
from tests.cli_models import save

RNG = np.random.default_rng(5)


def _outputs(count: int = 3) -> dict[str, np.ndarray]:
    return {f"layer/{i}:0": RNG.standard_normal((2, 3 + i)).astype(np.float32) for i in range(count)}


def test_a_store_writes_an_npz_results_io_and_numpy_read_back(tmp_path):
    first, second = _outputs(), {"y": np.arange(6, dtype=np.int64).reshape(2, 3)}
    expected = {"trt": [dict(first)], "onnxrt": [dict(second)]}
    with OutputStore(tmp_path / "o.npz") as store:
        store.spill("trt", 0, first)
        store.spill("onnxrt", 0, second)
    assert first == {} and second == {}  # spilled arrays are not kept
    loaded = results_io.load_outputs(tmp_path / "o.npz")
    for runner, iterations in expected.items():
        for name, arr in iterations[0].items():
            np.testing.assert_array_equal(loaded[runner][0][name], arr)
    with np.load(tmp_path / "o.npz", allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(f"{r}/0/{n}" for r, its in expected.items() for n in its[0])


def test_open_outputs_reads_one_array_per_access(tmp_path):
    saved = {"a": RNG.standard_normal((4, 4)).astype(np.float32), "b/c": RNG.standard_normal(3).astype(np.float16)}
    results_io.save_outputs(tmp_path / "o.npz", {"onnxrt": [dict(saved), dict(saved)]})
    archive, runs = open_outputs(tmp_path / "o.npz")
    try:
        assert list(runs) == ["onnxrt"] and len(runs["onnxrt"]) == 2
        lazy = runs["onnxrt"][1]
        assert sorted(lazy) == ["a", "b/c"] and "a" in lazy and "zz" not in lazy
        np.testing.assert_array_equal(lazy["b/c"], saved["b/c"])
        assert lazy["a"] is not lazy["a"]  # read again each time, never cached
    finally:
        archive.close()


@pytest.mark.parametrize("content", ["json", "plain"])
def test_files_that_are_not_polykit_outputs_archives_are_left_to_results_io(tmp_path, content):
    path = tmp_path / ("o.json" if content == "json" else "o.npz")
    if content == "json":
        path.write_text('{"onnxrt": [{"y": [1.0, 2.0]}]}')
    else:
        np.savez(path, y=np.ones(3, np.float32))
    assert open_outputs(path) is None


def test_a_corrupt_member_is_a_data_file_error_naming_it(tmp_path):
    path = tmp_path / "o.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("trt/0/y.npy", b"\x93NUMPY\x01\x00" + b"garbage")
    archive, runs = open_outputs(path)
    with pytest.raises(DataFileError, match="array 'trt/0/y'"):
        runs["trt"][0]["y"]
    archive.close()


def test_a_store_refuses_reads_before_sealing_and_spills_after(tmp_path):
    with OutputStore(tmp_path / "o.npz", keep=False) as store:
        lazy = store.spill("trt", 0, _outputs(1))
        with pytest.raises(UsageError, match="seal"):
            lazy["layer/0:0"]
        store.seal()
        assert lazy["layer/0:0"].shape == (2, 3)
        with pytest.raises(UsageError, match="sealed"):
            store.spill("trt", 1, _outputs(1))
    assert not (tmp_path / "o.npz").exists()


def _chain(path: Path, rows: int = 2048, width: int = 64, depth: int = 16) -> str:
    """x[rows, width] through `depth` MatMuls with small weights: large activations, none fused."""
    inits, nodes, prev = [], [], "x"
    for i in range(depth):
        w = (RNG.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"t{i}"], name=f"mm{i}"))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [rows, width])], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture
def chain_reference(tmp_path):
    model = _chain(tmp_path / "chain.onnx")
    ref, feeds = tmp_path / "ref.npz", tmp_path / "feeds.npz"
    assert main(["run", model, "--onnxrt", "--mark-all", "--save-outputs", str(ref), "--save-inputs", str(feeds), "-q"]) == 0
    return model, ref, results_io.load_feeds(feeds), 16 * 2048 * 64 * 4  # bytes of one runner's marked tensors


def _traced(fn):
    tracemalloc.start()
    try:
        value = fn()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return value, current, peak


def test_comparing_saved_layerwise_outputs_holds_about_one_tensor_pair(chain_reference, tmp_path):
    _, ref, _, total = chain_reference
    results_io.save_outputs(tmp_path / "other.npz", {"copy": results_io.load_outputs(ref)["onnxrt"]})
    archives = [open_outputs(ref), open_outputs(tmp_path / "other.npz")]
    results = RunResults()
    results.add("onnxrt", archives[0][1]["onnxrt"])
    results.add("copy", archives[1][1]["copy"])
    report, _, peak = _traced(lambda: Comparator.compare_accuracy(results))
    assert report.passed and len(report.pairs[0].outputs) == 16
    one = total // 16
    print(f"compare 2 x 16 marked tensors of {one / 1e6:.2f} MB: peak {peak / 1e6:.1f} MB")
    # a pair in float64 with its error arrays is ~14 tensors' worth; the two sides hold 32 tensors
    assert peak < 20 * one < 2 * total
    for archive, _ in archives:
        archive.close()


def test_a_layerwise_run_holds_no_runners_outputs_and_no_saved_reference(chain_reference, tmp_path):
    """What `polykit run --trt --mark-all --load-outputs ref.npz` does, against everything in memory."""
    model, ref, feeds, total = chain_reference
    optional = GraphOrder.from_onnx(model).intermediates

    def bounded():
        archive, reference = open_outputs(ref)
        with OutputStore(tmp_path / "live.npz", keep=False) as store:
            runners = make_runners(["trt"], RunnerRequest(model=model, target="cpu", mark_all=True))
            results, report = run_comparison(runners, AccuracySettings(), feeds=feeds, reference_outputs=reference,
                                             store=store, optional=optional)
        archive.close()
        return report

    def in_memory():
        runners = make_runners(["trt"], RunnerRequest(model=model, target="cpu", mark_all=True))
        return run_comparison(runners, AccuracySettings(), feeds=feeds, reference_outputs=results_io.load_outputs(ref),
                              optional=optional)

    report, held, peak = _traced(bounded)
    (_, eager), eager_held, eager_peak = _traced(in_memory)
    print(f"16 marked tensors, {total / 1e6:.1f} MB per runner: peak {peak / 1e6:.1f} MB, held after {held / 1e6:.1f} MB; "
          f"all in memory: peak {eager_peak / 1e6:.1f} MB, held {eager_held / 1e6:.1f} MB")
    assert report.passed and eager.passed and len(report.pairs[0].outputs) == 16
    assert held < 0.4 * total and eager_held > 1.5 * total
    assert peak < eager_peak - 0.5 * total  # the saved reference is never loaded whole
