"""Control flow and sequences: If, Loop, Scan, Sequence*/Optional*.

Each op: `<op>.py` (importer, shape rule) and `<op>_reference.py` (the numpy oracle).
"""
