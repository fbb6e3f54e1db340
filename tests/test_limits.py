"""polykit.limits: the limits in force come from POLYKIT_LIMITS (which the CLI's --limit sets),
and polykit.files.parse_json applies the JSON ones before anything else sees a document."""

from __future__ import annotations

import pytest

from polykit import limits
from polykit.errors import DataFileError, UsageError
from polykit.files import json_depth, parse_json


def test_defaults_hold_without_the_environment_variable(monkeypatch):
    monkeypatch.delenv(limits.ENV, raising=False)
    assert limits.current() == limits.Limits()


def test_the_environment_variable_raises_a_limit_with_a_size_suffix(monkeypatch):
    monkeypatch.setenv(limits.ENV, "host_memory=64GiB, json_depth=500")
    assert limits.current().host_memory == 64 << 30 and limits.current().json_depth == 500


@pytest.mark.parametrize("spec, message", [
    ("hostmemory=1", "does not set a known limit"),
    ("json_depth=many", "is not a count"),
    ("json_depth=-1", "is not a count"),
    ("data_bytes=1²", "is not a count"),
])
def test_a_bad_specification_is_a_usage_error_with_a_hint(monkeypatch, spec, message):
    monkeypatch.setenv(limits.ENV, spec)
    with pytest.raises(UsageError, match=message) as info:
        limits.current()
    assert info.value.hint


def test_raised_sets_limits_for_a_block_only(monkeypatch):
    monkeypatch.setenv(limits.ENV, "json_depth=7")
    with limits.raised(data_bytes=5):
        assert (limits.current().data_bytes, limits.current().json_depth) == (5, 7)
    assert limits.current().data_bytes == limits.Limits().data_bytes


def test_check_refuses_above_the_limit_and_says_how_to_raise_it():
    with limits.raised(data_bytes=1 << 20):
        limits.check("data_bytes", 1 << 20, "the array", DataFileError)
        with pytest.raises(DataFileError, match=r"the array \(3.0 MiB\) is over the data_bytes limit \(1.0 MiB\)") as info:
            limits.check("data_bytes", 3 << 20, "the array", DataFileError)
    assert "--limit data_bytes=3MiB" in info.value.hint


@pytest.mark.parametrize("text, message", [
    ("[" + "9" * 5000 + "]", "a number of 5000 characters"),
    ("[1e400]", "beyond the range of a float64"),
    ("[" * 100_000 + "]" * 100_000, "nests more levels than the parser can take"),
    ("[" * 300 + "]" * 300, "nests 300 levels deep; the json_depth limit is 200"),
    ('{"a": ', "is not valid JSON"),
])
def test_parse_json_refuses_what_would_crash_or_exhaust(text, message):
    with pytest.raises(DataFileError, match=message):
        parse_json(text, "f.json", error=DataFileError)


def test_parse_json_reads_ordinary_documents_and_nan():
    doc = parse_json('{"a": [1, 2.5, -3e-7, NaN], "b": {"c": []}}', "f.json")
    assert doc["a"][:3] == [1, 2.5, -3e-7] and json_depth(doc) == 3


def test_the_cli_limit_option_applies_to_the_command_and_is_undone(tmp_path, capsys, monkeypatch):
    import numpy as np

    from polykit.tools.cli.app import main

    monkeypatch.delenv(limits.ENV, raising=False)
    np.savez(tmp_path / "a.npz", x=np.zeros(4096, np.float32))
    assert main(["inspect", "data", str(tmp_path / "a.npz"), "--limit", "data_bytes=4KiB"]) == 2
    assert "over the data_bytes limit (4.0 KiB)" in capsys.readouterr().err
    assert limits.ENV not in __import__("os").environ
    assert main(["--limit=data_bytes=1MiB", "inspect", "data", str(tmp_path / "a.npz")]) == 0


def test_an_unknown_cli_limit_is_a_usage_error_with_a_hint(capsys):
    from polykit.tools.cli.app import main

    assert main(["--limit", "memory=1", "inspect", "data", "x.npz"]) == 2
    err = capsys.readouterr().err
    assert "does not set a known limit" in err and "hint:" in err and "Traceback" not in err
