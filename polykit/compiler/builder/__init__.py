"""The builder: Graph -> Plan (config, lowering, tactic choice and timing, caches, replay, calibration,
tensor-parallel partitioning). Imports everything below it: compiler.*, kernels, runtime.
"""
