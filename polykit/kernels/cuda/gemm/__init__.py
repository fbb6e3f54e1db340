"""GEMM family: SIMT and Hopper (wgmma) matrix products, their epilogues, split-K / stream-K, Einsum, Det.

CUDA sources live in ../src/ (one family per file).
"""
