"""Attention family: ai.polykit Attention (simple, flash, flash sm90, fp32) and ONNX Attention.

CUDA sources live in ../src/ (one family per file).
"""
