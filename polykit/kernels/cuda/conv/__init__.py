"""Convolution family: implicit GEMM and direct convolutions (NCHW, NHWC, sm90), pooling, reformats.

CUDA sources live in ../src/ (one family per file).
"""
