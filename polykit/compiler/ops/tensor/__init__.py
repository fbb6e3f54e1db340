"""Tensor ops: shapes, layout, indexing, selection, constants, casts.

Each op: `<op>.py` (importer, shape rule) and `<op>_reference.py` (the numpy oracle).
"""
