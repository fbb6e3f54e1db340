"""The runtime: Engine / ExecutionContext over a plan, on a target (cuda or cpu)."""
