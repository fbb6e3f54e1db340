"""Runners (polykit's engine, onnxruntime, plugins), the loaders they take, and their plugin specs."""
