"""The plan: its records, binary file format, schema and structure checks, profiles, memory plan.

What a runtime loads, nothing of the builder; imports compiler.ir, ops, graph, passes.
"""
