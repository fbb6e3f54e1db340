"""Markdown for docs/ZOO.md from zoo results files (`benchmarks/zoo.py --render a.json [b.json ...]`).

One table row per case (model, batch), then per family the geometric means of polykit's speed
(torch ms / polykit ms: above 1, polykit is faster) and the case furthest behind torch.compile,
then against issues 29 / 30's bars (acceptance_lines: cases missing, runs, eager, geomean, floor),
then the failed cases and those torch.compile could not compile. Where several files hold a
case, the later file's row counts. The provenance lines list every distinct (date, device,
commit, torch) the rows came from, and each file's command.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, Sequence

from benchmarks.zoo_models import FAMILIES, MODELS

BEGIN, END = "<!-- zoo:results -->", "<!-- zoo:results end -->"
HEADER = ("| model | family | batch | polykit ms | eager ms | compile ms | vs eager | vs compile "
          "| build cold / warm s | max rel err | top layer kinds (profile share) |")
ALIGN = "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"
ORDER = {m.name: i for i, m in enumerate(MODELS)}


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _ms(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _kinds(row: dict) -> str:
    return ", ".join(f"{kind} {100 * share:.0f}%" for kind, _, share in row.get("top_kinds", [])) or "–"


def _builds(row: dict) -> str:
    if row.get("build_kernels_warm_s") is not None:  # its kernels compiled by zoo.py's prepare phase
        return f"{row['build_kernels_warm_s']:.1f}† / {row['build_warm_s']:.1f}"
    if row.get("build_cold_s") is None:
        return "–"
    mark = "" if row.get("kernel_cache", "fresh") == "fresh" else "*"
    return f"{row['build_cold_s']:.1f}{mark} / {row['build_warm_s']:.1f}"


def _err(v) -> str:
    return "–" if v is None else f"{v:.1e}"


def collect(docs: Sequence[dict]) -> list[dict]:
    """The rows of `docs` (loaded results files), one per case (the last file's), in table order."""
    rows: dict[tuple[str, int], dict] = {}
    for doc in docs:
        for row in doc["results"]:
            rows[(row["model"], int(row["batch"]))] = row
    return sorted(rows.values(), key=lambda r: (ORDER.get(r["model"], len(ORDER)), r["model"], int(r["batch"])))


def provenance_lines(docs: Sequence[dict], rows: Sequence[dict]) -> list[str]:
    runs = sorted({(r.get("date", "?"), r.get("device", "?"), r.get("commit", "?"), r.get("torch", "?"))
                   for r in rows if "date" in r})
    lines = [f"Measured {date} on {device}, polykit commit {commit}, torch {torch}." for date, device, commit, torch in runs]
    commands = [c for doc in docs for c in doc.get("settings", {}).get("commands", [])]
    return lines + [f"Command: `{c}`" for c in dict.fromkeys(commands)]


def case_table(rows: Sequence[dict]) -> list[str]:
    lines = [HEADER, ALIGN]
    for r in rows:
        if "error" in r:
            continue
        lines.append(f"| {r['model']} | {r['family']} | {r['batch']} | {_ms(r.get('polykit_ms'))} | {_ms(r.get('eager_ms'))} "
                     f"| {_ms(r.get('compile_ms'))} | {_x(r.get('speed_vs_eager'))} | {_x(r.get('speed_vs_compile'))} "
                     f"| {_builds(r)} | {_err(r.get('max_rel_err'))} | {_kinds(r)} |")
    return lines


def family_table(rows: Sequence[dict]) -> list[str]:
    """Per family (and all): geometric means of speed vs eager and vs compile (overall, at batch 1,
    at the larger batches) and the case furthest behind torch.compile (vs eager without compile)."""
    lines = ["| family | cases | vs eager | vs compile | vs compile, batch 1 | vs compile, batch > 1 "
             "| furthest behind torch.compile |", "|---|--:|--:|--:|--:|--:|---|"]
    ok = [r for r in rows if "error" not in r]
    for family in (*FAMILIES, "all"):
        mine = [r for r in ok if family in ("all", r["family"])]
        if not mine:
            continue
        key = "speed_vs_compile" if any(r.get("speed_vs_compile") for r in mine) else "speed_vs_eager"
        worst = min((r for r in mine if r.get(key)), key=lambda r: r[key], default=None)
        worst_text = "–" if worst is None else f"{worst['model']} bs{worst['batch']} ({_x(worst[key])}" + \
            ("" if key == "speed_vs_compile" else " vs eager") + ")"
        lines.append(f"| {family} | {len(mine)} | {_x(geomean(r.get('speed_vs_eager') for r in mine))} "
                     f"| {_x(geomean(r.get('speed_vs_compile') for r in mine))} "
                     f"| {_x(geomean(r.get('speed_vs_compile') for r in mine if int(r['batch']) == 1))} "
                     f"| {_x(geomean(r.get('speed_vs_compile') for r in mine if int(r['batch']) > 1))} | {worst_text} |")
    return lines


#: issues 29 / 30's bars for a family's table (lent GPU, fp16, one run)
GEOMEAN_BAR, FLOOR = 1.0, 0.75


#: issue 30: movement kernels under 5 % of any zoo model's GPU time
MOVEMENT_BAR = 0.05


def acceptance_lines(rows: Sequence[dict]) -> list[str]:
    """Per family, what issues 29 / 30 ask of a table, read off these rows: every zoo case (each model at
    batch 1 and its throughput batch) measured in one run (one device and commit), every case faster than
    eager, the geometric mean against torch.compile >= 1.0x and no case below 0.75x. Cases the rows lack
    are named, so a partial table says what it is missing."""
    ok = [r for r in rows if "error" not in r]
    lines = ["Against issues 29 / 30 (per family: every case, one run; faster than eager; geometric mean vs "
             f"torch.compile >= {GEOMEAN_BAR:g}x; none below {FLOOR:g}x):", ""]
    for family in FAMILIES:
        want = [(m.name, b) for m in MODELS if m.family == family for b in (1, max(m.batches))]
        mine = [r for r in ok if r["family"] == family]
        have = {(r["model"], int(r["batch"])) for r in mine}
        missing = [f"{m} bs{b}" for m, b in want if (m, b) not in have]
        runs = {(r.get("device"), r.get("commit")) for r in mine}
        slow = [f"{r['model']} bs{r['batch']} ({_x(r.get('speed_vs_eager'))})" for r in mine
                if not (r.get("speed_vs_eager") or 0) > 1.0]
        vs = [r.get("speed_vs_compile") for r in mine if r.get("speed_vs_compile")]
        mean = geomean(vs)
        verdict = "meets" if mean is not None and mean >= GEOMEAN_BAR else "below"
        low = [f"{r['model']} bs{r['batch']} ({_x(r['speed_vs_compile'])})" for r in mine
               if r.get("speed_vs_compile") and r["speed_vs_compile"] < FLOOR]
        lines.append(f"- {family}: {len(have & set(want))} of {len(want)} cases"
                     + (f" (missing: {', '.join(missing)})" if missing else "")
                     + f"; {len(runs)} run(s) (device, commit); slower than eager: {', '.join(slow) or 'none'}"
                     + f"; geomean vs compile {_x(mean)} ({verdict} {GEOMEAN_BAR:g}x); below {FLOOR:g}x: "
                     + (", ".join(low) or "none") + _movement(mine))
    return lines + [""]


def _movement(rows: Sequence[dict]) -> str:
    """Issue 30's movement bar (copies, reformats and gathers under MOVEMENT_BAR of every model's profiled
    GPU time), for the rows that carry a movement share (rows before it was recorded do not)."""
    shares = [r for r in rows if r.get("movement_share") is not None]
    if not shares:
        return ""
    top = max(shares, key=lambda r: r["movement_share"])
    over = [f"{r['model']} bs{r['batch']} ({100 * r['movement_share']:.1f} %)" for r in shares
            if r["movement_share"] > MOVEMENT_BAR]
    return (f"; movement share (of {len(shares)} profiles) at most {100 * top['movement_share']:.1f} % "
            f"({top['model']} bs{top['batch']}), over {100 * MOVEMENT_BAR:g} %: {', '.join(over) or 'none'}")


def render(docs: Sequence[dict]) -> str:
    """The results section of docs/ZOO.md for the loaded results files `docs`."""
    rows = collect(docs)
    out = provenance_lines(docs, rows) + ["", *case_table(rows), ""]
    if any(r.get("kernel_cache") == "shared" for r in rows if "error" not in r):
        out += ["\\* first build with the run's shared kernel cache (not cold).", ""]
    if any(r.get("build_kernels_warm_s") is not None for r in rows if "error" not in r):
        out += ["† first build with its kernels compiled by the prepare phase (warm kernels, fresh timing: "
                "every tactic timed).", ""]
    out += ["Geometric means of polykit's speed (torch ms / polykit ms; above 1x polykit is faster):", "",
            *family_table(rows), "", *acceptance_lines(rows)]
    failed = [r for r in rows if "error" in r]
    if failed:
        out += ["Failed cases:", ""] + [f"- {r['model']} bs{r['batch']}: {r['error']}" for r in failed] + [""]
    uncompiled = [r for r in rows if "compile_error" in r and "error" not in r]
    if uncompiled:
        out += ["torch.compile failed (no compile time):", ""] + \
            [f"- {r['model']} bs{r['batch']}: {r['compile_error']}" for r in uncompiled] + [""]
    return "\n".join(out)


def replace_section(text: str, section: str, where: str = "markdown") -> str:
    """`text` with what stands between the BEGIN and END markers replaced by `section`."""
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{where}: no '{BEGIN}' ... '{END}' section to fill")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{section}\n{END}{rest.split(END, 1)[1]}"


def load_results(path: str | Path) -> dict:
    """A zoo results file ({"format", "settings", "results": [rows]}); SystemExit naming the file if not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: cannot read a zoo results file: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) \
            or not all(isinstance(r, dict) and "model" in r and "batch" in r for r in doc["results"]):
        raise SystemExit(f"{path}: not a zoo results file (a 'results' list of rows with model and batch)")
    return doc


def render_files(paths: Sequence[str], into: str | None = None) -> str:
    """Render the results files at `paths`; printed, or written into the marked section of `into`."""
    section = render([load_results(p) for p in paths])
    if into:
        target = Path(into)
        target.write_text(replace_section(target.read_text(), section, into))
    else:
        print(section)
    return section
