"""Quantization ops: QuantizeLinear/DequantizeLinear, QLinear*, polykit's INT8 layers.

Each op: `<op>.py` (importer, shape rule) and `<op>_reference.py` (the numpy oracle).
"""
