import json

import numpy as np

from polykit.tools.compare.comparator import Comparator, RunResults
from polykit.tools.report.comparison import render_text, to_json


def _report(delta):
    results = RunResults(feeds=[{}])
    ref = np.arange(6, dtype=np.float32).reshape(2, 3)
    act = ref.copy()
    act[1, 2] += delta
    results.add("onnxrt", [{"logits": ref}], [0.001])
    results.add("trt", [{"logits": act}], [0.002])
    return results, Comparator.compare_accuracy(results)


def test_text_report_names_failed_output_and_worst_element():
    results, report = _report(0.5)
    text = render_text(report, results)
    assert "logits: FAILED" in text
    assert "worst element [1, 2]" in text
    assert "FAILED | 1 output comparison(s) failed: logits (trt vs onnxrt)" in text


def test_text_report_passes_with_summary():
    results, report = _report(0.0)
    assert "PASSED | 1 comparison(s), 1 output(s) match" in render_text(report, results)


def test_json_report_is_serializable_with_statistics():
    results, report = _report(0.5)
    doc = json.loads(json.dumps(to_json(report, results)))
    out = doc["comparisons"][0]["outputs"][0]
    assert doc["passed"] is False
    assert out["worst_index"] == [1, 2] and out["max_abs"] == 0.5
    assert doc["runners"]["trt"]["mean_inference_time_s"] == 0.002
