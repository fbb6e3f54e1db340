"""Passes over control flow: sequences and optionals resolved at build time, If inlining, Loop unrolling.
"""
