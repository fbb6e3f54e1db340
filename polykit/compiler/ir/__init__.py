"""The graph IR: nodes over named tensors, dtypes, symbolic dims, sequences, nested graphs.

Imports only polykit's ground (errors, files, plugins).
"""
