"""The runtime: Engine / ExecutionContext over a plan, on a target (cuda or cpu).

Imports kernels, compiler.plan and the layers below; never the builder."""
