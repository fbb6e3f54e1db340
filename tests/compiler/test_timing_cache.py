"""The timing cache file: JSON round trip, merging, and a UsageError naming the file and
field for anything malformed (the file is untrusted)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polykit.compiler.builder.timing_cache import TimingCache, load_timing_cache
from polykit.errors import UsageError

KEY_A, KEY_B = "a" * 64, "b" * 64


def _entry(ms, tactic="cpu.reference"):
    return {"ms": ms, "tactic": tactic, "kind": "Conv", "device": "test cpu"}


def test_save_then_load_gives_the_same_entries(tmp_path):
    cache = TimingCache()
    cache.record(KEY_A, 0.25, "cpu.reference", "Conv", "test cpu")
    cache.record(KEY_B, 1.5, "cpu.conv.direct", "Conv", "test cpu")
    cache.save(tmp_path / "t.json")
    back = load_timing_cache(tmp_path / "t.json")
    assert back.entries == cache.entries
    assert back.lookup(KEY_A) == 0.25 and back.lookup("c" * 64) is None
    assert (back.hits, back.misses) == (1, 1)


def test_a_failed_measurement_is_not_recorded():
    cache = TimingCache()
    cache.record(KEY_A, float("inf"), "cpu.reference", "Conv", "test cpu")
    assert cache.entries == {}


def test_merge_adds_missing_entries_and_keeps_its_own_on_a_clash():
    mine = TimingCache({KEY_A: _entry(1.0)})
    mine.merge(TimingCache({KEY_A: _entry(9.0), KEY_B: _entry(2.0)}))
    assert mine.lookup(KEY_A) == 1.0 and mine.lookup(KEY_B) == 2.0


def test_saving_merges_into_the_file_already_there(tmp_path):
    path = tmp_path / "t.json"
    TimingCache({KEY_A: _entry(1.0)}).save(path)
    TimingCache({KEY_B: _entry(2.0)}).save(path)
    assert set(load_timing_cache(path).entries) == {KEY_A, KEY_B}


@pytest.mark.parametrize("doc,field", [
    ([], "the document"),
    ({"entries": {}}, "format"),
    ({"format": 3, "entries": {}}, "format"),
    ({"format": 2, "polykit": "0.1.0", "device": "cpu", "entries": {}}, "arch"),
    ({"format": 1}, "entries"),
    ({"format": 1, "entries": {"short": _entry(1.0)}}, "entries['short']"),
    ({"format": 1, "entries": {KEY_A: 3}}, f"entries[{KEY_A!r}]"),
    ({"format": 1, "entries": {KEY_A: _entry("fast")}}, f"entries[{KEY_A!r}].ms"),
    ({"format": 1, "entries": {KEY_A: _entry(-1.0)}}, f"entries[{KEY_A!r}].ms"),
    ({"format": 1, "entries": {KEY_A: _entry(True)}}, f"entries[{KEY_A!r}].ms"),
    ({"format": 1, "entries": {KEY_A: _entry(1.0, tactic=7)}}, f"entries[{KEY_A!r}].tactic"),
    ({"format": 1, "entries": {KEY_A: {"ms": 1.0}}}, f"entries[{KEY_A!r}].tactic"),
])
def test_a_malformed_cache_is_a_usage_error_naming_file_and_field(tmp_path, doc, field):
    path = tmp_path / "cache.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UsageError) as info:
        load_timing_cache(path)
    assert str(path) in str(info.value) and field in str(info.value)


def test_non_json_and_missing_files_are_usage_errors(tmp_path):
    (tmp_path / "junk.json").write_bytes(b"\x80\x81 not json")
    for path in (tmp_path / "junk.json", tmp_path / "missing.json"):
        with pytest.raises(UsageError, match="timing cache"):
            load_timing_cache(path)


def test_nan_times_are_refused(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text('{"format": 1, "entries": {"%s": {"ms": NaN, "tactic": "t", "kind": "k", "device": "d"}}}' % KEY_A)
    with pytest.raises(UsageError, match="finite"):
        load_timing_cache(path)


_json = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=8),
                     lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=70), children,
                                                                                       max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(entries=st.dictionaries(st.sampled_from([KEY_A, KEY_B, "x"]), _json, max_size=3))
def test_any_json_loads_or_is_a_usage_error(entries):
    try:
        cache = TimingCache.from_json({"format": 1, "entries": entries}, where="fuzz.json")
    except UsageError as exc:
        assert "fuzz.json" in str(exc)
    else:
        assert all(cache.lookup(k) >= 0 for k in entries)


def test_the_reference_tactic_is_keyed_by_each_ops_own_kernel_source():
    from polykit.compiler.plan.records import LayerDesc
    from polykit.kernels.tactics import find_tactic

    ref = find_tactic("cpu", "Conv", "cpu.reference")
    conv, relu = LayerDesc("a", "Conv", ("x", "w"), ("y",)), LayerDesc("a", "Relu", ("x",), ("y",))
    assert ref.source_key(conv) != ref.source_key(relu)
    assert ref.source_key(conv) == ref.source_key(LayerDesc("b", "Conv", ("p", "q"), ("r",)))
