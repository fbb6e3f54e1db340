"""benchmarks/sparse_gemm.py's host side: the tuner's own kernel times read from a timing cache."""

from __future__ import annotations

import json

from benchmarks.sparse_gemm import tuner_times


def test_the_best_dense_and_the_sparse_time_come_from_the_timing_cache(tmp_path):
    cache = tmp_path / "timing.json"
    entries = {"a" * 64: {"ms": 0.02, "tactic": "cuda.gemm.sm90_64x128", "kind": "MatMul", "device": "d"},
               "b" * 64: {"ms": 0.015, "tactic": "cuda.gemm.skinny_128x32", "kind": "MatMul", "device": "d"},
               "c" * 64: {"ms": 0.03, "tactic": "cuda.gemm.sparse24", "kind": "MatMul", "device": "d"}}
    cache.write_text(json.dumps({"format": 1, "entries": entries}))
    assert tuner_times(cache) == {"tuner_dense_ms": 0.015, "tuner_sparse_ms": 0.03}
    cache.write_text(json.dumps({"format": 1, "entries": {}}))
    assert tuner_times(cache) == {}
