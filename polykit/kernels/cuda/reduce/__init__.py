"""Reductions and row ops: Reduce*, scans, softmax, normalizations, LRN.

CUDA sources live in ../src/ (one family per file).
"""
