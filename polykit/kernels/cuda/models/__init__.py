"""Model-level tactics: LLM ops, losses, optimizers, training, RNNs, detection, image, sampling,
signal, random, collectives, control flow.

CUDA sources live in ../src/ (one family per file).
"""
