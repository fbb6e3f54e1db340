"""The fuzzer's calibration caches: a valid cache of the seed MLP and line-aware mutations
(scales, names, header fields, lines dropped or repeated; raw bytes now and then)."""

from __future__ import annotations

import numpy as np

from polykit.testing.mutate import mutate_bytes, pick

#: scale texts a mutation may put on a line: valid, out of range, not float32, not hex
SCALE_EDGES = ("0x1.0p-7", "0x1.5555560000000p-2", "0x0p+0", "-0x1.0p-3", "0x1.0p+200", "0x1.0000000000001p-3",
               "inf", "nan", "0.25", "", "0x", "0x1.gp-1")


def calibration_corpus() -> list[tuple[str, bytes]]:
    """(name, cache bytes): the scales of the Gemm inputs of the seed "mlp" model (fuzz_corpus)."""
    from polykit.compiler.builder.calibration_cache import CalibrationCache

    return [("mlp.cache", CalibrationCache("entropy", {"x": 0.021, "r": 0.047}).text().encode())]


def mutate_calibration(data: bytes, rng: np.random.Generator, steps: int) -> tuple[bytes, str]:
    if rng.random() < 0.1:
        return mutate_bytes(data, rng)
    lines = data.decode("utf-8", "replace").split("\n")
    notes = []
    for _ in range(steps):
        i = int(rng.integers(len(lines)))
        op = int(rng.integers(6))
        name, sep, scale = lines[i].rpartition(": ")
        if op == 0:
            lines[i] = f"{name}{sep}{pick(rng, SCALE_EDGES)}"
            notes.append(f"line {i + 1}: scale {lines[i]!r}")
        elif op == 1:
            lines[i] = f"{pick(rng, ('y', '', 'x: x', 'r ', 'x'))}{sep}{scale}"
            notes.append(f"line {i + 1}: name {lines[i]!r}")
        elif op == 2:
            del lines[i]
            notes.append(f"deleted line {i + 1}")
        elif op == 3:
            lines.insert(i, lines[i])
            notes.append(f"repeated line {i + 1}")
        elif op == 4:
            lines[0] = lines[0].replace(pick(rng, (" 1 ", "entropy", "polykit=")), pick(rng, (" 2 ", "bogus", "", " ")))
            notes.append(f"header {lines[0]!r}")
        else:
            lines[i] = lines[i].replace(": ", pick(rng, (":", " : ", ":  ", "\t")))
            notes.append(f"line {i + 1}: separator")
    return "\n".join(lines).encode(), "; ".join(notes)
