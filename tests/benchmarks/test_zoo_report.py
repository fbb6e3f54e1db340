"""benchmarks/zoo_report.py: `zoo.py --render` turns results files into docs/ZOO.md's tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import zoo, zoo_report
from benchmarks.zoo_models import CONV, FAMILIES, MODELS, VIDEO

REPO = Path(__file__).resolve().parents[2]
META = {"date": "2026-12-01", "device": "NVIDIA H200", "commit": "abc1234", "torch": "2.11.0"}


def row(model, family, batch, polykit, eager, compiled=None, **extra):
    r = dict(META, model=model, family=family, batch=batch, polykit_ms=polykit, eager_ms=eager,
             speed_vs_eager=round(eager / polykit, 3), build_cold_s=40.0, build_warm_s=3.0, kernel_cache="fresh",
             max_rel_err=2e-3, top_kinds=[["conv", 1.0, 0.61], ["pointwise", 0.3, 0.2], ["pool", 0.05, 0.05]])
    if compiled is not None:
        r.update(compile_ms=compiled, speed_vs_compile=round(compiled / polykit, 3))
    return dict(r, **extra)


def results(tmp_path, name, rows, command="PYTHONPATH=. python3 benchmarks/zoo.py --family conv"):
    path = tmp_path / name
    zoo.write_results(path, rows, {"commands": [command]})
    return str(path)


def table_rows(text):
    return [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| model")
            and not line.startswith("| family")]


def test_one_row_per_case_in_table_order_with_speeds_builds_errors_and_kinds(tmp_path):
    path = results(tmp_path, "a.json", [row("gpt2", "transformer", 8, 1.0, 3.0, 1.5),
                                        row("resnet50", "conv", 32, 2.0, 4.0, 1.0)])
    text = zoo_report.render_files([path])
    lines = table_rows(text)
    assert lines[0] == ("| resnet50 | conv | 32 | 2.000 | 4.000 | 1.000 | 2.00x | 0.50x | 40.0 / 3.0 | 2.0e-03 "
                        "| conv 61%, pointwise 20%, pool 5% |")
    assert lines[1].startswith("| gpt2 | transformer | 8 | 1.000 | 3.000 | 1.500 | 3.00x | 1.50x |")
    assert "Measured 2026-12-01 on NVIDIA H200, polykit commit abc1234, torch 2.11.0." in text
    assert "Command: `PYTHONPATH=. python3 benchmarks/zoo.py --family conv`" in text


def test_family_geometric_means_and_the_case_furthest_behind_compile(tmp_path):
    path = results(tmp_path, "a.json", [row("resnet18", "conv", 1, 1.0, 2.0, 2.0), row("resnet18", "conv", 32, 2.0, 4.0, 1.0),
                                        row("bert_base", "transformer", 1, 1.0, 1.0, 1.0)])
    text = zoo_report.render_files([path])
    conv = next(line for line in text.splitlines() if line.startswith("| conv |"))
    # vs eager 2 and 2 -> 2.00x; vs compile 2 and 0.5 -> 1.00x; batch 1: 2.00x, batch 32: 0.50x
    assert conv == "| conv | 2 | 2.00x | 1.00x | 2.00x | 0.50x | resnet18 bs32 (0.50x) |"
    everything = next(line for line in text.splitlines() if line.startswith("| all |"))
    assert everything.startswith("| all | 3 |") and "resnet18 bs32 (0.50x)" in everything
    assert math.isclose(zoo_report.geomean([2.0, 0.5, 1.0]), 1.0) and zoo_report.geomean([None, 0]) is None


def test_without_compile_the_slowest_case_is_judged_against_eager(tmp_path):
    path = results(tmp_path, "a.json", [row("resnet18", "conv", 1, 1.0, 3.0), row("resnet50", "conv", 1, 1.0, 1.5)])
    conv = next(line for line in zoo_report.render_files([path]).splitlines() if line.startswith("| conv |"))
    assert conv == "| conv | 2 | 2.12x | – | – | – | resnet50 bs1 (1.50x vs eager) |"
    assert "| resnet18 | conv | 1 | 1.000 | 3.000 | – | 3.00x | – |" in zoo_report.render_files([path])


def test_failed_cases_are_listed_not_tabled(tmp_path):
    path = results(tmp_path, "a.json", [row("resnet18", "conv", 1, 1.0, 2.0, 2.0),
                                        {"model": "swin_t", "family": "transformer", "batch": 8,
                                         "error": "build: BuildError: no tactic for Roll"}])
    text = zoo_report.render_files([path])
    assert "- swin_t bs8: build: BuildError: no tactic for Roll" in text
    assert not any("swin_t" in line for line in table_rows(text))


def test_cases_torch_compile_could_not_compile_are_listed(tmp_path):
    path = results(tmp_path, "a.json", [row("swin_t", "transformer", 1, 1.0, 2.0, compile_error="Unsupported: roll")])
    text = zoo_report.render_files([path])
    assert "- swin_t bs1: Unsupported: roll" in text and "| swin_t | transformer | 1 | 1.000 | 2.000 | – |" in text


def test_a_later_file_replaces_a_case_and_shared_kernel_cache_builds_are_marked(tmp_path):
    first = results(tmp_path, "a.json", [row("resnet18", "conv", 1, 1.0, 2.0), row("resnet18", "conv", 32, 4.0, 8.0)])
    second = results(tmp_path, "b.json", [row("resnet18", "conv", 1, 0.5, 2.0, kernel_cache="shared", commit="def5678")],
                     command="PYTHONPATH=. python3 benchmarks/zoo.py --models resnet18 --batches 1")
    text = zoo_report.render_files([first, second])
    lines = table_rows(text)
    assert lines[0].startswith("| resnet18 | conv | 1 | 0.500 |") and "| 40.0* / 3.0 |" in lines[0]
    assert lines[1].startswith("| resnet18 | conv | 32 | 4.000 |")
    assert "\\* first build with the run's shared kernel cache (not cold)." in text
    assert "polykit commit abc1234" in text and "polykit commit def5678" in text
    assert text.count("Command: `") == 2


def test_into_replaces_only_the_marked_section(tmp_path):
    path = results(tmp_path, "a.json", [row("resnet18", "conv", 1, 1.0, 2.0)])
    doc = tmp_path / "ZOO.md"
    doc.write_text(f"# title\n\n{zoo_report.BEGIN}\nold numbers\n{zoo_report.END}\n\ntail\n")
    zoo.main(["--render", path, "--into", str(doc)])
    text = doc.read_text()
    assert text.startswith("# title\n\n<!-- zoo:results -->\nMeasured") and text.endswith("<!-- zoo:results end -->\n\ntail\n")
    assert "old numbers" not in text and "| resnet18 | conv | 1 |" in text
    doc.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no '<!-- zoo:results -->'"):
        zoo.main(["--render", path, "--into", str(doc)])


def test_render_prints_without_into(tmp_path, capsys):
    zoo.main(["--render", results(tmp_path, "a.json", [row("resnet18", "conv", 1, 1.0, 2.0)])])
    assert "| resnet18 | conv | 1 |" in capsys.readouterr().out


def test_docs_zoo_md_explains_the_method_and_has_the_section_to_fill():
    text = (REPO / "docs" / "ZOO.md").read_text()
    assert zoo_report.BEGIN in text and zoo_report.END in text
    assert "benchmarks/zoo.py --render zoo.json --into docs/ZOO.md" in text
    for word in ("torch.compile", "POLYKIT_CACHE_DIR", "alternating", "fp32"):
        assert word in text
    conv, video = (sum(m.family == f for m in MODELS) for f in (CONV, VIDEO))
    assert f"({conv} convolutional,\n{len(MODELS) - conv - video} transformer-family and {video} video architectures" in text


def test_results_files_are_json_with_format_settings_and_rows(tmp_path):
    doc = json.loads(Path(results(tmp_path, "a.json", [row("resnet18", "conv", 1, 1.0, 2.0)])).read_text())
    assert doc["format"] == zoo.FORMAT and doc["settings"]["commands"] and doc["results"][0]["model"] == "resnet18"


def test_a_first_build_with_prepared_kernels_is_marked_and_not_shown_as_cold(tmp_path):
    prepared = row("resnet18", "conv", 1, 1.0, 2.0, kernel_cache="shared", prepared=["export", "kernels"],
                   build_kernels_warm_s=12.5)
    del prepared["build_cold_s"]
    text = zoo_report.render_files([results(tmp_path, "a.json", [prepared])])
    assert "| 12.5† / 3.0 |" in table_rows(text)[0]
    assert "† first build with its kernels compiled by the prepare phase" in text


def test_the_acceptance_lines_name_missing_cases_runs_and_each_bar():
    """Issues 29 / 30's bars read off the rows: a partial conv table names its missing cases, counts its runs
    (device, commit) and fails the bars it fails; a family without rows has every case missing."""
    conv = [m for m in MODELS if m.family == CONV]
    rows = [row(conv[0].name, CONV, 1, 1.0, 3.0, 1.2), row(conv[0].name, CONV, max(conv[0].batches), 2.0, 1.8, 1.4),
            dict(row(conv[1].name, CONV, 1, 1.0, 3.0, 0.7), commit="other")]
    lines = zoo_report.acceptance_lines(zoo_report.collect([{"results": rows}]))
    (line,) = [x for x in lines if x.startswith(f"- {CONV}:")]
    assert f"3 of {2 * len(conv)} cases" in line and f"{conv[1].name} bs{max(conv[1].batches)}" in line
    assert "2 run(s)" in line
    assert f"slower than eager: {conv[0].name} bs{max(conv[0].batches)} (0.90x)" in line
    assert "geomean vs compile 0.84x (below 1x)" in line  # (1.2 * 0.7 * 0.7) ** (1 / 3)
    assert f"below 0.75x: {conv[0].name} bs{max(conv[0].batches)} (0.70x), {conv[1].name} bs1 (0.70x)" in line
    others = [x for x in lines if x.startswith("- ") and not x.startswith(f"- {CONV}:")]
    assert len(others) == len(FAMILIES) - 1  # the transformer and video families, without rows
    assert all("0 of" in other and "geomean vs compile –" in other for other in others)


def test_the_acceptance_lines_name_the_largest_movement_share_and_those_over_5_percent():
    from benchmarks.zoo_report import acceptance_lines

    rows = [row("bert_base", "transformer", 8, 1.0, 4.0, 1.2, movement_share=0.012),
            row("swin_t", "transformer", 8, 1.0, 6.0, 1.3, movement_share=0.071),
            row("gpt2", "transformer", 8, 1.0, 4.0, 1.1)]
    line = next(x for x in acceptance_lines(rows) if x.startswith("- transformer"))
    assert "movement share (of 2 profiles) at most 7.1 % (swin_t bs8), over 5 %: swin_t bs8 (7.1 %)" in line
    conv = next(x for x in acceptance_lines(rows) if x.startswith("- conv"))
    assert "movement" not in conv
