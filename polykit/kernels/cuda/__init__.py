"""CUDA C kernel sources (.cu) and their tactic descriptions (importable without cuda-python)."""
