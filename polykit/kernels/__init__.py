"""Kernels: the tactic table and the cpu and cuda tactics (CUDA sources in cuda/src/).

Imports compiler.plan and the layers below it; never runtime or builder."""
