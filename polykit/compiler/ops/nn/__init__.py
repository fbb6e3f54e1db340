"""Neural-network ops: convolution, pooling, normalization, activations, resize, sampling, detection.

Each op: `<op>.py` (importer, shape rule) and `<op>_reference.py` (the numpy oracle).
"""
