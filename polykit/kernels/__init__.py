"""Kernels: numpy reference implementations (the oracle) and CUDA C sources with their tactics."""
