"""Data movement: transpose/slice/concat/pad, gather/scatter, selection, small tensor ops, TopK, Resize.

CUDA sources live in ../src/ (one family per file).
"""
