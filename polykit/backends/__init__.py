"""Runners (polykit's engine, onnxruntime, plugins), the loaders they take, rank processes.

Imports compiler.builder, runtime and everything below; never tools."""
