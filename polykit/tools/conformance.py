"""ONNX's own backend test suite run against polykit: passed / failed / unsupported per op.

Runs the cases `onnx.backend.test` ships (node, simple, pytorch-converted,
pytorch-operator, and the light_* real models) through polykit's ONNX backend on a target
and compares with the expected outputs exactly as onnx's BackendTest does
(np.testing.assert_allclose with each case's rtol/atol, shapes and dtypes equal).
`runner="onnxrt"` runs the same cases through onnxruntime (CPU) under the same comparison, so
the two pass counts are measured alike, in one process (a case onnxruntime cannot load fails).
One exception to the exact comparison, for both runners: elements ONNX leaves undefined, those
of a float -> integer Cast / CastLike of NaN or of a value truncating outside the type's range
(`undefined_elements`), are not compared: the suite generates their expected values with
ml_dtypes' C++ casts at load time, which differ between processors, and polykit gives them
its own rule's values (kernels/reference/cast.py).
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "light")
RUNNERS = ("polykit", "onnxrt")


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    model: Any
    data_sets: list
    rtol: float
    atol: float


@dataclass(frozen=True)
class CaseResult:
    name: str
    kind: str
    ops: tuple[str, ...]
    status: str  # passed | failed | unsupported
    message: str = ""
    seconds: float = 0.0
    builds: int = 0  # engines the case's backend rep built (more than one: rebuilt per input value)


@dataclass
class ConformanceReport:
    target: str
    results: list[CaseResult] = field(default_factory=list)

    def counts(self, kind: str | None = None) -> Counter:
        return Counter(r.status for r in self.results if kind is None or r.kind == kind)

    def per_op(self) -> dict[str, Counter]:
        table: dict[str, Counter] = defaultdict(Counter)
        for r in self.results:
            for op in r.ops:
                table[op][r.status] += 1
        return dict(sorted(table.items()))

    def pass_rate_supported(self, kind: str = "node") -> float:
        c = self.counts(kind)
        runnable = c["passed"] + c["failed"]
        return c["passed"] / runnable if runnable else 0.0

    def passed_names(self) -> list[str]:
        """Sorted names of the passing cases (the gate's baseline format)."""
        return sorted(r.name for r in self.results if r.status == "passed")

    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == "failed"]

    def rebuilt(self) -> list[str]:
        """Passing cases whose rep built more than one engine (shapes bound to input values)."""
        return sorted(r.name for r in self.results if r.status == "passed" and r.builds > 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "counts": {k or "all": dict(self.counts(k)) for k in (None, *KINDS)},
            "node_pass_rate_supported": self.pass_rate_supported("node"),
            "per_op": {op: dict(c) for op, c in self.per_op().items()},
            "rebuilt_per_value": len(self.rebuilt()),
            "results": [asdict(r) for r in self.results],
        }


def collect_cases(kinds: Iterable[str] = KINDS, pattern: str | None = None) -> list[Case]:
    """Load the suite's cases (light models get onnx's seeded dummy inputs)."""
    from onnx.backend.test.loader import load_model_tests

    rx = re.compile(pattern) if pattern else None
    cases: list[Case] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in kinds:
            if kind == "light":
                cases.extend(_light_cases(rx))
                continue
            for tc in load_model_tests(kind=kind):
                if rx and not rx.search(tc.name):
                    continue
                if tc.model is None and tc.model_dir is not None:
                    cases.extend(_dir_case(tc, kind))
                    continue
                cases.append(Case(tc.name, kind, tc.model, list(tc.data_sets or []), tc.rtol, tc.atol))
    return cases


def _dir_case(tc: Any, kind: str) -> list[Case]:
    import glob

    import onnx

    model = onnx.load(os.path.join(tc.model_dir, "model.onnx"))
    inits = {t.name for t in model.graph.initializer}
    in_types = [vi.type for vi in model.graph.input if vi.name not in inits]
    out_types = [vi.type for vi in model.graph.output]
    data_sets = []
    for ds in sorted(glob.glob(os.path.join(tc.model_dir, "test_data_set_*"))):
        ins = [_read_value(p, t) for p, t in zip(sorted(glob.glob(os.path.join(ds, "input_*.pb")), key=_num), in_types)]
        outs = [_read_value(p, t) for p, t in zip(sorted(glob.glob(os.path.join(ds, "output_*.pb")), key=_num),
                                                   out_types)]
        data_sets.append((ins, outs))
    return [Case(tc.name, kind, model, data_sets, tc.rtol, tc.atol)]


def _num(path: str) -> int:
    return int(re.findall(r"(\d+)\.pb$", path)[0])


def _read_value(path: str, type_proto: Any) -> Any:
    """A data-set file as the value its model type says: an array, a list of arrays (a
    SequenceProto) or None / the element (an OptionalProto), as onnx's BackendTest reads it."""
    import onnx
    from onnx import numpy_helper

    kind = type_proto.WhichOneof("value")
    if kind not in ("sequence_type", "optional_type"):
        return numpy_helper.to_array(_read_tensor(path))
    proto = onnx.SequenceProto() if kind == "sequence_type" else onnx.OptionalProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    return numpy_helper.to_list(proto) if kind == "sequence_type" else numpy_helper.to_optional(proto)


def _read_tensor(path: str) -> Any:
    import onnx

    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t


def _light_cases(rx: "re.Pattern[str] | None") -> list[Case]:
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.loader import load_model_tests
    from onnx.backend.test.runner import Runner

    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    cases = []
    for tc in load_model_tests(kind="real"):
        if not (tc.url or "").startswith("onnx/backend/test/data/light/"):
            continue
        name = "test_" + os.path.basename(tc.url)[len("light_"):-len(".onnx")]
        if rx and not rx.search(name):
            continue
        path = os.path.join(root, os.path.basename(tc.url))
        model = onnx.load(path)
        inits = {i.name for i in model.graph.initializer}
        feeds = [Runner.generate_dummy_data(x, seed=0, name=tc.model_name, random=False)
                 for x in model.graph.input if x.name not in inits]
        expected = numpy_helper.to_array(_read_tensor(path.replace(".onnx", "_output_0.pb")))
        cases.append(Case(name, "light", model, [(feeds, [expected])], tc.rtol, tc.atol))
    return cases


def _ops_of(model: Any) -> tuple[str, ...]:
    return tuple(sorted({n.op_type for n in model.graph.node}))


def run_onnxrt_case(case: Case) -> CaseResult:
    """Run one case through onnxruntime (CPU provider): passed, or failed with the first error."""
    import onnxruntime as ort

    ops = _ops_of(case.model)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            ort.set_default_logger_severity(4)  # its failures are recorded here, not logged
            options = ort.SessionOptions()
            options.log_severity_level = 4
            sess = ort.InferenceSession(case.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            names = [i.name for i in sess.get_inputs()]
            for inputs, expected in case.data_sets:
                outputs = sess.run(None, {n: _as_value(x) for n, x in zip(names, inputs)})
                _assert_similar([_as_value(x) for x in expected], tuple(outputs), case.rtol, case.atol,
                                undefined_elements(case.model, [_as_value(x) for x in inputs]))
    except Exception as exc:  # onnxruntime's errors are this case's failure, whatever their kind
        msg = f"{type(exc).__name__}: {str(exc).strip()}"
        return CaseResult(case.name, case.kind, ops, "failed", msg[:500], time.perf_counter() - start)
    return CaseResult(case.name, case.kind, ops, "passed", "", time.perf_counter() - start)


def run_case(case: Case, target: str = "cpu") -> CaseResult:
    """Run one case; 'unsupported' when an op is missing from polykit's tables."""
    from polykit.backends.onnx_backend import PolykitBackend
    from polykit.compiler.ops.registry import is_supported, load_ops
    from polykit.errors import UnsupportedModelError

    load_ops()
    ops = _ops_of(case.model)
    missing = [n.op_type for n in case.model.graph.node if not is_supported(n.domain, n.op_type)]
    start = time.perf_counter()
    if missing and not _has_importer(case.model):
        return CaseResult(case.name, case.kind, ops, "unsupported", f"ops: {sorted(set(missing))}")
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = PolykitBackend.prepare(case.model, "CUDA" if target == "cuda" else "CPU")
            for inputs, expected in case.data_sets:
                outputs = rep.run([_as_value(x) for x in inputs])
                _assert_similar([_as_value(x) for x in expected], outputs, case.rtol, case.atol,
                                undefined_elements(case.model, [_as_value(x) for x in inputs]))
    except UnsupportedModelError as exc:
        return CaseResult(case.name, case.kind, ops, "unsupported", str(exc).splitlines()[0], time.perf_counter() - start)
    except Exception as exc:  # a failure of this case, whatever its kind, is recorded and counted
        msg = f"{type(exc).__name__}: {str(exc).strip()}"
        return CaseResult(case.name, case.kind, ops, "failed", msg[:500], time.perf_counter() - start)
    return CaseResult(case.name, case.kind, ops, "passed", "", time.perf_counter() - start, rep.builds)


def _as_value(item: Any) -> Any:
    """A data-set value: an array, a list of them (a sequence) or None (an empty optional)."""
    if item is None:
        return None
    if isinstance(item, list):
        return [_as_value(x) for x in item]
    return _as_array(item)


def _as_array(item: Any) -> np.ndarray:
    """A data-set tensor as numpy (the suite stores some as TensorProto, as BackendTest normalizes)."""
    import onnx
    from onnx import numpy_helper

    return numpy_helper.to_array(item) if isinstance(item, onnx.TensorProto) else np.asarray(item)


def _has_importer(model: Any) -> bool:
    """Ops with only an importer (e.g. Upsample -> Resize) count as supported."""
    from polykit.compiler.ops.registry import IMPORTERS, is_supported

    return all(is_supported(n.domain, n.op_type) or (n.domain or "", n.op_type) in IMPORTERS for n in model.graph.node)


def undefined_elements(model: Any, inputs: list) -> list[np.ndarray | None]:
    """Per graph output, a mask of the elements whose value ONNX leaves undefined (None: all are
    defined): a one-node Cast / CastLike graph from a float input to an integer output, where
    the input is NaN or truncates outside the output type's range."""
    import ml_dtypes

    from polykit.compiler.ir.dtypes import ONNX_TO_NUMPY, is_float
    from polykit.compiler.ops.tensor.cast_reference import is_integer

    graph = model.graph
    masks: list[np.ndarray | None] = [None] * len(graph.output)
    if len(graph.node) != 1 or graph.node[0].op_type not in ("Cast", "CastLike") or len(graph.output) != 1:
        return masks
    feeds = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    source = graph.node[0].input[0]
    to = graph.output[0].type.tensor_type.elem_type
    if source not in feeds or to not in ONNX_TO_NUMPY or not is_integer(ONNX_TO_NUMPY[to]):
        return masks
    x = inputs[feeds.index(source)]
    if not isinstance(x, np.ndarray) or not is_float(x.dtype):
        return masks
    info = ml_dtypes.iinfo(ONNX_TO_NUMPY[to])
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        # float(max) + 1 is max + 1, or (past 2**53) the power of two above max: t below it is in range
        masks[0] = ~((t >= float(info.min)) & (t < float(info.max) + 1))  # NaN compares false: undefined
    return masks


def _assert_similar(expected: list, outputs: tuple, rtol: float, atol: float,
                    undefined: list[np.ndarray | None] | None = None) -> None:
    """onnx BackendTest's comparison; elements `undefined` marks (per output) are left out."""
    if len(outputs) != len(expected):
        raise AssertionError(f"{len(outputs)} outputs, expected {len(expected)}")
    for i, (ref, out) in enumerate(zip(expected, outputs)):
        if isinstance(ref, list) or ref is None:  # a sequence (element-wise) or an empty optional
            if not isinstance(out, list) if ref is not None else out is not None:
                raise AssertionError(f"output {i}: {type(out).__name__}, expected {type(ref).__name__}")
            if ref is not None:
                if len(out) != len(ref):
                    raise AssertionError(f"output {i}: a sequence of {len(out)} elements, expected {len(ref)}")
                _assert_similar(ref, tuple(out), rtol, atol)
            continue
        ref = np.asarray(ref)
        out = np.asarray(out)
        if out.shape != ref.shape:
            raise AssertionError(f"output {i}: shape {out.shape}, expected {ref.shape}")
        if ref.dtype == object:
            np.testing.assert_array_equal(out, ref)
            continue
        if out.dtype != ref.dtype:
            raise AssertionError(f"output {i}: dtype {out.dtype}, expected {ref.dtype}")
        if undefined and undefined[i] is not None:
            out, ref = out[~undefined[i]], ref[~undefined[i]]
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"output {i}")


def run_conformance(kinds: Iterable[str] = KINDS, target: str = "cpu", pattern: str | None = None,
                    progress: Any = None, runner: str = "polykit") -> ConformanceReport:
    """The suite's cases through polykit on `target`, or (runner "onnxrt") through onnxruntime."""
    report = ConformanceReport(target if runner == "polykit" else "onnxrt")
    cases = collect_cases(kinds, pattern)
    for case in cases:
        report.results.append(run_case(case, target) if runner == "polykit" else run_onnxrt_case(case))
        if progress:
            progress(report.results[-1])
    return report


def regressions(report: ConformanceReport, baseline: Iterable[str]) -> list[str]:
    """Baseline cases (names that passed before) that the report ran and did not pass."""
    status = {r.name: r.status for r in report.results}
    return sorted(name for name in baseline if name in status and status[name] != "passed")


def load_baseline(path: str | os.PathLike) -> list[str]:
    """A baseline file: a JSON list of case names that pass."""
    import json

    from polykit.errors import UsageError

    try:
        names = json.loads(open(path).read())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the conformance baseline: {exc}", where=str(path),
                         hint="check the path, or write the baseline again") from exc
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UsageError("a conformance baseline is a JSON list of case names", where=str(path),
                         hint="give a JSON list of the names of the cases that pass")
    return names


def save_report(report: ConformanceReport, path: str | os.PathLike) -> None:
    """Write the full report as JSON (counts, per op, every case's result)."""
    import json

    with open(path, "w") as f:
        json.dump(report.to_json(), f, indent=1, sort_keys=True)
        f.write("\n")


# ---- CLI: `polykit conformance` (formatting only; the work is the functions above) ----------
def conformance_cmd(
    kind: "list[str]" = None,  # type: ignore[assignment]  (typer fills the defaults below)
    target: str = "cpu",
    filter: "str | None" = None,
    as_json: bool = False,
    save: "str | None" = None,
    failures: bool = False,
    baseline: "str | None" = None,
    runner: str = "polykit",
) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from polykit.errors import UsageError

    kinds = tuple(kind or KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise UsageError(f"unknown kind {unknown[0]!r}", hint=f"kinds are: {', '.join(KINDS)}")
    if target not in ("cpu", "cuda"):
        raise UsageError(f"--target {target!r} is not cpu or cuda", hint="give --target cpu or --target cuda")
    if runner not in RUNNERS:
        raise UsageError(f"--runner {runner!r} is not one of {', '.join(RUNNERS)}",
                         hint="drop --runner for polykit's engine, or name one of those")
    report = run_conformance(kinds, target, filter, runner=runner)
    if save:
        save_report(report, save)
    lost = regressions(report, load_baseline(baseline)) if baseline else []
    if as_json:
        import json

        doc = report.to_json()
        if baseline:
            doc["regressions"] = lost
        print(json.dumps(doc, indent=1, sort_keys=True))
        return 1 if lost else 0
    console = Console(highlight=False)
    if runner == "onnxrt":
        import onnxruntime

        title = f"ONNX backend test suite on onnxruntime {onnxruntime.__version__} (CPU)"
    else:
        title = f"ONNX backend test suite on polykit ({target})"
    table = Table(title=title)
    for col in ("kind", "passed", "failed", "unsupported", "total"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for k in (*kinds, None):
        c = report.counts(k)
        table.add_row(k or "all", str(c["passed"]), str(c["failed"]), str(c["unsupported"]), str(sum(c.values())))
    console.print(table)
    ops = Table(title="per op (cases using the op)")
    for col in ("op", "passed", "failed", "unsupported"):
        ops.add_column(col, justify="left" if col == "op" else "right")
    for op, c in report.per_op().items():
        ops.add_row(op, str(c["passed"]), str(c["failed"]), str(c["unsupported"]))
    console.print(ops)
    if runner == "polykit":
        console.print(f"passing cases whose engine was rebuilt per input value: {len(report.rebuilt())}")
    if "node" in kinds:
        console.print(f"node pass rate over cases whose ops are all supported: {report.pass_rate_supported('node'):.1%}")
    if failures:
        for r in report.failures():
            first = r.message.splitlines()[0] if r.message else ""
            console.print(f"[bold]{escape(r.name)}[/bold] ({r.kind}): {escape(first)}", soft_wrap=True)
    if baseline:
        console.print(f"{len(lost)} baseline case(s) no longer pass" + (": " + ", ".join(lost) if lost else ""))
    return 1 if lost else 0


def register(app: Any) -> None:
    """Add `polykit conformance` to the CLI app."""
    import typer

    def conformance(
        kind: "list[str]" = typer.Option([], "--kind", help=f"suite kinds to run (repeatable): {', '.join(KINDS)}; default all"),
        target: str = typer.Option("cpu", "--target", help="cpu|cuda"),
        filter: "str | None" = typer.Option(None, "--filter", help="run only cases whose name matches this regex"),
        as_json: bool = typer.Option(False, "--json", help="print the full report as JSON"),
        save: "str | None" = typer.Option(None, "--save", help="write the full report as JSON to this file"),
        failures: bool = typer.Option(False, "--failures", help="list failing cases with their first error line"),
        baseline: "str | None" = typer.Option(None, "--baseline", help="JSON list of passing cases; exit 1 if one fails"),
        runner: str = typer.Option("polykit", "--runner", help="polykit, or onnxrt: the same cases and comparison "
                                                                "through onnxruntime (CPU), for a like-for-like count"),
    ) -> None:
        code = conformance_cmd(kind, target, filter, as_json, save, failures, baseline, runner)
        if code:
            raise typer.Exit(code)

    app.command("conformance", help="Run ONNX's backend test suite through polykit: pass/fail/unsupported "
                                    "per kind and per op, and the node pass rate.")(conformance)
