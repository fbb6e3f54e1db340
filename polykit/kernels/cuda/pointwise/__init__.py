"""Pointwise family: fused elementwise bodies generated into one CUDA module.

CUDA sources live in ../src/ (one family per file).
"""
