"""`polykit refit PLAN --weights new.onnx|weights.npz -o PLAN2`: a plan built --refittable with
new weights, without a rebuild (polykit.compiler.builder.refit; docs/REFIT.md)."""

from __future__ import annotations

import typer


def refit(
    plan: str = typer.Argument(..., metavar="PLAN", help="a plan built with polykit convert --refittable"),
    weights: str = typer.Option(..., "--weights", metavar="FILE",
                                help="the new weights: the model (.onnx) or a .npz of initializer name -> array"),
    output: str = typer.Option(..., "--output", "-o", help="where to write the refitted plan"),
) -> int:
    from polykit.compiler.builder.refit import record_of, refit_plan, weights_from_file
    from polykit.compiler.plan.file import Plan
    from polykit.files import require_output_folder
    from polykit.tools.cli.app import stderr_console

    require_output_folder(output, "--output")
    old = Plan.load(plan)
    values = weights_from_file(weights, record_of(old, plan))
    new = refit_plan(old, values, where=plan)
    new.save(output)
    changed = sum(1 for n, w in new.weights.items() if w.tobytes() != old.weights[n].tobytes())
    stderr_console().print(f"wrote {output}: {len(values)} initializers from {weights}, "
                           f"{changed} of {len(new.weights)} plan weights changed", soft_wrap=True)
    return 0


def register(app: typer.Typer) -> None:
    app.command("refit", help="Give a plan built --refittable new weights (an ONNX model or a .npz), "
                              "without a rebuild.")(refit)
