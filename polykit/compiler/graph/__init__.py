"""Graphs in and out: ONNX import/export, the network API, shape inference, the one evaluator.

Imports compiler.ir and compiler.ops.
"""
