"""Math ops: elementwise, reductions, matrix products, linear algebra, random, signal.

Each op: `<op>.py` (importer, shape rule) and `<op>_reference.py` (the numpy oracle).
"""
