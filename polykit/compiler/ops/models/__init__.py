"""Model-level ops: attention, LLM ops, recurrent layers, losses, optimizers, collectives, ai.onnx.ml.

Each op: `<op>.py` (importer, shape rule) and `<op>_reference.py` (the numpy oracle).
"""
