"""Parsing of the CLI's value syntaxes (Polygraphy's): `--atol 1e-4 logits:1e-3`,
`--val-range x:[-1,1]`, `--input-shapes x:[1,3,224,224]`, `--check-error-stat out:max`,
`--layer-precisions conv1:fp32`, `--memory-pool-limit workspace:64M`, `--inputs x:auto:auto`,
`--tensor-ranges x:-1,1`; the builder options run, convert, bench and debug tactics share
(`with_builder_options`, `channels_last_option`)
and the comparison options of run and debug tactics (`with_compare_options`).

click takes one value per option occurrence, so `expand_multi_values` first rewrites
`--atol 1e-4 logits:1e-3` into `--atol 1e-4 --atol logits:1e-3`, consuming only the
tokens that look like values of that option (so a model path after them is left alone),
and `rewrite_runner_flags` turns plugin runner flags (`--trt`, `--onnxrt`) into ordered
`--runner NAME` options.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from typing import Any, Callable, List, Mapping, Optional, Sequence

import typer

from polykit.errors import UsageError

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf"
_NAME = r"[^\s\[\]]+"
_TOL = re.compile(rf"^(?:(?P<name>{_NAME}):)?(?P<value>{_NUM})$")
_RANGE = re.compile(rf"^(?:(?P<name>{_NAME}):)?\[\s*(?P<low>{_NUM})\s*,\s*(?P<high>{_NUM})\s*\]$")
_SHAPE = re.compile(rf"^(?P<name>{_NAME}):\[(?P<dims>[\d\s,]*)\]$")
_VALUES = re.compile(rf"^(?P<name>{_NAME}):\[(?P<dims>[-+\d\s,.eE]*)\]$")  # floats: a float shape operand's opt
#: a tensor name (or NAME:SPEC) that is neither an option nor a model file
_TENSOR_NAME = re.compile(r"^(?!-)(?!.*\.(onnx|plan)$).+$")
_STAT = re.compile(r"^(?:(?P<name>.+):)?(?P<stat>elemwise|max|mean|median|quantile)$")

#: option -> pattern its values must match (what expand_multi_values may consume)
MULTI_VALUE_OPTIONS: dict[str, "re.Pattern[str]"] = {
    "--atol": _TOL,
    "--rtol": _TOL,
    "--val-range": _RANGE,
    "--input-shapes": _SHAPE,
    "--trt-min-shapes": _SHAPE,
    "--trt-opt-shapes": _SHAPE,
    "--trt-max-shapes": _SHAPE,
    "--trt-min-shape-values": _VALUES,
    "--trt-opt-shape-values": _VALUES,
    "--trt-max-shape-values": _VALUES,
    "--check-error-stat": _STAT,
    "--providers": re.compile(r"^[A-Za-z][A-Za-z0-9_]*$"),
    "--mark-outputs": _TENSOR_NAME,
    "--mark": _TENSOR_NAME,
    "--trt-outputs": _TENSOR_NAME,
    "--onnx-outputs": _TENSOR_NAME,
    "--inputs": _TENSOR_NAME,
    "--outputs": _TENSOR_NAME,
    "--layer-precisions": re.compile(r"^[^\s\[\]]+:[A-Za-z0-9]+(,[^\s\[\]]+:[A-Za-z0-9]+)*$"),
    "--memory-pool-limit": re.compile(r"^workspace:\d+(\.\d+)?[KMG]?(i?B)?$", re.I),
    "--show": re.compile(r"^(io|ops|layers|attrs|weights)$"),
    "--tensor-ranges": re.compile(rf"^.+:(?:{_NUM}),(?:{_NUM})$"),
    "--override-input-shapes": re.compile(rf"^{_NAME}:\[[^\]]*\]$"),
    "--set-unbounded-dds-upper-bound": re.compile(r"^(?:[^\s]+:)?\d+$"),
}


def expand_multi_values(argv: Sequence[str], options: Mapping[str, "re.Pattern[str]"] = MULTI_VALUE_OPTIONS) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        out.append(token)
        i += 1
        pattern = options.get(token)
        if pattern is None:
            continue
        if i < len(argv):  # the first value is always taken (click reports a bad one)
            out.append(argv[i])
            i += 1
        while i < len(argv) and not argv[i].startswith("--") and pattern.match(argv[i]):
            out.extend([token, argv[i]])
            i += 1
    return out


def rewrite_runner_flags(argv: Sequence[str], flags: Mapping[str, str]) -> list[str]:
    """Replace each runner flag with `--runner NAME` (order kept); stops at a bare `--`."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + list(argv[i:])
        if token in flags:
            out.extend(["--runner", flags[token]])
        else:
            out.append(token)
    return out


def _num(text: str) -> float:
    return float(text)


def parse_tolerances(values: Sequence[str], option: str) -> dict[str, float]:
    """['1e-4', 'logits:1e-3'] -> {'': 1e-4, 'logits': 1e-3}."""
    table: dict[str, float] = {}
    for v in values:
        m = _TOL.match(v.strip())
        if m is None:
            raise UsageError(f"{option} {v!r} is not a number or NAME:NUMBER", hint=f"e.g. {option} 1e-4 logits:1e-3")
        value = _num(m["value"])
        if value < 0:
            raise UsageError(f"{option} {v!r} is negative", hint=f"give a value >= 0, e.g. {option} 1e-4")
        table[m["name"] or ""] = value
    return table


def parse_val_ranges(values: Sequence[str]) -> dict[str, tuple[float, float]]:
    """['x:[-1,1]', '[0,5]'] -> {'x': (-1.0, 1.0), '': (0.0, 5.0)}."""
    table: dict[str, tuple[float, float]] = {}
    for v in values:
        m = _RANGE.match(v.strip())
        if m is None:
            raise UsageError(f"--val-range {v!r} is not NAME:[LOW,HIGH] or [LOW,HIGH]", hint="e.g. --val-range x:[-1,1]")
        low, high = _num(m["low"]), _num(m["high"])
        if low > high:
            raise UsageError(f"--val-range {v!r}: low > high", hint="write the range low first: --val-range x:[-1,1]")
        table[m["name"] or ""] = (low, high)
    return table


def parse_input_shapes(values: Sequence[str], option: str = "--input-shapes") -> dict[str, tuple[int, ...]]:
    """['x:[1,3,224,224]'] -> {'x': (1, 3, 224, 224)} (also the values of `option`, same syntax)."""
    table: dict[str, tuple[int, ...]] = {}
    for v in values:
        m = (_VALUES if option in VALUE_OPTIONS else _SHAPE).match(v.strip())
        if m is None:
            raise UsageError(f"{option} {v!r} is not NAME:[D0,D1,...]", hint=f"e.g. {option} x:[1,3,224,224]")
        dims = [d.strip() for d in m["dims"].split(",") if d.strip()]
        try:
            table[m["name"]] = tuple(_number(d) if option in VALUE_OPTIONS else int(d) for d in dims)
        except ValueError:
            raise UsageError(f"{option} {v!r} holds something that is not a number",
                             hint=f"e.g. {option} x:[1,3,224,224]") from None
    return table


def _number(text: str) -> "int | float":
    """An int, or a float where the text has a point or an exponent (Resize's scales)."""
    return float(text) if any(c in text for c in ".eE") else int(text)


PROFILE_OPTIONS = ("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes")
VALUE_OPTIONS = ("--trt-min-shape-values", "--trt-opt-shape-values", "--trt-max-shape-values")


def parse_profiles(min_shapes: Sequence[str], opt_shapes: Sequence[str], max_shapes: Sequence[str],
                   min_values: Sequence[str] = (), opt_values: Sequence[str] = (), max_values: Sequence[str] = ()
                   ) -> tuple:
    """Optimization profiles from Polygraphy's --trt-min/opt/max-shapes NAME:[dims] values (and
    --trt-min/opt/max-shape-values NAME:[values] for shape-tensor inputs): an input named again
    in one option starts the next profile (`--trt-min-shapes x:[1,3] --trt-min-shapes x:[8,3]`
    gives two); each profile needs all three of its inputs' shapes (values)."""
    shapes = _profile_triples(PROFILE_OPTIONS, (min_shapes, opt_shapes, max_shapes))
    values = _profile_triples(VALUE_OPTIONS, (min_values, opt_values, max_values))
    if not shapes and not values:
        return ()
    from polykit.compiler.plan.profiles import Profile  # only then: `run --onnxrt` loads no compiler

    if shapes and values and len(shapes) != len(values):
        raise UsageError(f"the shape flags give {len(shapes)} profile(s), the shape-value flags {len(values)}",
                         hint="give each profile's shapes and shape-tensor values")
    count = max(len(shapes), len(values))
    return tuple(Profile(shapes[i] if shapes else {}, values[i] if values else {}) for i in range(count))


def _profile_triples(options: Sequence[str], per_option_values: Sequence[Sequence[str]]) -> list[dict]:
    """Per profile, {input: (min, opt, max)} from three options' NAME:[...] values."""
    per_option = []
    for values in per_option_values:
        profiles: list[dict[str, tuple[int, ...]]] = [{}]
        for value in values:
            ((name, dims),) = parse_input_shapes([value], option=options[len(per_option)]).items()
            if name in profiles[-1]:
                profiles.append({})
            profiles[-1][name] = dims
        per_option.append(profiles if values else [])
    counts = {len(p) for p in per_option}
    if counts == {0}:
        return []
    if len(counts) != 1:
        raise UsageError(f"{'/'.join(options)} give {'/'.join(str(len(p)) for p in per_option)} profiles",
                         hint="give each profile's min, opt and max for the same inputs")
    out = []
    for i, (low, opt, high) in enumerate(zip(*per_option)):
        if not set(low) == set(opt) == set(high):
            odd = sorted((set(low) | set(opt) | set(high)) - (set(low) & set(opt) & set(high)))
            raise UsageError(f"profile {i} lacks the min, opt or max of input(s) {odd}",
                             hint=f"give {', '.join(options)} for every input")
        out.append({name: (low[name], opt[name], high[name]) for name in low})
    return out


def shape_value_options(min_shapes: Sequence[str], opt_shapes: Sequence[str], max_shapes: Sequence[str],
                        min_values: Sequence[str], opt_values: Sequence[str], max_values: Sequence[str]) -> dict:
    """BuilderConfig's `profiles` of the profile flags, and its `shape_values` when only
    --trt-opt-shape-values are given: opt values whose ranges the builder reads from the model."""
    if opt_values and not min_values and not max_values:
        values = parse_input_shapes(opt_values, option="--trt-opt-shape-values")
        if len(values) != len(opt_values):
            raise UsageError("--trt-opt-shape-values names an input twice without --trt-min-shape-values and --trt-max-shape-values",
                             hint="give each shape-tensor input's opt values once (one profile), or min/opt/max "
                                  "values per profile")
        return {"profiles": parse_profiles(min_shapes, opt_shapes, max_shapes), "shape_values": values}
    return {"profiles": parse_profiles(min_shapes, opt_shapes, max_shapes, min_values, opt_values, max_values)}


def opt_shapes(profiles: Sequence[Any]) -> dict[str, tuple[int, ...]]:
    """The first profile's opt shape of each input (what feeds default to)."""
    return {name: triple[1] for name, triple in profiles[0].shapes.items()} if profiles else {}


def parse_error_stats(values: Sequence[str]) -> dict[str, str]:
    """['elemwise', 'logits:max'] -> {'': 'elemwise', 'logits': 'max'}."""
    table: dict[str, str] = {}
    for v in values:
        m = _STAT.match(v.strip())
        if m is None:
            raise UsageError(f"--check-error-stat {v!r} is not [NAME:]elemwise|max|mean|median|quantile",
                             hint="e.g. --check-error-stat mean, or --check-error-stat logits:max")
        table[m["name"] or ""] = m["stat"]
    return table


# ---- options of the commands that build a plan (convert, run, bench): declared once -------
LOAD_TACTICS = typer.Option(None, "--load-tactics", metavar="FILE",
                            help="force the tactics of a replay file (written by --save-tactics)")
SAVE_TACTICS = typer.Option(None, "--save-tactics", metavar="FILE",
                            help="write the tactic chosen for every layer to a replay file")


def channels_last_option() -> Any:
    """`--channels-last/--no-channels-last` (BuilderConfig.channels_last; unset: auto)."""
    import typer

    return typer.Option(None, "--channels-last/--no-channels-last",
                        help="run 1-D / 2-D / 3-D convolutions in NHWC (default: on for fp16 cuda builds)")


_SIZE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMG]?)(?:i?B)?$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_memory_pool_limits(values: Sequence[str]) -> dict[str, int]:
    """['workspace:64M'] -> {'workspace': 67108864} (bytes; K/M/G are powers of 1024)."""
    table: dict[str, int] = {}
    for v in values:
        pool, _, size = v.strip().partition(":")
        m = _SIZE.match(size)
        if pool != "workspace" or m is None:
            raise UsageError(f"--memory-pool-limit {v!r} is not workspace:SIZE",
                             hint="e.g. --memory-pool-limit workspace:64M (bytes, or K/M/G)")
        table[pool] = int(float(m["n"]) * _UNITS[m["unit"].upper()])
    return table


_BUDGET_HINT = ("give -2 (streaming off), -1 (automatic), N% with 0 <= N <= 100 (that share of the streamable "
                "weights stays on the device) or bytes >= 0 (K/M/G: powers of 1024), e.g. 50% or 512M")


def parse_weight_streaming_budget(value: str | None) -> tuple[int | None, float | None]:
    """Polygraphy's --weight-streaming-budget -> (budget bytes or -2/-1, percent): '50%' ->
    (None, 50.0); '512M' -> (536870912, None); '-1' -> (-1, None); None -> (None, None). A
    number may use scientific notation; a fraction of a byte is truncated, as Polygraphy does."""
    if value is None:
        return None, None
    text = value.strip()
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0 <= percent <= 100:
                raise ValueError
            return None, percent
        unit = text[-1].upper() if text and text[-1].upper() in "KMG" else ""
        number = float(text[:-1] if unit else text)
        if not math.isfinite(number):
            raise ValueError
        budget = int(number * _UNITS[unit])
        if budget < -2 or (budget < 0 and (unit or number != budget)):
            raise ValueError
        return budget, None
    except ValueError:
        raise UsageError(f"--weight-streaming-budget {value!r} is not -2, -1, a percent from 0% to 100% or a "
                         "byte count >= 0", hint=_BUDGET_HINT) from None


#: (parameter, annotation, typer option) of the runtime options of polykit's engine runner
#: (Polygraphy's TrtRunnerArgs), shared by run and bench
RUNTIME_OPTIONS: list[tuple[str, Any, Any]] = [
    ("weight_streaming_budget", Optional[str], typer.Option(
        None, "--weight-streaming-budget", metavar="BUDGET",
        help="weights kept on the device for a plan built --weight-streaming: -2 streaming off (as unset), -1 "
             "automatic, N% of the streamable weights (0% streams them all), or bytes (K/M/G suffixes)")),
    ("allocation_strategy", Optional[str], typer.Option(
        None, "--allocation-strategy", metavar="static|profile|runtime",
        help="Polygraphy's activation memory strategy: polykit allocates statically (one arena at the largest "
             "shapes); profile and runtime run as static, with a notice")),
]


def runtime_options(weight_streaming_budget: str | None = None, allocation_strategy: str | None = None) -> dict[str, Any]:
    """PolykitRunner keyword arguments (RunnerRequest fields) from the runtime options' CLI values."""
    from polykit.backends.polykit_runner import check_allocation_strategy

    budget, percent = parse_weight_streaming_budget(weight_streaming_budget)
    check_allocation_strategy(allocation_strategy, where="--allocation-strategy", notice=False)  # the runner's
    return {"weight_streaming_budget": budget, "weight_streaming_percent": percent,
            "allocation_strategy": allocation_strategy}


def parse_layer_precisions(values: Sequence[str]) -> dict[str, str]:
    """['conv1:fp32,fc:float16'] -> {'conv1': 'fp32', 'fc': 'fp16'} (ONNX node names; Polygraphy's
    float32/float16/bfloat16 spellings too: cli.spellings.precision_name)."""
    from polykit.tools.cli.spellings import precision_name

    table: dict[str, str] = {}
    for v in values:
        for item in filter(None, (x.strip() for x in v.split(","))):
            name, _, precision = item.rpartition(":")
            if not name or precision_name(precision) is None:
                raise UsageError(f"--layer-precisions {item!r} is not NAME:PRECISION",
                                 hint="PRECISION: fp32|tf32|fp16|bf16 or float32|float16|bfloat16; e.g. "
                                      "--layer-precisions /conv1/Conv:fp32 (ONNX node names)")
            table[name] = precision_name(precision)
    return table


_TENSOR_RANGE = re.compile(rf"^(?P<name>.+):(?P<low>{_NUM}),(?P<high>{_NUM})$")


def parse_tensor_ranges(values: Sequence[str]) -> dict[str, tuple[float, float]]:
    """['x:-1,1', '/conv1/Conv_output_0:0,6.5'] -> {'x': (-1.0, 1.0), ...} (a name may hold ':')."""
    table: dict[str, tuple[float, float]] = {}
    for v in values:
        m = _TENSOR_RANGE.match(v.strip())
        if m is None:
            raise UsageError(f"--tensor-ranges {v!r} is not NAME:MIN,MAX", hint="e.g. --tensor-ranges input:-2.5,2.5")
        table[m["name"]] = (_num(m["low"]), _num(m["high"]))
    return table


def calibration_source(value: str | None) -> Any:
    """--calibration-data: a folder of .npz batches or one .npz (the path), or a data loader
    script FILE.py[:FUNC] (a ScriptDataLoader)."""
    if value is None or not re.search(r"\.py(:[A-Za-z_][A-Za-z0-9_]*)?$", value):
        return value
    from polykit.tools.data.loaders import ScriptDataLoader

    return ScriptDataLoader(value)


#: (parameter, annotation, typer option) of the builder options shared by run, convert and bench
BUILDER_OPTIONS: list[tuple[str, Any, Any]] = [
    ("fp16", bool, typer.Option(False, "--fp16", help="let float layers run in half precision (float16)")),
    ("bf16", bool, typer.Option(False, "--bf16", help="let float layers run in bfloat16")),
    ("tf32", bool, typer.Option(False, "--tf32", help="let float32 layers use tensor-core math on tf32-rounded operands")),
    ("precision_constraints", str, typer.Option("none", "--precision-constraints",
                                                help="obey|prefer|none: how --layer-precisions binds")),
    ("layer_precisions", List[str], typer.Option([], "--layer-precisions",
                                                 help="per ONNX node: NAME:fp32|tf32|fp16|bf16[,...] (Polygraphy's "
                                                      "float32|float16|bfloat16 too)")),
    ("strongly_typed", bool, typer.Option(False, "--strongly-typed", help="run layers in the model's own dtypes")),
    ("builder_optimization_level", int, typer.Option(3, "--builder-optimization-level",
                                                     help="0 (no timing) .. 5 (time every tactic); default 3")),
    ("memory_pool_limit", List[str], typer.Option([], "--memory-pool-limit",
                                                  help="workspace:SIZE, most scratch bytes a layer's tactic may use")),
    ("load_timing_cache", Optional[str], typer.Option(None, "--load-timing-cache", help="read tactic timings from this file")),
    ("save_timing_cache", Optional[str], typer.Option(None, "--save-timing-cache",
                                                      help="write the tactic timings (merged into the file)")),
    ("error_on_timing_cache_miss", bool, typer.Option(False, "--error-on-timing-cache-miss",
                                                      help="fail when a layer to time is not in the loaded cache")),
    ("int8", bool, typer.Option(False, "--int8", help="quantize Conv/Gemm/MatMul to INT8 from calibrated ranges")),
    ("fp8", bool, typer.Option(False, "--fp8", help="quantize Conv/Gemm/MatMul to FP8 (e4m3) from calibrated ranges "
                                                     "(minmax, max|x| / 448)")),
    ("calibrator", str, typer.Option("entropy", "--calibrator", help="entropy|minmax|percentile (with --int8)")),
    ("percentile", float, typer.Option(99.99, "--percentile", help="percent of |x| --calibrator percentile keeps")),
    ("calibration_data", Optional[str], typer.Option(None, "--calibration-data", metavar="DIR",
                                                     help="calibration batches: a folder of .npz (input name -> "
                                                          "array), one .npz, or a FILE.py[:FUNC] data loader")),
    ("calibration_cache", Optional[str], typer.Option(None, "--calibration-cache", metavar="FILE",
                                                      help="read INT8 / FP8 scales from FILE if it exists, else calibrate "
                                                           "and write them there")),
    ("tensor_ranges", List[str], typer.Option([], "--tensor-ranges", help="dynamic range per tensor: NAME:MIN,MAX")),
    ("trt_min_shapes", List[str], typer.Option([], "--trt-min-shapes",
                                               help="optimization profile min shapes: x:[1,3,32,32] (again per profile)")),
    ("trt_opt_shapes", List[str], typer.Option([], "--trt-opt-shapes",
                                               help="optimization profile opt shapes (tactics are timed at them)")),
    ("trt_max_shapes", List[str], typer.Option([], "--trt-max-shapes", help="optimization profile max shapes")),
    ("trt_min_shape_values", List[str], typer.Option([], "--trt-min-shape-values",
                                                     help="shape-tensor input min values: shape:[1,16] (per profile)")),
    ("trt_opt_shape_values", List[str], typer.Option([], "--trt-opt-shape-values",
                                                     help="shape-tensor input opt values (alone: the model's "
                                                          "ops give the ranges)")),
    ("trt_max_shape_values", List[str], typer.Option([], "--trt-max-shape-values",
                                                     help="shape-tensor input max values")),
    ("ranks", int, typer.Option(1, "--ranks", help="split the model tensor-parallel over N ranks (cpu: simulated "
                                                  "ranks; cuda: one process per GPU)")),
    ("version_compatible", bool, typer.Option(False, "--version-compatible",
                                              help="the plan loads with other polykit versions whose tactics have "
                                                   "the same revisions")),
    ("weight_streaming", bool, typer.Option(False, "--weight-streaming",
                                            help="record which weights each layer reads, so the runtime can "
                                                 "stream weights beyond a budget from host memory")),
    ("hardware_compatibility_level", str, typer.Option("none", "--hardware-compatibility-level",
                                                       help="none|ampere+: ampere+ takes only tactics that run on "
                                                            "every GPU of compute capability 8.0 and later")),
    ("input_io_formats", List[str], typer.Option([], "--input-io-formats",
                                                 help="dtype:format of the engine inputs as trtexec spells them "
                                                      "(fp32|fp16|bf16|int8 : chw|hwc), comma-separated, one per "
                                                      "input or one for all")),
    ("output_io_formats", List[str], typer.Option([], "--output-io-formats",
                                                  help="dtype:format of the engine outputs (as --input-io-formats)")),
    ("device", Optional[int], typer.Option(None, "--device", metavar="N",
                                           help="cuda: the GPU to build (time tactics) and run on (default 0); "
                                                "an error with the cpu target")),
    ("profiling_verbosity", str, typer.Option("layer_names_only", "--profiling-verbosity",
                                              help="none|layer_names_only|detailed: what the NVTX range of each "
                                                   "layer says in Nsight (detailed: its kind and tactic too)")),
    ("sparsity", str, typer.Option("disable", "--sparsity",
                                   help="disable|enable|force: enable times 2:4 sparse tactics for GEMM/1x1-conv "
                                        "weights that have the pattern; force prunes eligible weights to it first "
                                        "(results change: for speed studies)")),
    ("pdl", bool, typer.Option(False, "--pdl/--no-pdl",
                               help="cuda: launch the plan's kernels with Programmatic Dependent Launch on sm_90+ "
                                    "GPUs (each launch overlaps the tail of the one before; recorded in the plan)")),
]


def builder_config_options(fp16: bool = False, bf16: bool = False, tf32: bool = False,
                           precision_constraints: str = "none", layer_precisions: Sequence[str] = (),
                           strongly_typed: bool = False, builder_optimization_level: int = 3,
                           memory_pool_limit: Sequence[str] = (), load_timing_cache: str | None = None,
                           save_timing_cache: str | None = None, error_on_timing_cache_miss: bool = False,
                           int8: bool = False, fp8: bool = False, calibrator: str = "entropy", percentile: float = 99.99,
                           calibration_data: str | None = None, calibration_cache: str | None = None,
                           tensor_ranges: Sequence[str] = (), trt_min_shapes: Sequence[str] = (),
                           trt_opt_shapes: Sequence[str] = (), trt_max_shapes: Sequence[str] = (),
                           trt_min_shape_values: Sequence[str] = (), trt_opt_shape_values: Sequence[str] = (),
                           trt_max_shape_values: Sequence[str] = (), ranks: int = 1, version_compatible: bool = False,
                           weight_streaming: bool = False, hardware_compatibility_level: str = "none",
                           input_io_formats: Sequence[str] = (), output_io_formats: Sequence[str] = (),
                           device: int | None = None, profiling_verbosity: str = "layer_names_only",
                           sparsity: str = "disable", pdl: bool = False) -> dict[str, Any]:
    """BuilderConfig keyword arguments from the shared builder options' CLI values."""
    return {
        "fp16": fp16, "bf16": bf16, "tf32": tf32, "precision_constraints": precision_constraints,
        "layer_precisions": parse_layer_precisions(layer_precisions), "strongly_typed": strongly_typed,
        "builder_optimization_level": builder_optimization_level,
        "workspace_limit": parse_memory_pool_limits(memory_pool_limit).get("workspace"),
        "load_timing_cache": load_timing_cache, "save_timing_cache": save_timing_cache,
        "error_on_timing_cache_miss": error_on_timing_cache_miss,
        "int8": int8, "fp8": fp8, "calibrator": calibrator, "percentile": percentile,
        "calibration_data": calibration_source(calibration_data), "calibration_cache": calibration_cache,
        "tensor_ranges": parse_tensor_ranges(tensor_ranges),
        **shape_value_options(trt_min_shapes, trt_opt_shapes, trt_max_shapes, trt_min_shape_values,
                              trt_opt_shape_values, trt_max_shape_values),
        "ranks": ranks, "version_compatible": version_compatible, "weight_streaming": weight_streaming,
        "hardware_compatibility_level": hardware_compatibility_level,
        "input_io_formats": split_list(input_io_formats), "output_io_formats": split_list(output_io_formats),
        "device": device, "profiling_verbosity": profiling_verbosity, "sparsity": sparsity, "pdl": pdl,
    }


def split_list(values: Sequence[str]) -> tuple[str, ...]:
    """Repeated options whose values may also be comma-separated: ['a,b', 'c'] -> ('a', 'b', 'c')."""
    return tuple(item.strip() for v in values for item in str(v).split(",") if item.strip())


#: (parameter, annotation, typer option) of the comparison options shared by run and debug tactics
COMPARE_OPTIONS: list[tuple[str, Any, Any]] = [
    ("compare", str, typer.Option("simple", "--compare", "--compare-func", help="simple|l2|cosine|snr (plugins add more)")),
    ("atol", List[str], typer.Option([], "--atol", help="absolute tolerance: 1e-5 and/or per output: logits:1e-3")),
    ("rtol", List[str], typer.Option([], "--rtol", help="relative tolerance: 1e-5 and/or per output: logits:1e-3")),
    ("check_error_stat", List[str], typer.Option([], "--check-error-stat",
                                                 help="elemwise|max|mean|median|quantile, per output too")),
    ("error_quantile", float, typer.Option(0.99, "--error-quantile", help="the quantile of --check-error-stat quantile")),
    ("l2_tol", float, typer.Option(1e-5, "--l2-tol", help="largest relative L2 error for --compare l2")),
    ("cosine_tol", float, typer.Option(1e-6, "--cosine-tol", help="largest 1 - cosine similarity for --compare cosine")),
    ("snr_min", float, typer.Option(80.0, "--snr-min", help="smallest SNR in dB for --compare snr")),
]


def compare_settings(compare: str = "simple", atol: Sequence[str] = (), rtol: Sequence[str] = (),
                     check_error_stat: Sequence[str] = (), error_quantile: float = 0.99, l2_tol: float = 1e-5,
                     cosine_tol: float = 1e-6, snr_min: float = 80.0) -> dict[str, Any]:
    """AccuracySettings keyword arguments (`compare`, `compare_options`) from the comparison options' CLI values."""
    from polykit.tools.compare.funcs import CompareOptions

    options = CompareOptions(
        atol={"": 1e-5, **parse_tolerances(atol, "--atol")},
        rtol={"": 1e-5, **parse_tolerances(rtol, "--rtol")},
        check_error_stat={"": "elemwise", **parse_error_stats(check_error_stat)},
        error_quantile=error_quantile, l2_tol=l2_tol, cosine_tol=cosine_tol, snr_min_db=snr_min,
    )
    return {"compare": compare, "compare_options": options}


def with_builder_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command the shared builder options; it receives them as `builder_options`,
    a dict of BuilderConfig fields (builder_config_options)."""
    return with_options(command, BUILDER_OPTIONS, "builder_options", builder_config_options)


def with_runtime_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command the runtime options of polykit's engine runner; it receives them as
    `runtime_options`, a dict of RunnerRequest fields (runtime_options)."""
    return with_options(command, RUNTIME_OPTIONS, "runtime_options", runtime_options)


def with_compare_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command the shared comparison options; it receives them as `compare_settings`,
    a dict of AccuracySettings fields (compare_settings)."""
    return with_options(command, COMPARE_OPTIONS, "compare_settings", compare_settings)


def with_options(command: Callable[..., Any], options: list[tuple[str, Any, Any]], param: str,
                 convert: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with `options` as keyword-only typer parameters, passed to it as `param=convert(**values)`."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != param]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
             for name, annotation, option in options]

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name, _, _ in options}
        return command(**kwargs, **{param: convert(**values)})

    run.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
    return run
