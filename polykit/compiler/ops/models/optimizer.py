"""Optimizer update ops of the ai.onnx.preview.training domain: Adagrad, Adam, Momentum --
shape rules and the input / output grouping the kernels share.

Inputs are R (learning rate, scalar), T (update count, int64 scalar), then n tensors of each
state group in order (Adagrad: X, G, H; Adam: X, G, V, H; Momentum: X, G, V); outputs are the
new values of the groups that change (Adagrad: X, H; Adam: X, V, H; Momentum: X, V), each
shaped and typed like its input.
"""

from __future__ import annotations

from polykit.compiler.ops.registry import InferContext, shape_rule

TRAINING_DOMAIN = "ai.onnx.preview.training"
#: op -> (input groups after R and T, output groups)
GROUPS = {"Adagrad": ("XGH", "XH"), "Adam": ("XGVH", "XVH"), "Momentum": ("XGV", "XV")}


def grouped(op: str, names) -> tuple[int, dict[str, list]]:
    """(n, {group letter: its n entries}) of an optimizer node's inputs after R and T."""
    groups = GROUPS[op][0]
    rest = list(names)[2:]
    n = len(rest) // len(groups)
    return n, {g: rest[k * n:(k + 1) * n] for k, g in enumerate(groups)}


@shape_rule(*GROUPS, domain=TRAINING_DOMAIN)
def _optimizer(ctx: InferContext):
    op = ctx.node.op_type
    in_groups, out_groups = GROUPS[op]
    rest = ctx.n_inputs - 2
    if rest <= 0 or rest % len(in_groups):
        raise ctx.fail(f"{op} takes R, T and {len(in_groups)} groups of tensors ({', '.join(in_groups)}); "
                       f"got {ctx.n_inputs} inputs")
    n = rest // len(in_groups)
    if op == "Momentum":
        for required in ("alpha", "beta", "norm_coefficient"):
            ctx.attr(required)
        mode = ctx.attr("mode")
        if (mode.decode() if isinstance(mode, bytes) else mode) not in ("standard", "nesterov"):
            raise ctx.fail(f"Momentum mode {mode!r} is not 'standard' or 'nesterov'")
    if ctx.n_outputs != n * len(out_groups):
        raise ctx.fail(f"{op} with {n} tensor(s) per group has {n * len(out_groups)} outputs, got {ctx.n_outputs}")
    out = []
    for g in out_groups:
        first = 2 + in_groups.index(g) * n
        out += [(ctx.dtype(first + i), ctx.shape(first + i)) for i in range(n)]
    return out
