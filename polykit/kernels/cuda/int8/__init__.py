"""INT8 family: QConv/QMatMul on tensor cores, split-K, integer products, (de)quantization.

CUDA sources live in ../src/ (one family per file).
"""
