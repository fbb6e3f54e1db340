"""ai.polykit CheckRange and SelectByIndex: run-time index inputs that ONNX bounds, and tensors
chosen by a run-time index (resolve_sequences lowers SequenceInsert / SequenceErase / SequenceAt at
a position known only at run time to them: polykit.compiler.passes.control.sequence_positions).

CheckRange(x) -> y. Attributes `lo`, `hi` (ints), `what` (the value's role, as an error names it:
"input 'pos', the position of SequenceInsert 'n'"), `wrap` (int, default 0). Every element of the
integer tensor x must lie in [lo, hi], else the run stops with a RuntimeInputError naming `what`,
the value and the range (ONNX's ops error there). y = x, with `wrap` added to its negative elements
("negative counts from the end", the usual ONNX index rule; 0 leaves them).

SelectByIndex(index, c_0, ..., c_{C-1}) -> y_0, ..., y_{m-1}. `index` holds m integers; y_j is a copy
of c_{index[j]}. Attributes `width` (int >= 1) and `choices` (m * width ints, row j the candidates y_j
may take, -1 padding): y_j's dtype is its candidates' (one dtype, one rank); a dim its candidates
agree on is kept, one they differ in is sized by the run (polykit.compiler.ops.data_dims.sized_dim), so
an output whose candidates share a shape stays static. An index outside its row is a
RuntimeInputError (a CheckRange before it names the model's value).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ops.data_dims import sized_dim
from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.control.control_flow import same_dim
from polykit.compiler.ops.registry import InferContext, shape_rule

CHECK_RANGE = "CheckRange"
SELECT_BY_INDEX = "SelectByIndex"
_HINT = "resolve_sequences makes this layer; rebuild the plan"


def _int_attr(ctx: InferContext, key: str, default: Any = None) -> int:
    value = ctx.attr(key) if default is None else ctx.attr(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ctx.fail(f"attribute {key!r} is {value!r}, not an integer", hint=_HINT)
    return int(value)


@shape_rule(CHECK_RANGE, domain=POLYKIT_DOMAIN)
def _check_range(ctx: InferContext):
    if ctx.n_inputs != 1 or not ctx.has(0) or ctx.n_outputs != 1:
        raise ctx.fail("CheckRange takes one tensor and gives one", hint=_HINT)
    if ctx.dtype(0) is not None and ctx.dtype(0).kind not in "iu":
        raise ctx.fail(f"CheckRange checks integer values, not {ctx.dtype(0)}", hint=_HINT)
    lo, hi = _int_attr(ctx, "lo"), _int_attr(ctx, "hi")
    _int_attr(ctx, "wrap", 0)
    if lo > hi or not isinstance(ctx.attr("what"), str):
        raise ctx.fail(f"CheckRange needs lo <= hi and a text `what`, has [{lo}, {hi}], {ctx.attr('what')!r}",
                       hint=_HINT)
    return [(ctx.dtype(0), ctx.shape(0))]


def choice_rows(ctx: InferContext) -> list[list[int]]:
    """Row j of `choices`: the candidates output j may take (validated against the node)."""
    width, choices = _int_attr(ctx, "width"), ctx.attr("choices")
    count = ctx.n_inputs - 1
    if width < 1 or not isinstance(choices, (list, tuple)) or len(choices) != width * ctx.n_outputs:
        raise ctx.fail(f"choices must hold width ({width}) x {ctx.n_outputs} outputs entries", hint=_HINT)
    if any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not -1 <= c < count for c in choices):
        raise ctx.fail(f"choices are candidate numbers in [0, {count}) or -1, not {list(choices)}", hint=_HINT)
    rows = [[int(c) for c in choices[j * width:(j + 1) * width] if c >= 0] for j in range(ctx.n_outputs)]
    if not all(rows):
        raise ctx.fail("every output of SelectByIndex needs a candidate", hint=_HINT)
    return rows


@shape_rule(SELECT_BY_INDEX, domain=POLYKIT_DOMAIN)
def _select_by_index(ctx: InferContext):
    if ctx.n_inputs < 2 or not all(ctx.has(i) for i in range(ctx.n_inputs)):
        raise ctx.fail("SelectByIndex takes an index and one or more candidates", hint=_HINT)
    if ctx.dtype(0) is not None and ctx.dtype(0).kind not in "iu":
        raise ctx.fail(f"the index is {ctx.dtype(0)}, not an integer", hint=_HINT)
    rows = choice_rows(ctx)
    index = ctx.shape(0)
    if index is not None and all(isinstance(d, int) for d in index) and int(np.prod(index)) != len(rows):
        raise ctx.fail(f"the index has shape {tuple(index)}: one entry per output ({len(rows)})", hint=_HINT)
    known = ctx.const(0)
    out = []
    for j, row in enumerate(rows):
        if known is not None and int(known.reshape(-1)[j]) in row:
            row = [int(known.reshape(-1)[j])]
        dtypes = {ctx.dtype(1 + c) for c in row} - {None}
        if len(dtypes) > 1:
            raise ctx.fail(f"output {j}'s candidates have dtypes {sorted(map(str, dtypes))}", hint=_HINT)
        out.append((next(iter(dtypes), None), _shape(ctx, j, [ctx.shape(1 + c) for c in row])))
    return out


def _shape(ctx: InferContext, output: int, shapes: list) -> Any:
    """The dims all `shapes` agree on; a dim they differ in sized by the run (None: unknown)."""
    if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        if all(s is not None for s in shapes):
            raise ctx.fail(f"output {output}'s candidates have ranks {sorted({len(s) for s in shapes})}",
                           hint="a selection keeps its rank: the candidates of one output must share it")
        return None
    first = shapes[0]
    return tuple(d if all(same_dim(d, s[axis]) for s in shapes[1:]) else sized_dim(ctx, axis, output)
                 for axis, d in enumerate(first))
